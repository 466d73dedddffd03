//! Duplicates after a broker crash: nats-server (2.9 at least) writes a consumer's state
//! lazily, so a broker killed with SIGKILL can come back with an older state and deliver again,
//! as first deliveries (`delivered` 1), events the fleet had already finished. A worker keeps,
//! per hook, the highest stream sequence it has been given and that message's publish time: a
//! first delivery at or below it, of a message published no later, is such a replay and is
//! counted as `duplicate`. This worker's own finished events among them are acknowledged
//! without running the handler (also counted as `already_done`); the others run again (their
//! first handling may have been on another worker: possible duplicates). A stream recreated
//! empty reuses sequences for new messages, which are published later: not counted.
//!
//! Only what this worker has seen counts: a replayed event above its own high-water mark
//! (handled by another worker) is not recognised.

use std::sync::Mutex;

/// The highest delivery a worker has had for one hook.
#[derive(Default)]
pub struct HighWater {
    seen: Mutex<Option<(u64, i128)>>,
}

impl HighWater {
    /// Records a delivery (`published` in nanoseconds since the epoch); true when it is a first
    /// delivery replayed by a broker that lost consumer state.
    pub fn replayed(&self, delivered: i64, seq: u64, published: i128) -> bool {
        let Ok(mut seen) = self.seen.lock() else {
            return false;
        };
        match *seen {
            Some((high, at)) if seq <= high => delivered == 1 && published <= at,
            _ => {
                *seen = Some((seq, published));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_delivery_below_the_high_water_mark_is_a_replay_unless_published_later() {
        let h = HighWater::default();
        assert!(!h.replayed(1, 5, 500));
        assert!(!h.replayed(1, 9, 900));
        assert!(h.replayed(1, 7, 700), "rolled back");
        assert!(!h.replayed(2, 7, 700), "a redelivery is not a replay");
        assert!(
            !h.replayed(1, 3, 1000),
            "a recreated stream reuses sequences for new events"
        );
    }
}
