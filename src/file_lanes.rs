//! The threads that read hooks' files for the service (issue 47): the reload scan of each hook
//! directory, the check of a hook's tree before a worker starts or a library loads. Shared by
//! every hook, so 50 hooks do not cost 50 threads (each with its stack and allocator heap: the
//! per-hook starter threads this replaced took 6 MB of the service's memory with 50 Python
//! hooks), and bounded per hook, so one hook whose files stall delays only itself:
//!
//! - jobs carry a key (the hook, or its directory); one job per key runs at a time, at most
//!   [`BACKLOG`] more wait behind it, more are refused at once;
//! - a job's caller waits at most its deadline; the job keeps its thread until it returns (the
//!   thread is then that hook's own: nothing else waits for it);
//! - the pool runs at most [`FAST_THREADS`] threads whose job is not slow (running for more than
//!   [`SLOW`]); a thread whose job turns slow no longer counts, so a stalled hook's job makes
//!   room for a new thread for the others' (a waiting caller looks again every [`SLOW`]);
//! - threads idle for [`IDLE_EXIT`] end.
//!
//! The threads come from the service's thread maker ([`crate::priority::thread_at_base`]), so
//! they have its starting priority. Nothing here starts processes: starts stay on each hook's
//! own starter thread (`handler/starter.rs`), whose parent-death signal they follow.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Most threads whose job is not slow.
pub const FAST_THREADS: usize = 2;
/// A job running longer than this no longer holds a place among [`FAST_THREADS`].
pub const SLOW: Duration = Duration::from_millis(200);
/// Most jobs of one key waiting behind its running one.
pub const BACKLOG: usize = 64;
/// How long an idle thread waits for a job before it ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(2);

type Job = Box<dyn FnOnce() + Send>;

/// Why a job did not run to an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaneError {
    /// No thread could be started.
    #[error("no thread to read the hook's files ({0})")]
    Gone(String),
    /// [`BACKLOG`] jobs of this key already wait (its files stall).
    #[error(
        "{BACKLOG} reads of this hook's files already wait (a file system that does not answer?)"
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

#[derive(Default)]
struct State {
    /// Jobs not started yet, in order.
    queue: VecDeque<(String, Job)>,
    /// Jobs queued or running per key.
    per_key: HashMap<String, usize>,
    /// Keys with a running job, and when it started.
    running: HashMap<String, Instant>,
    /// Threads alive (running a job, waiting for one, or being started).
    threads: usize,
    /// Threads waiting for a job.
    idle: usize,
}

impl State {
    /// Whether a queued job may start now (its key has none running).
    fn runnable(&self) -> bool {
        self.queue
            .iter()
            .any(|(k, _)| !self.running.contains_key(k))
    }

    /// Threads that are not held by a slow job.
    fn fast(&self) -> usize {
        let slow = self
            .running
            .values()
            .filter(|t| t.elapsed() >= SLOW)
            .count();
        self.threads.saturating_sub(slow)
    }

    /// Whether a new thread should start: a job could run, no thread is free, and fewer than
    /// [`FAST_THREADS`] threads are not slow.
    fn wants_thread(&self) -> bool {
        self.runnable() && self.idle == 0 && self.fast() < FAST_THREADS
    }
}

struct Pool {
    state: Mutex<State>,
    wake: Condvar,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        state: Mutex::default(),
        wake: Condvar::new(),
    })
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long the job of `key` that runs now has been running (`None`: none runs). A caller may
/// refuse at once to queue behind one that already ran past its own deadline (a file system
/// that still does not answer) rather than wait that deadline again.
pub fn running_for(key: &str) -> Option<Duration> {
    lock(&pool().state).running.get(key).map(Instant::elapsed)
}

/// Runs `job` on a pool thread, after the jobs of `key` queued before it, and waits at most
/// `deadline` for its answer (see the module comment).
pub async fn run<T: Send + 'static>(
    key: &str,
    what: &'static str,
    deadline: Duration,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, LaneError> {
    let (answer, mut rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = answer.send(job());
    });
    {
        let mut st = lock(&pool().state);
        let n = st.per_key.entry(key.to_string()).or_default();
        if *n > BACKLOG {
            return Err(LaneError::Busy);
        }
        *n += 1;
        st.queue.push_back((key.to_string(), job));
    }
    pool().wake.notify_one();
    let until = tokio::time::Instant::now() + deadline;
    loop {
        spawn_if_wanted().await?;
        let step = (tokio::time::Instant::now() + SLOW).min(until);
        match tokio::time::timeout_at(step, &mut rx).await {
            Ok(r) => return r.map_err(|_| LaneError::Gone("it dropped a job".into())),
            Err(_) if tokio::time::Instant::now() >= until => {
                tracing::warn!(
                    key,
                    "{what} did not finish within {}: refused; the thread that waits is that hook's own",
                    crate::time::fmt_duration(deadline)
                );
                return Err(LaneError::TimedOut { what, deadline });
            }
            Err(_) => {} // look again: a slow job may have made room for a thread
        }
    }
}

/// Starts a thread when [`State::wants_thread`].
async fn spawn_if_wanted() -> Result<(), LaneError> {
    {
        let mut st = lock(&pool().state);
        if !st.wants_thread() {
            return Ok(());
        }
        st.threads += 1;
    }
    let started = crate::priority::thread_at_base(|| {
        std::thread::Builder::new()
            .name("hermes-hook-files".into())
            .stack_size(256 * 1024)
            .spawn(serve)
            .map(|_| ())
    })
    .await;
    started.map_err(|e| {
        lock(&pool().state).threads -= 1;
        tracing::warn!("cannot start a thread to read hooks' files: {e}");
        LaneError::Gone(e.to_string())
    })
}

/// A pool thread: runs the first job whose key has none running; ends after [`IDLE_EXIT`]
/// without one.
fn serve() {
    let p = pool();
    let mut st = lock(&p.state);
    loop {
        let next = st
            .queue
            .iter()
            .position(|(k, _)| !st.running.contains_key(k));
        if let Some(i) = next {
            let Some((key, job)) = st.queue.remove(i) else {
                continue;
            };
            st.running.insert(key.clone(), Instant::now());
            drop(st);
            job();
            st = lock(&p.state);
            st.running.remove(&key);
            if let Some(n) = st.per_key.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    st.per_key.remove(&key);
                }
            }
            continue;
        }
        st.idle += 1;
        let (guard, waited) = p
            .wake
            .wait_timeout(st, IDLE_EXIT)
            .unwrap_or_else(|e| e.into_inner());
        st = guard;
        st.idle -= 1;
        if waited.timed_out() && !st.runnable() {
            st.threads -= 1;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that hangs holds its key only: its caller gets the deadline, another key's job
    /// answers meanwhile, and a second job of the hanging key waits behind it.
    #[tokio::test]
    async fn a_hanging_job_costs_its_own_key_only() {
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let hold = std::sync::Mutex::new(hold);
        let err = run(
            "lanes-test-stalled",
            "the check",
            Duration::from_millis(300),
            move || {
                let _ = hold.lock().map(|h| h.recv());
            },
        )
        .await;
        assert!(matches!(err, Err(LaneError::TimedOut { .. })), "{err:?}");
        for i in 0..(FAST_THREADS + 2) {
            let key = format!("lanes-test-{i}");
            let ok = run(&key, "the check", Duration::from_secs(5), || 7).await;
            assert_eq!(ok, Ok(7));
        }
        let behind = run(
            "lanes-test-stalled",
            "the check",
            Duration::from_millis(300),
            || 1,
        );
        assert!(matches!(behind.await, Err(LaneError::TimedOut { .. })));
        let _ = release.send(());
        let after = run(
            "lanes-test-stalled",
            "the check",
            Duration::from_secs(5),
            || 2,
        );
        assert_eq!(after.await, Ok(2));
    }
}
