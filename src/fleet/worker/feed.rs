//! Feeding the hook's local queue from the backlog, in stream order and within its window:
//! the catch-up of a new lease holder, and starting each event's handler call.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use crate::fleet::versions::Fate;
use crate::hook::NotRun;

use super::ack::*;
use super::deliver::*;
use super::handover::Route;
use super::pull::*;
use super::state::{Counters, Settings, Shared, Started};

/// How soon an ordered hook's event whose version is not known yet is looked at again.
const RECHECK: Duration = Duration::from_millis(50);

impl Run {
    /// Starts events from the backlog, in order, while fewer than the window are in flight
    /// (the hook's local queue holds what starts; the rest waits here, held).
    pub(super) async fn feed(&mut self) {
        self.take_back();
        if self.renaming {
            if !self.running.is_empty() || !self.background.is_empty() {
                return;
            }
            // Every call of the old name is settled or back: in stream order again.
            self.renaming = false;
            self.backlog
                .make_contiguous()
                .sort_by_key(|d| (d.hseq, d.index));
        }
        if self.catch_up.is_some() || self.handing.is_some() || !self.may_start() {
            // (A shut lease bound: the pull loop stands down.)
            return;
        }
        let window = self.s.window.max(1) as usize;
        while self.running.len() + self.background.len() < window {
            if self
                .backlog
                .front()
                .is_some_and(|d| d.hseq > 0 && self.counters.running(&d.key))
            {
                // Delivered again (its bundle was handed back for another of its events) while
                // the earlier delivery's call still runs or waits in the hook's local queue:
                // it waits for that call (then it is done, or runs), never runs beside it.
                return;
            }
            if self.backlog.front().is_some_and(|d| self.marks_full(d)) {
                // On its last allowed delivery: no further ahead than a mark reaches.
                return;
            }
            let Some(d) = self.backlog.pop_front() else {
                return;
            };
            match self.route(&d) {
                Route::Here => {}
                Route::Elsewhere => {
                    // Ordered: only another version runs it, and nothing after it runs before.
                    // The pull loop hands over once what runs is finished.
                    self.handing = Some(d.env.event.clone());
                    self.backlog.push_front(d);
                    return;
                }
                Route::Unsure => {
                    self.recheck = Some(tokio::time::Instant::now() + RECHECK);
                    self.backlog.push_front(d);
                    return;
                }
                Route::Unrun(fate) => {
                    self.not_here(d, fate).await;
                    continue;
                }
            }
            self.start(d).await;
        }
    }

    /// Taking over ([`CatchUp`]): asks the broker how many events of the hook are pending; when
    /// this worker holds them all, sorts the backlog and starts it. Events nobody renews come
    /// back within an ack wait; a count that stays above what is held longer is a previous
    /// holder still running what it started (a long bundle), waited for while it says so (with
    /// a warning every four ack waits), or events the broker no longer delivers: given up on
    /// after [`CatchUp::limit`], with a warning.
    pub(super) async fn check_caught_up(&mut self, consumer: &jetstream::consumer::PullConsumer) {
        if self.catch_up.is_none() {
            return;
        }
        // The counts are only compared with what this worker knows of the broker they come
        // from: a restart not yet seen here (the connection came back since the last delivery)
        // is seen first, and an answer across a reconnection is asked again.
        self.after_broker_change();
        let link = self.sh.lost.load(std::sync::atomic::Ordering::SeqCst);
        let Ok(info) = consumer.get_info().await else {
            return;
        };
        if link != self.sh.lost.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // A restarted broker may have rolled its record of the deliveries back: it then
        // delivers again, as new, events below the highest one held here, and counts none of
        // them pending yet. Nothing is caught up while its last delivery is below that.
        let top = self.backlog.iter().map(|d| d.hseq).max().unwrap_or(0);
        let behind = info.delivered.stream_sequence < top;
        let Some(c) = self.catch_up.as_mut() else {
            return;
        };
        let now = (info.num_ack_pending as u64, self.main.count());
        if now.0 > now.1 as u64 || behind {
            let seen = (now.0, now.1, info.delivered.stream_sequence);
            if c.last != seen {
                c.last = seen;
                c.since = tokio::time::Instant::now();
                tracing::debug!(hook = %self.s.name, pending = now.0, held = now.1, "fleet: waiting for the previous holder's events to come back");
                return;
            }
            let ack_wait = self.sh.opts.ack_wait;
            if c.since.elapsed() < CatchUp::limit(ack_wait) {
                return;
            }
            let finishing = match &c.lease {
                Some((store, key)) => crate::fleet::lease::finishing(store, key).await,
                None => false,
            };
            if finishing {
                if c.warned.elapsed() >= ack_wait * 4 {
                    c.warned = tokio::time::Instant::now();
                    tracing::warn!(hook = %self.s.name, pending = now.0, held = now.1, "fleet: still waiting for events a previous holder of the ordered hook is finishing before this worker pulls it");
                }
                return;
            }
            tracing::warn!(hook = %self.s.name, pending = now.0, held = now.1, missing = now.0.saturating_sub(now.1 as u64), behind, waited = %crate::time::fmt_duration(c.since.elapsed()), "fleet: events the broker counts as pending for the ordered hook never came back and no worker says it still runs them (past their deliveries, a consumer reset, a broker that lost state?); running the ones here in stream order without them");
        }
        if let Some((store, key)) = c.lease.clone().filter(|_| c.taking_over) {
            // A holder that lost the lease leaves its note once it stood down: what it gave
            // back is here now.
            self.reread_note(&store, &key).await;
        }
        let Some(c) = self.catch_up.as_ref() else {
            return;
        };
        if c.vanished {
            // What the vanished holder had pending is all here now (or given up on): which of
            // it may have started there on a last allowed delivery.
            let top = self.backlog.iter().map(|d| d.hseq).max().unwrap_or(0);
            self.vanished_to = self.vanished_to.max(top);
            self.read_marks(top).await;
        }
        self.catch_up = None;
        self.backlog
            .make_contiguous()
            .sort_by_key(|d| (d.hseq, d.index));
        // A gap seen while catching up is part of what it waited for.
        self.main.take_gap();
        self.main.pause(false);
        tracing::debug!(hook = %self.s.name, held = now.1, "fleet: every pending event of the hook is here; running them in stream order");
        self.feed().await;
    }

    /// Leaves the backlog's messages none of whose events started to the ack wait (no more
    /// progress signals: the broker delivers them again after it, to whoever pulls then, in
    /// order; a `Nak` now would go to this session's pull request, still open at the broker,
    /// and cost a delivery). The events of a message partly started stay, for [`Run::drain`].
    pub(super) async fn release_backlog(&mut self) {
        let mut untouched = false;
        let mut current = None;
        let mut left = 0;
        for d in std::mem::take(&mut self.backlog) {
            if current != Some((d.hseq, d.slot)) {
                current = Some((d.hseq, d.slot));
                untouched = d.index == 0;
                if untouched && d.held.leave(d.hseq, d.slot, false).await {
                    left += 1;
                    self.released(d.hseq, d.hseq);
                }
            }
            if !untouched {
                self.backlog.push_back(d);
            }
        }
        if left > 0 {
            tracing::info!(hook = %self.s.name, messages = left, "fleet: delivered events not started here are left to the ack wait (another worker, or this one, gets them then)");
        }
    }

    /// An event this worker does not run here: its version does not match it (an ordered
    /// hook's route), or it entered the stream after this worker began to retire its version;
    /// `fate` says what becomes of it ([`not_run_here`]): skipped (settled before the feed goes
    /// on, as a run's start would be), dead-lettered, or handed on to another live version.
    async fn not_here(&mut self, d: Delivery, fate: Fate) {
        let (sh, s, counters) = (self.sh.clone(), self.s.clone(), self.counters.clone());
        if let Fate::Nobody(proof) = fate {
            return d.skip(proof, &counters).await;
        }
        self.running.push(Box::pin(async move {
            settle_fate(&sh, &s, &counters, d, fate).await;
        }));
    }

    /// Runs one event: settles it at once when it needs no handler (finished here before, for
    /// another hook, unreadable), dead-letters it past its last delivery, else puts it in the
    /// hook's local queue before this returns (so events enter it in stream order); the rest
    /// runs in `running`.
    pub(super) async fn start(&mut self, mut d: Delivery) {
        if !self.may_start() {
            // The lease's bound is shut (a retry delivered meanwhile): handed back while that
            // is still safe, else left to its ack wait.
            return d.give_back(None).await;
        }
        if self.past_retirement(&d) {
            // Retiring this version (its worker stops): what entered the stream since is not
            // its to run (an ordered hook's route decided before this).
            let fate = not_run_here(&self.sh, &self.s, &d);
            return self.not_here(d, fate).await;
        }
        let shown = self.count_attempts(&mut d);
        let (s, counters) = (&self.s, &self.counters);
        if !d.held.current(d.hseq, d.slot) {
            // Its message was handed back (for another of its events) or delivered again
            // since: the new delivery brings it.
            return;
        }
        if d.hseq > 0
            && counters
                .done
                .lock()
                .map(|done| done.contains(&d.key))
                .unwrap_or(false)
        {
            // Finished here already; the broker lost the acknowledgement (it crashed): ack again.
            counters.already_done.fetch_add(1, Ordering::Relaxed);
            return d.finish(AckKind::Ack).await;
        }
        if d.env
            .hook
            .as_deref()
            .is_some_and(|h| h != s.name && h != s.key)
        {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return d.finish(AckKind::Ack).await;
        }
        let Some(ctx) = d.env.handler_context(shown, d.seq) else {
            tracing::warn!(hook = %s.name, seq = d.seq, "fleet: event in the stream whose context is not a JSON object; dropping it");
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return d.finish(AckKind::Term).await;
        };
        let (sh, s, counters) = (self.sh.clone(), self.s.clone(), self.counters.clone());
        if d.delivered > s.max_deliver {
            // Its last allowed delivery went to a worker that stopped before finishing it, or
            // was given up unstarted (a worker frozen past the ack wait, or cut off from the
            // broker): the broker counts every delivery, and delivers without a limit.
            self.running.push(Box::pin(async move {
                let error = format!(
                    "delivered {} times, {} allowed: the worker with the last allowed delivery stopped, froze or lost the broker before it finished (killed?)",
                    d.delivered, s.max_deliver
                );
                let delivered = d.delivered - 1;
                dead_letter(&sh, &s, &counters, d, delivered, error).await;
            }));
            return;
        }
        // The host enforces the hook's timeout per call; this bound only covers the wait in the
        // hook's local queue behind the others this worker holds.
        let wait = (s.timeout + Duration::from_secs(5)) * (s.window.max(1) + 1);
        // One future per event: the handler call, then what follows it.
        let redo = self.redo_tx.clone();
        let started = (d.hseq > 0).then(|| Started::new(&counters, d.key));
        // On its last allowed delivery it is marked before it can start: a holder that
        // vanishes meanwhile is known to have maybe started it, and only it ([`super::marks`]).
        let unfinished = if d.delivered >= s.max_deliver {
            self.mark_attempt(&d).await
        } else {
            None
        };
        // An ordered hook's lease, else (`Explicit`) the delivery's own ack wait: checked by the
        // hook's queue and at the last moment by the handler (issue 56 row 8).
        let gate = self
            .gate
            .clone()
            .or_else(|| d.held.delivery_gate(d.hseq, d.slot));
        let lease_gate = self.gate.clone();
        let mut call: InFlight = Box::pin(async move {
            let _started = started;
            let _unfinished = unfinished;
            let outcome = sh
                .host
                .call_one(&d.env.event, ctx, wait, &s.name, gate)
                .await;
            after_call(
                &sh,
                &s,
                &counters,
                (&redo, lease_gate.as_deref()),
                d,
                outcome,
            )
            .await;
        });
        // The first poll puts the event in the hook's queue (so events enter it in stream order).
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
        if first.is_pending() {
            self.running.push(call);
        }
    }
}

/// What follows a handler call of delivery `d` (`outcome`): an ordered hook's event its
/// version no longer matches, or refused, goes back in order (through `redo`, the run's
/// backlog); one never started is handed back; one its version does not match gets its fate;
/// a renamed hook's runs under the new name; the rest is settled ([`settle`]).
async fn after_call(
    sh: &Shared,
    s: &Settings,
    counters: &Counters,
    (redo, lease_gate): (
        &tokio::sync::mpsc::Sender<Delivery>,
        Option<&crate::start_gate::StartGate>,
    ),
    d: Delivery,
    outcome: Outcome,
) {
    let from_stream = !crate::fleet::retry::is_retry(&sh.cfg, d.msg.subject.as_str());
    if let Some(g) = lease_gate.filter(|_| s.ordered() && from_stream)
        && unmatched_here(sh, s, &outcome)
    {
        // An ordered hook's event that this worker's version, changed by a reload since
        // the feed routed it, does not match: nothing after it starts here (the queue
        // shut the lease's gate as it found it; shut here for a call made after the
        // change), it goes back, and the lease is handed over (the pull loop sees the
        // gate shut while the lease is still its own); the next holder routes it in
        // stream order (the nemesis's seed 17722090543346195135 on 2.15: such
        // events went to the retry subject and ran after the events behind them).
        g.shut();
        return back_in_order(redo, d).await;
    }
    match &outcome {
        Ok(Some(o)) if o.not_run == Some(NotRun::GateShut) => {
            // Refused by the lease's bound (issue 48): not run here; handed back while
            // the lease is surely still this worker's, else left to its ack wait (an
            // ordered hook's through its backlog, which goes back in stream order).
            if s.ordered() && from_stream {
                return back_in_order(redo, d).await;
            }
            return d.give_back(None).await;
        }
        Ok(Some(o)) if o.not_run == Some(NotRun::Stopped) => {
            // Never started: the hook or this worker stopped first (a rolling
            // update's stop, a revoked approval). Handed back, not retried as a
            // failure: an ordered hook's next holder runs it in stream order.
            return d.give_back(None).await;
        }
        Ok(Some(o)) if o.not_run == Some(NotRun::Unmatched) => {
            // Queued for this worker's earlier version; the version loaded since does
            // not match it: the one place that decides an unrun event's fate does.
            return settle_unrun(sh, s, counters, d).await;
        }
        _ => {}
    }
    if !matches!(&outcome, Ok(Some(o)) if o.result.is_ok()) && renamed_away(sh, s) {
        // Dropped by the old name's hook: the same delivery runs under the new name.
        return back_in_order(redo, d).await;
    }
    settle(sh, s, counters, d, outcome).await;
}

/// Whether `outcome` of an ordered hook's call says this worker's version of the hook does not
/// match the event (changed by a reload after the feed routed it): queued for the version
/// before ([`NotRun::Unmatched`]), or not queued at all (`None`, the hook still loaded).
fn unmatched_here(sh: &Shared, s: &Settings, outcome: &Outcome) -> bool {
    match outcome {
        Ok(Some(o)) => o.not_run == Some(NotRun::Unmatched),
        Ok(None) => sh.host.snapshot().get(&s.name).is_some(),
        Err(_) => false,
    }
}

/// A delivery that did not start goes back to its run's backlog (an ordered hook's is handed
/// back to the broker in stream order with the rest, counted as no attempt; a renamed hook's
/// runs under the new name); once the run is gone, straight back to the broker.
async fn back_in_order(redo: &tokio::sync::mpsc::Sender<Delivery>, d: Delivery) {
    if let Err(e) = redo.send(d).await {
        let d = e.0;
        d.give_back(None).await;
    }
}
