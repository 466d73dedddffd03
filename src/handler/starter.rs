//! A hook's own starter threads (issue 47): an executable's checks of its files before a process
//! starts (listings, `stat`s, hashing) with the start itself, the opening of its handler file and
//! every process start of the hook run there (the checks before a forked Python worker or a
//! library load, which start nothing, run on the shared `crate::file_lanes`), never on the runtime's threads nor on threads other hooks share (the blocking pool,
//! the service's spawner thread). A hook whose files stall (a network or FUSE mount that stops
//! answering) or whose tree is huge delays only itself: `/healthz`, other hooks' events and
//! collects go on.
//!
//! Each version of a hook has one [`Starter`]: up to [`MAX_THREADS`] threads (as many as the
//! hook runs calls at once), started on first use from the service's thread maker (a thread at
//! the service's starting priority that only starts threads) so that they keep that priority (a child inherits its parent thread's priority and
//! may only lower its own: `crate::priority`), and ended when the version's handler is dropped.
//! What waits for them is bounded: at most [`BACKLOG`] jobs queue behind a hook's threads (more
//! are refused at once), and a check is given up after its deadline ([`CHECK_DEADLINE`]) while
//! the thread that hangs stays the hook's own. Each start is one hand-off to the thread and one
//! answer back. Threads that started a process stay as long as the version (the process's
//! parent-death signal follows the thread that started it); threads that only checked files
//! end when idle ([`IDLE_EXIT`]), so many Python hooks cost no thread each. The threads enter the runtime (its process reaping), so a `tokio::process`
//! command can be spawned there too.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most starter threads of one hook.
pub const MAX_THREADS: usize = 4;
/// Most jobs waiting for a hook's starter threads; more are refused at once.
pub const BACKLOG: usize = 64;
/// How long a check of a hook's files (before a worker's start, a library's load, the opening
/// of a handler) may take before the start is refused as "the files do not answer".
pub const CHECK_DEADLINE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

/// Why a job did not run to an answer on the hook's starter thread.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StarterError {
    /// No thread could be started, or it is gone.
    #[error("the hook's starter thread is not running ({0})")]
    Gone(String),
    /// [`BACKLOG`] jobs already wait (the hook's files stall).
    #[error(
        "{BACKLOG} starts of this hook already wait for its files (a file system that does not answer?)"
    )]
    Busy,
    /// The job did not finish within its deadline.
    #[error("{what} did not finish within {} (a file system that does not answer?)", crate::time::fmt_duration(*.deadline))]
    TimedOut {
        /// What ran, for the message.
        what: &'static str,
        /// The deadline.
        deadline: Duration,
    },
}

/// The starter threads of one hook version (see the module comment).
#[derive(Debug)]
pub struct Starter {
    hook: String,
    threads: usize,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// The channel to the running threads and its generation; `None` while none runs.
    tx: Mutex<Option<(mpsc::SyncSender<Job>, u64)>>,
    generation: AtomicU64,
    /// Threads of the current generation still running.
    live: AtomicUsize,
    /// A process started here may still run: the threads stay (a child's parent-death signal
    /// follows the thread that started it), until the version is dropped.
    keep: AtomicBool,
}

impl Starter {
    /// A starter for hook `hook` running up to `concurrency` starts at once (at most
    /// [`MAX_THREADS`]); no thread starts before the first job.
    pub fn new(hook: &str, concurrency: usize) -> Self {
        Self {
            hook: hook.to_string(),
            threads: concurrency.clamp(1, MAX_THREADS),
            shared: Arc::default(),
        }
    }

    /// Keeps the threads until the version is dropped: they start processes whose
    /// parent-death signal follows them. Otherwise (checks only) they end after [`IDLE_EXIT`]
    /// without a job, and start again for the next one.
    pub fn keep_threads(&self) {
        self.shared.keep.store(true, Ordering::Relaxed);
    }

    /// Runs `job` on one of the hook's threads and waits for its answer, at most `deadline`
    /// when given (the job keeps its thread until it returns). `abandoned` gets an answer
    /// nobody waited for any more (a started process to kill and reap), on that thread.
    pub async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        deadline: Option<Duration>,
        job: impl FnOnce() -> T + Send + 'static,
        abandoned: impl FnOnce(T) + Send + 'static,
    ) -> Result<T, StarterError> {
        let (answer, rx) = tokio::sync::oneshot::channel();
        let mut job: Option<Job> = Some(Box::new(move || {
            if let Err(value) = answer.send(job()) {
                abandoned(value);
            }
        }));
        // Twice at most: the threads may have ended (idle) just before the first try.
        for _ in 0..2 {
            let Some(j) = job.take() else { break };
            let sent = {
                let mut tx = lock(&self.shared.tx);
                match tx.as_ref() {
                    Some((sender, _)) => match sender.try_send(j) {
                        Ok(()) => Ok(()),
                        Err(mpsc::TrySendError::Full(_)) => return Err(StarterError::Busy),
                        Err(mpsc::TrySendError::Disconnected(j)) => {
                            *tx = None;
                            Err(j)
                        }
                    },
                    None => Err(j),
                }
            };
            match sent {
                Ok(()) => break,
                Err(j) => {
                    job = Some(j);
                    self.start_threads().await?;
                }
            }
        }
        if job.is_some() {
            return Err(StarterError::Gone("its threads stopped".into()));
        }
        let gone = || StarterError::Gone("it dropped a job".into());
        match deadline {
            None => rx.await.map_err(|_| gone()),
            Some(d) => match tokio::time::timeout(d, rx).await {
                Ok(r) => r.map_err(|_| gone()),
                Err(_) => {
                    tracing::warn!(hook = %self.hook, "{what} did not finish within {}: its start is refused; the thread that waits is the hook's own", crate::time::fmt_duration(d));
                    Err(StarterError::TimedOut { what, deadline: d })
                }
            },
        }
    }

    /// Starts the hook's threads (from the thread maker, so that they keep the service's
    /// starting priority) unless they run.
    async fn start_threads(&self) -> Result<(), StarterError> {
        let (rx, generation) = {
            let mut tx = lock(&self.shared.tx);
            if tx.is_some() {
                return Ok(());
            }
            let (new_tx, rx) = mpsc::sync_channel::<Job>(BACKLOG);
            let generation = self.shared.generation.fetch_add(1, Ordering::Relaxed) + 1;
            *tx = Some((new_tx, generation));
            self.shared.live.store(self.threads, Ordering::Relaxed);
            (Arc::new(Mutex::new(rx)), generation)
        };
        let runtime = tokio::runtime::Handle::current();
        let (n, shared) = (self.threads, self.shared.clone());
        let started = crate::priority::thread_at_base(move || {
            for _ in 0..n {
                let (rx, runtime, shared) = (rx.clone(), runtime.clone(), shared.clone());
                std::thread::Builder::new()
                    .name("hermes-hook-start".into())
                    .stack_size(256 * 1024)
                    .spawn(move || serve(&rx, &runtime, &shared, generation))?;
            }
            Ok(())
        })
        .await;
        started.map_err(|e| {
            tracing::warn!(hook = %self.hook, "cannot start the hook's starter thread: {e}");
            let mut tx = lock(&self.shared.tx);
            if tx.as_ref().is_some_and(|(_, g)| *g == generation) {
                *tx = None;
            }
            StarterError::Gone(e.to_string())
        })
    }
}

/// How long a starter thread that started no process waits for a job before it ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(2);

/// A starter thread: runs the hook's jobs until its version is dropped, or (when it started no
/// process that may still run) until it has been idle for [`IDLE_EXIT`].
fn serve(
    rx: &Mutex<mpsc::Receiver<Job>>,
    runtime: &tokio::runtime::Handle,
    shared: &Shared,
    generation: u64,
) {
    let _context = runtime.enter();
    loop {
        // One thread waits on the channel at a time; the others wait for the lock.
        let got = lock(rx).recv_timeout(IDLE_EXIT);
        match got {
            Ok(job) => job(),
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if shared.keep.load(Ordering::Relaxed) {
                    continue;
                }
                // Under the sender's lock: a job sent before is run first; after, the sender
                // finds no threads and starts new ones.
                let mut tx = lock(&shared.tx);
                let Ok(rx) = rx.try_lock() else {
                    continue; // another thread of the hook waits for jobs
                };
                if let Ok(job) = rx.try_recv() {
                    drop((rx, tx));
                    job();
                    continue;
                }
                if shared.live.fetch_sub(1, Ordering::Relaxed) == 1
                    && tx.as_ref().is_some_and(|(_, g)| *g == generation)
                {
                    *tx = None;
                }
                return;
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that hangs holds its hook's thread only: the caller gets its deadline, and
    /// another hook's starter answers meanwhile.
    #[tokio::test]
    async fn a_hanging_job_costs_its_own_hook_only() {
        let stalled = Starter::new("stalled", 1);
        let healthy = Starter::new("healthy", 1);
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let err = stalled
            .run(
                "the check",
                Some(Duration::from_millis(100)),
                move || {
                    let _ = hold.recv();
                },
                |_| {},
            )
            .await;
        assert!(matches!(err, Err(StarterError::TimedOut { .. })), "{err:?}");
        let ok = healthy.run("the check", Some(Duration::from_secs(5)), || 7, |_| {});
        assert_eq!(ok.await, Ok(7));
        let _ = release.send(());
    }
}
