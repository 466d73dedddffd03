//! Python handlers (`handler.py`): one persistent worker process per hook, running the embedded
//! `runner.py`, which imports the module once and calls `handle(event, context)` per request.
//!
//! Protocol (one JSON object per line): the host says hello, the runner answers
//! `{"ready": true}` or `{"ready": false, "error": ...}`; then requests
//! `{"id", "event", "context"}` get answers `{"id", "ok", "result" | "error"}`. The runner keeps
//! the real stdout for the protocol, so `print` in a handler becomes a log line.
//!
//! A worker that dies is restarted before the next event, after a backoff of 100 ms doubling to
//! 30 s (reset by a successful call); a worker that exceeds the timeout is killed and restarted
//! at once. Either way the module's state is lost, which is logged.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::task::JoinHandle;

use super::api::{
    BoxFuture, Call, Handler, HandlerContext, HandlerError, HandlerResult, Report, within,
};
use super::process::{GroupKill, command, describe_exit, log_stderr, read_line_limited};

/// The runner, shipped inside the binary.
pub const RUNNER_SOURCE: &str = include_str!("runner.py");
/// Largest response line accepted from a worker.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Time a worker gets to import its module, at least.
const MIN_START_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a worker gets to finish background tasks after stdin closes, before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// A running worker process.
struct Worker {
    child: Child,
    /// `None` once closed to ask the runner to exit.
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    group: GroupKill,
    stderr_task: JoinHandle<()>,
}

impl Worker {
    async fn kill(mut self) {
        self.group.kill();
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
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

impl PythonHandler {
    /// Starts the worker and waits for its ready handshake; import errors and a missing
    /// `handle` are returned as [`HandlerError::Load`].
    pub async fn start(ctx: HandlerContext) -> Result<Self, HandlerError> {
        let runner = ensure_runner(&ctx.runtime_dir).await?;
        let mut this = Self {
            ctx,
            runner,
            worker: None,
            next_id: 0,
            backoff: FIRST_BACKOFF,
            restart_at: None,
        };
        this.worker = Some(this.spawn().await?);
        Ok(this)
    }

    async fn spawn(&self) -> Result<Worker, HandlerError> {
        crate::trust::prestart::check(&self.ctx.files, &self.ctx.name).await?;
        let handler = self
            .ctx
            .handler_path
            .as_ref()
            .ok_or_else(|| HandlerError::Load("python hook without a handler file".into()))?;
        let mut cmd = command(&self.ctx.python, &self.ctx);
        cmd.arg("-u")
            .arg(&self.runner)
            .arg(&self.ctx.dir)
            .arg(handler)
            .arg(&self.ctx.name);
        let mut child = cmd.spawn().map_err(|e| {
            HandlerError::Load(format!(
                "cannot start Python interpreter {:?}: {e}",
                self.ctx.python
            ))
        })?;
        let group = GroupKill::new(child.id());
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(HandlerError::Load(
                "python worker started without its pipes".into(),
            ));
        };
        let stderr_task = log_stderr(self.ctx.name.clone(), stderr);
        let mut worker = Worker {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            group,
            stderr_task,
        };
        let start_timeout = self.ctx.timeout.max(MIN_START_TIMEOUT);
        let handshake = async {
            let stdin = worker.stdin.as_mut().ok_or("python worker has no stdin")?;
            stdin
                .write_all(b"{\"hello\": 1, \"protocol\": 1}\n")
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
                let status =
                    tokio::time::timeout(Duration::from_secs(5), worker.child.wait()).await;
                let how = match status {
                    Ok(Ok(s)) => describe_exit(s),
                    _ => "no exit status".into(),
                };
                worker.kill().await;
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
                worker.kill().await;
                Err(match e {
                    HandlerError::Load(reason) => HandlerError::Load(self.with_hint(reason)),
                    e => e,
                })
            }
        }
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
        format!(
            "{reason}: {}",
            crate::interpreter::missing_module_hint(&interpreter)
        )
    }

    /// The worker died: collect its exit status, schedule a restart after the backoff.
    async fn crashed(&mut self, during: &str) -> HandlerError {
        let how = match self.worker.take() {
            Some(mut w) => {
                let status = tokio::time::timeout(Duration::from_secs(2), w.child.wait()).await;
                let how = match status {
                    Ok(Ok(s)) => describe_exit(s),
                    _ => "no exit status".into(),
                };
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
        if let Some(w) = self.worker.take() {
            w.kill().await;
            tracing::warn!(
                hook = %self.ctx.name,
                "python worker killed after exceeding its {:?} timeout; restarting, module state is lost",
                self.ctx.timeout
            );
        }
        // Replace it now, so the next event does not pay for the start-up.
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

    async fn exchange(&mut self, event: &str, context: &Value) -> HandlerResult {
        self.next_id += 1;
        let id = self.next_id;
        let mut request =
            serde_json::to_vec(&json!({"id": id, "event": event, "context": context}))
                .map_err(|e| HandlerError::Failed(format!("cannot encode the event: {e}")))?;
        request.push(b'\n');
        let Some(worker) = self.worker.as_mut() else {
            return Err(HandlerError::Crashed("python worker is not running".into()));
        };
        let sent = match worker.stdin.as_mut() {
            Some(stdin) => stdin.write_all(&request).await.is_ok() && stdin.flush().await.is_ok(),
            None => false,
        };
        if !sent {
            return Err(self.crashed("before the event could be sent").await);
        }
        loop {
            let mut line = Vec::new();
            let Some(worker) = self.worker.as_mut() else {
                return Err(HandlerError::Crashed("python worker is not running".into()));
            };
            match read_line_limited(&mut worker.stdout, &mut line, MAX_RESPONSE).await {
                Ok(Some(false)) => {}
                Ok(Some(true)) => {
                    return Err(HandlerError::Failed(format!(
                        "result is larger than {} MiB; it was discarded",
                        MAX_RESPONSE >> 20
                    )));
                }
                Ok(None) | Err(_) => return Err(self.crashed("while handling the event").await),
            }
            match parse_answer(&line, id) {
                Answer::Broken => return Err(self.crashed("after breaking the protocol").await),
                Answer::Stale => continue, // an answer to an abandoned request
                Answer::Outcome(result) => {
                    self.backoff = FIRST_BACKOFF;
                    return result;
                }
            }
        }
    }
}

/// What one line from a worker means for the request with id `id`.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// Not a JSON value: the worker broke the protocol (it is restarted).
    Broken,
    /// An answer to another (abandoned) request.
    Stale,
    /// The request's outcome.
    Outcome(HandlerResult),
}

/// Reads one protocol line a worker sent in answer to request `id` (a pure function, so the
/// protocol can be fuzzed).
pub fn parse_answer(line: &[u8], id: u64) -> Answer {
    let Ok(answer) = serde_json::from_slice::<Value>(line) else {
        return Answer::Broken;
    };
    if answer.get("id").and_then(Value::as_u64) != Some(id) {
        return Answer::Stale;
    }
    Answer::Outcome(if answer.get("ok") == Some(&Value::Bool(true)) {
        match answer.get("result") {
            None | Some(Value::Null) => Ok(None),
            Some(v) => Ok(Some(v.clone())),
        }
    } else {
        let msg = answer
            .get("error")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or("handler failed without a message");
        Err(HandlerError::Failed(msg.to_string()))
    })
}

/// Reads a worker's handshake line: ready, or why it refused to start (a pure function, so the
/// protocol can be fuzzed).
pub fn parse_handshake(line: &[u8]) -> Result<(), HandlerError> {
    let answer: Value = serde_json::from_slice(line)
        .map_err(|e| HandlerError::Load(format!("python worker sent an invalid handshake: {e}")))?;
    if answer.get("ready") == Some(&Value::Bool(true)) {
        return Ok(());
    }
    Err(HandlerError::Load(
        answer
            .get("error")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or("python worker refused to start")
            .to_string(),
    ))
}

impl Handler for PythonHandler {
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
                    Err(HandlerError::Crashed(format!(
                        "python worker could not be restarted: {e}"
                    )))
                }
            }
        })
    }

    fn call<'a>(&'a mut self, calls: &'a [Call], report: &'a mut Report<'_>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            for (i, call) in calls.iter().enumerate() {
                let result =
                    within(self.ctx.timeout, self.exchange(&call.event, &call.context)).await;
                let timed_out = matches!(result, Err(HandlerError::TimedOut(_)));
                report(i, result);
                if timed_out {
                    self.replace_after_timeout().await;
                }
            }
        })
    }

    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(mut w) = self.worker.take() {
                // Closing stdin tells the runner to finish its pending tasks and exit.
                drop(w.stdin.take());
                if let Ok(Ok(_)) = tokio::time::timeout(SHUTDOWN_GRACE, w.child.wait()).await {
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
