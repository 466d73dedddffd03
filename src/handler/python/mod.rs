//! Python handlers (`handler.py`): one persistent worker process per hook, running the embedded
//! `runner.py`, which imports the module once and calls `handle(event, context)` per request.
//!
//! A worker is forked from the interpreter's fork server ([`super::zygote`]) when it can be: a
//! hook whose `env:` sets variables read only at interpreter start (`PYTHON*`, `LD_*`), or a host
//! run with `HERMES_HOOKS_FORK=0`, gets a process started from scratch instead; a hook naming its
//! own `python:` gets that interpreter's fork server. `list` shows which and why.
//!
//! Protocol (one JSON object per line): the host says hello, the runner answers
//! `{"ready": true}` or `{"ready": false, "error": ...}`; then requests
//! `{"id", "event", "context"}` get answers `{"id", "ok", "result" | "error"}`. The runner keeps
//! the real stdout for the protocol, so `print` in a handler becomes a log line.
//!
//! Requests are pipelined: up to [`PIPELINE_DEPTH`] calls (and [`PIPELINE_BYTES`](protocol::PIPELINE_BYTES) of requests) are
//! written at once and their answers read as they come; once half are answered, more from the
//! hook's queue are written behind them (a sliding window: `window.rs`). The runner handles them one at a time, in
//! order, so the timeout of a call counts from the answer to the one before it, and when a worker
//! dies or is killed the calls after the one it was running are provably never started: they are
//! reported [`HandlerError::NotStarted`] and go back to the front of the queue (at most once).
//!
//! A worker that dies is restarted before the next event, after a backoff of 100 ms doubling to
//! 30 s (reset by a successful call); a worker that exceeds the timeout is killed and restarted
//! at once. Either way the module's state is lost, which is logged.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::Child;
use tokio::task::JoinHandle;

use self::zygote::{Forked, Zygote};
use crate::handler::api::{
    BoxFuture, Call, Feed, Handler, HandlerContext, HandlerError, HandlerResult, NoFeed, Report,
};
use crate::handler::process::{GroupKill, command, describe_exit, log_stderr, read_line_limited};
use crate::handler::retire::{Retire, pidfd_open};

mod protocol;
pub mod pylog;
mod window;
pub mod zygote;

pub use protocol::{Answer, PIPELINE_DEPTH, parse_answer, parse_handshake};

/// The runner, shipped inside the binary.
pub const RUNNER_SOURCE: &str = include_str!("runner.py");
/// Largest response line accepted from a worker.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;
/// Capacity of the answer buffer kept between answers (a larger one is freed).
const KEPT_LINE_CAPACITY: usize = 64 * 1024;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Time a worker gets to import its module, at least.
const MIN_START_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a worker gets to finish background tasks after stdin closes, before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Time allowed to read what a killed worker had already written.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(1);

type Writer = Box<dyn AsyncWrite + Send + Sync + Unpin>;
type Reader = Box<dyn AsyncRead + Send + Sync + Unpin>;

/// How a worker process is held: a child of ours, or a child of the fork server watched
/// through its pidfd.
enum Proc {
    Fresh(Child),
    Forked {
        pid: i32,
        pidfd: AsyncFd<OwnedFd>,
        zygote: Arc<Zygote>,
    },
}

/// A running worker process.
struct Worker {
    proc: Proc,
    /// `None` once closed to ask the runner to exit.
    stdin: Option<Writer>,
    stdout: BufReader<Reader>,
    group: GroupKill,
    stderr_task: JoinHandle<()>,
    /// How the process ended, once known (the fork server reports a status only once).
    exited: Option<String>,
    /// Tells it to start no further call once a newer version of the hook is ready.
    _retire: Retire,
    /// Its entry in the hook's boost cell (raised while a collect waits for the hook).
    _boost: Option<crate::priority::BoostEntry>,
}

impl Worker {
    /// The worker process's pid.
    fn pid(&self) -> Option<u32> {
        match &self.proc {
            Proc::Fresh(child) => child.id(),
            Proc::Forked { pid, .. } => u32::try_from(*pid).ok(),
        }
    }

    /// Waits up to `wait` for the process to end and says how it ended; `None` if it did not.
    async fn wait_exit(&mut self, wait: Duration) -> Option<String> {
        if let Some(how) = &self.exited {
            return Some(how.clone());
        }
        let how = match &mut self.proc {
            Proc::Fresh(child) => match tokio::time::timeout(wait, child.wait()).await {
                Ok(Ok(s)) => describe_exit(s),
                _ => return None,
            },
            Proc::Forked { pid, pidfd, zygote } => {
                let _ready = tokio::time::timeout(wait, pidfd.readable())
                    .await
                    .ok()?
                    .ok()?;
                match zygote.exit_code(*pid, Duration::from_secs(1)).await {
                    Some(code) => {
                        use std::os::unix::process::ExitStatusExt;
                        let raw = if code >= 0 { (code & 0xff) << 8 } else { -code };
                        describe_exit(std::process::ExitStatus::from_raw(raw))
                    }
                    None => "exit status unknown: its fork server is gone".into(),
                }
            }
        };
        self.exited = Some(how.clone());
        Some(how)
    }

    /// Ends a worker that refused to load or exited before it was ready: the runner exits by
    /// itself, and what it wrote to stderr before (the traceback, at debug level) is read to its
    /// end before the worker is killed, so no record of why is lost (at most about 3 s).
    async fn finish(mut self) -> Option<String> {
        let how = self.wait_exit(Duration::from_secs(2)).await;
        if how.is_some() {
            let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.stderr_task).await;
        }
        self.kill().await;
        how
    }

    async fn kill(mut self) {
        self.group.kill();
        if let Proc::Fresh(child) = &mut self.proc {
            let _ = child.start_kill();
        }
        let _ = self.wait_exit(Duration::from_secs(5)).await;
        self.group.disarm();
        self.stderr_task.abort();
    }
}

/// The Python handler of one hook.
pub struct PythonHandler {
    ctx: HandlerContext,
    runner: PathBuf,
    worker: Option<Worker>,
    next_id: u64,
    backoff: Duration,
    restart_at: Option<Instant>,
    /// How long a call takes here, averaged (ns): a fleet lease holder's calls are written
    /// ahead only as far as they will surely start within their bound ([`crate::start_gate`]).
    call_ns: u64,
    /// The worker refused a call past its start-by bound in this batch: nothing more is written
    /// (the refused calls go back to the queue's front, to be written again in order).
    expired: bool,
    /// The answer line being read, kept between answers so reading one allocates nothing.
    line: Vec<u8>,
}

/// The runner and the bytecode cache beside it are code: their directory is checked as a hook's
/// is (owned by the service user or root, writable by nobody else).
fn check_runner_dir(dir: &Path) -> Result<(), HandlerError> {
    match crate::trust::permission_problem(dir) {
        Some(reason) => Err(HandlerError::Load(format!(
            "the Python runner's directory is unsafe: {reason}"
        ))),
        None => Ok(()),
    }
}

/// Writes the runner into `dir` (once per content version) and returns its path.
pub async fn ensure_runner(dir: &Path) -> Result<PathBuf, HandlerError> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    RUNNER_SOURCE.hash(&mut h);
    let path = dir.join(format!("runner-{:016x}.py", h.finish()));
    if tokio::fs::read_to_string(&path)
        .await
        .is_ok_and(|s| s == RUNNER_SOURCE)
    {
        check_runner_dir(dir)?;
        return Ok(path);
    }
    let fail = |what: &str, e: std::io::Error| {
        HandlerError::Load(format!(
            "cannot {what} the Python runner in {}: {e}",
            dir.display()
        ))
    };
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| fail("create the directory for", e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).await;
    }
    check_runner_dir(dir)?;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".runner-{}-{seq}.tmp", std::process::id()));
    tokio::fs::write(&tmp, RUNNER_SOURCE)
        .await
        .map_err(|e| fail("write", e))?;
    tokio::fs::rename(&tmp, &path)
        .await
        .map_err(|e| fail("install", e))?;
    Ok(path)
}

/// Starts the fork server of the service's default interpreter ahead of the first load (which
/// would otherwise start it only when its first Python hook asks for a worker, after the scan):
/// `python`, the runner in `runtime_dir`, lowered to `priority` once ready, confined when every
/// hook is confined by default. Nothing when forking is off; a failure is logged at debug (the
/// first worker tries again and reports it).
pub(crate) async fn prestart_fork_server(
    python: &str,
    runtime_dir: &Path,
    priority: crate::priority::Resolved,
    confined: bool,
) {
    if !zygote::fork_enabled() {
        return;
    }
    let started = match ensure_runner(runtime_dir).await {
        Ok(runner) => zygote::prestart(python, &runner, priority, confined).await,
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = started {
        tracing::debug!(python, "python fork server not started ahead: {e}");
    }
}

/// How a hook's worker is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMode {
    /// Forked from the fork server of the hook's interpreter.
    Forked,
    /// Started from scratch, for this reason.
    Fresh(String),
}

/// How the worker of a hook with this context is started.
pub fn start_mode(ctx: &HandlerContext) -> StartMode {
    if !zygote::fork_enabled() {
        return StartMode::Fresh(format!("{}=0 turns forking off", zygote::FORK_ENV));
    }
    let hook_env: std::collections::BTreeMap<String, String> = ctx
        .process_env()
        .iter()
        .filter(|(k, _)| !k.starts_with("HERMES_HOOK"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(why) = zygote::needs_fresh_process(&hook_env) {
        return StartMode::Fresh(why);
    }
    if ctx.priority.above(ctx.default_priority) {
        return StartMode::Fresh(fresh_for_priority(ctx.priority, ctx.default_priority));
    }
    StartMode::Forked
}

/// Why a hook asking for more CPU than the fork server has gets a worker from scratch, in the
/// words of HOOK.yaml and `serve`'s options (a forked process can only lower its priority).
fn fresh_for_priority(
    hook: crate::priority::Priority,
    server: crate::priority::Priority,
) -> String {
    use crate::priority::Sched;
    if hook.sched == Sched::Normal && server.sched == Sched::Idle {
        return "`sched: normal` asks for normal scheduling and the fork server runs under \
                SCHED_IDLE (serve --worker-sched idle, the default); a forked process cannot \
                leave SCHED_IDLE, so this worker is started from scratch (to fork it, leave \
                `sched:` out)"
            .to_string();
    }
    format!(
        "`nice: {}` is below the fork server's nice {:+} (serve --worker-nice); a forked process \
         cannot lower its nice value, so this worker is started from scratch",
        hook.nice, server.nice
    )
}

/// What happened to the calls of a batch after the one being waited for.
enum Aborted {
    /// The worker is gone and everything it wrote was read: the calls after this one never
    /// started.
    Clean,
    /// It is unknown whether the next call started (the worker was killed and its output could
    /// not be read to the end).
    Unknown,
}

impl PythonHandler {
    /// Starts the worker and waits for its ready handshake; import errors and a missing
    /// `handle` are returned as [`HandlerError::Load`].
    pub async fn start(ctx: HandlerContext) -> Result<Self, HandlerError> {
        super::confine::make_state_dir(&ctx).await?;
        let runner = ensure_runner(&ctx.runtime_dir).await?;
        let mut this = Self {
            ctx,
            runner,
            worker: None,
            next_id: 0,
            call_ns: 1_000_000,
            expired: false,
            backoff: FIRST_BACKOFF,
            restart_at: None,
            line: Vec::new(),
        };
        this.worker = Some(this.spawn().await?);
        Ok(this)
    }

    async fn spawn(&self) -> Result<Worker, HandlerError> {
        let handler = self
            .ctx
            .handler_path
            .as_ref()
            .ok_or_else(|| HandlerError::Load("python hook without a handler file".into()))?;
        self.ctx.check_files().await?;
        // Importing the handler is what a decision would wait for: the new worker runs in the
        // normal class until it is ready (crate::priority; lowered again after).
        let _starting = self.ctx.signals.boost.boost();
        let mut worker = match start_mode(&self.ctx) {
            StartMode::Forked => self.spawn_forked(handler).await?,
            StartMode::Fresh(why) => {
                let w = self.spawn_fresh(handler).await?;
                self.ctx.signals.set_start("fresh", why);
                w
            }
        };
        if let Some(pid) = worker.pid() {
            worker._boost = Some(
                self.ctx
                    .signals
                    .boost
                    .add_process(pid, self.ctx.priority.resolved()),
            );
        }
        let start_timeout = self.ctx.timeout.max(MIN_START_TIMEOUT);
        let handshake = async {
            let stdin = worker.stdin.as_mut().ok_or("python worker has no stdin")?;
            stdin
                .write_all(&self.hello())
                .await
                .map_err(|e| format!("cannot talk to the python worker: {e}"))?;
            stdin
                .flush()
                .await
                .map_err(|e| format!("cannot talk to the python worker: {e}"))?;
            let mut line = Vec::new();
            match read_line_limited(&mut worker.stdout, &mut line, MAX_RESPONSE).await {
                Ok(Some(_)) => Ok(line),
                Ok(None) => Err(String::new()),
                Err(e) => Err(format!("cannot read from the python worker: {e}")),
            }
        };
        let line = match tokio::time::timeout(start_timeout, handshake).await {
            Ok(Ok(line)) => line,
            Ok(Err(msg)) => {
                let how = worker
                    .finish()
                    .await
                    .unwrap_or_else(|| "no exit status".into());
                let msg = if msg.is_empty() {
                    format!(
                        "python worker exited before it was ready ({how}); its stderr is in the log"
                    )
                } else {
                    msg
                };
                return Err(HandlerError::Load(msg));
            }
            Err(_) => {
                worker.kill().await;
                return Err(HandlerError::Load(format!(
                    "handler.py did not finish importing within {:.0?}",
                    start_timeout
                )));
            }
        };
        match parse_handshake(&line) {
            Ok(()) => Ok(worker),
            Err(e) => {
                worker.finish().await;
                Err(match e {
                    HandlerError::Load(reason) => HandlerError::Load(self.with_hint(reason)),
                    e => e,
                })
            }
        }
    }

    /// A worker forked by the fork server of the hook's interpreter; started from scratch when
    /// the fork server cannot fork it.
    async fn spawn_forked(&self, handler: &Path) -> Result<Worker, HandlerError> {
        let forked = zygote::fork_worker(
            &self.ctx.python,
            &self.runner,
            &self.ctx.dir,
            &self.ctx.cwd,
            handler,
            &self.ctx.name,
            &self
                .ctx
                .confined_env()
                .unwrap_or_else(|| self.ctx.process_env()),
            zygote::Priorities {
                // Raised while a collect waits (always while it starts: `_starting`),
                // so the worker never lowers itself after the service raised it; the
                // service lowers it once it is ready and no collect waits (issue 47).
                worker: crate::priority::starting(
                    self.ctx.priority.resolved(),
                    self.ctx.signals.boost.boosted(),
                ),
                fork_server: self.ctx.default_priority.resolved(),
            },
            self.ctx.sandbox.as_ref(),
        )
        .await;
        match forked {
            Ok(forked) => {
                let w = self.adopt(forked)?;
                self.ctx.signals.set_start(
                    "forked",
                    format!("from the fork server of {}", self.ctx.python),
                );
                Ok(w)
            }
            Err(e) => {
                tracing::warn!(hook = %self.ctx.name, "cannot fork the python worker ({e}); starting it from scratch");
                let w = self.spawn_fresh(handler).await?;
                self.ctx
                    .signals
                    .set_start("fresh", format!("fork server unavailable: {e}"));
                Ok(w)
            }
        }
    }

    /// The hello line: the protocol, and the files of the hook's tree with their SHA-256, which
    /// the runner's import hook checks every module against when it is imported.
    fn hello(&self) -> Vec<u8> {
        let mut hello =
            serde_json::json!({"hello": 1, "protocol": 1, "files": &self.ctx.files.files});
        if let Some(policy) = &self.ctx.sandbox {
            hello["sandbox"] = super::confine::for_runner(policy);
        }
        let mut line = hello.to_string().into_bytes();
        line.push(b'\n');
        line
    }

    /// A load failure caused by a module the interpreter lacks says which interpreter ran and
    /// how to pick another.
    fn with_hint(&self, reason: String) -> String {
        if !reason.contains("ModuleNotFoundError") {
            return reason;
        }
        let interpreter = crate::interpreter::Interpreter {
            path: self.ctx.python.clone(),
            why: self.ctx.python_why.clone(),
        };
        let home = self.ctx.env.get("HERMES_HOME").map(Path::new);
        format!(
            "{reason}: {}",
            crate::interpreter::module_not_found_hint(&reason, &interpreter, &self.ctx.dir, home)
        )
    }

    /// Starts a worker from scratch: `<python> -u runner.py DIR HANDLER NAME`.
    async fn spawn_fresh(&self, handler: &Path) -> Result<Worker, HandlerError> {
        let mut cmd = command(&self.ctx.python, &self.ctx);
        super::confine::set_env(&mut cmd, &self.ctx);
        // Confined: no user site (`-s`); its environment holds no variable that steers what the
        // interpreter imports (refused in `env:`, `sandbox::policy::steers`), and the working
        // directory is not on `sys.path` of a script.
        cmd.env(zygote::PYCACHE_ENV, zygote::pycache_dir(&self.runner))
            .args(self.ctx.sandbox.is_some().then_some("-s"))
            .arg("-u")
            .arg(&self.runner)
            .arg(&self.ctx.dir)
            .arg(handler)
            .arg(&self.ctx.name);
        // On the hook's own starter thread: the start waits for the child's exec, which may
        // wait on the hook's files (its working directory, a `python:` inside the hook).
        let cannot = |e: String| {
            HandlerError::Load(format!(
                "cannot start Python interpreter {:?}: {e}",
                self.ctx.python
            ))
        };
        self.ctx.starter.keep_threads();
        let mut child = self
            .ctx
            .starter
            .run(
                "the start of the python worker",
                Some(crate::handler::starter::CHECK_DEADLINE),
                move || cmd.spawn(),
                |started| {
                    if let Ok(mut child) = started {
                        let _ = child.start_kill();
                    }
                },
            )
            .await
            .map_err(|e| cannot(e.to_string()))?
            .map_err(|e| cannot(e.to_string()))?;
        let group = GroupKill::new(child.id());
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(HandlerError::Load(
                "python worker started without its pipes".into(),
            ));
        };
        let retire = Retire::watch(child.id().and_then(pidfd_open), self.ctx.signals.clone());
        Ok(Worker {
            proc: Proc::Fresh(child),
            stdin: Some(Box::new(stdin)),
            stdout: BufReader::with_capacity(64 * 1024, Box::new(stdout) as Reader),
            group,
            stderr_task: log_stderr(self.ctx.name.clone(), stderr),
            exited: None,
            _retire: retire,
            _boost: None,
        })
    }

    /// Takes over a worker the fork server started.
    fn adopt(&self, f: Forked) -> Result<Worker, HandlerError> {
        use tokio::net::unix::pipe;
        let group = GroupKill::new(u32::try_from(f.pid).ok());
        let fail = |what: &str, e: std::io::Error| {
            HandlerError::Load(format!("forked python worker: cannot use its {what}: {e}"))
        };
        let stdin = pipe::Sender::from_owned_fd(f.stdin).map_err(|e| fail("stdin", e))?;
        let stdout = pipe::Receiver::from_owned_fd(f.stdout).map_err(|e| fail("stdout", e))?;
        let stderr = pipe::Receiver::from_owned_fd(f.stderr).map_err(|e| fail("stderr", e))?;
        let retire = Retire::watch(f.pidfd.try_clone().ok(), self.ctx.signals.clone());
        // SAFETY: the pidfd is owned here and moved into the AsyncFd, which neither replaces
        // nor closes it while registered.
        let pidfd =
            unsafe { AsyncFd::register_with_interest(f.pidfd, tokio::io::Interest::READABLE) }
                .map_err(|e| fail("pidfd", e.into()))?;
        Ok(Worker {
            proc: Proc::Forked {
                pid: f.pid,
                pidfd,
                zygote: f.zygote,
            },
            stdin: Some(Box::new(stdin)),
            stdout: BufReader::with_capacity(64 * 1024, Box::new(stdout) as Reader),
            group,
            stderr_task: log_stderr(self.ctx.name.clone(), stderr),
            exited: None,
            _retire: retire,
            _boost: None,
        })
    }

    /// The worker died: collect its exit status, schedule a restart after the backoff.
    async fn crashed(&mut self, during: &str) -> HandlerError {
        let how = match self.worker.take() {
            Some(mut w) => {
                let how = w
                    .wait_exit(Duration::from_secs(2))
                    .await
                    .unwrap_or_else(|| "no exit status".into());
                w.kill().await;
                how
            }
            None => "not running".into(),
        };
        self.restart_at = Some(Instant::now() + self.backoff);
        tracing::warn!(
            hook = %self.ctx.name,
            "python worker exited {during} ({how}); restarting in {:?}, module state is lost",
            self.backoff
        );
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        HandlerError::Crashed(format!("python worker exited {during} ({how})"))
    }

    /// The worker exceeded the timeout: kill it and start a new one at once, so the next event
    /// does not pay for the start-up.
    async fn replace_after_timeout(&mut self) {
        tracing::warn!(
            hook = %self.ctx.name,
            "python worker killed after exceeding its {:?} timeout; restarting, module state is lost",
            self.ctx.timeout
        );
        self.restart_at = None;
        match self.spawn().await {
            Ok(w) => {
                self.worker = Some(w);
                self.ctx.signals.restarted();
            }
            Err(e) => {
                tracing::warn!(hook = %self.ctx.name, "python worker could not be restarted: {e}");
                self.restart_at = Some(Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// Reads the answer to request `id`: `Err(None)` at EOF, `Err(Some(why))` when the worker
    /// broke the protocol.
    async fn read_answer(&mut self, id: u64) -> Result<HandlerResult, Option<String>> {
        let Some(worker) = self.worker.as_mut() else {
            return Err(None);
        };
        let line = &mut self.line;
        loop {
            if line.capacity() > KEPT_LINE_CAPACITY {
                *line = Vec::new(); // a large result once does not stay allocated
            }
            line.clear();
            match read_line_limited(&mut worker.stdout, line, MAX_RESPONSE).await {
                Ok(Some(false)) => {}
                Ok(Some(true)) => {
                    return Ok(Err(HandlerError::Failed(format!(
                        "result is larger than {} MiB; it was discarded",
                        MAX_RESPONSE >> 20
                    ))));
                }
                Ok(None) | Err(_) => return Err(None),
            }
            match parse_answer(line, id) {
                Answer::Outcome(result) => return Ok(result),
                Answer::Stale => continue, // an answer to an abandoned request
                Answer::Broken => return Err(Some("python worker broke the protocol".into())),
                Answer::OutOfOrder => {
                    return Err(Some(format!(
                        "python worker answered out of order (expected request {id})"
                    )));
                }
            }
        }
    }
}

/// Environment variable that turns pipelining off (`0`, `off`, `false`, `no`): one request at a
/// time, as before pipelining existed (kept for comparisons and as an escape hatch).
pub const PIPELINE_ENV: &str = "HERMES_HOOKS_PIPELINE";

fn pipelining_enabled() -> bool {
    !matches!(
        std::env::var(PIPELINE_ENV)
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
            .as_str(),
        "0" | "off" | "false" | "no"
    )
}

impl Handler for PythonHandler {
    fn max_calls(&self) -> usize {
        if pipelining_enabled() {
            PIPELINE_DEPTH
        } else {
            1
        }
    }

    fn ready(&mut self) -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async move {
            if self.worker.is_some() {
                return Ok(());
            }
            if let Some(at) = self.restart_at.take() {
                tokio::time::sleep_until(at.into()).await;
            }
            match self.spawn().await {
                Ok(w) => {
                    self.worker = Some(w);
                    self.ctx.signals.restarted();
                    tracing::info!(hook = %self.ctx.name, restarts = self.ctx.signals.restarts(), "python worker restarted");
                    Ok(())
                }
                Err(e) => {
                    self.restart_at = Some(Instant::now() + self.backoff);
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    let why = format!("python worker could not be restarted: {e}");
                    // Files changed: the events wait for the version loaded from them.
                    Err(match e {
                        HandlerError::Changed(_) => HandlerError::Changed(why),
                        _ => HandlerError::Crashed(why),
                    })
                }
            }
        })
    }

    fn call<'a>(&'a mut self, calls: Vec<Call>, report: &'a mut Report<'_>) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.run_calls(calls, &mut NoFeed, report).await })
    }

    fn call_fed<'a>(
        &'a mut self,
        calls: Vec<Call>,
        feed: &'a mut dyn Feed,
        report: &'a mut Report<'_>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.run_calls(calls, feed, report).await })
    }

    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(mut w) = self.worker.take() {
                // Closing stdin tells the runner to finish its pending tasks and exit.
                drop(w.stdin.take());
                if w.wait_exit(SHUTDOWN_GRACE).await.is_some() {
                    w.group.disarm();
                    let _ = tokio::time::timeout(Duration::from_secs(1), &mut w.stderr_task).await;
                } else {
                    tracing::warn!(hook = %self.ctx.name, "python worker did not exit within {SHUTDOWN_GRACE:?} of shutdown; killed");
                }
                w.kill().await;
            }
        })
    }
}
