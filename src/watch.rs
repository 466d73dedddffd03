//! Hot reload: watches the hook roots and rescans (via [`Host::reload`]) when something in them
//! changes.
//!
//! One inotify instance (raw system calls, no watcher thread of its own): its events are read on
//! the watcher task without blocking (the descriptor is non-blocking, polled by the runtime);
//! every watch is added on the threads for hooks' files ([`crate::file_lanes`]), one job per root
//! (its own watch and its listing) and one per hook directory (a watch on each directory of its
//! tree), each within [`ARM_DEADLINE`]. A root or a hook directory that does not answer (a mount
//! that stalls) is reported once and watched as soon as its job returns: then it is rescanned,
//! since its changes while it did not answer were not seen. Nothing the watcher does waits on a
//! hook's files on a runtime thread, or on a thread another root or hook needs (issue 59).
//!
//! The watcher task debounces (a burst of changes gives one rescan: it waits until the roots
//! have been quiet for the debounce period, at most one second in all), re-arms the watches of
//! roots and hook directories that appeared, were recreated or gained a directory, then
//! reloads. Roots that do not exist yet are watched through their nearest existing ancestor so
//! that their creation is seen. A kernel queue overflow is just another reason to rescan.
//!
//! `$HERMES_HOME/.env` and `.op.env` are watched too: a Python hook's worker took its environment
//! from them when it started ([`crate::dotenv`]); so are `config.yaml` and its allowlist.
//!
//! A chmod, chown or touch of a root or of a directory above one (`$HERMES_HOME`) that leaves its
//! mode and owner as they were is not a change: the real gateway re-applies 0700 to
//! `$HERMES_HOME` and `$HERMES_HOME/hooks` as it runs (each such chmod was a rescan: issue 36).
//!
//! Only changes that can matter wake it ([`matters`]): HOOK.yaml, files that can run (`.py`,
//! `.sh`, libraries, executables), directories, and entries directly in a root (hook directories
//! appearing, disappearing, renamed). A hook writing a log or state file into its own directory
//! does not cause a rescan, nor does anything in a root's directory that has no HOOK.yaml (not a
//! hook, as upstream: `_disabled/`, `logs/`). The few checks that need a file's attributes run on
//! the threads for hooks' files within a deadline; without an answer the change counts.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::host::Host;

/// Default quiet period before a rescan.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Longest a burst can postpone a rescan.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// How long arming the watch of one root or one hook directory, or a look at one changed file's
/// attributes, may take before it is reported as not answering.
pub const ARM_DEADLINE: Duration = Duration::from_secs(2);
/// Most directories watched in one hook directory's tree.
const MAX_DIRS_PER_HOOK: usize = 4096;
/// What every watch reports (never reads or opens).
const MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MODIFY
    | libc::IN_CLOSE_WRITE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// A watch that could not be set up.
#[derive(Debug, Error)]
pub enum WatchError {
    /// The per-user inotify limits were reached.
    #[error(
        "cannot watch {path}: too many watches (raise fs.inotify.max_user_watches / max_user_instances)"
    )]
    TooManyWatches {
        /// The path.
        path: PathBuf,
    },
    /// Any other error of the system calls.
    #[error("cannot watch {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn watch_error(path: &Path, e: std::io::Error) -> WatchError {
    if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EMFILE)) {
        WatchError::TooManyWatches {
            path: path.to_path_buf(),
        }
    } else {
        WatchError::Io {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

/// The inotify instance, shared by the reader (the watcher task) and the arming jobs.
struct Inotify {
    fd: OwnedFd,
    /// Watch descriptor -> the directory it watches (filled by the jobs that add them, also
    /// when their caller stopped waiting).
    dirs: Mutex<HashMap<i32, PathBuf>>,
}

impl Inotify {
    fn new() -> std::io::Result<Self> {
        // SAFETY: a plain system call; the descriptor it returns is owned here.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `fd` was just returned open and is not owned elsewhere.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            dirs: Mutex::new(HashMap::new()),
        })
    }

    /// Watches the directory `path` (may wait on its file system: only on a file lane).
    fn add(&self, path: &Path) -> Result<(), WatchError> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| {
            watch_error(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            )
        })?;
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd < 0 {
            return Err(watch_error(path, std::io::Error::last_os_error()));
        }
        self.dirs_lock().insert(wd, path.to_path_buf());
        Ok(())
    }

    fn dirs_lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, PathBuf>> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The descriptor the runtime polls.
struct Readable(Arc<Inotify>);

impl AsRawFd for Readable {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd.as_raw_fd()
    }
}

/// One event: the path it names and its mask (`None` path: the kernel queue overflowed).
#[derive(Debug)]
struct Raw {
    path: Option<PathBuf>,
    mask: u32,
}

/// Reads the events queued now (never blocks: the descriptor is non-blocking).
fn read_events(ino: &Inotify, out: &mut Vec<Raw>) -> std::io::Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        // SAFETY: reads into a buffer of the length given.
        let n = unsafe { libc::read(ino.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::WouldBlock {
                Ok(())
            } else {
                Err(e)
            };
        }
        parse_events(&buf[..n as usize], ino, out);
    }
}

/// The `struct inotify_event`s of `buf`.
fn parse_events(buf: &[u8], ino: &Inotify, out: &mut Vec<Raw>) {
    const HEAD: usize = 16;
    let word = |at: usize| -> [u8; 4] {
        let mut w = [0u8; 4];
        w.copy_from_slice(&buf[at..at + 4]);
        w
    };
    let mut at = 0;
    while at + HEAD <= buf.len() {
        let wd = i32::from_ne_bytes(word(at));
        let mask = u32::from_ne_bytes(word(at + 4));
        let len = u32::from_ne_bytes(word(at + 12)) as usize;
        let end = (at + HEAD + len).min(buf.len());
        let name = &buf[at + HEAD..end];
        let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
        at = end;
        if mask & libc::IN_Q_OVERFLOW != 0 {
            out.push(Raw { path: None, mask });
            continue;
        }
        let mut dirs = ino.dirs_lock();
        let Some(dir) = dirs.get(&wd).cloned() else {
            continue;
        };
        if mask & libc::IN_IGNORED != 0 {
            dirs.remove(&wd);
        }
        drop(dirs);
        let path = if name.is_empty() {
            dir
        } else {
            dir.join(std::ffi::OsStr::from_bytes(name))
        };
        out.push(Raw {
            path: Some(path),
            mask,
        });
    }
}

/// The running watcher; dropping it stops watching.
pub struct WatchHandle {
    task: JoinHandle<()>,
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Resolves once the first arming of every root and hook directory answered or passed its
/// deadline (see [`spawn`]).
pub struct Armed(oneshot::Receiver<()>);

impl Armed {
    /// Waits for it (returns at once when the watcher is gone).
    pub async fn wait(self) {
        let _ = self.0.await;
    }
}

/// True for paths whose changes cannot matter to a hook: bytecode caches, editor swap and
/// backup files, hidden files.
fn ignorable(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "__pycache__")
        || path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with('.') || n.ends_with('~') || n.ends_with(".pyc") || n == "4913"
        })
}

/// A directory's mode, owner and group.
type Perms = (u32, u32, u32);

fn perms(path: &Path) -> Option<Perms> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.mode(), m.uid(), m.gid()))
}

/// What a change at a path is, as far as the names tell (no file system call).
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Cannot matter.
    No,
    /// Matters.
    Yes,
    /// Matters when the file is executable (asked within a deadline).
    IfExecutable,
}

/// Whether a change at `path` (`is_dir`: it is a directory; `gone`: it was removed or moved
/// away) can change what loads or runs (see the module comment). `hooks` says which of the
/// roots' directories have a HOOK.yaml, as their arming found.
fn matters(
    path: &Path,
    is_dir: bool,
    gone: bool,
    roots: &[PathBuf],
    hooks: &HashMap<PathBuf, bool>,
) -> Verdict {
    if ignorable(path) || outside_any_hook(path, roots, hooks) {
        return Verdict::No;
    }
    if roots
        .iter()
        .any(|r| path == r || path.parent() == Some(r.as_path()) || r.starts_with(path))
    {
        return Verdict::Yes;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if name == "HOOK.yaml" || name == "handler" || name.starts_with("handler.") || is_dir {
        return Verdict::Yes;
    }
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if matches!(ext.as_str(), "py" | "pyw" | "pth" | "sh" | "so" | "dylib") {
        return Verdict::Yes;
    }
    // What is gone cannot be told apart: a removed helper is seen through the check before the
    // next start.
    if gone {
        Verdict::No
    } else {
        Verdict::IfExecutable
    }
}

/// The directory of a root that `path` is in (or is), with its root.
fn top_dir<'a>(path: &Path, roots: &'a [PathBuf]) -> Option<(&'a PathBuf, PathBuf)> {
    roots.iter().find_map(|r| {
        let rest = path.strip_prefix(r).ok()?;
        let top = rest.components().next()?;
        Some((r, r.join(top)))
    })
}

/// True for a path in (or being) a directory of a root that its arming found without a
/// HOOK.yaml: not a hook (`_disabled/`, `logs/`, `.git/`), so never a reason to rescan, as
/// upstream ignores it. A directory not armed yet may be a hook: that still matters.
fn outside_any_hook(path: &Path, roots: &[PathBuf], hooks: &HashMap<PathBuf, bool>) -> bool {
    let Some((_, dir)) = top_dir(path, roots) else {
        return false;
    };
    // A HOOK.yaml appearing is what turns a directory into a hook.
    if path.parent() == Some(dir.as_path()) && path.file_name().is_some_and(|n| n == "HOOK.yaml") {
        return false;
    }
    hooks.get(&dir) == Some(&false)
}

/// What an arming job found.
enum Found {
    /// A root: its directories (`None`: it does not exist, its nearest ancestor is watched),
    /// and the attributes of it and the directories above it.
    Root {
        dirs: Option<Vec<PathBuf>>,
        perms: Vec<(PathBuf, Perms)>,
    },
    /// A hook directory: whether it has a HOOK.yaml.
    Dir { hook: bool },
    /// `$HERMES_HOME`.
    Home,
}

/// An arming job's answer, or its caller's giving up on it.
enum Answer {
    Done {
        key: PathBuf,
        found: Found,
        error: Option<WatchError>,
    },
    TimedOut {
        key: PathBuf,
    },
}

/// Where an arming stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arm {
    /// Its job runs, within its deadline.
    Running,
    /// Its job passed its deadline and still runs: reported, watched when it returns.
    Stalled,
    /// Armed (or failed with an error, logged).
    Done,
}

/// Arms one root: its watch and its listing, or the watch of its nearest existing ancestor.
fn arm_root(ino: &Inotify, root: &Path) -> (Found, Option<WatchError>) {
    let perms_seen = root
        .ancestors()
        .filter_map(|d| Some((d.to_path_buf(), perms(d)?)))
        .collect();
    let mut error = None;
    let dirs = if root.is_dir() {
        error = ino.add(root).err();
        crate::layout::hook_dir_candidates(root)
    } else {
        if let Some(a) = root.ancestors().skip(1).find(|a| a.is_dir()) {
            error = ino.add(a).err();
        }
        None
    };
    (
        Found::Root {
            dirs,
            perms: perms_seen,
        },
        error,
    )
}

/// Arms one hook directory: a watch on each directory of its tree (not hidden ones nor
/// `__pycache__`; at most [`MAX_DIRS_PER_HOOK`]).
fn arm_dir(ino: &Inotify, dir: &Path) -> (Found, Option<WatchError>) {
    let mut stack = vec![dir.to_path_buf()];
    let mut count = 0;
    let mut error = None;
    while let Some(d) = stack.pop() {
        if count >= MAX_DIRS_PER_HOOK {
            tracing::warn!(
                dir = %dir.display(),
                "more than {MAX_DIRS_PER_HOOK} directories: the rest is not watched (seen at the next reload)"
            );
            break;
        }
        count += 1;
        if let Err(e) = ino.add(&d) {
            // Not a directory (a file beside the hooks), or gone: nothing to watch.
            if matches!(&e, WatchError::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ENOENT)))
            {
                continue;
            }
            error.get_or_insert(e);
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) && !ignorable(&e.path()) {
                stack.push(e.path());
            }
        }
    }
    let hook = dir.join("HOOK.yaml").exists();
    (Found::Dir { hook }, error)
}

/// The watcher task's state.
struct Watcher {
    host: Host,
    ino: Arc<Inotify>,
    roots: Vec<PathBuf>,
    home: PathBuf,
    /// Each root's, hook directory's and the home's arming.
    arms: HashMap<PathBuf, Arm>,
    /// Whether each directory of a root has a HOOK.yaml, as its arming found.
    hooks: HashMap<PathBuf, bool>,
    /// The mode and owner of every root and every directory above one, as last seen.
    seen: HashMap<PathBuf, Perms>,
    answers_tx: mpsc::Sender<Answer>,
    /// Told once the first arming is over.
    first: Option<oneshot::Sender<()>>,
}

/// Starts watching `host`'s roots; changes trigger a debounced reload. Returns at once: the
/// watches are armed on the threads for hooks' files, and [`Armed`] resolves when the first
/// arming of each root and hook directory answered or passed [`ARM_DEADLINE`]; one that answers
/// later is rescanned then.
pub fn spawn(host: Host, debounce: Duration) -> Result<(WatchHandle, Armed), WatchError> {
    let ino = Arc::new(Inotify::new().map_err(|e| watch_error(Path::new("inotify"), e))?);
    // SAFETY: `Readable` holds the instance (and its open descriptor) for as long as the
    // `AsyncFd` lives, and always names that descriptor.
    let readable = unsafe {
        AsyncFd::register_with_interest(Readable(ino.clone()), tokio::io::Interest::READABLE)
    }
    .map_err(|e| watch_error(Path::new("inotify"), e.into()))?;
    let (answers_tx, answers) = mpsc::channel(256);
    let (first_tx, first_rx) = oneshot::channel();
    let mut w = Watcher {
        roots: host.config().roots.clone(),
        home: host.config().hermes_home.clone(),
        host,
        ino,
        arms: HashMap::new(),
        hooks: HashMap::new(),
        seen: HashMap::new(),
        answers_tx,
        first: Some(first_tx),
    };
    // `$HERMES_HOME/.env` is part of a Python hook's environment, and `config.yaml` and
    // `shell-hooks-allowlist.json` say which shell hooks are hosted (issue 49): their changes
    // reload (one directory, not recursive; a home inside a watched root is covered already).
    if !w.roots.iter().any(|r| w.home.starts_with(r)) {
        w.start_arm(w.home.clone());
    }
    for root in w.roots.clone() {
        w.start_arm(root);
    }
    let task = tokio::spawn(w.run(readable, answers, debounce));
    Ok((WatchHandle { task }, Armed(first_rx)))
}

impl Watcher {
    /// Starts arming `key` (a root, a hook directory or the home) unless its arming runs.
    fn start_arm(&mut self, key: PathBuf) {
        if matches!(self.arms.get(&key), Some(Arm::Running | Arm::Stalled)) {
            return;
        }
        self.arms.insert(key.clone(), Arm::Running);
        let (ino, tx) = (self.ino.clone(), self.answers_tx.clone());
        let kind = if self.roots.contains(&key) {
            0
        } else if key == self.home {
            1
        } else {
            2
        };
        let k = key.clone();
        let late = self.answers_tx.clone();
        tokio::spawn(async move {
            let job = move || {
                let (found, error) = match kind {
                    0 => arm_root(&ino, &k),
                    1 => match ino.add(&k) {
                        Ok(()) => (Found::Home, None),
                        Err(e) => (Found::Home, Some(e)),
                    },
                    _ => arm_dir(&ino, &k),
                };
                // A lane thread, not a runtime's: it may block for room.
                let _ = tx.blocking_send(Answer::Done {
                    key: k,
                    found,
                    error,
                });
            };
            let lane = format!("watch:{}", key.display());
            let what = "arming the watch of a hooks directory";
            if crate::file_lanes::run(&lane, what, ARM_DEADLINE, job)
                .await
                .is_err()
            {
                let _ = late.send(Answer::TimedOut { key }).await;
            }
        });
    }

    /// Takes an arming's answer; returns the path to rescan when it answered late.
    fn answered(&mut self, answer: Answer) -> Option<PathBuf> {
        let (key, found, error) = match answer {
            Answer::TimedOut { key } => {
                if self.arms.get(&key) == Some(&Arm::Running) {
                    self.arms.insert(key.clone(), Arm::Stalled);
                    tracing::warn!(
                        path = %key.display(),
                        "not watching {}: it did not answer within {} (a file system that does not answer?); it is watched and rescanned once it answers",
                        key.display(),
                        crate::time::fmt_duration(ARM_DEADLINE)
                    );
                }
                return None;
            }
            Answer::Done { key, found, error } => (key, found, error),
        };
        let late = self.arms.insert(key.clone(), Arm::Done) == Some(Arm::Stalled);
        if late {
            tracing::info!(path = %key.display(), "{} answers again: watching it", key.display());
        }
        if let Some(e) = error {
            tracing::error!(
                "{e}; its changes are seen at the next reload (POST /v1/reload or SIGHUP)"
            );
        }
        match found {
            Found::Root { dirs, perms } => {
                self.seen.extend(perms);
                for d in dirs.unwrap_or_default() {
                    if !self.arms.contains_key(&d) {
                        self.start_arm(d);
                    }
                }
            }
            Found::Dir { hook } => {
                self.hooks.insert(key.clone(), hook);
            }
            Found::Home => {}
        }
        late.then_some(key)
    }

    /// Sends the first arming's signal once no arming runs within its deadline.
    fn first_over(&mut self) {
        if self.first.is_some() && !self.arms.values().any(|a| *a == Arm::Running) {
            let _ = self.first.take().map(|tx| tx.send(()));
        }
    }
}

/// A burst of changes being debounced.
#[derive(Default)]
struct Burst {
    /// When its first change came (`None`: no change waits).
    started: Option<Instant>,
    /// When its last change came.
    last: Option<Instant>,
    /// How many changes it holds.
    changes: usize,
}

impl Burst {
    fn add(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let now = Instant::now();
        self.started.get_or_insert(now);
        self.last = Some(now);
        self.changes += n;
    }

    /// When the rescan is due: quiet for `debounce`, at most [`MAX_DELAY`] after the first.
    fn due(&self, debounce: Duration) -> Option<tokio::time::Instant> {
        let (first, last) = (self.started?, self.last?);
        Some(tokio::time::Instant::from_std(
            (last + debounce).min(first + MAX_DELAY),
        ))
    }
}

/// The bits of an entry appearing, and of one going.
const APPEARED: u32 = libc::IN_CREATE | libc::IN_MOVED_TO;
const WENT: u32 = libc::IN_DELETE | libc::IN_MOVED_FROM;
const SELF_GONE: u32 = libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED;

impl Watcher {
    async fn run(
        mut self,
        readable: AsyncFd<Readable>,
        mut answers: mpsc::Receiver<Answer>,
        debounce: Duration,
    ) {
        let mut burst = Burst::default();
        loop {
            let due = burst.due(debounce);
            // A re-arming under way (a root or directory that appeared) answers first, within
            // its deadline: what is made in it after the rescan is then seen.
            let arming = self.arms.values().any(|a| *a == Arm::Running);
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                r = readable.readable() => {
                    let Ok(mut guard) = r else {
                        tracing::error!("the file watcher failed: hooks reload only on POST /v1/reload or SIGHUP");
                        return;
                    };
                    let mut raw = Vec::new();
                    let read = read_events(&self.ino, &mut raw);
                    guard.clear_ready();
                    if let Err(e) = read {
                        tracing::warn!("file watcher error: {e}; rescanning");
                        burst.add(1);
                    }
                    let n = self.classify(raw).await;
                    burst.add(n);
                }
                Some(a) = answers.recv() => {
                    if let Some(p) = self.answered(a) {
                        tracing::debug!(path = %p.display(), "armed late: rescanning");
                        burst.add(1);
                    }
                    self.first_over();
                }
                _ = tokio::time::sleep_until(due.unwrap_or(far)), if due.is_some() && !arming => {
                    let changes = std::mem::take(&mut burst).changes;
                    if self.host.is_draining() {
                        return;
                    }
                    let report = self.host.reload().await;
                    tracing::info!(
                        changes,
                        started = ?report.started,
                        stopped = ?report.stopped,
                        problems = report.skipped.iter().filter(|s| s.is_problem()).count(),
                        "hooks reloaded after a change on disk"
                    );
                }
            }
        }
    }

    /// How many of `raw` can change what loads or runs; re-arms what they name as needed.
    async fn classify(&mut self, raw: Vec<Raw>) -> usize {
        let mut n = 0;
        for ev in raw {
            let Some(path) = ev.path else {
                tracing::warn!("the kernel's queue of file events overflowed: rescanning");
                let keys: Vec<PathBuf> = self.arms.keys().cloned().collect();
                keys.into_iter().for_each(|k| self.start_arm(k));
                n += 1;
                continue;
            };
            self.rearm_for(&path, ev.mask);
            if self.same_attributes(&path, ev.mask).await {
                continue;
            }
            let home_file = crate::dotenv::is_env_file(&path, &self.home)
                || crate::config_hooks::is_config_file(&path, &self.home);
            let in_roots = self
                .roots
                .iter()
                .any(|r| path.starts_with(r) || r.starts_with(&path));
            if home_file {
                n += 1;
                continue;
            }
            if !in_roots {
                continue;
            }
            let is_dir = ev.mask & (libc::IN_ISDIR | SELF_GONE) != 0;
            let gone = ev.mask & WENT != 0;
            match matters(&path, is_dir, gone, &self.roots, &self.hooks) {
                Verdict::No => {}
                Verdict::Yes => n += 1,
                Verdict::IfExecutable => {
                    if self.executable(&path).await != Some(false) {
                        n += 1;
                    }
                }
            }
        }
        n
    }

    /// Re-arms the root or hook directory a change at `path` (`mask`) concerns: a root (or a
    /// directory above one) that appeared or went, an entry of a root (a hook directory
    /// appearing, going, renamed), a directory made inside a hook directory, its HOOK.yaml.
    fn rearm_for(&mut self, path: &Path, mask: u32) {
        let moved = mask & (APPEARED | WENT | SELF_GONE) != 0;
        for r in self.roots.clone() {
            if r.starts_with(path) && moved {
                self.start_arm(r);
            }
        }
        let Some((root, top)) = top_dir(path, &self.roots) else {
            return;
        };
        let root = root.clone();
        if path == top && moved {
            // A hook directory appeared, went or was renamed: the root's listing arms what is
            // there now.
            self.arms.remove(&top);
            self.hooks.remove(&top);
            self.start_arm(root);
        } else if path != top
            && ((mask & libc::IN_ISDIR != 0 && mask & APPEARED != 0)
                || (path.parent() == Some(top.as_path())
                    && path.file_name().is_some_and(|n| n == "HOOK.yaml")))
        {
            self.start_arm(top);
        }
    }

    /// True for an attribute change of a root or a directory above one that left its mode,
    /// owner and group as they were seen (then nothing a hook loads or may load changed); a
    /// real change is recorded and counts. Asked within [`ARM_DEADLINE`].
    async fn same_attributes(&mut self, path: &Path, mask: u32) -> bool {
        if mask & libc::IN_ATTRIB == 0 || !self.roots.iter().any(|r| r.starts_with(path)) {
            return false;
        }
        let p = path.to_path_buf();
        let lane = format!("watch:attributes:{}", path.display());
        let what = "a look at a hooks directory's attributes";
        let Ok(Some(now)) =
            crate::file_lanes::run(&lane, what, ARM_DEADLINE, move || perms(&p)).await
        else {
            return false;
        };
        self.seen.insert(path.to_path_buf(), now) == Some(now)
    }

    /// Whether the file `path` is executable (`None`: it did not answer within
    /// [`ARM_DEADLINE`], or is gone).
    async fn executable(&self, path: &Path) -> Option<bool> {
        use std::os::unix::fs::PermissionsExt;
        let key = top_dir(path, &self.roots).map_or_else(|| path.to_path_buf(), |(_, t)| t);
        let lane = format!("watch:attributes:{}", key.display());
        let p = path.to_path_buf();
        let what = "a look at a changed file's mode";
        crate::file_lanes::run(&lane, what, ARM_DEADLINE, move || {
            std::fs::symlink_metadata(&p)
                .ok()
                .map(|m| m.permissions().mode() & 0o111 != 0)
        })
        .await
        .ok()
        .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_matters_is_told_by_names_and_the_armed_hooks() {
        let roots = vec![PathBuf::from("/r")];
        let mut hooks = HashMap::new();
        hooks.insert(PathBuf::from("/r/h"), true);
        hooks.insert(PathBuf::from("/r/logs"), false);
        let m = |p: &str, dir: bool, gone: bool| matters(Path::new(p), dir, gone, &roots, &hooks);
        assert_eq!(m("/r/h/HOOK.yaml", false, false), Verdict::Yes);
        assert_eq!(m("/r/h/handler.py", false, false), Verdict::Yes);
        assert_eq!(m("/r/h/lib.sh", false, true), Verdict::Yes);
        assert_eq!(m("/r/h/sub", true, false), Verdict::Yes);
        assert_eq!(m("/r/h/state.json", false, false), Verdict::IfExecutable);
        assert_eq!(m("/r/h/state.json", false, true), Verdict::No);
        assert_eq!(m("/r/h/__pycache__/x.pyc", false, false), Verdict::No);
        assert_eq!(m("/r/logs/x.py", false, false), Verdict::No);
        assert_eq!(m("/r/logs/HOOK.yaml", false, false), Verdict::Yes);
        assert_eq!(m("/r/new", true, false), Verdict::Yes);
        assert_eq!(m("/r", true, false), Verdict::Yes);
    }
}
