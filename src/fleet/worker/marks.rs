//! An ordered hook's holder's marks of what it may have started on an event's last allowed
//! delivery ([`crate::fleet::attempts`]), and a new holder's reading of them: only an event a
//! holder that vanished may have started is dead-lettered unrun as "killed?" ([`Run::orphaned`]).

use std::sync::Arc;
use std::time::Duration;

use super::deliver::Delivery;
use super::pull::Run;
use super::state::Unfinished;
use crate::fleet::attempts::{Pos, Span};

/// How far ahead a mark reaches, in time at the hook's recent pace: one write of the bucket
/// per this much of starting events, at most.
const AHEAD: Duration = Duration::from_millis(2);

/// The most events one mark reaches ahead (what a holder that vanished leaves dead-lettered
/// at most, beside what it finished and had not acknowledged).
const MOST: usize = 64;

/// How long a holder goes without marks after the bucket could not be made or opened.
const RETRY_BUCKET: Duration = Duration::from_secs(30);

/// The most spans a holder keeps from holders that vanished (beyond it, the nearest are joined).
const SPANS: usize = 16;

impl Run {
    /// Before `d` starts on its last allowed delivery: unless the span in the bucket covers
    /// it, writes one from the lowest such event not finished here to a few events ahead
    /// (as many as start within [`AHEAD`] at the recent pace, from 1 to [`MOST`]). The
    /// returned guard keeps `d` among the unfinished while its call lives.
    pub(super) async fn mark_attempt(&mut self, d: &Delivery) -> Option<Unfinished> {
        if !self.s.ordered() || d.hseq == 0 || !Arc::ptr_eq(&d.held, &self.main) {
            return None;
        }
        let pos = (d.hseq, d.index);
        let m = &mut self.marks;
        if let Ok(mut s) = m.unfinished.lock() {
            s.insert(pos);
        }
        // The sequences between the hook's events: 0 within a bundle, 1 or more between
        // events alone (other hooks' events between). A jump after a quiet spell counts at
        // most twice the average and one more.
        let step = match m.last {
            Some(l) if pos.0 > l.0 => (pos.0 - l.0) as f64,
            Some(_) => 0.0,
            None => 1.0,
        };
        m.gap = m.gap * 0.9 + step.min(m.gap * 2.0 + 1.0) * 0.1;
        m.last = Some(pos);
        let guard = Unfinished {
            set: m.unfinished.clone(),
            pos,
        };
        if m.span.is_some_and(|(a, b)| a <= pos && pos <= b) {
            return Some(guard);
        }
        // The last mark's events started in the time since it was written.
        m.ahead = match (m.written, m.ahead) {
            (Some(t), n) if n > 0 => {
                let each = t.elapsed().as_nanos() / n as u128;
                (AHEAD.as_nanos() / each.max(1)).clamp(1, MOST as u128) as usize
            }
            _ => 1,
        };
        // As far as the backlog holds, or, when events come alone faster than the backlog
        // fills (each is started as it arrives), as far in the stream as that many of the
        // hook's events reach on average.
        let reach = (m.gap * m.ahead.saturating_sub(1) as f64) as u64;
        let ahead = if reach > 0 {
            (pos.0 + reach, usize::MAX)
        } else {
            pos
        };
        let to = self
            .backlog
            .iter()
            .take(m.ahead.saturating_sub(1))
            .map(|d| (d.hseq, d.index))
            .fold(ahead, Pos::max);
        let from = m
            .unfinished
            .lock()
            .ok()
            .and_then(|s| s.first().copied())
            .unwrap_or(pos)
            .min(pos);
        if m.store.is_none() {
            if m.failed.is_some_and(|t| t.elapsed() < RETRY_BUCKET) {
                return Some(guard);
            }
            match crate::fleet::attempts::bucket(&self.sh.cfg, &self.sh.js).await {
                Ok(s) => self.marks.store = Some(s),
                Err(e) => {
                    self.marks.failed = Some(std::time::Instant::now());
                    self.mark_failed(&e);
                    return Some(guard);
                }
            }
        }
        let m = &mut self.marks;
        let Some(store) = m.store.as_ref() else {
            return Some(guard);
        };
        let consumer = crate::fleet::consumer_name(&self.s.key);
        if crate::fleet::attempts::mark(store, &consumer, &self.sh.opts.id, (from, to)).await {
            m.span = Some((from, to));
            m.written = Some(std::time::Instant::now());
        } else {
            // The bucket is gone (a restarted broker lost one made in memory) or does not
            // answer: made again after RETRY_BUCKET, not waited for by every event meanwhile
            // (the nemesis's seed 2756418703060561171: a second per event after a broker
            // restart, for the rest of the run).
            m.store = None;
            m.failed = Some(std::time::Instant::now());
            self.mark_failed("not written within a second");
        }
        Some(guard)
    }

    /// Whether `d`, on its last allowed delivery, waits: as many such events as one mark
    /// reaches over are in flight already (each in flight was marked before it could start,
    /// so what a holder that vanishes may have started stays within a mark's reach).
    pub(super) fn marks_full(&self, d: &Delivery) -> bool {
        self.s.ordered()
            && d.hseq > 0
            && d.delivered >= self.s.max_deliver
            && Arc::ptr_eq(&d.held, &self.main)
            && self
                .marks
                .unfinished
                .lock()
                .is_ok_and(|s| s.len() >= self.marks.ahead.max(1))
    }

    fn mark_failed(&mut self, why: &str) {
        if !std::mem::replace(&mut self.marks.warned, true) {
            tracing::warn!(hook = %self.s.name, "fleet: cannot say which event starts on its last allowed delivery ({why}); if this worker dies meanwhile, the next holder may run it again");
        }
    }

    /// Everything started here finished (a stand-down, hand-over or stop drained it): this
    /// worker's span is taken back, so that a later holder that vanishes is not taken for
    /// having started it.
    pub(super) async fn clear_marks(&mut self) {
        let idle = self.marks.unfinished.lock().is_ok_and(|s| s.is_empty());
        if self.marks.span.is_none() || !idle {
            return;
        }
        if let Some(store) = &self.marks.store {
            let consumer = crate::fleet::consumer_name(&self.s.key);
            crate::fleet::attempts::clear(store, &consumer, &self.sh.opts.id).await;
        }
        self.marks.span = None;
        self.marks.written = None;
    }

    /// A new holder after one that vanished, its catch-up over: what any holder may have
    /// started on a last allowed delivery and not finished (the spans in the bucket). When
    /// the bucket cannot be read, everything it holds, up to `top`, counts.
    pub(super) async fn read_marks(&mut self, top: u64) {
        if top == 0 {
            return;
        }
        if self.marks.store.is_none() {
            self.marks.store = crate::fleet::attempts::bucket(&self.sh.cfg, &self.sh.js)
                .await
                .ok();
        }
        let consumer = crate::fleet::consumer_name(&self.s.key);
        let spans = match &self.marks.store {
            Some(store) => crate::fleet::attempts::spans(store, &consumer).await,
            None => None,
        };
        match spans {
            Some(spans) => self.add_orphans(spans),
            None => {
                self.marks.store = None;
                tracing::warn!(hook = %self.s.name, "fleet: cannot read which events the previous holder may have started on their last allowed delivery; every event it left past its deliveries is dead-lettered");
                self.add_orphans(vec![((0, 0), (top, usize::MAX))]);
            }
        }
    }

    /// Adds spans of events a vanished holder may have started (from its marks, or a note).
    pub(super) fn add_orphans(&mut self, spans: Vec<Span>) {
        for s in spans {
            if !self.orphans.contains(&s) {
                self.orphans.push(s);
            }
        }
        crate::fleet::attempts::bound_spans(&mut self.orphans, SPANS);
    }

    /// The attempts of `d` as the worker counts them (an ordered hook's event past its
    /// deliveries by the broker's count only runs as its last allowed attempt), and the
    /// delivery count its handler is shown.
    pub(super) fn count_attempts(&self, d: &mut Delivery) -> i64 {
        let mut maybe_ran = false;
        if self.s.ordered() && d.delivered > self.s.max_deliver && !self.orphaned((d.hseq, d.index))
        {
            // Past its deliveries by the broker's count only: hand-overs and messages left to
            // the ack wait cost deliveries no handler call made; no holder that vanished may
            // have started it. Its consumer has no broker-side limit: it runs, as its last
            // allowed attempt.
            maybe_ran = d.hseq <= self.vanished_to;
            d.delivered = self.s.max_deliver;
        }
        // Delivered before the consumer was made again, or left by a holder that vanished,
        // which may have run it (finished, not acknowledged): a repeat, shown as one.
        if (d.delivered <= 1 && d.hseq > 0 && d.hseq <= self.repeats_to) || maybe_ran {
            d.delivered.max(2)
        } else {
            d.delivered
        }
    }

    /// Whether the event at `pos` may have been started by a holder that vanished: past its
    /// deliveries, it is then dead-lettered unrun ("killed?"); any other runs as its last
    /// attempt (its extra deliveries were hand-overs, messages left to the ack wait, or a
    /// holder that vanished before it started).
    pub(super) fn orphaned(&self, pos: Pos) -> bool {
        self.orphans.iter().any(|(a, b)| *a <= pos && pos <= *b)
    }
}
