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
//! again), and which ranges of stream sequences hand-overs and releases gave back: each costs
//! the messages in it one delivery at the broker, which is not an attempt of their handler, so
//! the next holder subtracts them from the broker's count (an ordered hook's consumer has no
//! broker-side delivery limit; the worker keeps it, [`Run::handed_over`]). A holder that stops
//! or loses the lease leaves one too ([`Run::leave_release_note`]: what its pulls had buffered,
//! handed back, and what its backlog held unstarted, left to the ack wait); one that lost the
//! lease writes it after the next holder took it, which reads it again when its catch-up is
//! over ([`Run::reread_note`]).

use serde::{Deserialize, Serialize};

use crate::fleet::versions::Fate;

use super::deliver::*;
use super::pull::*;

/// Where an ordered hook's next event runs ([`Run::route`]).
pub(super) enum Route {
    Here,
    Elsewhere,
    Unsure,
    /// Neither this worker's version (it does not match it, or it is retiring) nor another
    /// live one runs it: its fate ([`crate::fleet::versions::Fate::Owed`] or `Nobody`),
    /// decided here in stream order before anything after it starts ([`super::feed`]'s
    /// `not_here`), never by a handler call that finds no match.
    Unrun(Fate),
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
    /// The highest stream sequence of [`Note::orphan_spans`], for a worker of a release before
    /// them (which dead-letters everything up to it past its deliveries).
    #[serde(default)]
    pub(super) orphans: u64,
    /// [`Run::orphans`]: the next holder keeps them (an event a vanished holder may have
    /// started stays a "killed?" dead letter across hand-overs).
    #[serde(default)]
    pub(super) orphan_spans: Vec<crate::fleet::attempts::Span>,
}

impl Run {
    /// Where an ordered hook's event runs: here (this worker's version matches it and takes
    /// new events), or on another live version of the hook (the only one that matches it: the
    /// in-order hand-over); when neither, its fate is decided now, in stream order (a dead
    /// letter or, with the proof that no version matches it, a skip): never a handler call
    /// that finds no match and decides afterwards, when the events after it may have started
    /// (the nemesis's seed 17722090543346195135 on 2.15: such an event went to the retry
    /// subject once a version that matched it came back, and first ran after later events).
    /// Not known yet when a worker may have changed its version just before the event was
    /// accepted, or this worker has not heard every live worker yet: decided again shortly,
    /// for as long as [`crate::fleet::versions::Versions::undecided`] says.
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
        let mine = h.spec.patterns.matches(&d.env.event).is_some();
        if mine && !self.past_retirement(d) {
            self.unsure = None;
            return Route::Here;
        }
        let versions = &self.sh.versions;
        if versions.other_matches(&self.s.key, &d.env.event, Some(d.seq)) {
            self.unsure = None;
            return Route::Elsewhere;
        }
        let own = self.sh.opts.status_interval;
        let accepted = super::ack::accepted(d);
        let known = versions.known_at(accepted, own);
        let since = *self.unsure.get_or_insert_with(std::time::Instant::now);
        if !known && !self.draining && versions.undecided(since, own) {
            return Route::Unsure;
        }
        self.unsure = None;
        match super::ack::not_run_here(&self.sh, &self.s, d) {
            Fate::Nobody(_) if !known => Route::Unrun(Fate::Owed(format!(
                "no version of the hook this worker knows of matches {:?}, but not every live worker's versions were known for when it was accepted (waited {}): a version not heard of may match it, then `dead replay` runs this event",
                d.env.event,
                crate::time::fmt_duration(since.elapsed())
            ))),
            Fate::Elsewhere => Route::Elsewhere,
            fate => Route::Unrun(fate),
        }
    }

    /// Told to hand over by a call (a retry for another version, or an event a reload's
    /// version did not match, back in the backlog with the ones behind it): the event at the
    /// front of the backlog when this worker's version does not match it (the hand-over then
    /// ends early when no other live version matches it either: this worker takes the lease
    /// back and routes it), else none (empty: the hand-over waits for another worker).
    pub(super) fn unmatched_head(&mut self) -> String {
        self.take_back();
        let snap = self.sh.host.snapshot();
        let theirs = |e: &str| {
            snap.get(&self.s.name)
                .is_some_and(|h| h.spec.patterns.matches(e).is_none())
        };
        self.backlog
            .front()
            .filter(|d| theirs(&d.env.event))
            .map(|d| d.env.event.clone())
            .unwrap_or_default()
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
        // What did not start comes back (an ordered hook's events its version, changed by a
        // reload, did not match, and the ones behind them): it goes back with the rest.
        self.take_back();
        self.main.flush().await;
        let mut note = Note::default();
        // Handed back from here: the backlog, and what the pull had buffered (`given`).
        let first = match (self.backlog.front().map(|d| d.hseq), self.given.take()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut part_way = Vec::new();
        if let Some(d) = self.backlog.front().filter(|d| d.index > 0) {
            // A bundle part-way through: its first events ran here.
            let (seq, id) = d.key;
            let base = id.wrapping_sub(d.index as u64);
            part_way = (0..d.index as u64)
                .map(|i| (seq, base.wrapping_add(i)))
                .collect();
        }
        note.done = self.note_done(part_way);
        let mut last = None;
        for d in std::mem::take(&mut self.backlog) {
            if last != Some((d.hseq, d.slot)) {
                last = Some((d.hseq, d.slot));
                d.held.give_back(d.hseq, d.slot, &d.msg, None).await;
            }
        }
        // What ran and could not be acknowledged before without making a hand-back above
        // invalid (the broker's ack floor, [`crate::fleet::held`]) is acknowledged now.
        self.main.flush().await;
        if let Some(first) = first {
            self.released(first, self.top.max(first));
        }
        self.end_release();
        note.handed = self.handed.clone();
        (note.orphans, note.orphan_spans) = self.orphans_for_note();
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
        let Some(note) = fetch_note(store, &crate::fleet::consumer_name(&self.s.key)).await else {
            return;
        };
        self.inherited.clear();
        self.inherit_done(note.done);
        self.join_handed(note.handed);
        self.orphans_from_note(note.orphans, note.orphan_spans);
    }

    /// Marks the done keys of a note done here (a delivery of one again is settled without
    /// running it) and passes them on in this holder's own note.
    fn inherit_done(&mut self, keys: Vec<super::state::DoneKey>) {
        if let Ok(mut done) = self.counters.done.lock() {
            for k in &keys {
                done.insert(*k);
            }
        }
        self.inherited.extend(keys);
    }

    /// Adds the ranges of a note this worker has not counted yet (each range is one release:
    /// the same range from two notes is the same release).
    fn join_handed(&mut self, ranges: Vec<(u64, u64)>) {
        for r in ranges {
            if !self.handed.contains(&r) {
                self.handed.push(r);
            }
        }
        let over = self.handed.len().saturating_sub(RANGES);
        self.handed.drain(..over);
    }

    /// A new holder's catch-up is over: a holder that lost the lease left its note after this
    /// one took it (it stood down meanwhile). Its done keys are done here too, and its new ranges
    /// lower the count of the events they cover that are here (triaged with the note read when
    /// the lease was taken).
    pub(super) async fn reread_note(
        &mut self,
        store: &async_nats::jetstream::kv::Store,
        key: &str,
    ) {
        let Some(note) = fetch_note(store, key).await else {
            return;
        };
        // What it finished last (a consumer made again meanwhile delivers that again).
        self.inherit_done(note.done);
        let new: Vec<(u64, u64)> = note
            .handed
            .into_iter()
            .filter(|r| !self.handed.contains(r))
            .collect();
        for d in self.backlog.iter_mut() {
            let more = new
                .iter()
                .filter(|(a, b)| (*a..=*b).contains(&d.hseq))
                .count() as i64;
            d.delivered = (d.delivered - more).max(1);
        }
        self.join_handed(new);
        self.orphans_from_note(note.orphans, note.orphan_spans);
    }

    /// [`Note::orphans`] and [`Note::orphan_spans`] of this holder's [`Run::orphans`].
    fn orphans_for_note(&self) -> (u64, Vec<crate::fleet::attempts::Span>) {
        let top = self.orphans.iter().map(|(_, b)| b.0).max().unwrap_or(0);
        (top, self.orphans.clone())
    }

    /// Takes on a note's spans; a note of a release before them names only the highest
    /// stream sequence, and everything up to it counts.
    fn orphans_from_note(&mut self, top: u64, spans: Vec<crate::fleet::attempts::Span>) {
        if spans.is_empty() && top > 0 {
            self.add_orphans(vec![((0, 0), (top, usize::MAX))]);
        } else {
            self.add_orphans(spans);
        }
    }
}

/// The note a holder left on the lease key `key`, if one is there and readable.
async fn fetch_note(store: &async_nats::jetstream::kv::Store, key: &str) -> Option<Note> {
    let body = crate::fleet::lease::read_note(store, key).await?;
    serde_json::from_slice(&body).ok()
}

impl Run {
    /// The messages from `first` to `last` went back to the broker, or were left to its ack
    /// wait, before any handler call (a stop, a lost lease, a hand-over): the broker's next
    /// delivery of each is no attempt.
    pub(super) fn released(&mut self, first: u64, last: u64) {
        let r = self.releasing.get_or_insert((first, last));
        *r = (r.0.min(first), r.1.max(last));
    }

    /// The release under way is over: its range joins [`Run::handed`] (one per release, so
    /// that ranges overlapping within one release do not count twice).
    pub(super) fn end_release(&mut self) {
        if let Some(r) = self.releasing.take() {
            self.join_handed(vec![r]);
        }
    }

    /// The done keys a note carries: `first` (a bundle's events that ran here), the last ones
    /// this holder inherited, and the events finished here last
    /// ([`super::state::Recent::latest`]). On nats-server 2.9 a consumer made by start time
    /// cannot be changed, so a worker whose new version must change it makes it again from the
    /// ack floor it read (`crate::fleet::versions::update_consumer`): what the holder ran and
    /// acknowledged meanwhile comes again as first deliveries, and the next holder must not run
    /// it twice (issue 34).
    fn note_done(&self, first: Vec<super::state::DoneKey>) -> Vec<super::state::DoneKey> {
        let mut out = first;
        let skip = self.inherited.len().saturating_sub(super::state::LATEST);
        out.extend(self.inherited.iter().skip(skip).copied());
        if let Ok(done) = self.counters.done.lock() {
            out.extend(done.latest().copied());
        }
        let mut seen = std::collections::HashSet::with_capacity(out.len());
        out.retain(|k| seen.insert(*k));
        out
    }

    /// Stopping or standing down: leaves the next holder a note of what releases gave back (with
    /// the done keys this holder inherited), so that those deliveries are not counted as attempts.
    pub(super) async fn leave_release_note(
        &mut self,
        leases: &Option<(async_nats::jetstream::kv::Store, std::time::Duration)>,
    ) {
        self.end_release();
        let Some((store, _)) = leases else { return };
        let (orphans, orphan_spans) = self.orphans_for_note();
        let note = Note {
            done: self.note_done(Vec::new()),
            handed: self.handed.clone(),
            orphans,
            orphan_spans,
        };
        let body = serde_json::to_vec(&note).unwrap_or_default();
        let key = crate::fleet::consumer_name(&self.s.key);
        crate::fleet::lease::leave_note(store, &key, body).await;
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
        self.clear_marks().await;
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
