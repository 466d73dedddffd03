//! A hook that trust refuses at a reload (its approval revoked or no longer matching, its tree
//! unsafe, its handler leaving its directory) stops at once: the running call is killed and the
//! events still queued are reported as not run, instead of draining with the code that lost its
//! approval. A hook removed or disabled for any other reason still drains its queue.

use std::path::Path;
use std::sync::Arc;

use crate::discovery::{SkipCode, Skipped};
use crate::hook::LoadedHook;

/// Why the hook in `dir` must stop now, when a trust check refused it in this scan.
pub fn refusal(skipped: &[Skipped], dir: &Path) -> Option<String> {
    skipped
        .iter()
        .find(|s| {
            s.dir == dir
                && matches!(
                    s.code,
                    SkipCode::NotApproved
                        | SkipCode::Revoked
                        | SkipCode::Permissions
                        | SkipCode::HandlerOutside
                )
        })
        .map(|s| format!("not started: the hook was refused ({})", s.reason))
}

/// Stops each refused hook now; logs how many queued events were reported instead of run.
pub async fn stop_all(refused: Vec<(Arc<LoadedHook>, String)>) {
    for (hook, why) in refused {
        let left = hook.stop_now(&why).await;
        tracing::warn!(
            hook = %hook.spec.name,
            not_run = left,
            "hook stopped at once: {why}; {left} queued or running event(s) were not run"
        );
    }
}
