//! Repeats after a consumer is made again (issue 48 row 3): nats-server cannot update a
//! consumer that starts at a time, so a change (a rename, a widened filter on 2.9) deletes it
//! and makes it again from its ack floor. The events the old consumer had delivered above that
//! floor (run, or waiting, on a worker) then come again as *first* deliveries. The new consumer
//! carries, at the end of its description, the highest stream sequence the old one had
//! delivered; a worker shows an event up to it to its handler as delivered at least twice, as
//! README's loss budget promises for every repeat (its own count of attempts, which decides
//! retries and dead letters, is the broker's, unchanged).

/// What precedes the sequence in a consumer's description.
const MARK: &str = " [delivered before it was made again: up to stream sequence ";

/// The highest stream sequence `description` says was delivered before the consumer was made
/// again (0: none).
pub fn delivered_before(description: Option<&str>) -> u64 {
    description
        .and_then(|d| d.rsplit_once(MARK))
        .and_then(|(_, rest)| rest.strip_suffix(']'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `description` without its mark (what a worker compares with the description it wants).
pub fn unmarked(description: Option<&str>) -> Option<&str> {
    description.map(|d| d.rsplit_once(MARK).map_or(d, |(base, _)| base))
}

/// `base` marked with the higher of `top` and the mark `old` carries (none when both are 0).
pub fn marked(base: &str, old: Option<&str>, top: u64) -> String {
    let top = top.max(delivered_before(old));
    if top == 0 {
        return base.to_string();
    }
    format!("{base}{MARK}{top}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_read_back_kept_and_raised() {
        let d = marked("hermes-hooks hook a", None, 0);
        assert_eq!(d, "hermes-hooks hook a");
        assert_eq!(delivered_before(Some(&d)), 0);
        let d = marked("hermes-hooks hook a", None, 911);
        assert_eq!(delivered_before(Some(&d)), 911);
        assert_eq!(unmarked(Some(&d)), Some("hermes-hooks hook a"));
        let renamed = marked("hermes-hooks hook b", Some(&d), 700);
        assert_eq!(delivered_before(Some(&renamed)), 911, "never lowered");
        assert_eq!(unmarked(Some(&renamed)), Some("hermes-hooks hook b"));
        assert_eq!(delivered_before(Some("no mark")), 0);
        assert_eq!(delivered_before(None), 0);
    }
}
