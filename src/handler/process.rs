//! Child-process plumbing shared by the process-based handler kinds: spawning in a new process
//! group, killing that group, logging a child's stderr without ever letting a full pipe block it,
//! and reading bounded lines.

use std::time::{Duration, Instant};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::task::JoinHandle;

use super::api::HandlerContext;

/// Longest stderr line logged; the rest of the line is cut.
const MAX_LOG_LINE: usize = 4096;
/// Lines per second logged for one child before lines are counted instead of logged.
const LOG_LINES_PER_SEC: u32 = 200;

/// A command for `program` set up for a hook: own process group, the hook's working directory
/// ([`HandlerContext::cwd`]), environment ([`HandlerContext::process_env`]) and CPU priority,
/// killed when dropped, and (Linux) killed when the service dies (a fleet worker SIGKILLed
/// mid-event must not leave its handler running while the broker gives the event to another
/// worker).
pub fn command(program: impl AsRef<std::ffi::OsStr>, ctx: &HandlerContext) -> Command {
    let mut cmd = Command::new(program);
    // A process started while a collect waits for the hook starts raised (crate::priority).
    let priority = crate::priority::starting(ctx.priority.resolved(), ctx.signals.boost.boosted());
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe system calls (setpriority, sched_setscheduler, prctl, getppid); it
    // allocates nothing. PR_SET_PDEATHSIG follows the spawning thread: commands are spawned from
    // the spawner thread (crate::priority::spawn_at_base), which lives as long as the service, or
    // from a hook's starter thread (handler/starter.rs), which lives as long as the hook's
    // handler, which owns (and kills) the process.
    unsafe {
        cmd.pre_exec(move || {
            priority.apply_to_self();
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::other("the service exited"));
                }
            }
            #[cfg(not(target_os = "linux"))]
            let _ = parent;
            Ok(())
        });
    }
    for secret in crate::sandbox::policy::service_secrets() {
        cmd.env_remove(secret);
    }
    cmd.current_dir(&ctx.cwd)
        .envs(ctx.process_env())
        .process_group(0)
        .kill_on_drop(true)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// Kills a whole process group when dropped, unless disarmed: the last resort that keeps a
/// timed-out or abandoned handler from leaving processes behind.
#[derive(Debug)]
pub struct GroupKill {
    pgid: Option<i32>,
}

impl GroupKill {
    /// Guards the group led by `pid` (children are spawned with `process_group(0)`).
    pub fn new(pid: Option<u32>) -> Self {
        Self {
            pgid: pid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0),
        }
    }

    /// Sends SIGKILL to the group now.
    pub fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // SAFETY: killpg has no memory-safety preconditions; a stale group id yields ESRCH.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }

    /// Forgets the group: it exited normally and must not be signalled.
    pub fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Logs each stderr line of a child under its hook's name, rate-limited, until EOF.
pub fn log_stderr<R>(hook: String, stderr: R) -> JoinHandle<()>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr);
        let mut line = Vec::new();
        let mut window = Instant::now();
        let mut in_window = 0u32;
        let mut suppressed = 0u64;
        let summary = |n: u64| {
            tracing::warn!(target: "hook", hook = %hook, "{n} output lines not logged (more than {LOG_LINES_PER_SEC}/s)");
        };
        loop {
            // While lines are being suppressed, report them when the window ends even if the
            // flood has stopped (the partial line read so far stays in `line`).
            let read = if suppressed > 0 {
                let left = Duration::from_secs(1).saturating_sub(window.elapsed());
                match tokio::time::timeout(
                    left,
                    read_line_limited(&mut reader, &mut line, MAX_LOG_LINE),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => {
                        summary(suppressed);
                        window = Instant::now();
                        in_window = 0;
                        suppressed = 0;
                        continue;
                    }
                }
            } else {
                read_line_limited(&mut reader, &mut line, MAX_LOG_LINE).await
            };
            let cut = match read {
                Ok(None) | Err(_) => break,
                Ok(Some(cut)) => cut,
            };
            if window.elapsed() >= Duration::from_secs(1) {
                if suppressed > 0 {
                    summary(suppressed);
                }
                window = Instant::now();
                in_window = 0;
                suppressed = 0;
            }
            in_window += 1;
            if in_window > LOG_LINES_PER_SEC {
                suppressed += 1;
            } else {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                let note = if cut {
                    format!(" [line cut at {MAX_LOG_LINE} bytes]")
                } else {
                    String::new()
                };
                super::python::pylog::log_line(&hook, text, &note);
            }
            line.clear();
        }
        if suppressed > 0 {
            summary(suppressed);
        }
    })
}

/// Reads one `\n`-terminated line into `buf`, keeping at most `max` bytes of it (the rest of the
/// line is consumed and discarded). Returns `None` at EOF, else whether the line was cut.
pub(crate) async fn read_line_limited<R>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>>
where
    R: AsyncBufRead + Unpin,
{
    let mut cut = false;
    let mut any = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let (take, done) = match memchr_newline(chunk) {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if room < take {
            cut = true;
        }
        buf.extend_from_slice(&chunk[..take.min(room)]);
        reader.consume(take);
        if done {
            return Ok(Some(cut));
        }
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// Describes how a child ended, for error messages ("exit code 3", "killed by signal 9").
pub fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}{}", signal_name(s)),
        _ => "unknown exit status".into(),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGINT => " (SIGINT)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 384, failure_persistence: None, ..ProptestConfig::default() })]

        /// Fuzzed: any bytes are split into lines of at most `max` bytes, each cut flagged,
        /// every line read once.
        #[test]
        fn protocol_lines_are_split_within_their_limit(
            input in prop::collection::vec(prop_oneof![Just(b'\n'), any::<u8>()], 0..600),
            max in 0usize..64,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let lines = rt.block_on(async {
                let mut reader = tokio::io::BufReader::with_capacity(7, &input[..]);
                let mut lines = Vec::new();
                loop {
                    let mut buf = Vec::new();
                    match read_line_limited(&mut reader, &mut buf, max).await {
                        Ok(None) => break,
                        Ok(Some(cut)) => lines.push((buf, cut)),
                        Err(e) => panic!("reading from memory failed: {e}"),
                    }
                    assert!(lines.len() <= input.len(), "more lines than bytes");
                }
                lines
            });
            let mut expected = input.split_inclusive(|b| *b == b'\n');
            for (buf, cut) in &lines {
                let whole = expected.next().unwrap_or_default();
                prop_assert!(buf.len() <= max);
                prop_assert_eq!(*cut, whole.len() > max);
                prop_assert_eq!(&buf[..], &whole[..buf.len()]);
            }
            prop_assert!(expected.next().is_none(), "every line was read");
        }
    }
}
