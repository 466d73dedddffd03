//! `update`: fetch an installed hook's source again (its ref, or a new `--ref`), check the new
//! version, show what changes (files added, removed, changed; each changed text file line by
//! line, and whether the installed files were edited by hand since: the update replaces such
//! edits, issue 50), and on
//! [`apply`] swap it into place atomically (`renameat2(RENAME_EXCHANGE)`) and update the lock.
//! The hook's data files (HOOK.yaml's `data:`) are carried over into the new version.

use std::path::{Path, PathBuf};

use crate::package::error::PackageError;
use crate::package::lock::{LockEntry, LockFile, lock_file};
use crate::package::source::{Origin, parse_source};
use crate::package::stage::{self, Staging};
use crate::package::tree::{self, Diff, Rules};

/// A checked new version of one hook, staged, not yet applied.
pub struct Plan {
    /// The hook.
    pub name: String,
    /// The lock entry it has.
    pub previous: LockEntry,
    /// The lock entry it will have.
    pub entry: LockEntry,
    /// The files that change.
    pub diff: Diff,
    /// Each changed file with its changed lines (`-old`, `+new`), or one line saying why they
    /// are not shown (binary, too long).
    pub file_diffs: Vec<(String, Vec<String>)>,
    /// The installed files' tree hash when it is not the one the lock file recorded: they were
    /// edited by hand since the install, and applying this plan replaces those edits.
    pub hand_edited: Option<String>,
    /// Warnings (an insecure URL scheme).
    pub warnings: Vec<String>,
    /// Install scripts shown, not run.
    pub notes: Vec<String>,
    staging: Staging,
    staged: PathBuf,
}

impl Plan {
    /// True when the new version is the installed one.
    pub fn unchanged(&self) -> bool {
        self.diff.is_empty()
    }

    /// The directory holding the staged new version (`land`, as a hook root).
    pub fn staged_root(&self) -> PathBuf {
        self.staging.land()
    }
}

/// The installed hook `name` from the lock file.
pub fn locked(hermes_home: &Path, name: &str) -> Result<LockEntry, PackageError> {
    let lock = LockFile::load(&lock_file(hermes_home))?;
    lock.hooks.get(name).cloned().ok_or_else(|| {
        PackageError::Hooks(format!(
            "{name} was not installed by `hermes-hooks install` (no entry in {}); installed: {}",
            lock_file(hermes_home).display(),
            names(&lock)
        ))
    })
}

/// The names in the lock file, for messages.
pub fn names(lock: &LockFile) -> String {
    if lock.hooks.is_empty() {
        return "none".into();
    }
    lock.hooks.keys().cloned().collect::<Vec<_>>().join(", ")
}

/// Fetches hook `name` again and stages the new version; `reference` replaces the locked ref.
pub fn plan_update(
    hermes_home: &Path,
    name: &str,
    reference: Option<&str>,
) -> Result<Plan, PackageError> {
    let old = locked(hermes_home, name)?;
    let root = old.dir.parent().unwrap_or(Path::new("/")).to_path_buf();
    let staging = Staging::new(&root)?;
    let reference = reference.map(str::to_string).or(old.reference.clone());
    let origin = match old.kind.as_str() {
        "git" => Origin::Git {
            url: old.location.clone(),
            subdir: None,
            reference: None,
        },
        "archive" => Origin::Archive(PathBuf::from(&old.location)),
        "dir" | "link" => Origin::Dir(PathBuf::from(&old.location)),
        other => {
            return Err(PackageError::Source {
                source_text: old.source.clone(),
                reason: format!("unknown kind {other:?} in the lock file"),
            });
        }
    };
    let warnings = parse_source(&old.source)
        .ok()
        .and_then(|o| o.warning())
        .into_iter()
        .collect();
    let fetched = stage::fetch(&origin, reference.as_deref(), &staging)?;
    let src = if old.path.is_empty() {
        fetched.top.clone()
    } else {
        stage::inside(&fetched.top, &old.path)?
    };
    // Approvals, state and the lock are keyed by the name: a new version keeps it.
    let declared = stage::hook_name_of(&src, None, name)?;
    if declared != name {
        return Err(PackageError::Hooks(format!(
            "the new version of {name} says `name: {declared}` in {}: an update keeps the \
             hook's name (its approval and state are kept under it); install it as a new hook \
             (`install`), or keep `name: {name}`",
            src.join("HOOK.yaml").display()
        )));
    }
    let notes = stage::install_scripts(&fetched.top, std::slice::from_ref(&old.path));
    let linked = old.kind == "link";
    let (new_tree, staged) =
        stage::stage_hook(&src, name, fetched.own_files_only, linked, &staging)?;
    let installed = tree::walk(&old.dir, rules(false))?;
    let diff = tree::diff(
        &tree::data_only(&old.dir, &installed, false),
        &tree::data_only(&src, &new_tree, false),
    );
    if !linked {
        // What the hook wrote as data (`data:`) goes along, unless the new version ships it.
        let mut kept = tree::data_only(&staged, &installed, true);
        kept.retain(|p, _| !new_tree.contains_key(p));
        tree::copy(&old.dir, &kept, &staged)?;
    }
    let file_diffs = diff
        .changed
        .iter()
        .map(|f| (f.clone(), file_diff(&old.dir.join(f), &src.join(f))))
        .collect();
    // A linked hook is its source, edited in place on purpose: nothing of it is replaced.
    let hand_edited = match old.drift() {
        Ok(crate::package::lock::Drift::Changed(now)) if !linked => Some(now),
        _ => None,
    };
    let previous = old.clone();
    let entry = LockEntry {
        reference,
        commit: fetched.commit.clone(),
        tree: tree::hook_hash(&src, &new_tree),
        installed_at: crate::time::now(),
        ..old
    };
    Ok(Plan {
        name: name.to_string(),
        previous,
        entry,
        diff,
        file_diffs,
        hand_edited,
        warnings,
        notes,
        staging,
        staged,
    })
}

fn rules(own_files_only: bool) -> Rules {
    Rules {
        own_files_only,
        skip_git: true,
    }
}

/// Swaps the staged version into place and records it in the lock file; on failure the
/// installed version stays.
pub fn apply(plan: Plan, hermes_home: &Path) -> Result<LockEntry, PackageError> {
    let lock_path = lock_file(hermes_home);
    let mut lock = LockFile::load(&lock_path)?;
    let dir = plan.entry.dir.clone();
    let linked = plan.entry.kind == "link";
    if !linked {
        exchange(&plan.staged, &dir)?;
    }
    lock.hooks.insert(plan.name.clone(), plan.entry.clone());
    if let Err(e) = lock.save(&lock_path) {
        if !linked {
            let _ = exchange(&plan.staged, &dir);
        }
        return Err(e);
    }
    // The old version, now at `plan.staged`, goes with the staging directory.
    drop(plan.staging);
    Ok(plan.entry)
}

/// Atomically swaps two directories (both must exist).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> Result<(), PackageError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| PackageError::unsafe_entry(p, "a path with a NUL byte"))
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: both are valid NUL-terminated paths; renameat2 reads them and nothing else.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    Err(PackageError::io("swap the new version into", b)(
        std::io::Error::last_os_error(),
    ))
}

/// Swaps two directories with three renames (no `renameat2` here): not atomic, so a watching
/// service may see the hook missing for a moment.
#[cfg(not(target_os = "linux"))]
fn exchange(a: &Path, b: &Path) -> Result<(), PackageError> {
    let tmp = a.with_extension("swap");
    std::fs::rename(b, &tmp).map_err(PackageError::io("move aside", b))?;
    if let Err(e) = std::fs::rename(a, b) {
        let _ = std::fs::rename(&tmp, b);
        return Err(PackageError::io("swap the new version into", b)(e));
    }
    std::fs::rename(&tmp, a).map_err(PackageError::io("move", &tmp))
}

/// Largest file shown line by line.
const MAX_DIFFED: u64 = 256 * 1024;

/// The changed lines of one file (see [`line_diff`]), or one line saying why they are not shown.
fn file_diff(old: &Path, new: &Path) -> Vec<String> {
    let read = |p: &Path| -> Result<String, String> {
        let meta = std::fs::symlink_metadata(p).map_err(|e| e.to_string())?;
        if meta.file_type().is_symlink() {
            return std::fs::read_link(p)
                .map(|t| format!("(a link to {})\n", t.display()))
                .map_err(|e| e.to_string());
        }
        if meta.len() > MAX_DIFFED {
            return Err(format!("{} bytes", meta.len()));
        }
        let bytes = std::fs::read(p).map_err(|e| e.to_string())?;
        String::from_utf8(bytes).map_err(|_| "not text".to_string())
    };
    match (read(old), read(new)) {
        (Ok(a), Ok(b)) => match line_diff(&a, &b) {
            d if d.is_empty() => vec!["(same lines: its mode changed)".into()],
            d => d,
        },
        (Err(why), _) | (_, Err(why)) => vec![format!("(not shown line by line: {why})")],
    }
}

/// The lines of `old` and `new` that differ, as `-line` and `+line` in order (a longest
/// common subsequence diff; HOOK.yaml files are small).
pub fn line_diff(old: &str, new: &str) -> Vec<String> {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a.len() * b.len() > 4_000_000 {
        return vec!["(too long to compare line by line)".into()];
    }
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(format!("-{}", a[i]));
            i += 1;
        } else {
            out.push(format!("+{}", b[j]));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_diff_shows_changed_lines() {
        assert_eq!(
            line_diff(
                "name: a\nevents: [x]\ntimeout: 5\n",
                "name: a\nevents: [y]\ntimeout: 5\n"
            ),
            vec!["-events: [x]", "+events: [y]"]
        );
        assert!(line_diff("a\n", "a\n").is_empty());
    }
}
