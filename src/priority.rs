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
//!
//! Decisions are the gateway's own work (issue 33): while someone waits for a collect, the
//! service's runtime threads (`boost_service`) and the processes of the hooks it waits for
//! ([`BoostCell`]) run in the normal class at the service's starting nice value, then go back.
//! Leaving `SCHED_IDLE` needs `CAP_SYS_NICE` (`can_raise`); a service without it cannot do
//! that, so its defaults are the normal class instead (`default_sched`): on a busy CPU an idle
//! deny hook would time out, and a timed-out deny lets the command run.

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
/// The thread that starts threads at the service's starting priority ([`thread_at_base`]).
static THREAD_MAKER: OnceLock<std::sync::Mutex<mpsc::Sender<Job>>> = OnceLock::new();

/// The priority of the service's own runtime threads (`serve --service-nice --service-sched`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServiceThreads(pub Priority);

impl ServiceThreads {
    /// Records the service's starting nice value and starts the spawner thread (at that
    /// priority: call it from the main thread, before any thread lowers its own). `runtime`: the
    /// runtime whose context child processes are spawned in (tokio's child reaping).
    pub fn install(self, runtime: tokio::runtime::Handle) {
        record_base_nice();
        // What the runtime threads lower themselves to, known now, before any of them has
        // started: the connection watch and a boost decided early must not see "not lowered"
        // (issue 47: the watch was missing when the listener came up first).
        let resolved = self.resolved();
        if resolved.nice > own_nice() || resolved.idle {
            lock(&RUNTIME).lowered = Some(resolved);
        }
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
        // A second thread at the same priority that only starts threads (the hooks' starter
        // threads, `handler/starter.rs`): a spawn that waits on a hook's files on the spawner
        // thread (a fork server whose interpreter is on a mount that stalls) must not keep
        // other hooks from getting theirs (issue 47).
        let (tx, rx) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("hermes-threads".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        if started.is_ok() {
            let _ = THREAD_MAKER.set(std::sync::Mutex::new(tx));
        }
    }

    /// This priority, resolved against the service's starting nice value.
    fn resolved(self) -> Resolved {
        Resolved {
            nice: (base_nice() + self.0.nice).clamp(-20, 19),
            idle: self.0.sched == Sched::Idle,
        }
    }

    /// Lowers the calling thread to this priority (for the runtime's `on_thread_start`), and
    /// records it for [`boost_service`].
    pub fn lower_this_thread(self) {
        let resolved = self.resolved();
        // Only ever lower: a thread at a better value than asked keeps it, a worse one too.
        if resolved.nice > own_nice() || resolved.idle {
            resolved.apply_to_self();
            let mut threads = lock(&RUNTIME);
            threads.lowered = Some(resolved);
            // SAFETY: gettid has no preconditions.
            threads.tids.push(unsafe { libc::gettid() });
            if threads.boosts > 0 {
                set_thread(0, boosted());
            }
        }
    }

    /// Forgets the calling thread (for the runtime's `on_thread_stop`).
    pub fn forget_this_thread() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        lock(&RUNTIME).tids.retain(|t| *t != me);
    }
}

/// The runtime threads [`ServiceThreads::lower_this_thread`] lowered, and the pending boosts.
#[derive(Default)]
struct RuntimeThreads {
    tids: Vec<i32>,
    lowered: Option<Resolved>,
    boosts: usize,
}

static RUNTIME: std::sync::Mutex<RuntimeThreads> = std::sync::Mutex::new(RuntimeThreads {
    tids: Vec::new(),
    lowered: None,
    boosts: 0,
});

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a boosted thread or process runs at: the normal class at the service's starting nice.
fn boosted() -> Resolved {
    Resolved {
        nice: base_nice(),
        idle: false,
    }
}

/// Sets the nice value and the class (normal or `SCHED_IDLE`) of thread `tid` (0: the calling
/// thread). Errors (a thread gone, no privilege) are ignored.
fn set_thread(tid: i32, at: Resolved) {
    let policy = if at.idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain system calls; `param` outlives the call; a stale id yields ESRCH.
    unsafe {
        // The class first: raising the nice value of a SCHED_IDLE thread is refused otherwise.
        libc::sched_setscheduler(tid, policy, &param);
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, at.nice);
    }
}

/// Sets every thread of `process` to `at` (its class and nice value), while it is the process
/// that was recorded.
fn set_process(process: ProcessId, at: Resolved) {
    // The pid may have been reused since the process was recorded (a Python worker forked and
    // reaped by its fork server): only the process started at the recorded time is changed,
    // checked again right before each thread (issue 59).
    if !process.is_alive() {
        return;
    }
    let pid = process.pid;
    let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for tid in tids {
        if !process.is_alive() {
            return;
        }
        set_thread(tid, at);
    }
}

/// A process as long as it lives: its pid and its start time (clock ticks after boot,
/// `/proc/PID/stat`'s 22nd field). Another process given the same pid later has another start
/// time, so a boost never reaches an unrelated process through a reused pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcessId {
    pid: u32,
    started: u64,
}

impl ProcessId {
    /// The process `pid` is now (`None`: it is gone).
    pub(crate) fn of(pid: u32) -> Option<Self> {
        Some(Self {
            pid,
            started: start_time(pid)?,
        })
    }

    /// Whether the process still runs under its pid (not another one given the same pid).
    fn is_alive(&self) -> bool {
        start_time(self.pid) == Some(self.started)
    }
}

/// `pid`'s start time from `/proc/PID/stat` (`None`: no such process).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses: the
    // fields after its last `)` start at the 3rd, so the 22nd is the 20th of them.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether this process may take a thread out of `SCHED_IDLE` again (`CAP_SYS_NICE`, or a
/// `RLIMIT_NICE` that allows it): tried once on a scratch thread.
pub(crate) fn can_raise() -> bool {
    static CAN: OnceLock<bool> = OnceLock::new();
    *CAN.get_or_init(|| {
        std::thread::spawn(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: plain system calls on the calling (scratch) thread.
            unsafe {
                libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0
                    && libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) == 0
            }
        })
        .join()
        .unwrap_or(false)
    })
}

/// The default class of hook processes and of the service's threads: `SCHED_IDLE` where the
/// service can raise the work a decision waits for ([`can_raise`]), else the normal class.
pub(crate) fn default_sched() -> Sched {
    if can_raise() {
        Sched::Idle
    } else {
        Sched::Normal
    }
}

/// Raises the service's runtime threads while the returned guard lives (a collect is pending);
/// `None` when they are not lowered to `SCHED_IDLE` or cannot be raised.
pub(crate) fn boost_service() -> Option<ServiceBoost> {
    let mut threads = lock(&RUNTIME);
    if !threads.lowered.is_some_and(|r| r.idle) || !can_raise() {
        return None;
    }
    threads.boosts += 1;
    if threads.boosts == 1 {
        let at = boosted();
        for tid in &threads.tids {
            set_thread(*tid, at);
        }
    }
    Some(ServiceBoost(()))
}

/// See [`boost_service`]: the last one dropped lowers the runtime threads again.
#[derive(Debug)]
pub(crate) struct ServiceBoost(());

impl Drop for ServiceBoost {
    fn drop(&mut self) {
        let mut threads = lock(&RUNTIME);
        threads.boosts = threads.boosts.saturating_sub(1);
        if threads.boosts == 0
            && let Some(at) = threads.lowered
        {
            for tid in &threads.tids {
                set_thread(*tid, at);
            }
        }
    }
}

/// How long a new connection keeps the service raised ([`watch_connections`]): enough to
/// accept it and read its request, after which a collect holds its own boost.
const CONNECT_HOLD: std::time::Duration = std::time::Duration::from_millis(250);

/// Watches the listening socket `fd` from a thread in the normal class: each new connection
/// raises the service's runtime threads ([`boost_service`]) for [`CONNECT_HOLD`], so that a
/// collect on a new connection (the Python client's, `emit --collect`) is accepted and read at
/// once on a busy CPU instead of after the runtime's SCHED_IDLE threads get a turn. Event
/// batches come on kept-alive connections and are not affected. `None` when the runtime
/// threads are not idle or cannot be raised. The watch ends when the guard is dropped (before
/// the listener is closed).
pub(crate) fn watch_connections(fd: std::os::fd::RawFd) -> Option<ConnectionWatch> {
    {
        let threads = lock(&RUNTIME);
        if !threads.lowered.is_some_and(|r| r.idle) {
            tracing::debug!("no connection watch: the service's threads do not run SCHED_IDLE");
            return None;
        }
        if !can_raise() {
            tracing::info!(
                "no connection watch: the service may not raise its threads out of SCHED_IDLE (no CAP_SYS_NICE)"
            );
            return None;
        }
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let started = spawn_at_base(move || {
        std::thread::Builder::new()
            .name("hermes-accept-watch".into())
            .spawn(move || watch_loop(fd, &flag))
    });
    match started {
        Ok(_) => Some(ConnectionWatch(stop)),
        Err(e) => {
            tracing::warn!(
                "no connection watch thread ({e}): a collect on a busy CPU waits for the service's idle threads"
            );
            None
        }
    }
}

/// Longest the service stays raised for connections that keep waiting unaccepted (a flood, or
/// runtime threads that do not accept): then it goes back until the backlog is seen empty once
/// (issue 47: the boost was held for as long as connections waited).
const CONNECT_HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(2);

fn watch_loop(fd: std::os::fd::RawFd, stop: &std::sync::atomic::AtomicBool) {
    use std::sync::atomic::Ordering;
    let mut held: Option<(ServiceBoost, std::time::Instant)> = None;
    // Since when the backlog has not been seen empty, and whether the hold ran out meanwhile.
    let mut pending_since: Option<std::time::Instant> = None;
    let mut spent = false;
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // Pending connections keep the socket readable until accepted: while raised, look
        // again every few ms instead of spinning; otherwise wake for the stop flag now and then.
        let wait = if held.is_some() { 5 } else { 200 };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, wait) };
        let pending = n > 0 && pfd.revents & libc::POLLIN != 0;
        if n > 0 && pfd.revents & (libc::POLLNVAL | libc::POLLERR) != 0 {
            break; // the listener is gone
        }
        let now = std::time::Instant::now();
        if !pending {
            pending_since = None;
            spent = false;
        } else if now.duration_since(*pending_since.get_or_insert(now)) >= CONNECT_HOLD_MAX {
            if !spent {
                tracing::debug!(
                    "connections wait unaccepted for {CONNECT_HOLD_MAX:?}: the service goes back to its priority"
                );
            }
            spent = true;
            held = None;
        }
        if pending && !spent {
            match &mut held {
                Some((_, until)) => *until = now + CONNECT_HOLD,
                None => held = boost_service().map(|b| (b, now + CONNECT_HOLD)),
            }
            if held.is_some() {
                std::thread::sleep(std::time::Duration::from_millis(2)); // the runtime accepts
            }
        } else if spent {
            // Raised no more until the backlog is seen empty; poll at the slow pace.
            std::thread::sleep(std::time::Duration::from_millis(50));
        } else if held.as_ref().is_some_and(|(_, until)| now >= *until) {
            held = None;
        }
    }
}

/// See [`watch_connections`]: dropping it ends the watch (within 200 ms).
#[derive(Debug)]
pub(crate) struct ConnectionWatch(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for ConnectionWatch {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A hook's processes and whether a collect waits for them: while one does, they run in the
/// normal class (`boosted`), and a process started meanwhile is raised as it starts. One cell
/// is shared by every version of a hook (a collect that waits across a reload raises the new
/// version's process too) and holds every process the hook runs: a Python worker, each running
/// executable (issue 47).
#[derive(Debug, Default)]
pub struct BoostCell {
    state: std::sync::Mutex<CellState>,
}

#[derive(Debug, Default)]
struct CellState {
    boosts: usize,
    /// The running processes and the priority each was started with, by entry id.
    processes: Vec<(u64, ProcessId, Resolved)>,
    next_id: u64,
}

impl BoostCell {
    /// Records a (new) process of the hook and its own priority until the returned entry is
    /// dropped (when the process is gone); raised at once when boosted.
    pub(crate) fn add_process(self: &std::sync::Arc<Self>, pid: u32, at: Resolved) -> BoostEntry {
        let mut st = lock(&self.state);
        st.next_id += 1;
        let id = st.next_id;
        // A process gone already is not recorded: nothing of it is left to raise.
        if let Some(process) = ProcessId::of(pid) {
            st.processes.push((id, process, at));
            if st.boosts > 0 && at.idle {
                set_process(process, boosted());
            }
        }
        BoostEntry(self.clone(), id)
    }

    /// Whether a collect waits for this hook (a process started now should be raised).
    pub fn boosted(&self) -> bool {
        lock(&self.state).boosts > 0 && can_raise()
    }

    /// Raises the hook's processes until the returned guard is dropped; `None` when the service
    /// cannot raise a process.
    pub(crate) fn boost(self: &std::sync::Arc<Self>) -> Option<ProcessBoost> {
        if !can_raise() {
            return None;
        }
        let mut st = lock(&self.state);
        st.boosts += 1;
        if st.boosts == 1 {
            for (_, process, at) in &st.processes {
                if at.idle {
                    set_process(*process, boosted());
                }
            }
        }
        Some(ProcessBoost(self.clone()))
    }
}

/// See [`BoostCell::add_process`]: dropping it forgets the process.
#[derive(Debug)]
pub(crate) struct BoostEntry(std::sync::Arc<BoostCell>, u64);

impl Drop for BoostEntry {
    fn drop(&mut self) {
        lock(&self.0.state)
            .processes
            .retain(|(id, _, _)| *id != self.1);
    }
}

/// See [`BoostCell::boost`]: the last one dropped lowers the processes again.
#[derive(Debug)]
pub(crate) struct ProcessBoost(std::sync::Arc<BoostCell>);

impl Drop for ProcessBoost {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        st.boosts = st.boosts.saturating_sub(1);
        if st.boosts == 0 {
            for (_, process, at) in &st.processes {
                if at.idle {
                    set_process(*process, *at);
                }
            }
        }
    }
}

/// The priority a hook process starts at: `at`, or the boosted one while a collect waits for
/// the hook (`boosted`).
pub(crate) fn starting(at: Resolved, boosted_now: bool) -> Resolved {
    if boosted_now && at.idle {
        boosted()
    } else {
        at
    }
}

/// Runs `job` (spawning a child process) on the spawner thread, which has the service's starting
/// priority, and returns its result; the caller waits for it as it would for the spawn itself.
/// Without a spawner (commands other than `serve`, the library in tests) it runs here. For
/// synchronous callers (blocking threads); async code uses [`spawn_at_base_async`].
pub(crate) fn spawn_at_base<T: Send + 'static>(
    job: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    if SPAWNER.get().is_none() {
        return job();
    }
    let (tx, rx) = mpsc::sync_channel(1);
    submit(Box::new(move || {
        let _ = tx.send(job());
    }));
    rx.recv().unwrap_or_else(|_| Err(spawner_gone()))
}

/// [`spawn_at_base`] for async code: the task waits for the spawner thread, its runtime thread
/// goes on with other tasks meanwhile. Without a spawner the job runs on a blocking thread (it
/// may check files before it spawns).
pub(crate) async fn spawn_at_base_async<T: Send + 'static>(
    job: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    if SPAWNER.get().is_none() {
        return tokio::task::spawn_blocking(job)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(format!("the spawn failed: {e}"))));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    submit(Box::new(move || {
        let _ = tx.send(job());
    }));
    rx.await.unwrap_or_else(|_| Err(spawner_gone()))
}

/// Runs `job` (starting threads, nothing else: it must never wait on a hook's files) on a
/// thread with the service's starting priority, so that the threads it starts have it too; on
/// a blocking thread when the service has none (commands other than `serve`, tests).
pub(crate) async fn thread_at_base<T: Send + 'static>(
    job: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let Some(maker) = THREAD_MAKER.get() else {
        return spawn_at_base_async(job).await;
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sent = maker
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(Box::new(move || {
            let _ = tx.send(job());
        }));
    if sent.is_err() {
        return Err(spawner_gone());
    }
    rx.await.unwrap_or_else(|_| Err(spawner_gone()))
}

/// Hands `job` to the spawner thread; runs it here, at this thread's priority, when there is
/// none or it is gone.
fn submit(job: Job) {
    let Some(spawner) = SPAWNER.get() else {
        return job();
    };
    let sent = spawner.lock().unwrap_or_else(|e| e.into_inner()).send(job);
    if let Err(mpsc::SendError(job)) = sent {
        job();
    }
}

fn spawner_gone() -> std::io::Error {
    std::io::Error::other("the spawner thread is gone")
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
    #[test]
    fn a_process_is_named_by_its_pid_and_start_time() {
        let me = super::ProcessId::of(std::process::id()).expect("this process");
        assert!(me.is_alive());
        let reused = super::ProcessId {
            started: me.started + 1,
            ..me
        };
        assert!(!reused.is_alive(), "another start time is another process");
    }

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
