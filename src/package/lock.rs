//! `$HERMES_HOME/hooks.lock`: per installed hook where it came from (the SOURCE, the ref asked
//! for, the commit resolved), the tree hash of what was installed and when. JSON, written
//! atomically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::package::error::PackageError;

/// Name of the lock file inside `$HERMES_HOME`.
pub const LOCK_FILE: &str = "hooks.lock";

/// `$HERMES_HOME/hooks.lock`.
pub fn lock_file(hermes_home: &Path) -> PathBuf {
    hermes_home.join(LOCK_FILE)
}

/// One installed hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockEntry {
    /// SOURCE as given to `install`.
    pub source: String,
    /// `git`, `dir`, `link` or `archive`.
    pub kind: String,
    /// The repository URL, directory or archive fetched (absolute for local ones).
    pub location: String,
    /// The hook's directory inside the package (`""` for its top).
    #[serde(default)]
    pub path: String,
    /// The ref asked for (`--ref` or a browser URL's), if any.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The commit installed (git sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// [`crate::package::tree::tree_hash`] of the hook directory as installed.
    pub tree: String,
    /// The installed hook directory.
    pub dir: PathBuf,
    /// When it was installed or last updated (RFC 3339 UTC).
    pub installed_at: String,
}

impl LockEntry {
    /// The version as `list` shows it: the ref and short commit, else the short tree hash.
    pub fn version(&self) -> String {
        let tree = self.tree.trim_start_matches("sha256:");
        match (&self.reference, &self.commit) {
            (Some(r), Some(c)) => format!("{r}@{}", &c[..c.len().min(12)]),
            (None, Some(c)) => c[..c.len().min(12)].to_string(),
            _ => format!("tree {}", &tree[..tree.len().min(12)]),
        }
    }
}

/// How an installed hook's files compare with its lock entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// The files hash as recorded.
    Same,
    /// The directory is gone.
    Missing,
    /// The files hash to something else (edited by hand): the hash now.
    Changed(String),
}

impl LockEntry {
    /// Walks the installed directory and compares its hash with the recorded one.
    pub fn drift(&self) -> Result<Drift, PackageError> {
        if !self.dir.exists() {
            return Ok(Drift::Missing);
        }
        let rules = crate::package::tree::Rules {
            own_files_only: false,
            skip_git: true,
        };
        let tree = crate::package::tree::walk(&self.dir, rules)?;
        let now = crate::package::tree::hook_hash(&self.dir, &tree);
        Ok(if now == self.tree {
            Drift::Same
        } else {
            Drift::Changed(now)
        })
    }
}

/// The content of `hooks.lock`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockFile {
    /// Format version (1).
    #[serde(default = "one")]
    pub version: u32,
    /// Installed hooks by name.
    #[serde(default)]
    pub hooks: BTreeMap<String, LockEntry>,
}

fn one() -> u32 {
    1
}

impl LockFile {
    /// Reads `path`; a missing file is an empty lock.
    pub fn load(path: &Path) -> Result<Self, PackageError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self {
                    version: 1,
                    ..Self::default()
                });
            }
            Err(e) => return Err(PackageError::io("read", path)(e)),
        };
        serde_json::from_str(&text).map_err(|e| PackageError::Lock {
            path: path.to_path_buf(),
            reason: format!("not valid JSON ({e}); fix or remove it"),
        })
    }

    /// Writes `path` atomically (mode 0644).
    pub fn save(&self, path: &Path) -> Result<(), PackageError> {
        let mut text = serde_json::to_string_pretty(self).map_err(|e| PackageError::Lock {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        text.push('\n');
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(PackageError::io("create", dir))?;
        }
        crate::atomic::write(path, text.as_bytes(), 0o644).map_err(|e| PackageError::Lock {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }
}
