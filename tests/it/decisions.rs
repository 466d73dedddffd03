//! Decisions never fail open (issue 33): a collect waits for the matching hooks' own timeouts
//! through a fleet edge too, names the matching hooks that cannot answer, and the Python client
//! neither loses a collect to a service that is shutting down nor hides a hook that cannot
//! answer. (The busy CPU case is in `priority.rs`, beside the other scheduling tests.)

use serde_json::json;

#[cfg(feature = "fleet")]
use crate::fleet::{fleet_of, records};

/// A fleet edge loads no hooks: its collect without `timeout_ms` used to give up after the
/// 5 s fallback. It now waits for the matching hook's own `timeout:` (120 s here) as the
/// workers report it, and returns a deny that takes 6 s.
#[cfg(feature = "fleet")]
#[test]
fn a_fleet_collect_waits_for_the_hooks_own_timeout_not_five_seconds() {
    let Some((_nats, hooks, [_w], edge)) = fleet_of("slow-deny", r#"["command:*"]"#, "", ["w1"])
    else {
        return;
    };
    let started = std::time::Instant::now();
    let (status, v) = edge.post(
        "/v1/collect",
        &json!({"event": "command:run", "context": {"pause": 6, "answer": {"decision": "deny"}}}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v,
        json!({"results": [{"hook": "slow-deny", "result": {"decision": "deny"}}], "errors": []}),
        "after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(6));
    assert_eq!(records(&hooks, "slow-deny").len(), 1);
}
