//! Decisions that never fail open (issue 19): how long a collect waits when its caller gives no
//! deadline, and how a decision hook that ran out of time is reported.
//!
//! The original host awaited every decision handler inline, so a `command:*` hook that denies
//! after 6 s (its own `timeout: 30`) was waited for. Here a collect without `timeout_ms` waits as
//! long as the matching hooks' own timeouts allow: for each hook its `timeout` once per event
//! ahead of this one (queued, taken by a worker and written ahead to a Python window, or
//! running: issue 47; a call taken by the version a reload replaced keeps that version's
//! `timeout`: issue 59) plus this one, and a second for the answer to travel; the longest of
//! these, at most [`MAX_WAIT`]. A caller may still pass a shorter deadline.

use std::time::Duration;

use crate::discovery::SkipCode;
use crate::pattern::PatternSet;
use crate::registry::Registry;

/// A hook that a collect's event matches but that cannot answer: its directory did not load.
/// The answer names it, so that "nobody objects" and "the objector is not running" differ.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unanswerable {
    /// Hook name.
    pub hook: String,
    /// `refused` (trust: not approved, approval revoked, unsafe permissions, a handler outside
    /// its directory), `disabled` (`enabled: false`: a decision it would have given is
    /// missing, and whoever fails closed must know; issue 46) or `not_loaded` (its handler
    /// failed to load, is missing or unusable, a `requires:` does not hold, a field is invalid).
    pub state: &'static str,
    /// Why, as `/v1/hooks` `skipped` says it.
    pub reason: String,
}

/// The hooks of `reg` whose directory did not load but whose `events:` match `event`, in
/// discovery order. A disabled hook (`enabled: false`) is listed: whoever disabled it (an
/// operator, or anything that could write its HOOK.yaml) took away a decision, and a caller that
/// fails closed counts it. One shadowed by a hook of the same name is not listed; neither is
/// one whose HOOK.yaml could not be read (its events are unknown) nor one whose previous
/// version still runs (it answers).
pub fn unanswerable(reg: &Registry, event: &str) -> Vec<Unanswerable> {
    reg.skipped
        .iter()
        .filter(|s| !s.events.is_empty())
        .filter(|s| !reg.hooks.iter().any(|h| h.spec.name == s.name))
        .filter_map(|s| {
            let state = match s.code {
                SkipCode::Shadowed => return None,
                SkipCode::Disabled | SkipCode::Revoked => "disabled",
                SkipCode::NotApproved | SkipCode::Permissions | SkipCode::HandlerOutside => {
                    "refused"
                }
                _ => "not_loaded",
            };
            PatternSet::new(&s.events).ok()?.matches(event)?;
            Some(Unanswerable {
                hook: s.name.clone(),
                state,
                reason: s.reason.clone(),
            })
        })
        .collect()
}

/// Longest wait a collect gets (the longest `timeout:` a hook may have, plus the answer's second).
pub const MAX_WAIT: Duration = Duration::from_secs(301);
/// Time for an answer to come back after a handler's own timeout fired (kill, restart, reply).
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// How long a collect of `event` waits by default: `None` when no hook of `reg` matches (the
/// caller's default applies).
pub fn collect_budget(reg: &Registry, event: &str) -> Option<Duration> {
    reg.matching(event)
        .into_iter()
        .map(|hook| {
            hook.ahead_budget()
                .saturating_add(hook.spec.manifest.timeout)
                .saturating_add(ANSWER_GRACE)
        })
        .max()
        .map(|d| d.min(MAX_WAIT))
}

/// How long a fleet edge's collect waits by default for a hook whose `timeout:` is `timeout` and
/// whose workers last reported `lag` events not settled (in the stream, queued, written ahead or
/// running): `timeout` once for each, once for a call that started since the report, once for
/// this event, and the answer's second; at most [`MAX_WAIT`].
#[cfg(feature = "fleet")]
pub fn fleet_budget(timeout: Duration, lag: u64) -> Duration {
    let calls = u32::try_from(lag).unwrap_or(u32::MAX).saturating_add(2);
    timeout
        .saturating_mul(calls)
        .saturating_add(ANSWER_GRACE)
        .min(MAX_WAIT)
}

/// Whether an outcome's error means the hook ran out of time (its own `timeout`, or the
/// collect's deadline) rather than failing: reported as `"timed_out": true`.
pub fn is_timeout(error: &str) -> bool {
    error.starts_with("timed out after") || error.starts_with("no result within the deadline")
}
