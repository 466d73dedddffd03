//! A hook's own starter threads (issue 47): the checks of its files before a process starts
//! (listings, `stat`s, hashing), the opening of its handler file and its process starts run
//! there, never on the runtime's threads nor on threads other hooks share (the blocking pool,
//! the service's spawner thread). A hook whose files stall (a network or FUSE mount that stops
//! answering) or whose tree is huge delays only itself: `/healthz`, other hooks' events and
//! collects go on.
//!
//! Each version of a hook has one [`Starter`]: up to [`MAX_THREADS`] threads (as many as the
//! hook runs calls at once), started on first use from the service's spawner thread so that
//! they keep the service's starting priority (a child inherits its parent thread's priority and
//! may only lower its own: `crate::priority`), and ended when the version's handler is dropped.
//! What waits for them is bounded: at most [`BACKLOG`] jobs queue behind a hook's threads (more
//! are refused at once), and a check is given up after its deadline ([`CHECK_DEADLINE`]) while
//! the thread that hangs stays the hook's own. Each start is one hand-off to the thread and one
//! answer back. The threads enter the runtime (its process reaping), so a `tokio::process`
//! command can be spawned there too.

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
    tx: Mutex<Option<mpsc::SyncSender<Job>>>,
}

impl Starter {
    /// A starter for hook `hook` running up to `concurrency` starts at once (at most
    /// [`MAX_THREADS`]); no thread starts before the first job.
    pub fn new(hook: &str, concurrency: usize) -> Self {
        Self {
            hook: hook.to_string(),
            threads: concurrency.clamp(1, MAX_THREADS),
            tx: Mutex::new(None),
        }
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
        let tx = self.sender().await?;
        let (answer, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            if let Err(value) = answer.send(job()) {
                abandoned(value);
            }
        });
        match tx.try_send(job) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => return Err(StarterError::Busy),
            Err(mpsc::TrySendError::Disconnected(_)) => {
                *lock(&self.tx) = None;
                return Err(StarterError::Gone("it stopped".into()));
            }
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

    /// The sender to the hook's threads, starting them on first use.
    async fn sender(&self) -> Result<mpsc::SyncSender<Job>, StarterError> {
        let rx = {
            let mut tx = lock(&self.tx);
            if let Some(tx) = tx.as_ref() {
                return Ok(tx.clone());
            }
            let (new_tx, rx) = mpsc::sync_channel::<Job>(BACKLOG);
            *tx = Some(new_tx);
            Arc::new(Mutex::new(rx))
        };
        let runtime = tokio::runtime::Handle::current();
        let (hook, n) = (self.hook.clone(), self.threads);
        // Started from the spawner thread: they keep the service's starting priority.
        let started = crate::priority::spawn_at_base_async(move || {
            for _ in 0..n {
                let (rx, runtime) = (rx.clone(), runtime.clone());
                std::thread::Builder::new()
                    .name("hermes-hook-start".into())
                    .stack_size(256 * 1024)
                    .spawn(move || serve(&rx, &runtime))?;
            }
            Ok(())
        })
        .await;
        let tx = lock(&self.tx).clone();
        match (started, tx) {
            (Ok(()), Some(tx)) => Ok(tx),
            (Err(e), _) => {
                tracing::warn!(hook = %hook, "cannot start the hook's starter thread: {e}");
                *lock(&self.tx) = None;
                Err(StarterError::Gone(e.to_string()))
            }
            (Ok(()), None) => Err(StarterError::Gone("it stopped".into())),
        }
    }
}

/// A starter thread: runs the hook's jobs until its version is dropped.
fn serve(rx: &Mutex<mpsc::Receiver<Job>>, runtime: &tokio::runtime::Handle) {
    let _context = runtime.enter();
    loop {
        // One thread waits on the channel at a time; the others wait for the lock.
        let job = match lock(rx).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        job();
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
