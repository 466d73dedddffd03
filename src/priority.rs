//! The CPU priority of hook work: the processes that run hooks (Python workers, executables, the
//! Python fork server) yield the CPU to the gateway and to the service's own threads.
//!
//! A [`Priority`] is a `nice` increment over the service's own nice value (default +10, like
//! `nice -n 10`) and a policy: by default `SCHED_IDLE` (the process gets the CPU only when no
//! normal task of its group wants it, and a waking gateway preempts it at once; under `nice`
//! alone the kernel lets a running hook finish its slice first, which measured as loop lag),
//! `normal` on request. `serve --worker-nice N --worker-sched normal|idle` sets the default for
//! every hook; a hook's HOOK.yaml (`nice:`, `sched:`) overrides it. A process can always lower its own priority; raising
//! it above the service's needs `CAP_SYS_NICE` (or `RLIMIT_NICE`): a hook asking for more than it
//! may have runs at what it could get, and says so in the log.
//!
//! The service's own runtime threads (HTTP, queues, the pipes to the workers) are background work
//! too: `serve` lowers each of them as it starts (`ServiceThreads`, `serve --service-nice
//! --service-sched`). Hook processes are then started by one thread that keeps the service's
//! starting priority (`spawn_at_base`): a child inherits the priority of the thread that forks
//! it, and an unprivileged process can lower its priority but never raise it again (nor leave
//! `SCHED_IDLE`), so a hook that asks for more than the runtime threads have still gets it.

use std::sync::OnceLock;
use std::sync::mpsc;

use serde::Deserialize;

/// Default `nice` increment of hook processes over the service's own.
pub const DEFAULT_NICE: i32 = 10;
/// Default scheduling policy of hook processes.
pub const DEFAULT_SCHED: Sched = Sched::Idle;
/// Environment variable for the default increment (`serve --worker-nice`).
pub(crate) const NICE_ENV: &str = "HERMES_HOOKS_WORKER_NICE";
/// Environment variable for the default scheduling policy (`serve --worker-sched`).
pub(crate) const SCHED_ENV: &str = "HERMES_HOOKS_WORKER_SCHED";
/// Default `nice` increment of the service's runtime threads over the service's starting value.
pub(crate) const DEFAULT_SERVICE_NICE: i32 = 10;
/// Default scheduling policy of the service's runtime threads.
pub(crate) const DEFAULT_SERVICE_SCHED: Sched = Sched::Idle;
/// Environment variable for `serve --service-nice`.
pub(crate) const SERVICE_NICE_ENV: &str = "HERMES_HOOKS_SERVICE_NICE";
/// Environment variable for `serve --service-sched`.
pub(crate) const SERVICE_SCHED_ENV: &str = "HERMES_HOOKS_SERVICE_SCHED";

/// `sched:` of a hook, `--worker-sched` of `serve`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Sched {
    /// The normal time-sharing policy (`SCHED_OTHER`), weighted by `nice`.
    #[default]
    Normal,
    /// `SCHED_IDLE`: only CPU time nobody else wants.
    Idle,
}

impl Sched {
    /// The name used in HOOK.yaml and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Sched::Normal => "normal",
            Sched::Idle => "idle",
        }
    }
}

/// How hook processes are scheduled, relative to the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Priority {
    /// Increment over the service's nice value (-20..=19; the result is clamped to -20..=19).
    pub nice: i32,
    /// Scheduling policy.
    pub sched: Sched,
}

impl Default for Priority {
    fn default() -> Self {
        Self {
            nice: DEFAULT_NICE,
            sched: DEFAULT_SCHED,
        }
    }
}

impl Priority {
    /// This priority with a hook's own `nice:` / `sched:` applied over it.
    pub fn overridden(self, nice: Option<i32>, sched: Option<Sched>) -> Self {
        Self {
            nice: nice.unwrap_or(self.nice),
            sched: sched.unwrap_or(self.sched),
        }
    }

    /// The absolute nice value a hook process gets: the service's own (as it started, before
    /// its runtime threads lowered theirs) plus the increment.
    pub(crate) fn target_nice(self) -> i32 {
        (base_nice() + self.nice).clamp(-20, 19)
    }

    /// What the handler's processes are started with, as resolved now (for a child to apply).
    pub(crate) fn resolved(self) -> Resolved {
        Resolved {
            nice: self.target_nice(),
            idle: self.sched == Sched::Idle,
        }
    }

    /// True when a process at this priority gets more CPU than one at `other` (a lower nice
    /// value, or a normal policy against `SCHED_IDLE`): it cannot come from a process at `other`.
    pub fn above(self, other: Priority) -> bool {
        self.nice < other.nice || (self.sched == Sched::Normal && other.sched == Sched::Idle)
    }

    /// For `list` / `/v1/hooks`: `nice +10`, `nice +10, idle`.
    pub fn describe(self) -> String {
        let idle = if self.sched == Sched::Idle {
            ", idle"
        } else {
            ""
        };
        format!("nice {:+}{idle}", self.nice)
    }
}

/// A priority resolved to absolute values, applied in a child before it runs hook code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Resolved {
    /// Absolute nice value.
    pub nice: i32,
    /// `SCHED_IDLE`.
    pub idle: bool,
}

impl Resolved {
    /// Applies this priority to the calling thread (in a child between fork and exec: only
    /// async-signal-safe system calls). Failures are ignored: a process that may not raise its
    /// priority keeps the one it has, which is never higher than the service's.
    pub fn apply_to_self(self) {
        // SAFETY: setpriority and sched_setscheduler are plain system calls without memory
        // preconditions; `param` outlives the call.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, 0, self.nice);
            if self.idle {
                let param = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
            }
        }
    }
}

/// The service's nice value as it started: what [`ServiceThreads::install`] recorded before any
/// thread lowered its own, else the calling thread's.
pub(crate) fn base_nice() -> i32 {
    match BASE_NICE.get() {
        Some(n) => *n,
        None => own_nice(),
    }
}

static BASE_NICE: OnceLock<i32> = OnceLock::new();

/// Records the calling thread's nice value as the service's starting one (once; from the main
/// thread, before the runtime's threads start and lower theirs).
pub(crate) fn record_base_nice() {
    let _ = BASE_NICE.set(own_nice());
}

/// A job for the spawner thread: it runs there and hands its result back itself.
type Job = Box<dyn FnOnce() + Send>;

static SPAWNER: OnceLock<std::sync::Mutex<mpsc::Sender<Job>>> = OnceLock::new();

/// The priority of the service's own runtime threads (`serve --service-nice --service-sched`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServiceThreads(pub Priority);

impl ServiceThreads {
    /// Records the service's starting nice value and starts the spawner thread (at that
    /// priority: call it from the main thread, before any thread lowers its own). `runtime`: the
    /// runtime whose context child processes are spawned in (tokio's child reaping).
    pub fn install(self, runtime: tokio::runtime::Handle) {
        record_base_nice();
        let (tx, rx) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("hermes-spawner".into())
            .spawn(move || {
                let _context = runtime.enter();
                // The thread lives as long as the service: PR_SET_PDEATHSIG of the children it
                // starts follows it.
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        match started {
            Ok(_) => {
                let _ = SPAWNER.set(std::sync::Mutex::new(tx));
            }
            Err(e) => tracing::warn!(
                "no spawner thread ({e}): hook processes are started by the runtime's threads"
            ),
        }
    }

    /// Lowers the calling thread to this priority (for the runtime's `on_thread_start`).
    pub fn lower_this_thread(self) {
        let resolved = Resolved {
            nice: (base_nice() + self.0.nice).clamp(-20, 19),
            idle: self.0.sched == Sched::Idle,
        };
        // Only ever lower: a thread at a better value than asked keeps it, a worse one too.
        if resolved.nice > own_nice() || resolved.idle {
            resolved.apply_to_self();
        }
    }
}

/// Runs `job` (spawning a child process) on the spawner thread, which has the service's starting
/// priority, and returns its result; the caller waits for it as it would for the spawn itself.
/// Without a spawner (commands other than `serve`, the library in tests) it runs here.
pub(crate) fn spawn_at_base<T: Send + 'static>(
    job: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let Some(spawner) = SPAWNER.get() else {
        return job();
    };
    let (tx, rx) = mpsc::sync_channel(1);
    let boxed: Job = Box::new(move || {
        let _ = tx.send(job());
    });
    let sent = spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(boxed);
    if let Err(mpsc::SendError(boxed)) = sent {
        boxed(); // the spawner is gone: start it here, at this thread's priority
    }
    rx.recv()
        .unwrap_or_else(|_| Err(std::io::Error::other("the spawner thread is gone")))
}

/// The nice value of the calling thread (the service's, called from its threads).
pub(crate) fn own_nice() -> i32 {
    // getpriority returns -1 both for nice -1 and for an error; errno tells them apart.
    // SAFETY: errno location and getpriority have no preconditions.
    unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, 0);
        if n == -1 && *libc::__errno_location() != 0 {
            0
        } else {
            n
        }
    }
}

/// Reads a `nice` increment (`--worker-nice`, `nice:`): an integer in -20..=19.
pub(crate) fn parse_nice(s: &str) -> Result<i32, String> {
    let n: i32 = s
        .trim()
        .trim_start_matches('+')
        .parse()
        .map_err(|_| format!("{s:?} is not an integer (a nice increment, -20..=19)"))?;
    check_nice(n as i64)
}

/// Checks a `nice` increment's range.
pub(crate) fn check_nice(n: i64) -> Result<i32, String> {
    if (-20..=19).contains(&n) {
        Ok(n as i32)
    } else {
        Err(format!("{n} is out of range -20..=19"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_and_description() {
        let p = Priority::default();
        assert_eq!(p.describe(), "nice +10, idle");
        let q = p.overridden(Some(0), Some(Sched::Normal));
        assert_eq!(q.describe(), "nice +0");
        assert_eq!(p.overridden(None, None), p);
    }

    #[test]
    fn nice_parsing() {
        assert_eq!(parse_nice("+5"), Ok(5));
        assert_eq!(parse_nice("19"), Ok(19));
        assert!(parse_nice("20").is_err());
        assert!(parse_nice("x").is_err());
    }
}
