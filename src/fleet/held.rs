//! The events a worker holds for one hook's consumer during one pull session: delivered, not
//! yet acknowledged. It owns their acknowledgements and their progress signals.
//!
//! - **Acknowledgements.** On a consumer with `AckPolicy::All` (ordered hooks) one
//!   acknowledgement of stream sequence `s` acknowledges every event of the consumer up to `s`.
//!   So an event is only marked finished here, and [`Held::flush`] acknowledges the highest
//!   sequence below which every held event is finished (one message per batch instead of one per
//!   event); an event still running, or handed back for redelivery (`Nak`), stops the flush
//!   there, so no event is ever acknowledged that did not run. On an `Explicit` consumer each
//!   event is acknowledged on its own when it finishes.
//! - **Progress.** [`Held::progress`] (every third of the ack wait) sends a progress signal for
//!   every held event that is not finished, so none is redelivered while it waits in the hook's
//!   local queue or runs: one timer per session instead of a task and a timer per event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_nats::jetstream::{AckKind, Message};
use tokio::sync::Notify;

/// One held event.
struct Slot {
    msg: Arc<Message>,
    /// Finished (acknowledged by the next [`Held::flush`]).
    done: bool,
}

/// The events held for one consumer (see the module comment).
pub struct Held {
    ack_all: bool,
    slots: Mutex<BTreeMap<u64, Slot>>,
    /// Woken when an event finishes (the flusher batches what finished meanwhile).
    pub finished: Notify,
}

impl Held {
    /// For a consumer whose acknowledgement policy is `All` (`ack_all`) or `Explicit`.
    pub fn new(ack_all: bool) -> Self {
        Self {
            ack_all,
            slots: Mutex::new(BTreeMap::new()),
            finished: Notify::new(),
        }
    }

    /// Whether acknowledgements are cumulative (`AckPolicy::All`).
    pub fn ack_all(&self) -> bool {
        self.ack_all
    }

    /// Holds a delivered event (a redelivery replaces the message of its sequence).
    pub fn hold(&self, seq: u64, msg: Arc<Message>) {
        if let Ok(mut s) = self.slots.lock() {
            s.insert(seq, Slot { msg, done: false });
        }
    }

    /// The event at `seq` is finished: acknowledged at once (`Explicit`, or `kind` is not a
    /// plain acknowledgement there), or by the next flush (`All`).
    pub async fn finish(&self, seq: u64, msg: &Message, kind: AckKind) {
        if self.ack_all && seq > 0 {
            let marked = match self.slots.lock() {
                Ok(mut s) => match s.get_mut(&seq) {
                    Some(slot) => {
                        slot.done = true;
                        true
                    }
                    None => false,
                },
                Err(_) => false,
            };
            if marked {
                self.finished.notify_one();
                return;
            }
            // Not held (cannot happen for a delivery this session dispatched): never send a
            // cumulative acknowledgement for it; the broker redelivers it after the ack wait.
            tracing::debug!(seq, "fleet: finished event not held; left to the ack wait");
            return;
        }
        if let Ok(mut s) = self.slots.lock() {
            s.remove(&seq);
        }
        // Boxed: the publish's future would otherwise be part of every event's (see `settle`).
        if let Err(e) = Box::pin(msg.ack_with(kind)).await {
            tracing::warn!(
                seq,
                "fleet: acknowledgement not sent ({e}); the event will come again"
            );
        }
    }

    /// Hands the event at `seq` back for redelivery (after `delay`). On an `All` consumer it
    /// stays held, unfinished, so no flush acknowledges past it until it is redelivered and
    /// finished.
    pub async fn give_back(&self, seq: u64, msg: &Message, delay: Option<std::time::Duration>) {
        if !self.ack_all
            && let Ok(mut s) = self.slots.lock()
        {
            s.remove(&seq);
        }
        let _ = msg.ack_with(AckKind::Nak(delay)).await;
    }

    /// `All`: acknowledges the highest sequence up to which every held event is finished, and
    /// forgets those events. Returns how many it acknowledged.
    pub async fn flush(&self) -> usize {
        if !self.ack_all {
            return 0;
        }
        let (last, n) = {
            let Ok(mut s) = self.slots.lock() else {
                return 0;
            };
            let mut last = None;
            let mut n = 0;
            while let Some(entry) = s.first_entry() {
                if !entry.get().done {
                    break;
                }
                last = Some(entry.remove().msg);
                n += 1;
            }
            (last, n)
        };
        if let Some(msg) = last
            && let Err(e) = msg.ack().await
        {
            tracing::warn!(
                "fleet: acknowledgement of {n} event(s) not sent ({e}); they will come again"
            );
        }
        n
    }

    /// Sends a progress signal for every held event not finished.
    pub async fn progress(&self) {
        let msgs: Vec<Arc<Message>> = match self.slots.lock() {
            Ok(s) => s
                .values()
                .filter(|slot| !slot.done)
                .map(|slot| slot.msg.clone())
                .collect(),
            Err(_) => return,
        };
        for m in msgs {
            let _ = m.ack_with(AckKind::Progress).await;
        }
    }

    /// Forgets every held event (the lease was lost and the events still held were handed
    /// back: whoever pulls next gets them).
    pub fn forget(&self) {
        if let Ok(mut s) = self.slots.lock() {
            s.clear();
        }
    }

    /// Hands back every held event not finished (stopping: another worker takes them now).
    pub async fn give_back_all(&self) {
        let msgs: Vec<(u64, Arc<Message>)> = match self.slots.lock() {
            Ok(s) => s
                .iter()
                .filter(|(_, slot)| !slot.done)
                .map(|(seq, slot)| (*seq, slot.msg.clone()))
                .collect(),
            Err(_) => return,
        };
        for (seq, m) in msgs {
            self.give_back(seq, &m, None).await;
        }
    }
}

/// Flushes `held` when events finish (at most every `every`, so a burst is one
/// acknowledgement) and sends its progress signals every `progress`; runs until aborted.
pub async fn tend(held: Arc<Held>, every: std::time::Duration, progress: std::time::Duration) {
    let mut tick = tokio::time::interval(progress);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = held.finished.notified() => {
                held.flush().await;
                tokio::time::sleep(every).await;
            }
            _ = tick.tick() => held.progress().await,
        }
    }
}
