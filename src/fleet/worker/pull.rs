//! The pull loop of one hook ([`consume`]) and what it keeps across its pull sessions
//! ([`Run`]): the sessions, the drain on stop, the retries held until due.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use tokio::sync::watch;

use crate::fleet::held::Held;

use super::consumer::*;
use super::deliver::*;
use super::holder::*;
use super::state::*;

/// What one hook's consume task keeps across its pull sessions: the held events of its two
/// consumers, the handler calls in flight, and the retries waiting for their time.
pub(super) struct Run {
    pub(super) sh: Arc<Shared>,
    /// Shared with every call in flight (an `Arc`: cloned per event).
    pub(super) s: Arc<Settings>,
    pub(super) counters: Arc<Counters>,
    /// The hook's consumer's events.
    pub(super) main: Arc<Held>,
    /// The retry consumer's events.
    pub(super) retry: Arc<Held>,
    pub(super) _tend: [AbortOnDrop; 2],
    /// Handler calls in flight, polled by the pull session itself (no task, no cross-thread
    /// wake-up per event); moved to `background` when the session ends.
    pub(super) running: futures_util::stream::FuturesUnordered<InFlight>,
    pub(super) background: tokio::task::JoinSet<()>,
    /// Retries held until their time (one sleeping task each; there are at most
    /// [`crate::fleet::retry::WINDOW`]).
    pub(super) waiting: tokio::task::JoinSet<()>,
    pub(super) due_tx: tokio::sync::mpsc::Sender<Arc<jetstream::Message>>,
    pub(super) due_rx: tokio::sync::mpsc::Receiver<Arc<jetstream::Message>>,
    /// Something was delivered since the last look (the pause between pulls starts over).
    pub(super) pulled: bool,
    /// Delivered events not started yet, in stream order: a message may hold many (a bundle),
    /// and at most the window enter the hook's local queue at once ([`Run::feed`]).
    pub(super) backlog: std::collections::VecDeque<Delivery>,
    /// Just took an ordered hook's lease: nothing starts until the broker's pending events are
    /// all held here ([`Run::check_caught_up`]).
    pub(super) catch_up: Option<CatchUp>,
    /// The lease bucket and the hook's lease key while this worker holds the lease (a
    /// catch-up asks whether a previous holder still finishes events).
    pub(super) lease_key: Option<(async_nats::jetstream::kv::Store, String)>,
    /// The hook's current name ([`Run::renamed`]).
    pub(super) rename: watch::Receiver<String>,
    /// Renamed: nothing starts until every call of the old name is finished or back here.
    pub(super) renaming: bool,
    /// Events whose call the old name's hook dropped (renamed meanwhile): run again, in order,
    /// under the new name, as the same delivery.
    pub(super) redo_tx: tokio::sync::mpsc::Sender<Delivery>,
    pub(super) redo_rx: tokio::sync::mpsc::Receiver<Delivery>,
    /// Ordered: the feed stopped at an event only another version matches (its name); the
    /// lease goes to that version ([`super::handover`]).
    pub(super) handing: Option<String>,
    /// Stream sequence ranges that hand-overs and releases gave back ([`Run::handed_over`]).
    pub(super) handed: Vec<(u64, u64)>,
    /// The range of what the release under way gave back or left to the ack wait
    /// ([`Run::released`]); it joins `handed` as one range when the release ends.
    pub(super) releasing: Option<(u64, u64)>,
    /// The done keys the last holder's note carried ([`super::handover::Note::done`]): passed
    /// on in this holder's note when it stops or loses the lease.
    pub(super) inherited: Vec<(u64, u64)>,
    /// The highest stream sequence the hook's consumer delivered here.
    pub(super) top: u64,
    /// The lowest stream sequence a hand-over gave back from the pull's buffer.
    pub(super) given: Option<u64>,
    /// Ordered: the feed waits to know every live version as of its next event's acceptance
    /// (since then; [`Run::route`]), until `recheck`.
    pub(super) unsure: Option<std::time::Instant>,
    pub(super) recheck: Option<tokio::time::Instant>,
    /// In [`Run::drain`]: no more waiting to know versions.
    pub(super) draining: bool,
    /// Ordered: the spans of events a holder that vanished (its lease ran out, not released)
    /// may have started on their last allowed delivery and not finished, from its marks
    /// ([`crate::fleet::attempts`]). Only an event in one that is past its deliveries is
    /// dead-lettered as "killed?" unrun; the broker's count of any other is inflated by
    /// hand-overs, messages left to the ack wait and holders that vanished before starting
    /// it, none of which ran it (issues 34 and 48).
    pub(super) orphans: Vec<crate::fleet::attempts::Span>,
    /// Ordered: this holder's marks of what it starts on a last allowed delivery.
    pub(super) marks: super::state::Marks,
    /// Ordered: the highest stream sequence a holder that vanished left pending here: an
    /// event up to it may have run there (finished, not acknowledged), so it is shown to its
    /// handler as delivered at least twice.
    pub(super) vanished_to: u64,
    /// An ordered hook's lease bound ([`crate::start_gate`], issue 48): no event starts, and
    /// nothing is acknowledged or handed back, once it says the lease may be another worker's.
    pub(super) gate: Option<Arc<crate::start_gate::StartGate>>,
    /// The highest stream sequence delivered before the hook's consumer was made again: an
    /// event up to it is shown to its handler as delivered at least twice
    /// ([`crate::fleet::repeats`], issue 48 row 3).
    pub(super) repeats_to: u64,
    /// The lease was lost to a broker restart ([`crate::fleet::lease::Lease::bucket_gone`]):
    /// the stand-down hands back what it holds at once rather than to the ack wait.
    pub(super) broker_restarted: bool,
    /// The id of the broker this worker was connected to when it took the lease: another one
    /// at the lease's loss is a broker restart too (the renewal's error that says the bucket
    /// is gone may come after the lease's bound closed).
    pub(super) leased_on: Option<String>,
    /// When the broker connection was last lost as this holder last looked
    /// ([`Run::after_broker_change`]).
    pub(super) link_seen: u64,
    /// Set when this worker, stopping, retires the hook's version ([`HookTask::retiring`]): the
    /// highest stream sequence it still runs (0: not retiring).
    pub(super) retiring: Arc<std::sync::atomic::AtomicU64>,
}

/// A new lease holder waiting for what the previous one left pending (issue 34): the broker
/// redelivers those events in the order their ack waits ran out (progress signals and
/// deliveries interleave, so not in stream order), and a cumulative acknowledgement of one that
/// came back early would settle the lower ones still on their way, never run. So nothing starts
/// and nothing is acknowledged until the broker's count of pending events is what this worker
/// holds (every one is here, whatever the previous holder still does); then the backlog is put
/// in stream order and runs. A previous holder still running (its lease lost but not its
/// process) keeps its events pending with progress signals and says so in the lease bucket
/// ([`crate::fleet::lease::Finishing`]): this waits for it. Otherwise a count that stays above
/// what is held for [`CatchUp::limit`] (a message the broker no longer delivers: past its
/// deliveries, a consumer reset, a broker that lost state) is given up on with a warning, and
/// what is here runs in stream order.
pub(super) struct CatchUp {
    /// The broker's pending count, this worker's held count and the broker's last delivered
    /// stream sequence at the last change.
    pub(super) last: (u64, usize, u64),
    pub(super) since: tokio::time::Instant,
    /// The lease bucket and the hook's lease key (whether a previous holder still finishes).
    pub(super) lease: Option<(async_nats::jetstream::kv::Store, String)>,
    /// When a warning was last logged.
    pub(super) warned: tokio::time::Instant,
    /// The previous holder let the lease run out ([`crate::fleet::lease::Lease::vanished`]):
    /// what it left pending may have started there ([`Run::orphans`]).
    pub(super) vanished: bool,
    /// Taking the lease over (not catching up on a gap within a holding): a holder that lost
    /// the lease leaves its note meanwhile, read again at the end ([`Run::reread_note`]).
    pub(super) taking_over: bool,
}

impl CatchUp {
    pub(super) fn new(
        lease: Option<(async_nats::jetstream::kv::Store, String)>,
        vanished: bool,
    ) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            last: (u64::MAX, 0, 0),
            since: now,
            lease,
            warned: now,
            vanished,
            taking_over: true,
        }
    }

    /// Catching up within a holding: deliveries went where this worker never read them
    /// ([`crate::fleet::held::Held::take_gap`]).
    pub(super) fn after_gap(lease: Option<(async_nats::jetstream::kv::Store, String)>) -> Self {
        Self {
            taking_over: false,
            ..Self::new(lease, false)
        }
    }

    /// How long a pending count above what is held may stay unchanged, nobody saying it still
    /// finishes them, before the new holder goes on without them: every event nobody renews
    /// comes back within an ack wait; twice that and a second more.
    pub(super) fn limit(ack_wait: Duration) -> Duration {
        ack_wait * 2 + Duration::from_secs(1)
    }
}

/// How often a new lease holder asks the broker what is still pending.
pub(super) const CATCH_UP_EVERY: Duration = Duration::from_millis(100);

/// A handler call in flight and what follows it (acknowledgement, retry, dead letter).
pub(super) type InFlight = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Where a delivery came from.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Source {
    Main,
    Retry,
}

/// How a pull session ended.
pub(super) enum Ended {
    Stop,
    Again,
    /// An event only another version of the ordered hook matches: let that version pull.
    HandOver,
}

impl Run {
    pub(super) fn new(
        sh: Arc<Shared>,
        s: Settings,
        counters: Arc<Counters>,
        (ack_all, wait): (bool, Duration),
        rename: watch::Receiver<String>,
        retiring: Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        let progress = (wait / 3).max(Duration::from_millis(30));
        let (main, retry) = (
            Arc::new(Held::new(ack_all, wait, progress, Some(sh.lost.clone()))),
            Arc::new(Held::new(false, wait, progress, Some(sh.lost.clone()))),
        );
        let tend = |h: &Arc<Held>| {
            AbortOnDrop(tokio::spawn(crate::fleet::held::tend(
                h.clone(),
                ACK_BATCH_EVERY,
                progress,
            )))
        };
        let (due_tx, due_rx) = tokio::sync::mpsc::channel(crate::fleet::retry::WINDOW as usize);
        // Every call in flight may come back once.
        let (redo_tx, redo_rx) = tokio::sync::mpsc::channel(
            s.window as usize + crate::fleet::retry::WINDOW as usize + 1,
        );
        Self {
            _tend: [tend(&main), tend(&retry)],
            sh,
            s: Arc::new(s),
            counters,
            main,
            retry,
            running: futures_util::stream::FuturesUnordered::new(),
            background: tokio::task::JoinSet::new(),
            waiting: tokio::task::JoinSet::new(),
            due_tx,
            due_rx,
            pulled: false,
            backlog: Default::default(),
            catch_up: None,
            lease_key: None,
            rename,
            renaming: false,
            redo_tx,
            redo_rx,
            handing: None,
            handed: Vec::new(),
            releasing: None,
            inherited: Vec::new(),
            top: 0,
            given: None,
            unsure: None,
            recheck: None,
            draining: false,
            orphans: Vec::new(),
            marks: Default::default(),
            vanished_to: 0,
            gate: None,
            repeats_to: 0,
            broker_restarted: false,
            leased_on: None,
            link_seen: 0,
            retiring,
        }
    }

    /// Whether delivery `d` entered the stream after this worker began to retire its version of
    /// the hook (it stops, or holds a change, during a rolling update): its version runs only
    /// what was there before, and what its held next version also matches (issue 56 row 4: the
    /// change loads once the drain is done, so that version's events need not wait for it).
    pub(super) fn past_retirement(&self, d: &Delivery) -> bool {
        let bound = self.retiring.load(std::sync::atomic::Ordering::Relaxed);
        bound > 0 && d.seq > bound && !self.sh.versions.next_matches(&self.s.key, &d.env.event)
    }

    /// This holding's lease bound (`None`: not a lease holder), for what starts and what is
    /// sent from now on.
    pub(super) fn set_gate(&mut self, gate: Option<Arc<crate::start_gate::StartGate>>) {
        self.main.set_gate(gate.clone());
        self.retry.set_gate(gate.clone());
        self.gate = gate;
    }

    /// Whether events may start now (no lease bound, or one still open).
    pub(super) fn may_start(&self) -> bool {
        self.gate.as_ref().is_none_or(|g| g.open())
    }

    /// Gives back the retries this worker holds until their time (standing by: whoever pulls
    /// the hook next runs them).
    pub(super) async fn forget_retries(&mut self) {
        self.waiting.abort_all();
        while self.waiting.join_next().await.is_some() {}
        while self.due_rx.try_recv().is_ok() {}
        self.retry.give_back_all().await;
    }

    /// Runs what was delivered (the backlog too) and waits for it, then acknowledges what
    /// finished. With `start_by`, no message is started after that time: the backlog's
    /// messages none of whose events started by then are left to the ack wait
    /// ([`Run::release_backlog`]); the events of a message partly started still run.
    pub(super) async fn drain(&mut self, start_by: Option<tokio::time::Instant>) {
        self.draining = true;
        if self.handing.is_some() {
            // Stopped at an event for another version: it and the rest go back now.
            let _ = self.hand_back().await;
        }
        self.drain_all(start_by).await;
        self.draining = false;
    }

    async fn drain_all(&mut self, mut start_by: Option<tokio::time::Instant>) {
        if self.catch_up.take().is_some() {
            // Nothing started: what was delivered goes to whoever pulls next, in order.
            self.release_backlog().await;
            self.main.pause(false);
        }
        loop {
            while self.background.try_join_next().is_some() {}
            if start_by.is_some_and(|t| tokio::time::Instant::now() >= t) {
                self.release_backlog().await;
                start_by = None;
            }
            if !self.may_start() {
                // The lease's bound is shut: nothing more starts here, the rest of a bundle
                // part-way through included (handed back while that is safe).
                self.give_back_backlog().await;
            }
            self.feed().await;
            if self.handing.is_some() {
                // The feed stopped at an event for another version: it and the rest go back now
                // (the feed starts nothing more while `handing` is set; waiting here would spin).
                let _ = self.hand_back().await;
                continue;
            }
            let deadline = start_by;
            let passed = async move {
                match deadline {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(passed);
            tokio::select! {
                r = self.running.next() => if r.is_some() {
                    continue;
                },
                _ = &mut passed => continue,
            }
            if self.backlog.is_empty() {
                break;
            }
            // Only calls of an earlier session hold the window: wait for one.
            tokio::select! {
                _ = self.background.join_next() => {}
                _ = &mut passed => {}
            }
        }
        while self.background.join_next().await.is_some() {}
        // Calls that did not start and came back meanwhile (an ordered hook's, from an event
        // its reloaded version does not match on) go back to the broker now, not to the ack wait.
        if self.take_back() {
            self.give_back_backlog().await;
        }
        self.main.flush().await;
    }

    /// Whether the broker this worker is connected to is not the one it took the lease on (a
    /// restart gives a server a new id).
    fn broker_changed(&self) -> bool {
        self.leased_on
            .as_deref()
            .is_some_and(|id| id != self.sh.client.server_info().server_id)
    }

    /// Just took an ordered hook's lease (`lease`, from the bucket `leases`). A previous holder
    /// may have left events pending: they come back as their ack waits run out, in no useful
    /// order; nothing runs until all are here ([`CatchUp`]).
    fn took_lease(
        &mut self,
        leases: &Option<(async_nats::jetstream::kv::Store, Duration)>,
        lease: Option<&crate::fleet::lease::Lease>,
    ) {
        let bucket = leases
            .as_ref()
            .map(|(store, _)| (store.clone(), crate::fleet::consumer_name(&self.s.key)));
        let vanished = lease.is_some_and(|l| l.vanished());
        self.lease_key = bucket.clone();
        self.main.expect_anew();
        self.catch_up = Some(CatchUp::new(bucket, vanished));
        self.leased_on = Some(self.sh.client.server_info().server_id);
        self.link_seen = self.sh.lost.load(std::sync::atomic::Ordering::SeqCst);
        self.main.pause(true);
        self.set_gate(lease.map(|l| l.gate()));
        // A hand-over asked for before this holding (by a call of an earlier one that ended
        // after its lease went) is not this holding's: its permit would hand the lease over at
        // the first turn of the pull loop, with nothing to hand.
        let _ = futures_util::FutureExt::now_or_never(self.counters.handover.notified());
    }

    /// An ordered hook's holder that kept its lease across a broker restart (the lease bucket
    /// is on file, issue 56): what was on its way to it when the broker went is lost in flight,
    /// and the restarted broker may have rolled back its record of the consumer's deliveries.
    /// It starts nothing more and acknowledges nothing until every event the new broker counts
    /// as pending is here ([`Run::check_caught_up`]), then runs them in stream order. Looked at
    /// before each delivery is taken: one atomic load unless the connection was lost since.
    pub(super) fn after_broker_change(&mut self) {
        let lost = self.sh.lost.load(std::sync::atomic::Ordering::SeqCst);
        if lost == self.link_seen
            || self.gate.is_none()
            || self.sh.client.connection_state() != async_nats::connection::State::Connected
        {
            // (Not connected yet: the server's id is not known; looked at again.)
            return;
        }
        self.link_seen = lost;
        if !self.broker_changed() {
            return;
        }
        self.leased_on = Some(self.sh.client.server_info().server_id);
        tracing::info!(hook = %self.s.name, "fleet: the broker restarted while this worker held the ordered hook's lease; it starts nothing more until every pending event is here again");
        self.main.pause(true);
        self.main.expect_anew();
        if self.catch_up.is_none() {
            self.catch_up = Some(CatchUp::after_gap(self.lease_key.clone()));
        }
    }

    /// Hands back every message the backlog holds (once each; nothing if the lease's bound
    /// passed: [`crate::fleet::held::Held::may_send`]); what goes back is released (its next
    /// delivery is no attempt).
    async fn give_back_backlog(&mut self) {
        let mut last = None;
        let sending = self.main.may_send();
        for d in std::mem::take(&mut self.backlog) {
            if last != Some((d.hseq, d.slot)) {
                last = Some((d.hseq, d.slot));
                if sending && d.hseq > 0 {
                    self.released(d.hseq, d.hseq);
                }
                d.held.give_back(d.hseq, d.slot, &d.msg, None).await;
            }
        }
    }

    /// The lease was lost (another worker may hold it now): starts nothing more, finishes what
    /// runs (the rest of a bundle partly started too), acknowledges it, and forgets what was
    /// handed back or left (it goes to whoever holds the lease next: that worker waits for it,
    /// and for what this one still finishes, which it says in the lease bucket meanwhile)
    /// before standing by.
    pub(super) async fn stand_down(
        &mut self,
        leases: &Option<(async_nats::jetstream::kv::Store, Duration)>,
    ) {
        let finishing = leases.as_ref().map(|(store, ttl)| {
            crate::fleet::lease::Finishing::start(
                store,
                *ttl,
                &crate::fleet::consumer_name(&self.s.key),
                &self.sh.opts.id,
            )
        });
        self.drain(Some(tokio::time::Instant::now())).await;
        if std::mem::take(&mut self.broker_restarted) || self.broker_changed() {
            // The broker restarted: no pull request of this worker is open there any more, so
            // what it holds unfinished goes back now (nats-server 2.9 would otherwise keep it
            // until its ack wait: the hook stalled that long after every restart). Also past
            // the lease's bound: none of these ran here, and a worker that took the lease
            // meanwhile only gets them sooner.
            let n = self.main.hand_back_unfinished().await;
            tracing::info!(hook = %self.s.name, events = n, "fleet: the broker restarted: what was delivered here and not run goes back at once");
        }
        // The next holder reads it once what this worker left is back ([`Run::check_caught_up`]).
        self.leave_release_note(leases).await;
        self.clear_marks().await;
        if let Some(f) = finishing {
            f.end().await;
        }
        self.forget_retries().await;
        self.main.forget();
        self.set_gate(None);
        self.lease_key = None;
    }

    /// Pulls both consumers until the pull breaks (`Again`) or the task stops (`Stop`); the
    /// handler calls still in flight then go on in tasks of their own.
    pub(super) async fn session(
        &mut self,
        consumer: &jetstream::consumer::PullConsumer,
        retries: &jetstream::consumer::PullConsumer,
        lease: &mut Option<crate::fleet::lease::Lease>,
        stop: &mut watch::Receiver<bool>,
    ) -> Ended {
        let ended = self.pull(consumer, retries, lease, stop).await;
        for f in std::mem::take(&mut self.running) {
            self.background.spawn(f);
        }
        ended
    }

    pub(super) async fn pull(
        &mut self,
        consumer: &jetstream::consumer::PullConsumer,
        retries: &jetstream::consumer::PullConsumer,
        lease: &mut Option<crate::fleet::lease::Lease>,
        stop: &mut watch::Receiver<bool>,
    ) -> Ended {
        let batch = (2 * self.s.window as usize).max(4);
        // An ordered hook's expire soon: a hand-over waits for them ([`PULLS_EXPIRED`]).
        let expires = if self.s.ordered() {
            (ORDERED_PULL_EXPIRES, ORDERED_PULL_EXPIRES / 2)
        } else {
            (Duration::from_secs(5), Duration::from_secs(2))
        };
        let (mut messages, mut retried) = match futures_util::future::try_join(
            open_pull(consumer, batch, expires),
            open_pull(retries, 2 * crate::fleet::retry::WINDOW as usize, expires),
        )
        .await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(hook = %self.s.name, "fleet: cannot pull: {e}; retrying");
                return Ended::Again;
            }
        };
        let opened = crate::start_gate::monotonic_ns();
        if self.s.ordered() {
            self.after_broker_change();
        }
        // What an earlier session left in the backlog goes on.
        while self.background.try_join_next().is_some() {}
        self.feed().await;
        let mut catching = tokio::time::interval(CATCH_UP_EVERY);
        loop {
            let holding = lease.is_some();
            // Handing over after this worker shut its own gate (below): the shut gate is no
            // lost lease while the lease is surely still its own.
            let self_shut =
                self.handing.is_some() && lease.as_ref().is_some_and(|l| l.still_ours());
            if holding && self.ready_to_hand_over() {
                self.give_back_pulls([messages, retried]).await;
                return Ended::HandOver;
            }
            let lost = async {
                match lease.as_mut() {
                    Some(l) => l.lost().await,
                    None => std::future::pending().await,
                }
            };
            let (next, source) = tokio::select! {
                m = messages.next() => (m, Source::Main),
                m = retried.next() => (m, Source::Retry),
                Some(m) = self.due_rx.recv() => {
                    self.dispatch(m, Source::Retry).await;
                    continue;
                }
                Ok(()) = self.rename.changed() => {
                    self.renamed();
                    continue;
                }
                _ = sleep_until(self.recheck), if self.recheck.is_some() => {
                    self.recheck = None;
                    self.feed().await;
                    continue;
                }
                _ = catching.tick(), if self.catch_up.is_some() => {
                    self.check_caught_up(consumer).await;
                    continue;
                }
                Some(()) = self.running.next(), if !self.running.is_empty() => {
                    self.feed().await;
                    continue;
                }
                Some(_) = self.background.join_next(), if !self.background.is_empty() => {
                    self.feed().await;
                    continue;
                }
                _ = stop.changed() => {
                    if let Some((a, b)) = give_back(&mut messages).await {
                        self.released(a, b);
                    }
                    give_back(&mut retried).await;
                    return Ended::Stop;
                }
                _ = lost, if !self_shut => {
                    match self.gate_shut(lease, [&mut messages, &mut retried]).await {
                        Some(ended) => return ended,
                        None => continue,
                    }
                }
                _ = self.counters.handover.notified(), if holding => {
                    let head = self.unmatched_head();
                    self.handing.get_or_insert(head);
                    continue;
                }
            };
            match next {
                Some(Ok(msg)) => {
                    if let Some(ended) = self.take(msg, source, opened).await {
                        return ended;
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(hook = %self.s.name, "fleet: pull interrupted: {e}; pulling again");
                    return Ended::Again;
                }
                None => return Ended::Again,
            }
            while self.background.try_join_next().is_some() {}
            while self.waiting.try_join_next().is_some() {}
            // Calls of an earlier session that finished meanwhile free the window.
            self.feed().await;
        }
    }

    /// The held lease's gate shut. While the lease is surely still this worker's, it shut the
    /// gate itself: a queued event its reloaded version does not match stopped the hook's
    /// queue ([`crate::start_gate::StartGate::in_order`]); what did not start goes back in
    /// stream order and the lease is handed over (released, not left to run out): `None`, the
    /// session goes on to the hand-over. Else the lease is lost or past its bound: what no
    /// handler started is handed back while that is safe, and the session ends.
    async fn gate_shut(
        &mut self,
        lease: &mut Option<crate::fleet::lease::Lease>,
        [messages, retried]: [&mut jetstream::consumer::pull::Stream; 2],
    ) -> Option<Ended> {
        if lease.as_ref().is_some_and(|l| l.still_ours()) {
            tracing::info!(hook = %self.s.name, "fleet: a queued event this worker's reloaded version of the ordered hook does not match stopped its queue; what did not start goes back and the lease is handed over");
            let head = self.unmatched_head();
            self.handing.get_or_insert(head);
            return None;
        }
        tracing::warn!(hook = %self.s.name, "fleet: the ordered hook's lease is lost or past its bound (this worker was paused, starved or cut off); it starts nothing more, hands back what it safely can and stands down");
        // Another worker may take over: hand back what no handler started, unless past the
        // lease's bound (another worker may hold those deliveries now: nothing is sent for
        // them, they come back with their ack wait).
        if self.main.may_send() {
            if let Some((a, b)) = give_back(messages).await {
                self.released(a, b);
            }
            give_back(retried).await;
        }
        self.broker_restarted =
            lease.as_ref().is_some_and(|l| l.bucket_gone()) || self.broker_changed();
        *lease = None;
        Some(Ended::Again)
    }

    /// A message the session `opened` (monotonic ns) pulled: dispatched, held until due (a
    /// retry before its time), or, when the worker was stopped or starved past the ack wait
    /// since (issue 56), left unread with the rest of the pulls' buffer: it may be another
    /// worker's now, and the session ends (`Some`) so that a new one pulls afresh.
    async fn take(
        &mut self,
        msg: jetstream::Message,
        source: Source,
        opened: u64,
    ) -> Option<Ended> {
        // An ordered hook's lease bound governs its deliveries (the lease holder stands down).
        if !self.s.ordered() && (self.main.lapsed_since(opened) || self.retry.lapsed_since(opened))
        {
            tracing::info!(hook = %self.s.name, "fleet: this worker was stopped or starved past the ack wait; what its pulls had buffered is left to the broker and it pulls again");
            return Some(Ended::Again);
        }
        if !self.s.ordered()
            && (self.main.link_lost_since(opened) || self.retry.link_lost_since(opened))
        {
            tracing::info!(hook = %self.s.name, "fleet: the broker connection was lost; what the pulls had buffered is left to the broker and this worker pulls again");
            return Some(Ended::Again);
        }
        if self.s.ordered() {
            self.after_broker_change();
        }
        let msg = Arc::new(msg);
        if source == Source::Retry && !self.hold_until_due(&msg) {
            return None;
        }
        self.dispatch(msg, source).await;
        None
    }

    /// A retry before its time is held (with progress signals) until then: false. True when
    /// it is due (or unreadable: triage drops it).
    pub(super) fn hold_until_due(&mut self, msg: &Arc<jetstream::Message>) -> bool {
        let Some(wait) = crate::fleet::retry::Retry::read(msg)
            .map(|r| r.wait())
            .filter(|w| !w.is_zero())
        else {
            return true;
        };
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        self.retry.hold(seq, msg.clone(), 1);
        let (tx, msg) = (self.due_tx.clone(), msg.clone());
        self.waiting.spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = tx.send(msg).await;
        });
        false
    }
}

/// Pulls `batch` at a time from `c`, each request expiring after `expires` (idle heartbeats
/// every `heartbeat`).
fn open_pull(
    c: &jetstream::consumer::PullConsumer,
    batch: usize,
    (expires, heartbeat): (Duration, Duration),
) -> impl std::future::Future<
    Output = Result<jetstream::consumer::pull::Stream, jetstream::consumer::StreamError>,
> + '_ {
    c.stream()
        // More than may be in flight: a pull request is always waiting at the broker
        // when an acknowledgement frees a slot (with exactly one, nats-server 2.9 only
        // delivered after a delay: 30 events/s at concurrency 1; with two, ~1,100/s).
        .max_messages_per_batch(batch)
        .expires(expires)
        .heartbeat(heartbeat)
        .messages()
}

/// Sleeps until `t`; never when `None`.
async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// How soon an ordered hook's pull requests expire at the broker: a hand-over waits that long
/// (and a margin, [`PULLS_EXPIRED`]) before it gives events back.
pub(super) const ORDERED_PULL_EXPIRES: Duration = Duration::from_secs(1);

/// When the pull requests of a holder that stopped reading them have surely expired at the
/// broker ([`ORDERED_PULL_EXPIRES`] and a margin).
pub(super) const PULLS_EXPIRED: Duration = Duration::from_millis(1300);

/// Most often an ordered hook's finished events are acknowledged (one acknowledgement of the
/// highest finished sequence for all that finished meanwhile).
pub(super) const ACK_BATCH_EVERY: Duration = Duration::from_millis(2);

/// What this worker starts, signals and hands back is bounded by the shortest of its own wait
/// and its consumers' (issue 56 row 2: the broker redelivers after theirs).
fn bounded_wait(
    sh: &Shared,
    consumer: &jetstream::consumer::PullConsumer,
    retries: &jetstream::consumer::PullConsumer,
) -> Duration {
    sh.opts
        .broker_wait()
        .min(consumer.cached_info().config.ack_wait)
        .min(retries.cached_info().config.ack_wait)
}

/// Pulls the hook's events and hands each to the host as soon as it arrives, in stream order
/// (the broker holds back more than `window` unacknowledged ones; the hook's local queue keeps
/// them in order and the handler's own concurrency and pipelining apply), and its retries when
/// they are due. An ordered hook is pulled only while this worker holds its lease.
pub(super) async fn consume(
    sh: Arc<Shared>,
    stream: jetstream::stream::Stream,
    s: Settings,
    counters: Arc<Counters>,
    slot: Arc<Mutex<Option<jetstream::consumer::PullConsumer>>>,
    (mut stop, renamed, retiring): (
        watch::Receiver<bool>,
        watch::Receiver<String>,
        Arc<std::sync::atomic::AtomicU64>,
    ),
) {
    let mut run: Option<Run> = None;
    let mut pause = Duration::from_millis(100);
    let mut lease: Option<crate::fleet::lease::Lease> = None;
    let mut leases: Option<(async_nats::jetstream::kv::Store, Duration)> = None;
    'outer: while !*stop.borrow() {
        // The consumers first (the hook joins the fleet view with it, also on a standby worker).
        let consumers = async {
            let c = ensure_consumer(&sh, &stream, &s).await?;
            let r = crate::fleet::retry::ensure_consumer(
                &stream,
                &sh.cfg,
                &s.key,
                sh.opts.broker_wait(),
                s.since,
            )
            .await?;
            Ok::<_, String>((c, r))
        };
        let (consumer, retries) = match consumers.await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(hook = %s.name, "fleet: {e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.changed() => break 'outer,
                }
                pause = (pause * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        if let Ok(mut g) = slot.lock() {
            *g = Some(consumer.clone());
        }
        // Cumulative acknowledgements only on a consumer made with them (one made by an older
        // version keeps explicit ones until it is recreated).
        let ack_all =
            consumer.cached_info().config.ack_policy == jetstream::consumer::AckPolicy::All;
        let wait = bounded_wait(&sh, &consumer, &retries);
        if let Some(r) = run
            .as_mut()
            .filter(|r| r.main.ack_all() != ack_all || r.retry.ack_wait() > Some(wait))
        {
            r.drain(None).await;
            run = None;
        }
        let r = run.get_or_insert_with(|| {
            Run::new(
                sh.clone(),
                s.clone(),
                counters.clone(),
                (ack_all, wait),
                renamed.clone(),
                retiring.clone(),
            )
        });
        r.repeats_to = crate::fleet::repeats::delivered_before(
            consumer.cached_info().config.description.as_deref(),
        );
        if s.ordered() && lease.is_none() {
            match take_lease(&sh, &s, &mut leases, &mut stop).await {
                Some(l) => lease = Some(l),
                None => break 'outer,
            }
            r.read_note(&leases).await;
            r.took_lease(&leases, lease.as_ref());
        }
        let mut handed_over = false;
        let held = lease.is_some();
        match r.session(&consumer, &retries, &mut lease, &mut stop).await {
            Ended::Stop => break 'outer,
            Ended::HandOver => {
                if !r.hand_over(lease.take(), &leases, &mut stop).await {
                    break 'outer;
                }
                handed_over = true;
            }
            Ended::Again => {}
        }
        // A hand-over settled everything before releasing the lease: nothing to finish, and no
        // `finishing` key that would hold the next holder's catch-up.
        if s.ordered() && lease.is_none() && !handed_over {
            r.stand_down(&leases).await;
            if held {
                // Lost: the bucket may be gone with a broker restart (made in memory); it
                // is made again before the next try (issue 48: 2.9 otherwise stalled 10 s).
                leases = None;
            }
        }
        if std::mem::take(&mut r.pulled) {
            pause = Duration::from_millis(100);
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => break 'outer,
        }
        pause = (pause * 2).min(Duration::from_secs(1));
    }
    stopped(&sh, run, lease, &leases).await;
}

/// The hook's consume task stops: what was delivered runs until shortly before the service's
/// drain timeout (what has not started then is left to the ack wait: another worker gets it),
/// retries waiting for their time go back, then the lease (if held) is released.
async fn stopped(
    sh: &Shared,
    run: Option<Run>,
    lease: Option<crate::fleet::lease::Lease>,
    leases: &Option<(async_nats::jetstream::kv::Store, Duration)>,
) {
    if let Some(mut r) = run {
        let stop_by = sh.stop_by.lock().ok().and_then(|by| *by);
        r.drain(stop_by.map(|t| t.checked_sub(STOP_MARGIN).unwrap_or(t)))
            .await;
        // Retries still waiting for their time: back to the broker for the next worker.
        r.waiting.abort_all();
        r.retry.give_back_all().await;
        if lease.is_some() {
            r.leave_release_note(leases).await;
        }
        r.clear_marks().await;
    }
    // Only now (every event this worker held is settled) may the next worker start.
    if let Some(l) = lease {
        l.release().await;
    }
}
