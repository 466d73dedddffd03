//! The layout of a hook directory, as discovery and trust both read it: where `$HERMES_HOME` is,
//! which directories of a root are hook directories and in what order, which file is the
//! handler and what kind it is, whether a path stays inside its hook directory, and the file
//! mode tests (executable, shell script). It uses only [`crate::kind`] (which files each kind
//! runs).

use std::path::{Component, Path, PathBuf};

pub use crate::kind::HandlerKind;
use crate::kind::KINDS;

/// Creates `dir` (and missing parents) with mode 0700 when it does not exist; an existing
/// directory is left as it is. For `$HERMES_HOME` and the socket's directory: nobody else may
/// list them or reach what is inside.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// `$HERMES_HOME`, defaulting to `~/.hermes`.
pub fn hermes_home() -> PathBuf {
    match std::env::var_os("HERMES_HOME").filter(|v| !v.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".hermes"),
    }
}

/// The hook directories of `root` in discovery order (name ascending; hidden entries and
/// files ignored; a missing root has none).
pub fn hook_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .filter(|p| !is_hidden(p))
        .collect();
    dirs.sort();
    dirs
}

/// [`hook_dirs`] without a `stat` of any entry (a hook directory that is a mount point which
/// stalls must not stall the listing of its root, issue 47): every entry the listing itself
/// says is a directory or a link (or does not say), in order; the caller checks each one
/// ([`Path::is_dir`]) where its stall is that hook's own. `None` when the root cannot be read.
pub fn hook_dir_candidates(root: &Path) -> Option<Vec<PathBuf>> {
    let entries = std::fs::read_dir(root).ok()?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            // d_type from the listing; a file system that gives none is asked per entry.
            e.file_type().map_or(true, |t| t.is_dir() || t.is_symlink())
        })
        .map(|e| e.path())
        .filter(|p| !is_hidden(p))
        .collect();
    dirs.sort();
    Some(dirs)
}

fn is_hidden(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'))
}

/// The last component of `dir` (a hook's name when HOOK.yaml gives none).
pub fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What is wrong with a hook's handler file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerFault {
    /// No handler file was found.
    Missing,
    /// The handler file exists but cannot be used (not executable, ...).
    Unusable,
    /// The handler path leaves the hook directory.
    Outside,
}

/// Why no usable handler was found: what, in which file, and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerProblem {
    /// What is wrong.
    pub fault: HandlerFault,
    /// The file the problem is in.
    pub file: PathBuf,
    /// Worded for an operator.
    pub reason: String,
}

fn problem(fault: HandlerFault, file: PathBuf, reason: String) -> HandlerProblem {
    HandlerProblem {
        fault,
        file,
        reason,
    }
}

/// Finds the handler: the explicit `handler:` path, or the first of handler.py, handler (with the
/// run bit), handler.sh, handler.so/.dylib/.dll. The result stays inside `dir`, also through
/// symlinks.
pub fn find_handler(
    dir: &Path,
    explicit: Option<&str>,
) -> Result<(HandlerKind, PathBuf), HandlerProblem> {
    let (kind, path) = find_handler_file(dir, explicit)?;
    check_inside(dir, &path).map_err(|r| problem(HandlerFault::Outside, path.clone(), r))?;
    Ok((kind, path))
}

fn find_handler_file(
    dir: &Path,
    explicit: Option<&str>,
) -> Result<(HandlerKind, PathBuf), HandlerProblem> {
    if let Some(rel) = explicit {
        let path = resolve_inside(dir, rel)?;
        if !path.is_file() {
            return Err(problem(
                HandlerFault::Missing,
                path.clone(),
                format!("handler {rel:?} (named in HOOK.yaml) does not exist or is not a file"),
            ));
        }
        let kind = HandlerKind::of_extension(path.extension().and_then(|e| e.to_str()));
        if kind.spec().needs_run_bit && !is_executable(&path) && !is_shell_script(&path) {
            return Err(problem(
                HandlerFault::Unusable,
                path,
                format!("handler {rel:?} is not executable: run `chmod +x` on it"),
            ));
        }
        return Ok((kind, path));
    }
    for spec in &KINDS {
        for file in spec.default_files {
            let path = dir.join(file.name);
            if path.is_file() && (!file.needs_run_bit || is_executable(&path)) {
                return Ok((spec.kind, path));
            }
        }
    }
    let not_executable = KINDS
        .iter()
        .flat_map(|k| k.default_files)
        .find(|f| f.needs_run_bit && dir.join(f.name).is_file());
    let reason = match not_executable {
        Some(f) => format!(
            "no handler: `{0}` exists but is not executable (chmod +x {0})",
            f.name
        ),
        None => format!(
            "no handler: expected {} next to HOOK.yaml (or `handler:`/`url:` in HOOK.yaml)",
            crate::kind::default_hint()
        ),
    };
    Err(problem(HandlerFault::Missing, dir.to_path_buf(), reason))
}

/// Resolves `rel` against `dir`, refusing absolute paths, `..` and symlinks that lead outside.
fn resolve_inside(dir: &Path, rel: &str) -> Result<PathBuf, HandlerProblem> {
    let rel_path = Path::new(rel);
    let outside = |reason: String| problem(HandlerFault::Outside, dir.join("HOOK.yaml"), reason);
    if rel_path.is_absolute() {
        return Err(outside(format!(
            "handler {rel:?} is an absolute path; it must be a file inside the hook directory"
        )));
    }
    if rel_path
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(outside(format!(
            "handler {rel:?} uses `..`; it must be a file inside the hook directory"
        )));
    }
    let path = dir.join(rel_path);
    if path.exists() {
        let real_dir = dir
            .canonicalize()
            .map_err(|e| outside(format!("cannot resolve directory: {e}")))?;
        let real = path
            .canonicalize()
            .map_err(|e| outside(format!("cannot resolve handler: {e}")))?;
        if !real.starts_with(&real_dir) {
            return Err(outside(format!(
                "handler {rel:?} resolves to {} outside the hook directory (symlink escape)",
                real.display()
            )));
        }
    }
    Ok(path)
}

/// Refuses a handler that resolves (through symlinks) outside the hook directory.
pub fn check_inside(dir: &Path, handler: &Path) -> Result<(), String> {
    let real_dir = dir
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
    let real = handler
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", handler.display()))?;
    if real.starts_with(&real_dir) {
        Ok(())
    } else {
        Err(format!(
            "handler {} resolves to {} outside the hook directory (symlink escape); copy the \
             handler into the hook directory",
            handler.display(),
            real.display()
        ))
    }
}

/// True for `*.sh` files, which run with `sh` when they lack the run bit.
pub fn is_shell_script(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()) == Some("sh")
}

/// True when the file has any execute bit.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Looks `program` up on `PATH` (or checks it directly when it contains a slash).
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return (p.is_file() && is_executable(&p)).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file() && is_executable(p))
}
