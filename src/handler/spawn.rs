//! Starting an executable hook's process the way `posix_spawn` does, with the few system calls
//! a hook process needs before it runs (issue 37).
//!
//! Rust's `Command` forks (copies the service's page tables, then faults on every page either
//! side writes) as soon as a `pre_exec` closure is set, and a hook process needs one: its CPU
//! priority, the parent-death signal, its descriptor-checked handler (`/proc/self/fd/N`, see
//! `verified_exec`) and, when confined, its Landlock ruleset. Here the child is made with
//! `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)`, as glibc's `posix_spawn` does: it runs on a
//! stack of its own in the service's memory while the spawning thread waits, makes only raw
//! system calls (no allocation, no lock), and execs. Nothing is copied; the exit is watched
//! through the pidfd.
//!
//! In the child, in order: signal dispositions that run a handler back to default (and `SIGPIPE`,
//! which the service ignores), a new process group, stdin/stdout/stderr onto the pipes, the
//! handler's descriptor kept open across the exec, the working directory, the priority, the
//! parent-death signal (and a check that the service is still its parent), the Landlock ruleset,
//! the signal mask emptied, `execve`. A failing step's `errno` is handed back to the parent
//! through memory both share until the exec.

use std::cell::Cell;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use tokio::io::unix::AsyncFd;

use crate::priority::Resolved;

/// Stack of the cloned child until it execs (it only makes system calls).
const CHILD_STACK: usize = 64 * 1024;

/// What to start: everything is made into C strings before the spawning thread clones.
#[derive(Debug)]
pub(crate) struct Plan {
    pub program: CString,
    pub argv: Vec<CString>,
    pub envp: std::sync::Arc<Vec<CString>>,
    pub cwd: CString,
    /// A descriptor the process keeps across the exec (the checked handler file).
    pub keep_fd: Option<RawFd>,
    pub priority: Resolved,
    /// Landlock ruleset enforced before the exec (a confined hook).
    pub ruleset: Option<RawFd>,
    /// What the process reads on stdin: put into the pipe before the process starts, as far as
    /// the pipe's buffer takes it (all of an event, in practice).
    pub input: Vec<u8>,
}

/// A C string of `s`; a NUL inside is an error naming `what`.
pub(crate) fn c_string(s: &OsStr, what: &str) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

/// `NAME=value` entries for `envp` from an environment map (entries with a NUL are skipped, as
/// `Command` would refuse them).
pub(crate) fn env_block(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<CString> {
    vars.into_iter()
        .filter_map(|(k, v)| {
            let mut entry = k.into_vec_bytes();
            entry.push(b'=');
            entry.extend_from_slice(v.as_bytes());
            CString::new(entry).ok()
        })
        .collect()
}

trait IntoVecBytes {
    fn into_vec_bytes(self) -> Vec<u8>;
}

impl IntoVecBytes for OsString {
    fn into_vec_bytes(self) -> Vec<u8> {
        use std::os::unix::ffi::OsStringExt;
        self.into_vec()
    }
}

/// A started process: its pid, its pidfd and the service's ends of its pipes (stdin only when
/// the pipe did not take all of the input, with what is left to write).
#[derive(Debug)]
pub(crate) struct Spawned {
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub stdin: Option<(OwnedFd, Vec<u8>)>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// What the child reads (and writes `error` into): lives on the spawning thread's stack, which
/// the child shares until it execs.
#[repr(C)]
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdio: [RawFd; 3],
    keep_fd: RawFd,
    ruleset: RawFd,
    priority: Resolved,
    parent: libc::pid_t,
    error: AtomicI32,
}

/// A pipe whose two ends are close-on-exec and above the standard descriptors (so putting the
/// child's ends onto 0, 1 and 2 never overwrites another).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// `fd`, or a close-on-exec copy of it numbered 3 or above when it is 0, 1 or 2 (a service
/// started with a standard descriptor closed).
pub(crate) fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl on a descriptor we own; the copy is owned by the returned OwnedFd.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl returned a new open descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own (pipe ends have no other status flags to keep).
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes what the (non-blocking) pipe `w` takes of `data` now; returns how much that was.
fn write_ahead(w: &OwnedFd, data: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: write from a live slice to a descriptor we own.
        let n = unsafe {
            libc::write(
                w.as_raw_fd(),
                data[done..].as_ptr().cast(),
                data.len() - done,
            )
        };
        if n > 0 {
            done += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => break,
            _ => return Err(e),
        }
    }
    Ok(done)
}

thread_local! {
    /// The child stack of this thread's last spawn, free again once `clone` returned.
    static STACK: Cell<Option<Stack>> = const { Cell::new(None) };
}

/// A private stack for the child, with a guard page below it; unmapped when dropped.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn new() -> io::Result<Self> {
        let page = 4096;
        let len = CHILD_STACK + page;
        // SAFETY: an anonymous private mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping, which is page-aligned.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the child no longer runs on it (it exec'd or exited
        // before `clone` returned: CLONE_VFORK).
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// Starts `plan` and returns its pid, pidfd and pipes. Blocks the calling thread until the child
/// has exec'd (microseconds); call it where a spawn may block (the spawner thread).
pub(crate) fn spawn(plan: &Plan) -> io::Result<Spawned> {
    let (in_r, in_w) = pipe()?;
    set_nonblocking(&in_w)?;
    let stdin = match write_ahead(&in_w, &plan.input)? {
        n if n == plan.input.len() => None, // all in the pipe: its end closes below
        n => Some(plan.input[n..].to_vec()),
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let argv: Vec<*const libc::c_char> = plan
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = plan
        .envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let args = ChildArgs {
        program: plan.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: plan.cwd.as_ptr(),
        stdio: [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        keep_fd: plan.keep_fd.unwrap_or(-1),
        ruleset: plan.ruleset.unwrap_or(-1),
        priority: plan.priority,
        parent: std::process::id() as libc::pid_t,
        error: AtomicI32::new(0),
    };
    let stack = STACK.with(Cell::take).map_or_else(Stack::new, Ok)?;
    let mut pidfd: libc::c_int = -1;
    // SAFETY: all signals are blocked on this thread while the child shares its memory (no
    // handler of the service may run on the child's stack); the child resets the dispositions
    // before it unblocks them. `args`, `argv`, `envp`, the strings of `plan` and the stack
    // outlive the child's use of them: with CLONE_VFORK, clone returns only once the child
    // has exec'd or exited. CLONE_PIDFD writes the pidfd into `pidfd`.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            std::ptr::from_ref(&args).cast_mut().cast(),
            &mut pidfd as *mut libc::c_int,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    // Free again: the child has exec'd or exited (CLONE_VFORK). Kept for this thread's next
    // spawn (no map, protect and unmap, with its TLB flush on every CPU, per process).
    STACK.with(|s| s.set(Some(stack)));
    drop((in_r, out_w, err_w));
    // SAFETY: clone succeeded with CLONE_PIDFD: `pidfd` is a new descriptor of ours.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let failed = args.error.load(Ordering::Acquire);
    if failed != 0 {
        reap_blocking(pid); // it has already exited (_exit after the failed step)
        return Err(io::Error::from_raw_os_error(failed));
    }
    for end in [&out_r, &err_r] {
        set_nonblocking(end)?;
    }
    Ok(Spawned {
        pid,
        pidfd,
        stdin: stdin.map(|rest| (in_w, rest)),
        stdout: out_r,
        stderr: err_r,
    })
}

/// The child until `execve`: see the module comment. Returns only if a step failed.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive until this child execs or exits.
    let args = unsafe { &*arg.cast::<ChildArgs>() };
    // SAFETY: see `child_exec`; _exit makes no call back into the service's code.
    unsafe {
        let errno = child_exec(args);
        args.error.store(errno.max(1), Ordering::Release);
        libc::_exit(127)
    }
}

/// The steps before the exec; returns the `errno` of the first that failed.
///
/// # Safety
///
/// Runs in the cloned child, on its own stack, sharing the service's memory: only system
/// calls, nothing that allocates or locks.
unsafe fn child_exec(a: &ChildArgs) -> i32 {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    };
    // SAFETY: plain system calls on this process's own descriptors, signals and attributes;
    // every pointer read comes from `a`, alive until the exec.
    unsafe {
        reset_signals();
        // First: a child that fails below leads its own group, so the orphan reaper
        // (`crate::reaper`) leaves it to `spawn`, which reaps it.
        if libc::setpgid(0, 0) != 0 {
            return errno();
        }
        for (target, &fd) in a.stdio.iter().enumerate() {
            if libc::dup2(fd, target as i32) < 0 {
                return errno();
            }
        }
        if a.keep_fd >= 0 && libc::fcntl(a.keep_fd, libc::F_SETFD, 0) < 0 {
            return errno();
        }
        if libc::chdir(a.cwd) != 0 {
            return errno();
        }
        a.priority.apply_to_self();
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return errno();
        }
        if libc::getppid() != a.parent {
            return libc::ESRCH; // the service exited meanwhile
        }
        if a.ruleset >= 0
            && let Err(e) = crate::sandbox::landlock::restrict_self(a.ruleset)
        {
            return e.raw_os_error().unwrap_or(libc::EPERM);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(a.program, a.argv, a.envp);
        errno()
    }
}

/// Every signal whose disposition runs a handler of the service, and `SIGPIPE`, back to the
/// default (the exec would reset the handled ones anyway; until then a handler would run on
/// the child's stack in the service's memory).
///
/// # Safety
///
/// Only in the cloned child (it changes the dispositions of the calling process).
unsafe fn reset_signals() {
    // SAFETY: sigaction with valid pointers; signals it refuses (SIGKILL, SIGSTOP, the C
    // library's own) fail with EINVAL and are skipped.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..libc::SIGRTMAX() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            if handled || sig == libc::SIGPIPE {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// Waits for `pid`, which has exited or is about to.
fn reap_blocking(pid: i32) -> Option<ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Some(ExitStatus::from_raw(status));
        }
        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

/// A started process as the runtime sees it: its exit awaited through the pidfd; killed
/// (SIGKILL) and reaped in the background if dropped before it was waited for.
#[derive(Debug)]
pub(crate) struct Child {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
    reaped: bool,
}

impl Child {
    /// Takes over a spawned process (call inside the runtime).
    pub(crate) fn new(pid: i32, pidfd: OwnedFd) -> io::Result<Self> {
        // SAFETY: the OwnedFd moves into the AsyncFd, which owns it (open, the same
        // description) until it is dropped.
        let pidfd =
            unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
                .map_err(io::Error::from)?;
        Ok(Self {
            pid,
            pidfd: Some(pidfd),
            reaped: false,
        })
    }

    pub(crate) fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for the process to exit and reaps it.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        let pidfd = self
            .pidfd
            .as_ref()
            .ok_or_else(|| io::Error::other("the process was already reaped"))?;
        loop {
            let mut ready = pidfd.readable().await?;
            if let Some(status) = try_reap(self.pid)? {
                self.reaped = true;
                return Ok(status);
            }
            ready.clear_ready();
        }
    }
}

/// Kills a started process nobody adopted (its call was given up while it started) and its
/// group, and reaps it. Blocks until it is gone: call it where a spawn may block.
pub(crate) fn discard(s: Spawned) {
    // SAFETY: the pid is our unreaped child, the leader of its own group; waitpid with a valid
    // status pointer.
    unsafe {
        libc::kill(-s.pid, libc::SIGKILL);
        libc::kill(s.pid, libc::SIGKILL);
        let mut status = 0;
        while libc::waitpid(s.pid, &mut status, 0) < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
    }
}

/// Reaps `pid` if it has exited.
fn try_reap(pid: i32) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // SAFETY: the pid is our unreaped child (alive or a zombie), so it names no one else.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
        }
        let pid = self.pid;
        let pidfd = self.pidfd.take();
        match (tokio::runtime::Handle::try_current(), pidfd) {
            (Ok(rt), Some(pidfd)) => {
                rt.spawn(async move {
                    let _ = pidfd.readable().await;
                    let _ = try_reap(pid);
                });
            }
            _ => {
                let _ = std::thread::Builder::new()
                    .name("reap".into())
                    .spawn(move || reap_blocking(pid));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn plan(shell_code: &str, cwd: &std::path::Path, keep: &std::fs::File) -> Plan {
        let path = format!("/proc/self/fd/{}", keep.as_raw_fd());
        Plan {
            program: CString::new(path.clone()).unwrap(),
            argv: vec![
                CString::new(path).unwrap(),
                c"-c".to_owned(),
                CString::new(shell_code).unwrap(),
            ],
            envp: env_block([("HOOK_VAR".into(), "from the plan".into())]).into(),
            cwd: c_string(cwd.as_os_str(), "cwd").unwrap(),
            keep_fd: Some(keep.as_raw_fd()),
            priority: Resolved {
                nice: crate::priority::own_nice(),
                idle: false,
            },
            ruleset: None,
            input: b"hello\n".to_vec(),
        }
    }

    /// The process runs the open descriptor (not a path) with the plan's arguments,
    /// environment and working directory, its own process group, stdin from the service and
    /// stdout back; its exit is awaited through the pidfd.
    #[tokio::test]
    async fn runs_the_descriptor_with_its_pipes_environment_directory_and_group() {
        let dir = tempfile::tempdir().unwrap();
        let sh = std::fs::File::open("/bin/sh").unwrap();
        let p = plan(
            "read line; echo \"$line|$HOOK_VAR|$(pwd)\"; cut -d' ' -f5 /proc/$$/stat; exit 3",
            dir.path(),
            &sh,
        );
        let s = spawn(&p).unwrap();
        let pid = s.pid;
        let mut child = Child::new(s.pid, s.pidfd).unwrap();
        assert!(
            s.stdin.is_none(),
            "the pipe took the whole input before the start"
        );
        let mut stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(s.stdout).unwrap();
        let mut out = String::new();
        stdout.read_to_string(&mut out).await.unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
        let want_dir = dir.path().canonicalize().unwrap();
        assert_eq!(
            out,
            format!("hello|from the plan|{}\n{pid}\n", want_dir.display()),
            "stdin, environment, working directory, own process group"
        );
    }

    /// An input larger than the pipe's buffer: the pipe takes what fits before the start, the
    /// rest is handed back and the process reads all of it.
    #[tokio::test]
    async fn an_input_larger_than_the_pipe_is_handed_back_in_part() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().unwrap();
        let sh = std::fs::File::open("/bin/sh").unwrap();
        let mut p = plan("wc -c", dir.path(), &sh);
        p.input = vec![b'x'; 300_000];
        let s = spawn(&p).unwrap();
        let mut child = Child::new(s.pid, s.pidfd).unwrap();
        let (fd, rest) = s.stdin.expect("a pipe holds less than 300,000 bytes");
        assert!(!rest.is_empty() && rest.len() < 300_000, "{}", rest.len());
        let mut stdin = tokio::net::unix::pipe::Sender::from_owned_fd(fd).unwrap();
        let mut stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(s.stdout).unwrap();
        let writer = tokio::spawn(async move {
            stdin.write_all(&rest).await.unwrap();
        });
        let mut out = String::new();
        stdout.read_to_string(&mut out).await.unwrap();
        writer.await.unwrap();
        assert_eq!(out.trim(), "300000");
        assert_eq!(child.wait().await.unwrap().code(), Some(0));
    }

    /// A step before the exec that fails (here the working directory) is the spawn's error,
    /// and the child it made is reaped.
    #[tokio::test]
    async fn a_failed_step_before_the_exec_is_the_spawn_error() {
        let sh = std::fs::File::open("/bin/sh").unwrap();
        let p = plan("exit 0", std::path::Path::new("/nonexistent/dir"), &sh);
        let err = spawn(&p).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
        let mut status = 0;
        // SAFETY: waitpid with a valid pointer; no child of this test may be left to reap.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        assert!(r <= 0, "a child was left unreaped: {r}");
    }

    /// A process dropped before it was waited for is killed and reaped.
    #[tokio::test]
    async fn a_dropped_child_is_killed_and_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let sh = std::fs::File::open("/bin/sh").unwrap();
        let s = spawn(&plan("sleep 30", dir.path(), &sh)).unwrap();
        let pid = s.pid;
        drop(Child::new(s.pid, s.pidfd).unwrap());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "process {pid} still exists"
            );
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}
