//! One event of a delivered message on its way to the handler ([`Delivery`]): finishing it,
//! settling it for good, handing it back.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use crate::fleet::envelope::Envelope;
use crate::fleet::held::Held;
use crate::fleet::versions::NoVersion;

use super::state::*;

/// One event of a delivered message, about to run.
pub(super) struct Delivery {
    pub(super) msg: Arc<jetstream::Message>,
    /// Deliveries of the event so far, this one included (a retry's count goes on).
    pub(super) delivered: i64,
    /// The event's stream sequence (a retry's: the original's).
    pub(super) seq: u64,
    /// This message's own stream sequence (where it is held).
    pub(super) hseq: u64,
    /// The message's holding ([`Held::hold`]).
    pub(super) slot: u64,
    /// Its place in the message (a bundle's events are 0, 1, ...; an event alone is 0).
    pub(super) index: usize,
    pub(super) key: DoneKey,
    pub(super) env: Envelope,
    pub(super) held: Arc<Held>,
}

impl Delivery {
    /// This event is finished (the message is once all its events are).
    pub(super) async fn finish(&self, kind: AckKind) {
        self.held
            .finish(self.hseq, self.slot, &self.msg, kind)
            .await;
    }

    /// This event is settled for good here (handled, or handed on to the retry subject): finished,
    /// and known as done, so a delivery of its message again (a bundle handed back for another
    /// of its events, a broker that lost the acknowledgement) does not run it twice here.
    pub(super) async fn settled(&self, counters: &Counters) {
        self.finish(AckKind::Ack).await;
        if let Ok(mut done) = counters.done.lock() {
            done.insert(self.key);
        }
    }

    /// Acknowledges this event unrun, counted `skipped`: only with the proof that no version of
    /// the hook matches it ([`crate::fleet::versions::Versions::fate`]).
    pub(super) async fn skip(&self, _proof: NoVersion, counters: &Counters) {
        counters
            .skipped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.settled(counters).await;
    }

    /// Hands this event back: its whole message comes again (after `delay`).
    pub(super) async fn give_back(&self, delay: Option<Duration>) {
        self.held
            .give_back(self.hseq, self.slot, &self.msg, delay)
            .await;
    }
}
