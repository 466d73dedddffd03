//! What trust refused or could not do, worded for an operator.

use std::path::PathBuf;

use thiserror::Error;

/// Something trust refused or could not do, worded for an operator.
#[derive(Debug, Error)]
pub enum TrustError {
    /// No hook of that name in any root.
    #[error("no hook named {name:?} in {roots}")]
    NotFound {
        /// The name asked for.
        name: String,
        /// The roots searched, for the message.
        roots: String,
    },
    /// A file could not be read or written.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The approvals file is not what this program writes.
    #[error("{} is not a valid approvals file ({reason}); fix or remove it, then approve hooks again with `hermes-hooks enable NAME --trust explicit`", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        reason: String,
    },
    /// The hook cannot be approved or edited as it is.
    #[error("{}: {reason}", path.display())]
    Refused {
        /// The file the problem is in.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
}

impl From<crate::atomic::WriteError> for TrustError {
    fn from(e: crate::atomic::WriteError) -> Self {
        TrustError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}
