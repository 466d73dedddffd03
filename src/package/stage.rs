//! A package fetched into a private staging directory inside the hook root (hidden, so
//! discovery never sees it; on the same file system, so landing is a rename; removed when
//! dropped, so a failed install leaves nothing): its hooks found, copied and checked.

use std::path::{Path, PathBuf};

use crate::discovery::load_dir_with;
use crate::package::error::PackageError;
use crate::package::source::Origin;
use crate::package::tree::{self, Rules, Tree};
use crate::package::{archive, git};
use crate::trust::policy::Gate;

/// Files shown (never run) when a package has them: what its author meant to run at install.
pub const INSTALL_SCRIPTS: &[&str] = &[
    "install.sh",
    "setup.sh",
    "postinstall.sh",
    "install.py",
    "Makefile",
];

/// A staging directory in a hook root.
pub struct Staging {
    dir: tempfile::TempDir,
}

impl Staging {
    /// Creates `root` if needed and a private staging directory in it.
    pub fn new(root: &Path) -> Result<Self, PackageError> {
        std::fs::create_dir_all(root).map_err(PackageError::io("create the hook root", root))?;
        sweep(root);
        let dir = tempfile::Builder::new()
            .prefix(".hermes-install-")
            .tempdir_in(root)
            .map_err(PackageError::io("create a staging directory in", root))?;
        Ok(Self { dir })
    }

    /// The staging directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where checked hooks wait to land: `land/NAME`.
    pub fn land(&self) -> PathBuf {
        self.dir.path().join("land")
    }
}

/// How old a staging directory must be before another install deletes it as left behind (by a
/// process killed mid-install): far longer than any install takes.
const STALE_STAGING: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Deletes the staging directories of `root` left behind by installs, updates and removals
/// that were killed (hidden, so discovery never saw them).
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with(".hermes-install-") || name.starts_with(".hermes-remove-");
        let stale = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_STAGING);
        if ours && stale && e.file_type().is_ok_and(|t| t.is_dir()) {
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => {
                    tracing::info!(dir = %e.path().display(), "deleted a staging directory left behind")
                }
                Err(err) => {
                    tracing::warn!(dir = %e.path().display(), "cannot delete a staging directory left behind: {err}")
                }
            }
        }
    }
}

/// A package fetched (or, for a local directory, found in place).
#[derive(Debug)]
pub struct Fetched {
    /// The package's top directory (a repository's subdirectory when one was named).
    pub top: PathBuf,
    /// The repository URL, or the absolute directory or archive.
    pub location: String,
    /// `top` relative to the repository (git only; `""` otherwise).
    pub subdir: String,
    /// The commit checked out (git only).
    pub commit: Option<String>,
    /// Files of a local directory must be owned by this user.
    pub own_files_only: bool,
    /// The name a hook at `top` gets when HOOK.yaml names none.
    pub natural_name: String,
}

/// Fetches `origin` into `staging` (`src`), checking out `reference` for git.
pub fn fetch(
    origin: &Origin,
    reference: Option<&str>,
    staging: &Staging,
) -> Result<Fetched, PackageError> {
    let src = staging.path().join("src");
    match origin {
        Origin::Git { url, subdir, .. } => {
            let commit = git::fetch(url, reference, &src)?;
            let subdir = subdir.clone().unwrap_or_default();
            let top = inside(&src, &subdir)?;
            let natural_name = match subdir.rsplit('/').find(|s| !s.is_empty()) {
                Some(last) => last.to_string(),
                None => repo_name(url),
            };
            Ok(Fetched {
                top,
                location: url.clone(),
                subdir,
                commit: Some(commit),
                own_files_only: false,
                natural_name,
            })
        }
        Origin::Dir(dir) => {
            let top = std::path::absolute(dir).map_err(PackageError::io("resolve", dir))?;
            Ok(Fetched {
                natural_name: crate::layout::dir_name(&top),
                location: top.display().to_string(),
                top,
                subdir: String::new(),
                commit: None,
                own_files_only: true,
            })
        }
        Origin::Archive(file) => {
            archive::extract(file, &src)?;
            let abs = std::path::absolute(file).map_err(PackageError::io("resolve", file))?;
            let stem = crate::layout::dir_name(&abs);
            let stem = [".tar.gz", ".tgz", ".zip"]
                .iter()
                .find_map(|e| stem.strip_suffix(e))
                .unwrap_or(&stem)
                .to_string();
            Ok(Fetched {
                top: src,
                location: abs.display().to_string(),
                subdir: String::new(),
                commit: None,
                own_files_only: false,
                natural_name: stem,
            })
        }
    }
}

/// The last path component of a repository URL without `.git`.
fn repo_name(url: &str) -> String {
    let last = url
        .trim_end_matches('/')
        .rsplit(['/', ':'])
        .next()
        .unwrap_or(url);
    last.trim_end_matches(".git").to_string()
}

/// `top/sub`, which must be a directory inside `top` (links resolved).
pub fn inside(top: &Path, sub: &str) -> Result<PathBuf, PackageError> {
    let dir = top.join(sub);
    let real_top = top
        .canonicalize()
        .map_err(PackageError::io("resolve", top))?;
    let real = dir
        .canonicalize()
        .map_err(|_| PackageError::Hooks(format!("the package has no directory {sub:?}")))?;
    if !real.starts_with(&real_top) {
        return Err(PackageError::unsafe_entry(
            &dir,
            "the subdirectory leads outside the package",
        ));
    }
    if !real.is_dir() {
        return Err(PackageError::Hooks(format!("{sub:?} is not a directory")));
    }
    Ok(dir)
}

/// The hook directories of a package: `top` itself when it has a HOOK.yaml, else every
/// directory below holding one (hidden directories and links not entered, nor a hook's own
/// subdirectories), as paths relative to `top`, sorted.
pub fn find_hooks(top: &Path, tree: &Tree) -> Vec<String> {
    if tree.contains_key("HOOK.yaml") {
        return vec![String::new()];
    }
    let mut found: Vec<String> = Vec::new();
    for (rel, entry) in tree {
        let Some(dir) = rel.strip_suffix("/HOOK.yaml") else {
            continue;
        };
        let hidden = dir.split('/').any(|c| c.starts_with('.'));
        let nested = found.iter().any(|f| dir.starts_with(&format!("{f}/")));
        if matches!(entry, tree::Entry::File { .. }) && !hidden && !nested && top.join(dir).is_dir()
        {
            found.push(dir.to_string());
        }
    }
    found
}

/// The name a hook directory gets: `name:` in its HOOK.yaml, else `wanted` (`--name`), else
/// `natural`. A `--name` that HOOK.yaml contradicts is refused (discovery goes by HOOK.yaml).
pub fn hook_name_of(
    dir: &Path,
    wanted: Option<&str>,
    natural: &str,
) -> Result<String, PackageError> {
    let text = std::fs::read_to_string(dir.join("HOOK.yaml")).unwrap_or_default();
    let declared = crate::manifest::parse_manifest(&text)
        .ok()
        .and_then(|m| m.name);
    let name = match (declared, wanted) {
        (Some(d), Some(w)) if d != w => {
            return Err(PackageError::Hooks(format!(
                "{} says `name: {d}`; --name {w} would not rename it (change `name:` or drop --name)",
                dir.join("HOOK.yaml").display()
            )));
        }
        (Some(d), _) => d,
        (None, Some(w)) => w.to_string(),
        (None, None) => natural.to_string(),
    };
    crate::manifest::validate_name(&name)
        .map_err(|r| PackageError::Hooks(format!("hook name {name:?}: {r}; use --name")))?;
    Ok(name)
}

/// Walks one hook directory (links must stay inside it), copies it to `land/NAME` and checks
/// it as discovery would load it (no code runs). With `linked` (a `--link` install) nothing is
/// copied: it is checked in place. Returns its tree and where it was staged.
pub fn stage_hook(
    src: &Path,
    name: &str,
    own_files_only: bool,
    linked: bool,
    staging: &Staging,
) -> Result<(Tree, PathBuf), PackageError> {
    let rules = Rules {
        own_files_only,
        skip_git: true,
    };
    let tree = tree::walk(src, rules)?;
    if linked {
        check(src.parent().unwrap_or(Path::new("/")), src, name)?;
        return Ok((tree, PathBuf::new()));
    }
    let land = staging.land();
    std::fs::create_dir_all(&land).map_err(PackageError::io("create", &land))?;
    let dest = crate::hook_name::path_under(&land, name).map_err(PackageError::Hooks)?;
    tree::copy(src, &tree, &dest)?;
    check(&land, &dest, name)?;
    Ok((tree, dest))
}

/// `check` on one hook directory: it must load (or be disabled on purpose).
pub fn check(root: &Path, dir: &Path, name: &str) -> Result<(), PackageError> {
    match load_dir_with(root, dir, &Gate::default()) {
        Ok(_) => Ok(()),
        Err(skipped) if !skipped.is_problem() => Ok(()),
        Err(skipped) => Err(PackageError::Check {
            name: name.to_string(),
            reason: format!("{}: {}", rel_to(&skipped.file, dir), skipped.reason),
        }),
    }
}

fn rel_to(file: &Path, dir: &Path) -> String {
    file.strip_prefix(dir)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| file.display().to_string())
}

/// The install scripts at the top of the package and in its hook directories (`rels`, relative
/// to `top`), with their first lines, to show (never to run).
pub fn install_scripts(top: &Path, rels: &[String]) -> Vec<String> {
    let mut dirs: Vec<&str> = vec![""];
    dirs.extend(rels.iter().map(String::as_str).filter(|r| !r.is_empty()));
    let mut notes = Vec::new();
    for dir in dirs {
        for s in INSTALL_SCRIPTS {
            let rel = if dir.is_empty() {
                s.to_string()
            } else {
                format!("{dir}/{s}")
            };
            let path = top.join(&rel);
            let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
            if !is_file {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let head: Vec<&str> = text.lines().take(20).collect();
            notes.push(format!(
                "note: the package has {rel} (shown, not run; read it and run what you need yourself):\n    {}",
                head.join("\n    ")
            ));
        }
    }
    notes
}
