//! What to do with a delivered message ([`Triage`]): settle it at once (done already, a
//! retry not due, unreadable) or split it into its events, and hold them in the backlog.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::jetstream::{self, AckKind};

use crate::fleet::held::Held;

use super::deliver::*;
use super::pull::*;
use super::state::*;

/// What to do with a delivered message.
pub(super) enum Triage {
    /// Finish it without running a handler (already counted).
    Settle(Arc<jetstream::Message>, u64, AckKind),
    /// Its events (held from here), each to run, or to settle on its own ([`Run::start`]).
    Events(Vec<Delivery>),
}

impl Run {
    /// The held messages of the consumer a delivery came from.
    pub(super) fn held(&self, source: Source) -> &Arc<Held> {
        match source {
            Source::Main => &self.main,
            Source::Retry => &self.retry,
        }
    }

    pub(super) fn triage(&self, msg: Arc<jetstream::Message>, source: Source) -> Triage {
        let (s, counters) = (&self.s, &self.counters);
        let (broker_delivered, hseq, replayed) = match msg.info() {
            Ok(i) => {
                let at = i.published.unix_timestamp_nanos();
                let replayed = source == Source::Main
                    && counters.high.replayed(i.delivered, i.stream_sequence, at);
                (i.delivered, i.stream_sequence, replayed)
            }
            Err(_) => (1, 0, false),
        };
        // Counted per event: the message's first here, the rest of a bundle's below.
        counters.messages.fetch_add(1, Ordering::Relaxed);
        counters.delivered.fetch_add(1, Ordering::Relaxed);
        if replayed {
            counters.duplicate.fetch_add(1, Ordering::Relaxed);
        }
        let (delivered, seq) = match source {
            // A retry on a consumer of every event: its hook's retry consumer runs it.
            Source::Main if crate::fleet::retry::is_retry(&self.sh.cfg, &msg.subject) => {
                return Triage::Settle(msg, hseq, AckKind::Ack);
            }
            // Deliveries that were hand-overs to another version are no attempts.
            Source::Main => ((broker_delivered - self.handed_over(hseq)).max(1), hseq),
            Source::Retry => match crate::fleet::retry::Retry::read(&msg) {
                Some(r) => (r.delivered + broker_delivered, r.seq),
                None => (i64::MAX, hseq),
            },
        };
        let envs = match crate::fleet::envelope::read(&msg.payload) {
            Ok(e) if delivered != i64::MAX => e,
            Ok(_) => {
                tracing::warn!(hook = %s.name, seq, "fleet: retry without its headers in the stream; dropping it");
                counters.skipped.fetch_add(1, Ordering::Relaxed);
                return Triage::Settle(msg, hseq, AckKind::Term);
            }
            Err(e) => {
                tracing::warn!(hook = %s.name, seq, "fleet: unreadable event in the stream ({e}); dropping it");
                counters.skipped.fetch_add(1, Ordering::Relaxed);
                return Triage::Settle(msg, hseq, AckKind::Term);
            }
        };
        let n = envs.len() as u64;
        counters.delivered.fetch_add(n - 1, Ordering::Relaxed);
        if replayed {
            counters.duplicate.fetch_add(n - 1, Ordering::Relaxed);
        }
        if broker_delivered > 1 {
            counters.redelivered.fetch_add(n, Ordering::Relaxed);
        }
        let held = self.held(source);
        // Held from here: progress signals while its events wait and run.
        let slot = held.hold(hseq, msg.clone(), envs.len());
        let (seq_key, id_key) = done_key(&msg, hseq);
        let events = envs
            .into_iter()
            .enumerate()
            .map(|(index, env)| Delivery {
                msg: msg.clone(),
                delivered,
                seq,
                hseq,
                slot,
                index,
                key: (seq_key, id_key.wrapping_add(index as u64)),
                env,
                held: held.clone(),
            })
            .collect();
        Triage::Events(events)
    }

    /// Takes one delivered message: its events go to the backlog (a retry's straight to the
    /// host), and as many as the window allows enter the hook's local queue now.
    pub(super) async fn dispatch(&mut self, msg: Arc<jetstream::Message>, source: Source) {
        self.pulled = true;
        if source == Source::Main
            && let Ok(i) = msg.info()
        {
            self.top = self.top.max(i.stream_sequence);
        }
        match self.triage(msg, source) {
            Triage::Settle(msg, hseq, kind) => {
                let held = self.held(source).clone();
                let slot = held.hold(hseq, msg.clone(), 1);
                self.catch_up_on_gap(source);
                held.finish(hseq, slot, &msg, kind).await;
            }
            Triage::Events(events) if source == Source::Retry => {
                for d in events {
                    self.start(d).await;
                }
            }
            Triage::Events(events) => {
                self.catch_up_on_gap(source);
                self.insert(events);
                self.feed().await;
            }
        }
    }

    /// Deliveries of the hook's consumer went where this worker never read them
    /// ([`Held::take_gap`], seen as a message is held): they come back with their ack wait;
    /// nothing more starts, and nothing is acknowledged, until every pending event is here
    /// again, then in stream order.
    fn catch_up_on_gap(&mut self, source: Source) {
        if source == Source::Main && self.main.take_gap() && self.catch_up.is_none() {
            self.catch_up = Some(CatchUp::after_gap(self.lease_key.clone()));
        }
    }

    /// Puts a message's events in the backlog in stream order: a message handed back (or left
    /// by a previous holder) may come again after higher ones were delivered.
    pub(super) fn insert(&mut self, events: Vec<Delivery>) {
        let Some(first) = events.first() else { return };
        let key = (first.hseq, first.index);
        let at = self.backlog.partition_point(|d| (d.hseq, d.index) <= key);
        for (i, d) in events.into_iter().enumerate() {
            self.backlog.insert(at + i, d);
        }
    }

    /// Takes into the backlog, in stream order, the deliveries calls sent back (renamed away,
    /// or an ordered hook's that did not start: [`super::feed`]'s `back_in_order`); whether
    /// there were any.
    pub(super) fn take_back(&mut self) -> bool {
        let mut any = false;
        while let Ok(d) = self.redo_rx.try_recv() {
            self.insert(vec![d]);
            any = true;
        }
        any
    }

    /// The hook was renamed (same identity): what starts from now on runs under the new name,
    /// once every call made under the old one is settled or back ([`Run::feed`]).
    pub(super) fn renamed(&mut self) {
        let name = self.rename.borrow_and_update().clone();
        if name == self.s.name {
            return;
        }
        let mut s = (*self.s).clone();
        s.name = name;
        self.s = Arc::new(s);
        self.renaming = true;
    }
}
