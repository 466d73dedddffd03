//! Executable handlers (`handler`, `handler.sh`, any file with the run bit): one process per
//! event, as the gateway's shell hooks do.
//!
//! stdin: `{"hook_event_name", "event", "context", "hook"}`; stdout: empty or one JSON value (the
//! result); stderr: logged. A non-zero exit is an error. The process runs in its own process group
//! so a timeout (the dispatcher drops the call) kills it and everything it started. When the
//! process exits while something it started in the background still holds its stdout or stderr,
//! what was read so far is kept (result and log lines) and, after [`PIPE_GRACE`], the group is
//! killed so the pipes close.
//!
//! `concurrency: N` runs up to N events of the hook at once (each reported as it completes); at 1,
//! the default, events run one after the other, in order.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use super::api::{
    BoxFuture, Call, Feed, Handler, HandlerContext, HandlerError, HandlerResult, NoFeed, Report,
    call_each,
};
use super::context::Context;
use super::process::{GroupKill, describe_exit};
use super::spawn::{self, Plan, c_string};

/// Largest stdout kept; beyond it the output is cut and the call fails.
pub const MAX_STDOUT: usize = 1024 * 1024;
/// Largest stderr kept for the log.
const MAX_STDERR: usize = 64 * 1024;
/// How long pipes may stay open after the process exited (a background grandchild holding them)
/// before the group is killed; what was read until then is kept.
pub const PIPE_GRACE: Duration = Duration::from_millis(500);

/// The executable handler of one hook.
pub struct ExecHandler {
    ctx: HandlerContext,
    program: PathBuf,
    /// `sh` for a `.sh` file without the run bit.
    via_shell: bool,
    /// The `sh` that runs such a file (found on `PATH` when the handler starts).
    shell: Option<PathBuf>,
    /// The Landlock ruleset of a confined hook, enforced in each process before exec.
    ruleset: Option<Arc<crate::sandbox::landlock::Ruleset>>,
}

/// What an executable reads on stdin (the context's text embedded as it is, not parsed).
#[derive(serde::Serialize)]
struct Input<'a> {
    hook_event_name: &'a str,
    event: &'a str,
    context: &'a serde_json::value::RawValue,
    hook: &'a str,
}

impl ExecHandler {
    /// Checks the handler file; nothing runs until an event arrives.
    pub fn new(ctx: HandlerContext) -> Result<Self, HandlerError> {
        let program = ctx
            .handler_path
            .clone()
            .ok_or_else(|| HandlerError::Load("executable hook without a handler file".into()))?;
        let via_shell = !crate::discovery::is_executable(&program);
        if via_shell && !crate::discovery::is_shell_script(&program) {
            return Err(HandlerError::Load(format!(
                "{} is not executable: run `chmod +x` on it",
                program.display()
            )));
        }
        let shell = if via_shell {
            Some(crate::layout::find_on_path("sh").ok_or_else(|| {
                HandlerError::Load(format!(
                    "{} has no run bit and no `sh` was found on PATH to run it",
                    program.display()
                ))
            })?)
        } else {
            None
        };
        Ok(Self {
            ctx,
            program,
            via_shell,
            shell,
            ruleset: None,
        })
    }

    /// [`ExecHandler::new`], and for a confined hook its state directory and ruleset.
    pub async fn start(ctx: HandlerContext) -> Result<Self, HandlerError> {
        let mut this = Self::new(ctx)?;
        super::confine::make_state_dir(&this.ctx).await?;
        this.ruleset =
            super::confine::exec_ruleset(&this.ctx, &this.program, this.via_shell).await?;
        Ok(this)
    }

    /// What one process of this hook starts as: the checked file (through `sh` for a script
    /// without the run bit), the environment (a confined hook's holds only what its sandbox
    /// allows), the working directory, the priority and the ruleset.
    fn plan(&self, verified: &super::verified_exec::VerifiedExec) -> std::io::Result<Plan> {
        let path = c_string(verified.path().as_os_str(), "the handler path")?;
        let (program, argv) = match &self.shell {
            Some(sh) => (
                c_string(sh.as_os_str(), "the path of sh")?,
                vec![c"sh".to_owned(), path],
            ),
            None => (path.clone(), vec![path]),
        };
        let envp = match self.ctx.confined_env() {
            Some(env) => spawn::env_block(env.into_iter().map(|(k, v)| (k.into(), v.into()))),
            None => {
                let mut all: std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString> =
                    std::env::vars_os().collect();
                all.extend(
                    self.ctx
                        .process_env()
                        .into_iter()
                        .map(|(k, v)| (k.into(), v.into())),
                );
                spawn::env_block(all)
            }
        };
        Ok(Plan {
            program,
            argv,
            envp,
            cwd: c_string(self.ctx.cwd.as_os_str(), "the working directory")?,
            keep_fd: Some(verified.raw_fd()),
            // A process started while a collect waits for the hook starts raised.
            priority: crate::priority::starting(
                self.ctx.priority.resolved(),
                self.ctx.signals.boost.boosted(),
            ),
            ruleset: self.ruleset.as_ref().map(|r| r.raw()),
        })
    }

    async fn run(&self, event: &str, context: &Context) -> HandlerResult {
        let context = context
            .raw()
            .map_err(|e| HandlerError::Failed(format!("cannot encode the event: {e}")))?;
        let payload = Input {
            hook_event_name: event,
            event,
            context,
            hook: &self.ctx.name,
        };
        let mut input = serde_json::to_vec(&payload)
            .map_err(|e| HandlerError::Failed(format!("cannot encode the event: {e}")))?;
        input.push(b'\n');
        // The hook's tree is checked, then what runs is the open file whose bytes were checked,
        // not whatever the path names by the time the kernel opens it (a rename race between
        // the check and the exec).
        let verified = super::verified_exec::open(&self.ctx, &self.program).await?;
        let cannot_run = |e: std::io::Error| {
            HandlerError::Failed(format!("cannot run {}: {e}", self.program.display()))
        };
        let plan = self.plan(&verified).map_err(cannot_run)?;
        let spawned = crate::priority::spawn_at_base_async(move || spawn::spawn(&plan)).await;
        drop(verified);
        let (mut child, stdin, stdout, stderr) =
            adopt(spawned.map_err(cannot_run)?).map_err(cannot_run)?;
        let mut group = GroupKill::new(Some(child.id()));
        let writer = write_input(stdin, input);
        let (mut out_task, out_buf) = read_capped(stdout, MAX_STDOUT);
        let (mut err_task, err_buf) = read_capped(stderr, MAX_STDERR);
        let status = child.wait().await.map_err(|e| {
            HandlerError::Failed(format!("cannot wait for {}: {e}", self.program.display()))
        })?;
        if let Some(writer) = writer {
            writer.abort();
        }
        if tokio::time::timeout(PIPE_GRACE, both_eof(&mut out_task, &mut err_task))
            .await
            .is_err()
        {
            // Something the handler left in the background holds its pipes: keep what was read,
            // kill the group so the pipes close, and stop reading.
            tracing::debug!(hook = %self.ctx.name, "a background process held the handler's output; its group is killed");
            group.kill();
            let _ = tokio::time::timeout(PIPE_GRACE, both_eof(&mut out_task, &mut err_task)).await;
            out_task.abort();
            err_task.abort();
        }
        group.disarm();
        let (stdout, out_cut) = take(&out_buf);
        let (stderr, _) = take(&err_buf);
        let stderr_text = String::from_utf8_lossy(&stderr);
        for line in stderr_text.lines().filter(|l| !l.trim().is_empty()) {
            tracing::info!(target: "hook", hook = %self.ctx.name, "{line}");
        }
        if !status.success() {
            let last = stderr_text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            let mut detail = if last.is_empty() {
                String::new()
            } else {
                format!(": {}", last.trim())
            };
            if let Some(hint) = super::confine::denial_hint(&self.ctx, &stderr_text) {
                tracing::warn!(target: "hook", hook = %self.ctx.name, "{hint}");
                detail.push_str(&format!(" ({hint})"));
            }
            return Err(HandlerError::Failed(format!(
                "{} failed with {}{detail}",
                file_name(&self.program),
                describe_exit(status)
            )));
        }
        if out_cut {
            return Err(HandlerError::Failed(format!(
                "stdout exceeded {} MiB and was cut; no result",
                MAX_STDOUT >> 20
            )));
        }
        super::api::parse_json_result(
            &String::from_utf8_lossy(&stdout),
            "stdout",
            "; print a JSON result or nothing, log to stderr",
        )
    }
}

/// Writes the event to the child's stdin and closes it: at once when the pipe takes it all (an
/// event is far smaller than a pipe's buffer), else on a task of its own, since the child may
/// never read stdin and writing must not block the call.
fn write_input(
    mut stdin: tokio::net::unix::pipe::Sender,
    input: Vec<u8>,
) -> Option<JoinHandle<()>> {
    let done = match stdin.try_write(&input) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(_) => return None, // the child closed its stdin: nothing to write
    };
    if done == input.len() {
        return None; // dropping `stdin` closes it
    }
    Some(tokio::spawn(async move {
        let _ = stdin.write_all(&input[done..]).await;
        let _ = stdin.shutdown().await;
    }))
}

/// A spawned process and its pipes, handed to the runtime.
fn adopt(
    s: spawn::Spawned,
) -> std::io::Result<(
    spawn::Child,
    tokio::net::unix::pipe::Sender,
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Receiver,
)> {
    use tokio::net::unix::pipe::{Receiver, Sender};
    // The child first: dropped on an error below, it is killed and reaped.
    let child = spawn::Child::new(s.pid, s.pidfd)?;
    Ok((
        child,
        Sender::from_owned_fd_unchecked(s.stdin)?,
        Receiver::from_owned_fd_unchecked(s.stdout)?,
        Receiver::from_owned_fd_unchecked(s.stderr)?,
    ))
}

fn file_name(p: &std::path::Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What a pipe reader has kept so far, and whether it had to cut.
#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    cut: bool,
}

/// Reads a pipe to EOF keeping at most `max` bytes (the rest is drained so the child never
/// blocks). What was read is in the returned buffer even if the reader is stopped before EOF.
fn read_capped<R>(mut pipe: R, max: usize) -> (JoinHandle<()>, Arc<Mutex<Captured>>)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let kept = Arc::new(Mutex::new(Captured::default()));
    let sink = kept.clone();
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut k = sink.lock().unwrap_or_else(|p| p.into_inner());
                    let room = max.saturating_sub(k.bytes.len());
                    if n > room {
                        k.cut = true;
                    }
                    k.bytes.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
    });
    (task, kept)
}

/// Returns when both readers reached EOF.
async fn both_eof(a: &mut JoinHandle<()>, b: &mut JoinHandle<()>) {
    let _ = a.await;
    let _ = b.await;
}

/// Takes what a reader kept.
fn take(buf: &Mutex<Captured>) -> (Vec<u8>, bool) {
    let mut k = buf.lock().unwrap_or_else(|p| p.into_inner());
    (std::mem::take(&mut k.bytes), k.cut)
}

impl Handler for ExecHandler {
    fn max_calls(&self) -> usize {
        self.ctx.concurrency
    }

    fn call<'a>(&'a mut self, calls: Vec<Call>, report: &'a mut Report<'_>) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.call_fed(calls, &mut NoFeed, report).await })
    }

    fn call_fed<'a>(
        &'a mut self,
        calls: Vec<Call>,
        feed: &'a mut dyn Feed,
        report: &'a mut Report<'_>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let this = &*self;
            // Past the timeout a call is dropped, and its process group killed with it.
            call_each(
                calls,
                feed,
                this.ctx.timeout,
                this.ctx.concurrency,
                report,
                |call| async move { this.run(&call.event, &call.context).await },
            )
            .await;
        })
    }
}
