//! The Python fork server: one pre-started interpreter per `python` (the "zygote", `runner.py
//! --zygote`) that has imported what every worker needs and frozen its heap (`gc.freeze()`), so a
//! hook's worker is a `fork()` of it instead of a fresh interpreter: a few MB of private memory and a
//! few ms of start-up.
//!
//! This file owns the host's side: starting a zygote per interpreter (and again after it died),
//! asking it for a worker, receiving the worker's pipes and pidfd (SCM_RIGHTS over a
//! SOCK_SEQPACKET socket pair), and the exit statuses the zygote reports when it reaps a worker.
//! The zygote is the worker's parent and reaps it; the host watches the worker through its pidfd
//! and kills its process group, so the worker needs nothing from the zygote after the fork: a dead
//! zygote is only restarted for the next worker.
//!
//! Everything here runs on plain threads and runtime-agnostic channels: one pool serves every
//! host (and every tokio runtime) of the process.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use crate::priority::Resolved;

/// Time a zygote gets to import and say it is ready.
const ZYGOTE_START_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a fork request may take.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest control message.
const MAX_MESSAGE: usize = 64 * 1024;
/// Exit statuses kept for workers nobody asked about yet (bounded).
const MAX_EXITS: usize = 4096;
/// Environment variable that turns forking off (`0`, `off`, `false`, `no`).
pub const FORK_ENV: &str = "HERMES_HOOKS_FORK";

/// Where Python keeps bytecode caches: given to every interpreter the service starts (the runner
/// sets `sys.pycache_prefix` from it after its own imports), so none reads (or writes) a hook's
/// own `__pycache__`.
pub const PYCACHE_ENV: &str = "HERMES_HOOKS_PYCACHE";

/// The CPU priority a fork server lowers itself to once it is ready: `"NICE IDLE"` (absolute
/// nice value, `1` for `SCHED_IDLE`); read and removed from its environment by runner.py.
const PRIORITY_ENV: &str = "HERMES_HOOKS_FORK_SERVER_PRIORITY";

/// The bytecode cache of the interpreters started with `runner`: beside it, owned by the service.
pub fn pycache_dir(runner: &Path) -> PathBuf {
    runner.parent().unwrap_or(Path::new("/")).join("pycache")
}

/// A worker forked by a zygote: its pipes, pid and pidfd.
pub struct Forked {
    /// Worker pid (also its process group id).
    pub pid: i32,
    /// Write end of the worker's stdin.
    pub stdin: OwnedFd,
    /// Read end of the worker's stdout (the protocol).
    pub stdout: OwnedFd,
    /// Read end of the worker's stderr (its log).
    pub stderr: OwnedFd,
    /// Becomes readable when the worker exits.
    pub pidfd: OwnedFd,
    /// Where the zygote reports the worker's exit status.
    pub zygote: Arc<Zygote>,
}

/// Whether workers are forked at all (`HERMES_HOOKS_FORK=0` starts each from scratch).
pub fn fork_enabled() -> bool {
    !matches!(
        std::env::var(FORK_ENV)
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
            .as_str(),
        "0" | "off" | "false" | "no"
    )
}

/// Why a hook's worker cannot be forked from the shared zygote, if it cannot: variables read only
/// at interpreter start (`PYTHON*`, `LD_*`) in its `env:`.
pub fn needs_fresh_process(
    hook_env: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    let startup: Vec<&str> = hook_env
        .keys()
        .filter(|k| k.starts_with("PYTHON") || k.starts_with("LD_"))
        .map(String::as_str)
        .collect();
    (!startup.is_empty()).then(|| {
        format!(
            "env sets {} (read only when an interpreter starts)",
            startup.join(", ")
        )
    })
}

/// A running fork server for one interpreter.
pub struct Zygote {
    python: String,
    pid: u32,
    ctl: OwnedFd,
    next_id: AtomicU64,
    /// The control socket reached EOF: no more workers or exit reports from this one.
    dead: AtomicBool,
    /// Its process has been reaped.
    reaped: AtomicBool,
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<Forked, String>>>>,
    exits: Mutex<HashMap<i32, i32>>,
    exit_notify: Notify,
    /// The confined fork server's interpreter directories (its ready message), which every
    /// confined worker may read: part of the ruleset the service builds for it.
    dirs: std::sync::OnceLock<Vec<PathBuf>>,
}

impl std::fmt::Debug for Zygote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zygote")
            .field("python", &self.python)
            .field("pid", &self.pid)
            .finish()
    }
}

/// The zygotes of this process, one per interpreter.
fn pool() -> &'static Mutex<HashMap<String, Arc<Zygote>>> {
    static POOL: OnceLock<Mutex<HashMap<String, Arc<Zygote>>>> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

/// Serialises the start-ups of one fork server (many hooks loading at once share one); each
/// fork server has its own, so the confined one starts beside the default one instead of after
/// it (issue 46's start-up cost), and an interpreter whose files stall holds up only its own.
fn start_lock(key: &str) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(key.to_string())
        .or_default()
        .clone()
}

/// The fork servers whose process start has not returned yet (its interpreter's files stall):
/// no second start of the same one is tried meanwhile, so each holds at most one thread.
fn spawning() -> &'static Mutex<std::collections::HashSet<String>> {
    static SPAWNING: OnceLock<Mutex<std::collections::HashSet<String>>> = OnceLock::new();
    SPAWNING.get_or_init(Default::default)
}

/// Pid of the live zygote for `python`, if one runs (tests and `list`).
pub fn zygote_pid(python: &str) -> Option<u32> {
    pool()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(python)
        .filter(|z| !z.dead.load(Ordering::SeqCst))
        .map(|z| z.pid)
}

/// The CPU priorities of a fork: the worker's, and the fork server's should it need starting.
#[derive(Debug, Clone, Copy)]
pub struct Priorities {
    /// Set in the worker right after the fork (never above the fork server's).
    pub worker: Resolved,
    /// A fork server started for this request runs at this one.
    pub fork_server: Resolved,
}

/// Forks a worker for one hook from the zygote of `python` (started, or restarted, on demand).
// Every argument is one field of the fork request (see runner.py's zygote protocol).
#[allow(clippy::too_many_arguments)]
pub async fn fork_worker(
    python: &str,
    runner: &Path,
    dir: &Path,
    cwd: &Path,
    handler: &Path,
    name: &str,
    env: &std::collections::BTreeMap<String, String>,
    priorities: Priorities,
    sandbox: Option<&Arc<crate::sandbox::Policy>>,
) -> Result<Forked, String> {
    // The hook's part of the ruleset is built while the fork server starts (a first load waits
    // for it anyway), its interpreter's directories added once it said them.
    let hook_part = sandbox.and_then(hook_ruleset);
    let zygote = get_or_start(python, runner, priorities.fork_server, sandbox.is_some()).await?;
    let ruleset = match hook_part {
        Some(part) => with_interpreter_dirs(part, &zygote, name).await,
        None => None,
    };
    let id = zygote.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    zygote
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, tx);
    let request = json!({
        "spawn": id,
        "dir": dir,
        "cwd": cwd,
        "handler": handler,
        "name": name,
        "env": env,
        "nice": priorities.worker.nice,
        "idle": priorities.worker.idle,
    });
    let ruleset_fd = ruleset.as_ref().map(|r| r.raw());
    let sent = send_packet(&zygote.ctl, request.to_string().as_bytes(), ruleset_fd).await;
    drop(ruleset); // the fork server holds its own copy now
    if let Err(e) = sent {
        zygote
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        return Err(format!("cannot reach the fork server: {e}"));
    }
    match tokio::time::timeout(SPAWN_TIMEOUT, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err("the fork server exited".into()),
        Err(_) => {
            zygote
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            Err(format!(
                "the fork server did not answer within {SPAWN_TIMEOUT:?}"
            ))
        }
    }
}

/// Stops every fork server of the process (end of `serve`): each gets EOF, waits briefly for its
/// workers (killed or closing by now), reaps them and exits; returns when all are gone or after
/// `wait`.
pub async fn shutdown_all(wait: Duration) {
    let all: Vec<Arc<Zygote>> = pool()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .map(|(_, z)| z)
        .collect();
    let deadline = tokio::time::Instant::now() + wait;
    for z in all {
        // SAFETY: shutdown(2) on a socket this process owns; the fd stays open until dropped.
        unsafe {
            libc::shutdown(z.ctl.as_raw_fd(), libc::SHUT_RDWR);
        }
        loop {
            let notified = z.exit_notify.notified();
            if z.reaped.load(Ordering::SeqCst) {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!(python = %z.python, pid = z.pid, "python fork server did not exit in time; killed");
                kill_pid(z.pid);
                break;
            }
        }
    }
}

/// The pool's key of the fork server of `python` (confined or not).
fn pool_key(python: &str, confined: bool) -> String {
    if confined {
        format!("{python}\0confined")
    } else {
        python.to_string()
    }
}

/// Starts the fork server of `python` ahead of any request (the service does at start, while it
/// arms its watch and scans the roots, instead of after); a no-op when it runs already.
pub(crate) async fn prestart(
    python: &str,
    runner: &Path,
    priority: Resolved,
    confined: bool,
) -> Result<(), String> {
    get_or_start(python, runner, priority, confined)
        .await
        .map(|_| ())
}

/// Where the start of a fork server that is not ready yet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Starting {
    /// Its process is being started.
    Spawning,
    /// Its process is being started, and [`stop_unneeded`] asked to stop it.
    Unwanted,
    /// Its process runs (this pid) and imports.
    Running(u32),
}

/// The fork servers started but not ready yet, by pool key.
fn not_ready() -> &'static Mutex<HashMap<String, Starting>> {
    static NOT_READY: OnceLock<Mutex<HashMap<String, Starting>>> = OnceLock::new();
    NOT_READY.get_or_init(Default::default)
}

/// Fork servers killed on purpose ([`stop_unneeded`]): their exit is no warning.
fn stopped_on_purpose() -> &'static Mutex<std::collections::HashSet<u32>> {
    static STOPPED: OnceLock<Mutex<std::collections::HashSet<u32>>> = OnceLock::new();
    STOPPED.get_or_init(Default::default)
}

fn lock_map<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stops the fork server of `python` started ahead when the first scan found no hook that needs
/// it, even while it is still starting (it would take a CPU from the fork server the hooks do
/// need: issue 46's start-up of strict hooks); else as [`stop_if_unused`]. The caller holds
/// the reload lock: no worker is asked of it meanwhile.
pub(crate) fn stop_unneeded(python: &str, confined: bool) {
    let key = pool_key(python, confined);
    {
        let mut starting = lock_map(not_ready());
        match starting.get(&key).copied() {
            Some(Starting::Running(pid)) => {
                starting.remove(&key);
                tracing::debug!(
                    python,
                    pid,
                    "python fork server started ahead and not needed by any hook: stopped"
                );
                lock_map(stopped_on_purpose()).insert(pid);
                kill_pid(pid);
                return;
            }
            Some(Starting::Spawning | Starting::Unwanted) => {
                // Stopped as soon as its process runs (`get_or_start`).
                starting.insert(key, Starting::Unwanted);
                return;
            }
            None => {}
        }
    }
    stop_if_unused(python, confined);
}

/// Stops the fork server of `python` when it never forked a worker (it was started ahead and no
/// hook turned out to need it); returns whether it did. The caller makes sure no fork request
/// can start meanwhile (the host holds its reload lock).
pub(crate) fn stop_if_unused(python: &str, confined: bool) -> bool {
    let key = pool_key(python, confined);
    let mut pool = pool().lock().unwrap_or_else(|p| p.into_inner());
    let unused = pool
        .get(&key)
        .is_some_and(|z| z.next_id.load(Ordering::SeqCst) == 1);
    if !unused {
        return false;
    }
    if let Some(z) = pool.remove(&key) {
        // EOF on its socket: it exits, and its reader thread reaps it.
        // SAFETY: shutdown(2) on a socket this process owns; the fd stays open until dropped.
        unsafe {
            libc::shutdown(z.ctl.as_raw_fd(), libc::SHUT_RDWR);
        }
        tracing::debug!(
            python,
            pid = z.pid,
            "python fork server started ahead and unused: stopped"
        );
    }
    true
}

/// The fork server of `python`; with `confined`, the one that forks confined hooks' workers: it
/// starts with only the variables every sandbox allows, so no worker forked from it holds the
/// service's other variables anywhere in its memory.
async fn get_or_start(
    python: &str,
    runner: &Path,
    priority: Resolved,
    confined: bool,
) -> Result<Arc<Zygote>, String> {
    let key = pool_key(python, confined);
    let key = key.as_str();
    let live = |p: &str| {
        pool()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(p)
            .filter(|z| !z.dead.load(Ordering::SeqCst))
            .cloned()
    };
    if let Some(z) = live(key) {
        return Ok(z);
    }
    let lock = start_lock(key);
    let _guard = lock.lock().await;
    if let Some(z) = live(key) {
        return Ok(z);
    }
    let (ready_tx, ready_rx) = oneshot::channel();
    lock_map(not_ready()).insert(key.to_string(), Starting::Spawning);
    let started = start_on_own_thread(key, python, runner, priority, confined, ready_tx).await;
    let zygote = {
        let mut starting = lock_map(not_ready());
        let unwanted = starting.get(key) == Some(&Starting::Unwanted);
        match started {
            Ok(z) if unwanted => {
                starting.remove(key);
                lock_map(stopped_on_purpose()).insert(z.pid);
                kill_pid(z.pid);
                tracing::debug!(
                    python,
                    pid = z.pid,
                    "python fork server started ahead and not needed by any hook: stopped"
                );
                return Err("stopped: no hook needs it".into());
            }
            Ok(z) => {
                starting.insert(key.to_string(), Starting::Running(z.pid));
                z
            }
            Err(e) => {
                starting.remove(key);
                return Err(e);
            }
        }
    };
    let ready = tokio::time::timeout(ZYGOTE_START_TIMEOUT, ready_rx).await;
    lock_map(not_ready()).remove(key);
    match ready {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            return Err(format!(
                "the fork server for {python:?} exited before it was ready; its stderr is in the log"
            ));
        }
        Err(_) => {
            kill_pid(zygote.pid);
            return Err(format!(
                "the fork server for {python:?} was not ready within {ZYGOTE_START_TIMEOUT:?}"
            ));
        }
    }
    tracing::info!(python, pid = zygote.pid, "python fork server started");
    pool()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.to_string(), zygote.clone());
    Ok(zygote)
}

/// [`start`] on a thread of its own, made by the service's thread maker (so it has the
/// service's starting priority, which the fork server inherits), not on the spawner thread every
/// hook shares: an interpreter on a file system that stalls (a `python:` inside a hook's tree)
/// blocks its own start only, which is given up after [`ZYGOTE_START_TIMEOUT`] (issue 47).
async fn start_on_own_thread(
    key: &str,
    python: &str,
    runner: &Path,
    priority: Resolved,
    confined: bool,
    ready: oneshot::Sender<()>,
) -> Result<Arc<Zygote>, String> {
    if !spawning()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.to_string())
    {
        return Err(format!(
            "the last start of the fork server for {python:?} has not returned (its files do not answer?)"
        ));
    }
    let (python_owned, runner, key_owned) =
        (python.to_string(), runner.to_path_buf(), key.to_string());
    let (tx, rx) = oneshot::channel();
    let made = crate::priority::thread_at_base(move || {
        std::thread::Builder::new()
            .name("hermes-fork-start".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let started = start(&python_owned, &runner, priority, confined, ready);
                spawning()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key_owned);
                if let Err(Ok(z)) = tx.send(started) {
                    // Nobody waits any more: stop it (EOF on its socket; its reader reaps it).
                    // SAFETY: shutdown(2) on a socket this process owns.
                    unsafe {
                        libc::shutdown(z.ctl.as_raw_fd(), libc::SHUT_RDWR);
                    }
                }
            })
            .map(|_| ())
    })
    .await;
    if let Err(e) = made {
        spawning()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        return Err(format!(
            "cannot start a thread to start the fork server: {e}"
        ));
    }
    match tokio::time::timeout(ZYGOTE_START_TIMEOUT, rx).await {
        Ok(Ok(started)) => started,
        Ok(Err(_)) => Err("starting the fork server failed: its thread ended".into()),
        Err(_) => Err(format!(
            "the fork server for {python:?} did not start within {ZYGOTE_START_TIMEOUT:?} (its files do not answer?)"
        )),
    }
}

fn kill_pid(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Starts a zygote (blocking: fork/exec and socket set-up) and its reader thread.
fn start(
    python: &str,
    runner: &Path,
    priority: Resolved,
    confined: bool,
    ready: oneshot::Sender<()>,
) -> Result<Arc<Zygote>, String> {
    let (host_end, child_end) =
        seqpacket_pair().map_err(|e| format!("cannot create the fork server's socket: {e}"))?;
    let mut cmd = std::process::Command::new(python);
    if confined {
        cmd.env_clear()
            .envs(std::env::vars().filter(|(k, _)| crate::sandbox::policy::always_seen(k)));
    }
    for secret in crate::sandbox::policy::service_secrets() {
        cmd.env_remove(secret);
    }
    // It imports and warms up at the spawner's priority (the service's own, as the new worker a
    // first load or a restart waits for does) and lowers itself to `priority` before it says it
    // is ready, so every worker it forks starts from there.
    cmd.env(PYCACHE_ENV, pycache_dir(runner))
        .env(
            PRIORITY_ENV,
            format!("{} {}", priority.nice, u8::from(priority.idle)),
        )
        // Isolated (`-I`) when confined: no PYTHON* variable, user site or working directory
        // decides what the interpreter imports before the sandbox holds.
        .args(confined.then_some("-I"))
        .arg("-u")
        .arg(runner)
        .arg("--zygote")
        .stdin(Stdio::from(child_end))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    if let Some(dir) = runner.parent() {
        cmd.current_dir(dir);
    }
    // On its own thread at the service's starting priority (`start_on_own_thread`).
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start Python interpreter {python:?}: {e}"))?;
    let zygote = Arc::new(Zygote {
        python: python.to_string(),
        pid: child.id(),
        ctl: host_end,
        next_id: AtomicU64::new(1),
        dead: AtomicBool::new(false),
        reaped: AtomicBool::new(false),
        pending: Mutex::new(HashMap::new()),
        exits: Mutex::new(HashMap::new()),
        exit_notify: Notify::new(),
        dirs: std::sync::OnceLock::new(),
    });
    if let Some(stderr) = child.stderr.take() {
        let python = python.to_string();
        let _ = std::thread::Builder::new()
            .name("zygote-stderr".into())
            .spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    tracing::warn!(target: "hook", zygote = %python, "{line}");
                }
            });
    }
    let z = zygote.clone();
    std::thread::Builder::new()
        .name("zygote-reader".into())
        .spawn(move || {
            read_loop(&z, Some(ready));
            z.dead.store(true, Ordering::SeqCst);
            z.exit_notify.notify_waiters();
            let pending: Vec<_> = z
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain()
                .collect();
            drop(pending);
            // The socket closes when the zygote exits (or is shut down): reap it, then say so.
            let status = child.wait();
            z.reaped.store(true, Ordering::SeqCst);
            z.exit_notify.notify_waiters();
            let meant = lock_map(stopped_on_purpose()).remove(&z.pid);
            match status {
                Ok(_) if meant => tracing::debug!(python = %z.python, pid = z.pid, "python fork server stopped"),
                Ok(s) if s.success() => tracing::info!(python = %z.python, pid = z.pid, "python fork server exited"),
                Ok(s) => tracing::warn!(python = %z.python, pid = z.pid, "python fork server exited ({s}); the next worker starts a new one"),
                Err(e) => tracing::warn!(python = %z.python, pid = z.pid, "python fork server: cannot collect its exit status: {e}"),
            }
        })
        .map_err(|e| format!("cannot start the fork server's reader thread: {e}"))?;
    Ok(zygote)
}

/// Reads the zygote's messages until EOF: ready, spawned workers (with their fds), exits.
fn read_loop(z: &Arc<Zygote>, mut ready: Option<oneshot::Sender<()>>) {
    loop {
        let (data, fds) = match recv_packet(z.ctl.as_raw_fd()) {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(python = %z.python, "reading from the fork server failed: {e}");
                return;
            }
        };
        let Ok(msg) = serde_json::from_slice::<Value>(&data) else {
            tracing::warn!(python = %z.python, "the fork server sent an unreadable message");
            continue;
        };
        if msg.get("zygote").is_some() {
            if let Some(dirs) = msg.get("dirs").and_then(Value::as_array) {
                let dirs = dirs.iter().filter_map(Value::as_str).map(PathBuf::from);
                let _ = z.dirs.set(dirs.collect());
            }
            if let Some(tx) = ready.take() {
                let _ = tx.send(());
            }
        } else if let Some(id) = msg.get("spawned").and_then(Value::as_u64) {
            let tx = z
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            let result = match (msg.get("error").and_then(Value::as_str), fds.len()) {
                (Some(e), _) => Err(format!("the fork server could not start the worker: {e}")),
                (None, 4) => {
                    let pid = msg
                        .get("pid")
                        .and_then(Value::as_i64)
                        .and_then(|p| i32::try_from(p).ok())
                        .unwrap_or(0);
                    let mut it = fds.into_iter();
                    match (it.next(), it.next(), it.next(), it.next()) {
                        (Some(stdin), Some(stdout), Some(stderr), Some(pidfd)) if pid > 0 => {
                            Ok(Forked {
                                pid,
                                stdin,
                                stdout,
                                stderr,
                                pidfd,
                                zygote: z.clone(),
                            })
                        }
                        _ => Err("the fork server sent an incomplete answer".into()),
                    }
                }
                (None, n) => Err(format!("the fork server sent {n} descriptors instead of 4")),
            };
            match (tx, result) {
                (Some(tx), r) => {
                    if let Err(Ok(forked)) = tx.send(r) {
                        // Nobody waits any more (the request timed out): do not leave it running.
                        // SAFETY: killpg has no memory-safety preconditions.
                        unsafe {
                            libc::killpg(forked.pid, libc::SIGKILL);
                        }
                    }
                }
                (None, Ok(forked)) => unsafe {
                    // SAFETY: as above.
                    libc::killpg(forked.pid, libc::SIGKILL);
                },
                (None, Err(_)) => {}
            }
        } else if let Some(pid) = msg
            .get("exited")
            .and_then(Value::as_i64)
            .and_then(|p| i32::try_from(p).ok())
        {
            let code = msg
                .get("code")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(i32::MIN);
            let mut exits = z.exits.lock().unwrap_or_else(|p| p.into_inner());
            if exits.len() >= MAX_EXITS {
                exits.clear();
            }
            exits.insert(pid, code);
            drop(exits);
            z.exit_notify.notify_waiters();
        }
    }
}

impl Zygote {
    /// The exit code the zygote reported for `pid` (negative: killed by that signal), waiting
    /// up to `wait` for the report; `None` when it does not come (the zygote is gone).
    pub async fn exit_code(&self, pid: i32, wait: Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.exit_notify.notified();
            if let Some(code) = self
                .exits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&pid)
            {
                return Some(code);
            }
            if self.dead.load(Ordering::SeqCst) {
                return None;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

/// A connected AF_UNIX SOCK_SEQPACKET pair, close-on-exec (std gives the child its end as fd 0).
fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A ruleset being built on a blocking thread, and the rights of a read-only grant in it.
type Building = tokio::task::JoinHandle<std::io::Result<(crate::sandbox::landlock::Ruleset, u64)>>;

/// The Landlock ruleset of a confined worker is built by the service (issue 46: building it in
/// every worker, after the fork, took ~0.35 ms of each confined worker's start): first the
/// hook's rules, each grant opened without following a link as the runner would (`None` without
/// Landlock: the runner says what it enforces instead)...
fn hook_ruleset(policy: &Arc<crate::sandbox::Policy>) -> Option<Building> {
    use crate::sandbox::landlock;
    let abi = landlock::abi();
    if abi <= 0 {
        return None;
    }
    let policy = policy.clone();
    Some(tokio::task::spawn_blocking(move || {
        let rules = policy.rules(abi, &[]);
        landlock::build(&rules).map(|r| (r, rules.read_rights))
    }))
}

/// ...then the fork server's interpreter directories, read-only. `None` (the runner builds the
/// ruleset itself and says why it cannot) when the fork server did not say its directories, or
/// building fails or takes longer than a second (a grant on a filesystem that does not answer).
async fn with_interpreter_dirs(
    part: Building,
    zygote: &Zygote,
    hook: &str,
) -> Option<crate::sandbox::landlock::Ruleset> {
    let dirs = zygote.dirs.get()?.clone();
    let finish = async {
        let (ruleset, read) = part
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || {
            let dirs: Vec<(PathBuf, u64)> = dirs.into_iter().map(|d| (d, read)).collect();
            crate::sandbox::landlock::add_paths(&ruleset, &dirs).map(|()| ruleset)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(1), finish).await {
        Ok(Ok(ruleset)) => Some(ruleset),
        Ok(Err(e)) => {
            tracing::debug!(hook, "the worker builds its own sandbox: {e}");
            None
        }
        Err(_) => {
            tracing::debug!(
                hook,
                "the worker builds its own sandbox: building it took over 1s"
            );
            None
        }
    }
}

/// Sends one packet, with `with_fd` as its one descriptor, without blocking the runtime (retries
/// briefly while the buffer is full).
async fn send_packet(fd: &OwnedFd, data: &[u8], with_fd: Option<RawFd>) -> std::io::Result<()> {
    loop {
        let e = match try_send(fd.as_raw_fd(), data, with_fd) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        match e.kind() {
            std::io::ErrorKind::WouldBlock => tokio::time::sleep(Duration::from_millis(1)).await,
            std::io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

/// One non-blocking `sendmsg` of `data` and `with_fd` (`SCM_RIGHTS`).
fn try_send(fd: RawFd, data: &[u8], with_fd: Option<RawFd>) -> std::io::Result<()> {
    // Room for one descriptor's control message.
    let mut cmsg = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // SAFETY: a zeroed msghdr is a valid empty header; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(passed) = with_fd {
        // SAFETY: `cmsg` has room for CMSG_SPACE(one descriptor) (24 of its 32 bytes), aligned
        // for cmsghdr; the libc macros compute the header and data positions.
        unsafe {
            let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), passed);
        }
    }
    // SAFETY: `msg` points at live buffers of the stated sizes.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n >= 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Receives one packet and the descriptors sent with it (blocking; the reader thread's job).
/// `None` at EOF.
fn recv_packet(fd: RawFd) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    // Room for up to 8 descriptors.
    let mut cmsg = [0u64; 16];
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: zeroed msghdr is a valid "empty" header; the pointers set below outlive the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cmsg) as _;
        // SAFETY: `msg` points at live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut fds = Vec::new();
        // SAFETY: walking the control messages the kernel filled in, with the libc macros.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for i in 0..len / std::mem::size_of::<RawFd>() {
                        let raw = std::ptr::read_unaligned(data.add(i));
                        fds.push(OwnedFd::from_raw_fd(raw));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        buf.truncate(n as usize);
        return Ok(Some((buf, fds)));
    }
}
