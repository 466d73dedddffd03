//! The check before every process start of a hook (first start, restart after a crash or a
//! timeout, each call of an executable, loading a library): the hook's tree must still pass the
//! permission checks, and its files that can run must be the ones this version was loaded (and,
//! with `--trust explicit`, approved) with. Otherwise the start is refused: a replaced helper
//! module, or a broken edit whose new version did not load, never runs under the old version's
//! name. Restoring the files lets the version start again; a reload loads the new files as a new
//! version (when they load and are approved).
//!
//! The handler kinds call [`check_blocking`] with their context's record (on the hook's own
//! starter thread); the refusal converts into their
//! load error, so this file knows nothing of the handlers.

use crate::trust::files::{RunFiles, describe_changes, digest_of};

/// A refused process start, worded for an operator (`not started: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not started: {why}")]
pub struct StartRefused {
    /// Why, for an operator.
    pub why: String,
    /// The files changed (rather than became unsafe or unreadable): a newer version of the hook
    /// may load them, and the events waiting for this one can wait for that one.
    pub changed: bool,
}

impl StartRefused {
    fn new(why: String, changed: bool) -> Self {
        Self { why, changed }
    }
}

/// Refuses the start when the tree of hook `hook` changed since `loaded` was recorded, or is no
/// longer safe. Blocks (it walks the tree and may read and hash): the handlers call it on the
/// hook's own starter thread (`handler/starter.rs`), never on a runtime or shared thread.
pub fn check_blocking(loaded: &RunFiles, hook: &str) -> Result<(), StartRefused> {
    let now = loaded.rescan();
    let (why, changed) = match now {
        Ok(now) if digest_of(&now) == loaded.digest() => return Ok(()),
        Ok(now) => (
            format!(
                "{} since this version of the hook was loaded; only the files it was loaded (and \
             approved) with run. Restore them, or fix the hook so that the reload loads the new \
             version",
                describe_changes(&loaded.files, &now)
            ),
            true,
        ),
        // A file that vanished between the listing and its read is an edit in progress (an
        // editor's or a deploy's temporary file renamed away): the files changed, and the
        // version that loads them can take the events, as for any other change.
        Err(crate::trust::files::TreeError::Unreadable { path, reason })
            if std::fs::symlink_metadata(&path).is_err() =>
        {
            (
                format!(
                    "{} was removed while the hook's files were checked ({reason}): the files \
                 changed since this version of the hook was loaded; only the files it was \
                 loaded (and approved) with run",
                    path.display()
                ),
                true,
            )
        }
        Err(e) => (e.to_string(), false),
    };
    tracing::warn!(hook = %hook, "process start refused: {why}");
    Err(StartRefused::new(why, changed))
}
