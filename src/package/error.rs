//! What can go wrong installing, updating or removing a hook package; every variant says
//! which source, file or hook and why.

use std::path::PathBuf;

use thiserror::Error;

/// A failed package operation. Nothing was left in the hook root when it is returned.
#[derive(Debug, Error)]
pub enum PackageError {
    /// SOURCE could not be understood.
    #[error("{source_text:?}: {reason}")]
    Source {
        /// SOURCE as given.
        source_text: String,
        /// Why, and what to write instead.
        reason: String,
    },
    /// `git` failed.
    #[error("git {what} failed for {url}: {detail}")]
    Git {
        /// The step (clone, checkout, ...).
        what: &'static str,
        /// The repository.
        url: String,
        /// git's own message.
        detail: String,
    },
    /// A file system step failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The package holds something that may not be installed (a path or link escaping, a file
    /// owned by another user, too large, a special file).
    #[error("refused {}: {reason}", path.display())]
    Unsafe {
        /// The entry, relative to the package when it comes from one.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An archive could not be read.
    #[error("cannot read the archive {}: {reason}", path.display())]
    Archive {
        /// The archive.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A hook of the package fails `check`.
    #[error("hook {name} does not pass check: {reason}")]
    Check {
        /// The hook.
        name: String,
        /// What check says.
        reason: String,
    },
    /// Something about the hooks asked for (none found, several without `--all`, a clash).
    #[error("{0}")]
    Hooks(String),
    /// The lock file cannot be read or written.
    #[error("lock file {}: {reason}", path.display())]
    Lock {
        /// `$HERMES_HOME/hooks.lock`.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl PackageError {
    /// An [`PackageError::Io`] builder for `map_err`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { op, path, source }
    }

    /// An [`PackageError::Unsafe`].
    pub fn unsafe_entry(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Unsafe {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
