//! Hot reload: watches the hook roots and rescans (via [`Host::reload`]) when something in them
//! changes.
//!
//! notify's callback runs on notify's own thread and only forwards a wake-up into a bounded
//! channel; the watcher task debounces (a burst of changes gives one rescan: it waits until the
//! roots have been quiet for the debounce period, at most one second in all), re-arms watches on
//! roots that appeared or were recreated, then reloads. Roots that do not exist yet are watched
//! through their nearest existing ancestor so that their creation is seen. A kernel queue
//! overflow (a `Rescan` event) is just another reason to rescan.
//!
//! `$HERMES_HOME/.env` and `.op.env` are watched too: a Python hook's worker took its environment
//! from them when it started ([`crate::dotenv`]).
//!
//! A chmod, chown or touch of a root or of a directory above one (`$HERMES_HOME`) that leaves its
//! mode and owner as they were is not a change ([`same_dir_attributes`]): the real gateway
//! re-applies 0700 to `$HERMES_HOME` and `$HERMES_HOME/hooks` as it runs (each such chmod was a
//! rescan and a re-armed watch: issue 36).
//!
//! Only changes that can matter wake it ([`matters`]): HOOK.yaml, files that can run (`.py`,
//! `.sh`, libraries, executables), directories, and entries directly in a root (hook directories
//! appearing, disappearing, renamed). A hook writing a log or state file into its own directory
//! does not cause a rescan, nor does anything in a root's directory that has no HOOK.yaml (not a
//! hook, as upstream: `_disabled/`, `logs/`). Arming the recursive watches walks whole trees, so it runs on a
//! blocking thread, never on the runtime's workers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher as _};
use thiserror::Error;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::host::Host;

/// Default quiet period before a rescan.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Longest a burst can postpone a rescan.
const MAX_DELAY: Duration = Duration::from_secs(1);

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
    /// Any other notify error.
    #[error("cannot watch {path}: {source}")]
    Notify {
        /// The path.
        path: PathBuf,
        /// The error.
        source: notify::Error,
    },
}

fn watch_error(path: &Path, e: notify::Error) -> WatchError {
    let too_many = matches!(e.kind, notify::ErrorKind::MaxFilesWatch)
        || matches!(&e.kind, notify::ErrorKind::Io(io) if matches!(io.raw_os_error(), Some(28) | Some(24)));
    if too_many {
        WatchError::TooManyWatches {
            path: path.to_path_buf(),
        }
    } else {
        WatchError::Notify {
            path: path.to_path_buf(),
            source: e,
        }
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

/// The mode and owner of every root and every directory above one, as first seen.
fn dir_attributes(roots: &[PathBuf]) -> HashMap<PathBuf, Perms> {
    roots
        .iter()
        .flat_map(|r| r.ancestors())
        .filter_map(|d| Some((d.to_path_buf(), perms(d)?)))
        .collect()
}

/// True for a metadata-only change (`kind`) of a root or a directory above one that left its
/// mode, owner and group as `seen` has them (then nothing a hook loads or may load changed);
/// a real change is recorded in `seen` and counts.
fn same_dir_attributes(
    kind: &EventKind,
    path: &Path,
    roots: &[PathBuf],
    seen: &std::sync::Mutex<HashMap<PathBuf, Perms>>,
) -> bool {
    if !matches!(kind, EventKind::Modify(ModifyKind::Metadata(_)))
        || !roots.iter().any(|r| r.starts_with(path))
    {
        return false;
    }
    let Some(now) = perms(path) else {
        return false;
    };
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    seen.insert(path.to_path_buf(), now) == Some(now)
}

/// True when a change at `path` can change what loads or runs (see the module comment).
fn matters(path: &Path, roots: &[PathBuf]) -> bool {
    if ignorable(path) || outside_any_hook(path, roots) {
        return false;
    }
    if roots
        .iter()
        .any(|r| path == r || path.parent() == Some(r.as_path()) || r.starts_with(path))
    {
        return true;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if name == "HOOK.yaml" || name == "handler" || name.starts_with("handler.") {
        return true;
    }
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if matches!(ext.as_str(), "py" | "pyw" | "pth" | "sh" | "so" | "dylib") {
        return true;
    }
    use std::os::unix::fs::PermissionsExt;
    // What is gone cannot be told apart: a removed directory is seen through its parent's
    // change, a removed helper through the check before the next start.
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() || m.permissions().mode() & 0o111 != 0)
}

/// True for a path in (or being) a directory of a root that exists and has no HOOK.yaml: not a
/// hook (`_disabled/`, `logs/`, `.git/`), so never a reason to rescan, as upstream ignores it. A
/// directory that is gone may have been a hook: that still matters.
fn outside_any_hook(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| {
        let Ok(rest) = path.strip_prefix(r) else {
            return false;
        };
        let Some(top) = rest.components().next() else {
            return false;
        };
        let dir = r.join(top);
        // A HOOK.yaml appearing is what turns a directory into a hook.
        if rest
            .components()
            .nth(1)
            .is_some_and(|c| c.as_os_str() == "HOOK.yaml")
            && rest.components().count() == 2
        {
            return false;
        }
        dir.is_dir() && !dir.join("HOOK.yaml").exists()
    })
}

struct Roots {
    watcher: notify::RecommendedWatcher,
    /// Root -> whether it currently has a recursive watch.
    watched: HashMap<PathBuf, bool>,
    /// Ancestors watched non-recursively to see roots appear.
    ancestors: Vec<PathBuf>,
}

impl Roots {
    /// Arms a recursive watch on every existing root (again, when `force` names it) and an
    /// ancestor watch for missing ones.
    fn arm(&mut self, force: &[PathBuf]) {
        let roots: Vec<PathBuf> = self.watched.keys().cloned().collect();
        for root in roots {
            let exists = root.is_dir();
            let was = self.watched.get(&root).copied().unwrap_or(false);
            if exists && (!was || force.contains(&root)) {
                let _ = self.watcher.unwatch(&root);
                match self.watcher.watch(&root, RecursiveMode::Recursive) {
                    Ok(()) => {
                        self.watched.insert(root.clone(), true);
                        tracing::debug!(root = %root.display(), "watching");
                    }
                    Err(e) => tracing::error!("{}", watch_error(&root, e)),
                }
            } else if !exists {
                self.watched.insert(root.clone(), false);
                let mut up = root.parent();
                while let Some(a) = up {
                    if a.is_dir() {
                        if !self.ancestors.iter().any(|x| x == a) {
                            match self.watcher.watch(a, RecursiveMode::NonRecursive) {
                                Ok(()) => self.ancestors.push(a.to_path_buf()),
                                Err(e) => tracing::error!("{}", watch_error(a, e)),
                            }
                        }
                        break;
                    }
                    up = a.parent();
                }
            }
        }
    }
}

/// A wake-up from notify: which paths changed, and whether the kernel asked for a rescan.
struct Change {
    paths: Vec<PathBuf>,
}

/// Starts watching `host`'s roots; changes trigger a debounced reload.
pub async fn spawn(host: Host, debounce: Duration) -> Result<WatchHandle, WatchError> {
    let (tx, rx) = mpsc::channel::<Change>(256);
    let root_list = host.config().roots.clone();
    let home = host.config().hermes_home.clone();
    let env_home = home.clone();
    let seen_attributes = std::sync::Mutex::new(dir_attributes(&root_list));
    let mut watcher =
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(event) => {
                if matches!(event.kind, EventKind::Access(_)) {
                    return;
                }
                let rescan = event.need_rescan();
                let kind = event.kind;
                let paths: Vec<PathBuf> = event
                    .paths
                    .into_iter()
                    .filter(|p| !same_dir_attributes(&kind, p, &root_list, &seen_attributes))
                    .filter(|p| {
                        // The home's own watch reports its other entries (the cache, logs):
                        // only its .env files count there.
                        let in_roots = root_list
                            .iter()
                            .any(|r| p.starts_with(r) || r.starts_with(p));
                        rescan
                            || (in_roots && matters(p, &root_list))
                            || crate::dotenv::is_env_file(p, &env_home)
                            || crate::config_hooks::is_config_file(p, &env_home)
                    })
                    .collect();
                if paths.is_empty() && !rescan {
                    return;
                }
                // A full channel already holds a pending rescan: nothing is lost by dropping.
                let _ = tx.try_send(Change { paths });
            }
            Err(e) => {
                tracing::warn!("file watcher error: {e}; rescanning");
                let _ = tx.try_send(Change { paths: Vec::new() });
            }
        })
        .map_err(|e| watch_error(Path::new("."), e))?;
    // `$HERMES_HOME/.env` is part of a Python hook's environment, and `config.yaml` and
    // `shell-hooks-allowlist.json` say which shell hooks are hosted (issue 49): their changes
    // reload (one directory, not recursive; a home inside a watched root is covered already).
    if home.is_dir()
        && !host.config().roots.iter().any(|r| home.starts_with(r))
        && let Err(e) = watcher.watch(&home, RecursiveMode::NonRecursive)
    {
        tracing::warn!(
            "{}; changes to its .env are seen at the next reload",
            watch_error(&home, e)
        );
    }
    let roots = Roots {
        watcher,
        watched: host
            .config()
            .roots
            .iter()
            .map(|r| (r.clone(), false))
            .collect(),
        ancestors: Vec::new(),
    };
    let roots = arm_off_runtime(roots, Vec::new()).await.ok_or_else(|| {
        watch_error(
            Path::new("."),
            notify::Error::generic("arming the watches did not finish"),
        )
    })?;
    let task = tokio::spawn(run(host, roots, rx, debounce));
    Ok(WatchHandle { task })
}

/// [`Roots::arm`] on a blocking thread: a recursive watch walks the whole tree.
/// `None` when the runtime is shutting down (or arming panicked).
async fn arm_off_runtime(mut roots: Roots, force: Vec<PathBuf>) -> Option<Roots> {
    tokio::task::spawn_blocking(move || {
        roots.arm(&force);
        roots
    })
    .await
    .ok()
}

async fn run(host: Host, mut roots: Roots, mut rx: mpsc::Receiver<Change>, debounce: Duration) {
    while let Some(first) = rx.recv().await {
        let started = Instant::now();
        let mut touched: Vec<PathBuf> = first.paths;
        loop {
            let left = MAX_DELAY.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(debounce.min(left), rx.recv()).await {
                Ok(Some(c)) => touched.extend(c.paths),
                Ok(None) => return,
                Err(_) => break,
            }
        }
        // A root that was itself removed, created or renamed needs its watch re-armed.
        let force: Vec<PathBuf> = roots
            .watched
            .keys()
            .filter(|r| touched.iter().any(|p| p == *r))
            .cloned()
            .collect();
        let Some(armed) = arm_off_runtime(roots, force).await else {
            return;
        };
        roots = armed;
        if host.is_draining() {
            return;
        }
        let report = host.reload().await;
        tracing::info!(
            started = ?report.started,
            stopped = ?report.stopped,
            problems = report.skipped.iter().filter(|s| s.is_problem()).count(),
            "hooks reloaded after a change on disk"
        );
    }
}
