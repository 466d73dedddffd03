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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use super::api::{
    BoxFuture, Call, Feed, Handler, HandlerContext, HandlerError, HandlerResult, NoFeed, Report,
    call_each,
};
use super::process::{GroupKill, describe_exit};
use super::spawn::{self, Plan, c_string};
use super::verified_exec::{NotStarted, VerifiedExec};

/// Largest stdout kept; beyond it the output is cut and the call fails.
pub const MAX_STDOUT: usize = 1024 * 1024;
/// Largest stderr kept for the log.
const MAX_STDERR: usize = 64 * 1024;
/// How long pipes may stay open after the process exited (a background grandchild holding them)
/// before the group is killed; what was read until then is kept.
pub const PIPE_GRACE: Duration = Duration::from_millis(500);

/// An environment block as `execve` takes it.
type EnvBlock = Arc<Vec<std::ffi::CString>>;

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
    /// The handler file, open while the handler is (opened by [`ExecHandler::start`]).
    exe: Option<Arc<VerifiedExec>>,
    /// The last environment block, and what the hook added to the service's for it.
    env: Mutex<Option<(BTreeMap<String, String>, EnvBlock)>>,
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
            exe: None,
            env: Mutex::new(None),
        })
    }

    /// [`ExecHandler::new`], the open handler file, and for a confined hook its state
    /// directory and ruleset.
    pub async fn start(ctx: HandlerContext) -> Result<Self, HandlerError> {
        let mut this = Self::new(ctx)?;
        this.exe = Some(Arc::new(
            VerifiedExec::open(&this.ctx, &this.program).await?,
        ));
        super::confine::make_state_dir(&this.ctx).await?;
        this.ruleset =
            super::confine::exec_ruleset(&this.ctx, &this.program, this.via_shell).await?;
        Ok(this)
    }

    /// What one process of this hook starts as: the checked file (through `sh` for a script
    /// without the run bit), the environment (a confined hook's holds only what its sandbox
    /// allows), the working directory, the priority, the ruleset and what it reads on stdin.
    fn plan(&self, verified: &VerifiedExec, input: Vec<u8>) -> std::io::Result<Plan> {
        let path = c_string(verified.path().as_os_str(), "the handler path")?;
        let (program, argv) = match &self.shell {
            Some(sh) => (
                c_string(sh.as_os_str(), "the path of sh")?,
                vec![c"sh".to_owned(), path],
            ),
            None => (path.clone(), vec![path]),
        };
        Ok(Plan {
            program,
            argv,
            envp: self.envp(),
            cwd: c_string(self.ctx.cwd.as_os_str(), "the working directory")?,
            keep_fd: Some(verified.raw_fd()),
            // A process started while a collect waits for the hook starts raised.
            priority: crate::priority::starting(
                self.ctx.priority.resolved(),
                self.ctx.signals.boost.boosted(),
            ),
            ruleset: self.ruleset.as_ref().map(|r| r.raw()),
            input,
        })
    }

    /// The environment block of this hook's processes: built again only when what the hook adds
    /// to the service's environment changed (its `.env` files are read by identity, one `stat`
    /// each); the service's own environment does not change while it runs.
    fn envp(&self) -> EnvBlock {
        let own = self.ctx.process_env();
        let mut last = self.env.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, block)) = last.as_ref()
            && *seen == own
        {
            return block.clone();
        }
        let block = Arc::new(match self.ctx.confine_env(own.clone()) {
            Some(env) => spawn::env_block(env.into_iter().map(|(k, v)| (k.into(), v.into()))),
            None => {
                let mut all: BTreeMap<std::ffi::OsString, std::ffi::OsString> = std::env::vars_os()
                    .filter(|(k, _)| {
                        !k.to_str()
                            .is_some_and(crate::sandbox::policy::service_secret)
                    })
                    .collect();
                all.extend(own.clone().into_iter().map(|(k, v)| (k.into(), v.into())));
                spawn::env_block(all)
            }
        });
        *last = Some((own, block.clone()));
        block
    }

    /// Starts one process of this hook reading `input`, after the checks of its files.
    /// With `gate`, the process starts only while the gate is open, looked at on the starter
    /// thread just before the fork (the checks before it and the hand-off to that thread take
    /// time): a fleet worker stopped or starved meanwhile starts nothing another worker may run
    /// now (issue 56 row 8).
    async fn start_process(
        &self,
        input: Vec<u8>,
        gate: Option<Arc<crate::start_gate::StartGate>>,
    ) -> Result<spawn::Spawned, HandlerError> {
        let cannot_run = |e: std::io::Error| {
            HandlerError::Failed(format!("cannot run {}: {e}", self.program.display()))
        };
        let exe = self
            .exe
            .clone()
            .ok_or_else(|| HandlerError::Load("the handler was not started".into()))?;
        let plan = self.plan(&exe, input).map_err(cannot_run)?;
        // The hook's tree is checked, then what runs is the open file whose bytes were checked,
        // not whatever the path names by the time the kernel opens it (a rename race between
        // the check and the exec). Both on the hook's own starter thread, in one hand-off: no
        // runtime thread touches the hook's files or waits for a process start, and a hook
        // whose files stall delays no other (issue 47). A start nobody waits for any more (the
        // call timed out meanwhile) is killed and reaped there.
        let (files, hook) = (self.ctx.files.clone(), self.ctx.name.clone());
        self.ctx.starter.keep_threads();
        self.ctx
            .starter
            .run(
                "the start of the handler",
                None,
                move || {
                    exe.check_blocking(&files, &hook)?;
                    if !crate::start_gate::may_start(gate.as_deref()) {
                        return Err(NotStarted::Expired);
                    }
                    spawn::spawn(&plan).map_err(NotStarted::Io)
                },
                |started| {
                    if let Ok(s) = started {
                        spawn::discard(s);
                    }
                },
            )
            .await
            .map_err(|e| {
                HandlerError::Failed(format!("cannot run {}: {e}", self.program.display()))
            })?
            .map_err(|e| e.into_error(&self.ctx.name, &self.program))
    }

    async fn run(&self, call: &Call) -> HandlerResult {
        let (event, context) = (&*call.event, &*call.context);
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
        let spawned = self.start_process(input, call.gate.clone()).await?;
        let cannot_run = |e: std::io::Error| {
            HandlerError::Failed(format!("cannot run {}: {e}", self.program.display()))
        };
        let (mut child, stdin, stdout, stderr) = adopt(spawned).map_err(cannot_run)?;
        let mut group = GroupKill::new(Some(child.id()));
        // Raised while a collect waits for the hook, like every process of the hook (issue 47).
        let _boost = self
            .ctx
            .signals
            .boost
            .add_process(child.id(), self.ctx.priority.resolved());
        let writer = stdin.map(|(pipe, rest)| write_input(pipe, rest));
        // The pipes are read in this task, beside the wait (no task per pipe: each would be a
        // wake-up of another runtime thread per event).
        let mut out = Captured::default();
        let mut err = Captured::default();
        let status = {
            let reads = async {
                tokio::join!(
                    read_capped(stdout, MAX_STDOUT, &mut out),
                    read_capped(stderr, MAX_STDERR, &mut err)
                )
            };
            tokio::pin!(reads);
            let mut eof = false;
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status,
                    _ = &mut reads, if !eof => eof = true,
                }
            };
            let status = status.map_err(|e| {
                HandlerError::Failed(format!("cannot wait for {}: {e}", self.program.display()))
            })?;
            if let Some(Some(writer)) = writer {
                writer.abort();
            }
            if !eof && tokio::time::timeout(PIPE_GRACE, &mut reads).await.is_err() {
                // Something the handler left in the background holds its pipes: keep what was
                // read, kill the group so the pipes close, and stop reading.
                tracing::debug!(hook = %self.ctx.name, "a background process held the handler's output; its group is killed");
                group.kill();
                let _ = tokio::time::timeout(PIPE_GRACE, &mut reads).await;
            }
            status
        };
        group.disarm();
        let (stdout, out_cut) = (out.bytes, out.cut);
        let stderr = err.bytes;
        let stderr_text = String::from_utf8_lossy(&stderr);
        // The shell names the script by the descriptor it ran from: say the handler's path.
        let stderr_text = match &self.exe {
            Some(exe) => {
                super::shell_syntax::name_the_handler(&stderr_text, exe.path(), &self.program)
                    .into_owned()
            }
            None => stderr_text.into_owned(),
        };
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

/// Writes the rest of the event the pipe did not take before the process started (see
/// [`spawn::spawn`]) to the child's stdin and closes it: at once when the pipe takes it all,
/// else on a task of its own, since the child may never read stdin and writing must not block
/// the call.
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

/// The service's end of a child's stdin when the pipe did not take all of the input before the
/// start, with what is left to write.
type StdinRest = Option<(tokio::net::unix::pipe::Sender, Vec<u8>)>;

/// A spawned process and its pipes, handed to the runtime.
fn adopt(
    s: spawn::Spawned,
) -> std::io::Result<(
    spawn::Child,
    StdinRest,
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Receiver,
)> {
    use tokio::net::unix::pipe::{Receiver, Sender};
    // The child first: dropped on an error below, it is killed and reaped.
    let child = spawn::Child::new(s.pid, s.pidfd)?;
    let stdin = match s.stdin {
        Some((fd, rest)) => Some((Sender::from_owned_fd_unchecked(fd)?, rest)),
        None => None,
    };
    Ok((
        child,
        stdin,
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

/// Reads a pipe to EOF into `kept`, keeping at most `max` bytes (the rest is drained so the
/// child never blocks). What was read stays in `kept` if the read is dropped before EOF.
async fn read_capped<R>(mut pipe: R, max: usize, kept: &mut Captured)
where
    R: AsyncRead + Unpin,
{
    let mut buf = [0u8; 8 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(kept.bytes.len());
                if n > room {
                    kept.cut = true;
                }
                kept.bytes.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
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
                |call| async move { this.run(&call).await },
            )
            .await;
        })
    }
}
