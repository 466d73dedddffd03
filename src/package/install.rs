//! `install`: a package fetched into a staging directory, its hooks found, each copied and
//! checked, then all moved into the hook root (or linked, with `--link`) and recorded in the
//! lock file. Any failure before the lock file is written leaves the hook root as it was.

use std::path::{Path, PathBuf};

use crate::package::error::PackageError;
use crate::package::lock::{LockEntry, LockFile, lock_file};
use crate::package::source::{Origin, parse_source};
use crate::package::stage::{self, Staging};
use crate::package::tree::{self, Rules};

/// What `install` was asked.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// SOURCE as given.
    pub source: String,
    /// `--ref`.
    pub reference: Option<String>,
    /// `--name`.
    pub name: Option<String>,
    /// `--all`: every hook of the package.
    pub all: bool,
    /// `--link`: use a local directory in place.
    pub link: bool,
    /// The hook root hooks land in.
    pub root: PathBuf,
    /// `$HERMES_HOME` (the lock file).
    pub hermes_home: PathBuf,
    /// The hooks already in the service's roots, by name (their directories): approvals and
    /// state are keyed by name, so a package may not take one.
    pub taken: std::collections::BTreeMap<String, PathBuf>,
}

/// One hook installed.
#[derive(Debug, Clone)]
pub struct Installed {
    /// Its name.
    pub name: String,
    /// Its lock entry.
    pub entry: LockEntry,
}

/// What `install` did.
#[derive(Debug, Default)]
pub struct Report {
    /// The hooks installed.
    pub installed: Vec<Installed>,
    /// Warnings (an insecure URL scheme).
    pub warnings: Vec<String>,
    /// Install scripts shown, not run.
    pub notes: Vec<String>,
    /// With `--all`: the hooks of the package already installed, left as they are (one line
    /// each, saying how to refresh it).
    pub skipped: Vec<String>,
}

/// A hook checked and waiting in the staging directory.
struct Ready {
    name: String,
    staged: PathBuf,
    linked: Option<PathBuf>,
    entry: LockEntry,
}

/// Called with the staging root (`land`, holding the checked hooks by name) and their names,
/// just before they land: an error stops the install. `--link` installs stage nothing.
pub type BeforeLand<'a> = dyn FnMut(&Path, &[String]) -> Result<(), String> + Send + 'a;

/// Installs the hooks of `opts.source` (see the module comment).
pub fn install(
    opts: &InstallOptions,
    before_land: &mut BeforeLand<'_>,
) -> Result<Report, PackageError> {
    let origin = parse_source(&opts.source)?;
    if opts.link && !matches!(origin, Origin::Dir(_)) {
        return Err(PackageError::Hooks(
            "--link uses a local directory in place; SOURCE is not one".into(),
        ));
    }
    let mut report = Report {
        warnings: origin.warning().into_iter().collect(),
        ..Report::default()
    };
    let staging = Staging::new(&opts.root)?;
    let reference = opts.reference.clone().or(match &origin {
        Origin::Git { reference, .. } => reference.clone(),
        _ => None,
    });
    let fetched = stage::fetch(&origin, reference.as_deref(), &staging)?;
    let rules = Rules {
        own_files_only: fetched.own_files_only,
        skip_git: true,
    };
    let whole = tree::walk(&fetched.top, rules)?;
    let rels = pick_hooks(&fetched.top, &whole, opts)?;
    report.notes = stage::install_scripts(&fetched.top, &rels);
    let lock_path = lock_file(&opts.hermes_home);
    let lock = LockFile::load(&lock_path)?;
    let mut ready: Vec<Ready> = Vec::new();
    for rel in &rels {
        let src = fetched.top.join(rel);
        let natural = match rel.rsplit('/').next() {
            Some(last) if !last.is_empty() => last.to_string(),
            _ => fetched.natural_name.clone(),
        };
        let name = stage::hook_name_of(&src, opts.name.as_deref(), &natural)?;
        let target =
            crate::hook_name::path_under(&opts.root, &name).map_err(PackageError::Hooks)?;
        if let Some(dir) = opts
            .taken
            .get(&name)
            .filter(|_| !lock.hooks.contains_key(&name))
        {
            return Err(PackageError::Hooks(format!(
                "a hook named {name} already runs from {} (not installed by `install`); its \
                 approval and state are kept under that name: install this one under another \
                 name (`--name`, or its `name:`), or move that hook away first",
                dir.display()
            )));
        }
        if lock.hooks.contains_key(&name)
            || ready.iter().any(|r| r.name == name)
            || std::fs::symlink_metadata(&target).is_ok()
        {
            // With --all, one hook already there does not stop the others (issue 50).
            if opts.all && !ready.iter().any(|r| r.name == name) {
                report.skipped.push(format!(
                    "skipped {name}: already installed ({}); `hermes-hooks update {name}` refreshes it",
                    target.display()
                ));
                continue;
            }
            return Err(PackageError::Hooks(format!(
                "a hook {name} is already installed ({}); use `update {name}` or `remove {name}` first",
                target.display()
            )));
        }
        let (tree, staged) =
            stage::stage_hook(&src, &name, fetched.own_files_only, opts.link, &staging)?;
        let path = [fetched.subdir.as_str(), rel.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("/");
        let entry = LockEntry {
            source: opts.source.clone(),
            kind: if opts.link { "link" } else { origin.kind() }.to_string(),
            location: fetched.location.clone(),
            path,
            reference: reference.clone(),
            commit: fetched.commit.clone(),
            tree: tree::hook_hash(&src, &tree),
            dir: target,
            installed_at: crate::time::now(),
        };
        ready.push(Ready {
            name,
            staged,
            linked: opts.link.then(|| src.clone()),
            entry,
        });
    }
    if ready.is_empty() {
        return Err(PackageError::Hooks(format!(
            "every hook of {} is already installed ({}); `hermes-hooks update --all` refreshes them",
            opts.source,
            report.skipped.len()
        )));
    }
    let names: Vec<String> = ready.iter().map(|r| r.name.clone()).collect();
    before_land(&staging.land(), &names).map_err(PackageError::Hooks)?;
    land(&ready, &lock_path, lock)?;
    report.installed = ready
        .into_iter()
        .map(|r| Installed {
            name: r.name,
            entry: r.entry,
        })
        .collect();
    Ok(report)
}

/// The hook directories to install (relative to the package top): one, or all with `--all`.
fn pick_hooks(
    top: &Path,
    whole: &tree::Tree,
    opts: &InstallOptions,
) -> Result<Vec<String>, PackageError> {
    let rels = stage::find_hooks(top, whole);
    let listed = || {
        rels.iter()
            .map(|r| format!("  {r}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    match rels.len() {
        0 => Err(PackageError::Hooks(format!(
            "no HOOK.yaml in {}: a hook directory needs one (name a subdirectory: owner/repo/PATH or URL#PATH)",
            opts.source
        ))),
        1 => Ok(rels),
        n if !opts.all => Err(PackageError::Hooks(format!(
            "{} holds {n} hooks:\n{}\ninstall one by naming its directory (owner/repo/PATH, URL#PATH), or all with --all",
            opts.source,
            listed()
        ))),
        _ if opts.name.is_some() => Err(PackageError::Hooks(
            "--name renames one hook; it cannot be used with --all".into(),
        )),
        _ => Ok(rels),
    }
}

/// Moves every staged hook into the hook root (or links it) and writes the lock file; on any
/// failure undoes what landed.
fn land(ready: &[Ready], lock_path: &Path, mut lock: LockFile) -> Result<(), PackageError> {
    let mut landed: Vec<&Path> = Vec::new();
    let undo = |landed: &[&Path], ready: &[Ready]| {
        for (dir, r) in landed.iter().zip(ready) {
            if r.linked.is_some() {
                let _ = std::fs::remove_file(dir);
            } else {
                let _ = std::fs::rename(dir, &r.staged);
            }
        }
    };
    for r in ready {
        let target = &r.entry.dir;
        let done = match &r.linked {
            Some(src) => std::os::unix::fs::symlink(src, target),
            None => std::fs::rename(&r.staged, target),
        };
        if let Err(e) = done {
            undo(&landed, ready);
            return Err(PackageError::io("move the hook into", target)(e));
        }
        landed.push(target);
    }
    for r in ready {
        lock.hooks.insert(r.name.clone(), r.entry.clone());
    }
    if let Err(e) = lock.save(lock_path) {
        undo(&landed, ready);
        return Err(e);
    }
    Ok(())
}
