//! An ordered hook's hand-over to another version of it (a rolling update, issue 34): the
//! lease holder meets an event its version does not match and another live version does. It
//! starts nothing from that event on, lets what runs before it finish and acknowledges that,
//! stops reading its pulls and waits until their requests expired at the broker (nats-server
//! 2.9 delivers to a request nobody reads until it expires: what went there was lost until the
//! ack wait), gives that event and every later one it holds back to the broker (nak), leaves a
//! note for the next holder, and releases the lease; a worker whose version matches takes it
//! and, by its catch-up, runs them in stream order.
//!
//! The note (in the lease bucket, next to the lease; it lives one ack wait) says which events of
//! a bundle handed back part-way through already ran here (the next holder does not run them
//! again), and which ranges of stream sequences hand-overs gave back: each costs the messages
//! in it one delivery at the broker, which is not an attempt of their handler, so the next
//! holder subtracts them from the broker's count (an ordered hook's consumer has no broker-side
//! delivery limit; the worker keeps it, [`Run::handed_over`]).

use serde::{Deserialize, Serialize};

use super::deliver::*;
use super::pull::*;

/// Where an ordered hook's next event runs ([`Run::route`]).
pub(super) enum Route {
    Here,
    Elsewhere,
    Unsure,
}

/// Most hand-over ranges remembered (the oldest go first).
const RANGES: usize = 64;

/// What a holder that handed over leaves for the next one.
#[derive(Serialize, Deserialize, Default)]
pub(super) struct Note {
    /// Done keys ([`super::state::DoneKey`]) of the events of a bundle handed back part-way
    /// through that ran.
    pub(super) done: Vec<(u64, u64)>,
    /// Stream sequence ranges (first, last) whose messages hand-overs gave back, one delivery
    /// each.
    pub(super) handed: Vec<(u64, u64)>,
    /// [`Run::orphans`]: the next holder keeps it (an event a vanished holder may have
    /// started stays a "killed?" dead letter across hand-overs).
    #[serde(default)]
    pub(super) orphans: u64,
}

impl Run {
    /// Where an ordered hook's event runs: here, or on another live version of the hook (the
    /// only one that matches it); or not known yet (no version this worker knows of matches
    /// it, and a worker may have changed its version just before the event was accepted:
    /// decided again shortly, for at most [`crate::fleet::versions::Versions::patience`]).
    pub(super) fn route(&mut self, d: &Delivery) -> Route {
        if !self.s.ordered()
            || self
                .counters
                .done
                .lock()
                .is_ok_and(|done| done.contains(&d.key))
        {
            return Route::Here;
        }
        let snap = self.sh.host.snapshot();
        let Some(h) = snap.get(&self.s.name) else {
            return Route::Here;
        };
        if h.spec.patterns.matches(&d.env.event).is_some() {
            self.unsure = None;
            return Route::Here;
        }
        let versions = &self.sh.versions;
        if versions.other_matches(&self.s.key, &d.env.event) {
            self.unsure = None;
            return Route::Elsewhere;
        }
        let since = *self.unsure.get_or_insert_with(std::time::Instant::now);
        if self.draining
            || versions.known_at(super::ack::accepted(d))
            || since.elapsed() >= versions.patience(self.sh.opts.status_interval)
        {
            self.unsure = None;
            return Route::Here;
        }
        Route::Unsure
    }

    /// How many of the broker's deliveries of the message at `seq` were hand-overs.
    pub(super) fn handed_over(&self, seq: u64) -> i64 {
        self.handed
            .iter()
            .filter(|(a, b)| (*a..=*b).contains(&seq))
            .count() as i64
    }

    /// Hands the ordered hook back from the event the feed stopped at: what runs (every event
    /// before it) finishes and is acknowledged, that event and the rest of the backlog go back
    /// to the broker. Returns the note for the next holder and the event handed over for.
    pub(super) async fn hand_back(&mut self) -> (Note, Option<String>) {
        use futures_util::StreamExt;
        while self.running.next().await.is_some() {}
        while self.background.join_next().await.is_some() {}
        self.main.flush().await;
        let mut note = Note::default();
        // Handed back from here: the backlog, and what the pull had buffered (`given`).
        let first = match (self.backlog.front().map(|d| d.hseq), self.given.take()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(d) = self.backlog.front().filter(|d| d.index > 0) {
            // A bundle part-way through: its first events ran here.
            let (seq, id) = d.key;
            let base = id.wrapping_sub(d.index as u64);
            note.done = (0..d.index as u64)
                .map(|i| (seq, base.wrapping_add(i)))
                .collect();
        }
        let mut last = None;
        for d in std::mem::take(&mut self.backlog) {
            if last != Some((d.hseq, d.slot)) {
                last = Some((d.hseq, d.slot));
                d.held.give_back(d.hseq, d.slot, &d.msg, None).await;
            }
        }
        if let Some(first) = first {
            self.handed.push((first, self.top.max(first)));
            if self.handed.len() > RANGES {
                self.handed.remove(0);
            }
        }
        note.handed = self.handed.clone();
        note.orphans = self.orphans;
        // Empty: handing over for a retry (the event is not known here).
        (note, self.handing.take().filter(|e| !e.is_empty()))
    }
}

impl Run {
    /// Just took the lease: what a holder that handed over left ([`Note`]).
    pub(super) async fn read_note(
        &mut self,
        leases: &Option<(async_nats::jetstream::kv::Store, std::time::Duration)>,
    ) {
        let Some((store, _)) = leases else { return };
        let key = crate::fleet::consumer_name(&self.s.key);
        let Some(body) = crate::fleet::lease::read_note(store, &key).await else {
            return;
        };
        let Ok(note) = serde_json::from_slice::<Note>(&body) else {
            return;
        };
        if let Ok(mut done) = self.counters.done.lock() {
            for k in note.done {
                done.insert(k);
            }
        }
        self.handed = note.handed;
        self.orphans = self.orphans.max(note.orphans);
    }
}

impl Run {
    /// The pull session ended at an event for another version: what runs finishes and is
    /// acknowledged, the rest goes back, before the lease goes (it is still held: no other
    /// worker pulls meanwhile); then the lease is released and this worker stands back
    /// ([`super::holder::hand_over`]). False when stopping meanwhile.
    pub(super) async fn hand_over(
        &mut self,
        lease: Option<crate::fleet::lease::Lease>,
        leases: &Option<(async_nats::jetstream::kv::Store, std::time::Duration)>,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        let (note, head) = self.hand_back().await;
        self.forget_retries().await;
        self.main.forget();
        if let Some((store, _)) = leases {
            let body = serde_json::to_vec(&note).unwrap_or_default();
            let key = crate::fleet::consumer_name(&self.s.key);
            crate::fleet::lease::leave_note(store, &key, body).await;
        }
        super::holder::hand_over(&self.sh, &self.s, lease, leases, head.as_deref(), stop).await
    }
}

impl Run {
    /// Handing over, and what started before the event for another version is finished (the
    /// events delivered meanwhile were held).
    pub(super) fn ready_to_hand_over(&self) -> bool {
        self.handing.is_some() && self.running.is_empty() && self.background.is_empty()
    }

    /// Drops the pulls once their requests expired at the broker ([`PULLS_EXPIRED`]: what
    /// goes back then goes to the next holder, not to a request of this one nobody reads) and
    /// gives back what they had brought.
    pub(super) async fn give_back_pulls(
        &mut self,
        pulls: [async_nats::jetstream::consumer::pull::Stream; 2],
    ) {
        if let Some((low, high)) = super::holder::drop_and_give_back(pulls, PULLS_EXPIRED).await {
            self.given = Some(low);
            self.top = self.top.max(high);
        }
    }
}
