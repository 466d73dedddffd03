//! The check before every process start of a hook (first start, restart after a crash or a
//! timeout, each call of an executable, loading a library): the hook's tree must still pass the
//! permission checks, and its files that can run must be the ones this version was loaded (and,
//! with `--trust explicit`, approved) with. Otherwise the start is refused: a replaced helper
//! module, or a broken edit whose new version did not load, never runs under the old version's
//! name. Restoring the files lets the version start again; a reload loads the new files as a new
//! version (when they load and are approved).

use crate::handler::{HandlerContext, HandlerError};
use crate::trust::files::{describe_changes, digest_of};

/// Refuses the start when the hook's tree changed since its version loaded, or is no longer
/// safe. Runs the walk off the runtime's worker threads.
pub async fn check(ctx: &HandlerContext) -> Result<(), HandlerError> {
    let files = ctx.files.clone();
    let name = ctx.name.clone();
    let now = tokio::task::spawn_blocking(move || files.rescan())
        .await
        .map_err(|e| HandlerError::Load(format!("checking the hook's files failed: {e}")))?;
    let refuse = |msg: String| {
        tracing::warn!(hook = %name, "process start refused: {msg}");
        Err(HandlerError::Load(format!("not started: {msg}")))
    };
    match now {
        Ok(now) if digest_of(&now) == ctx.files.digest() => Ok(()),
        Ok(now) => refuse(format!(
            "{} since this version of the hook was loaded; only the files it was loaded (and \
             approved) with run. Restore them, or fix the hook so that the reload loads the new \
             version",
            describe_changes(&ctx.files.files, &now)
        )),
        Err(e) => refuse(e.to_string()),
    }
}
