//! The events a worker holds for one hook's consumer during one pull session: delivered, not
//! yet acknowledged. It owns their acknowledgements and their progress signals.
//!
//! A held message carries one event or a bundle of them ([`super::envelope`]): it is finished
//! when each of its events is (finished, or handed back), and handed back (`Nak`, once) as soon
//! as one of its events is. Each holding has its own id, so the events of a delivery that was
//! handed back and delivered again never count towards the new delivery. A message none of
//! whose events started can be left ([`Held::leave`]): no more progress signals, never
//! acknowledged from this holding, so the broker delivers it again after the ack wait.
//!
//! - **Acknowledgements.** On a consumer with `AckPolicy::All` (ordered hooks) one
//!   acknowledgement of stream sequence `s` acknowledges every event of the consumer up to `s`.
//!   So an event is only marked finished here, and [`Held::flush`] acknowledges the highest
//!   sequence below which every held event is finished (one message per batch instead of one per
//!   event); an event still running, or handed back for redelivery (`Nak`), stops the flush
//!   there, so no event is ever acknowledged that did not run. Nor one this worker never
//!   read: a delivery sequence skipped stops every acknowledgement until the worker caught up
//!   ([`Held::take_gap`]). On an `Explicit` consumer each
//!   event is acknowledged on its own when it finishes.
//! - **Taking over.** While a new lease holder waits for what the previous one left pending
//!   ([`Held::pause`]), nothing is acknowledged: the broker redelivers a dead holder's events in
//!   the order their ack waits ran out, not in stream order, and a cumulative acknowledgement of
//!   one that came early would settle lower ones still on their way back (issue 34).
//! - **Progress.** [`Held::progress`] (every third of the ack wait) sends a progress signal for
//!   every held message not handed back, so none is redelivered while it waits in the hook's
//!   local queue, runs, or (`All`) waits finished for a lower one to be acknowledged: one timer
//!   per session instead of a task and a timer per event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{AckKind, Message};
use tokio::sync::Notify;

use crate::start_gate::{StartGate, monotonic_ns};

/// One held message.
struct Slot {
    msg: Arc<Message>,
    /// The consumer's delivery sequence of this delivery (the broker's ack floor is kept in
    /// it: [`Held::flush`]).
    dseq: u64,
    /// Which holding of the sequence this is.
    id: u64,
    /// Its events not yet finished or handed back.
    left: usize,
    /// Handed back: redelivered, never acknowledged from this holding.
    back: bool,
    /// Finished (acknowledged by the next [`Held::flush`]).
    done: bool,
    /// `Explicit`: until when this delivery is surely this worker's (its ack wait from its
    /// arrival or the last progress signal, less a margin); its events start only before
    /// ([`Held::delivery_gate`]).
    gate: Option<Arc<StartGate>>,
}

/// What to do after marking one event of a held message.
enum Then {
    Nothing,
    /// `All`: the message is finished; the flusher acknowledges it.
    Flush,
    /// Acknowledge the message now.
    Ack,
}

/// The events held for one consumer (see the module comment).
pub struct Held {
    ack_all: bool,
    slots: Mutex<BTreeMap<u64, Slot>>,
    /// The id of the next holding.
    next: std::sync::atomic::AtomicU64,
    /// Woken when an event finishes (the flusher batches what finished meanwhile).
    pub finished: Notify,
    /// No acknowledgement while set ([`Held::pause`]).
    paused: std::sync::atomic::AtomicBool,
    /// An ordered hook's lease bound ([`Held::set_gate`]): nothing is sent past it.
    gate: Mutex<Option<Arc<crate::start_gate::StartGate>>>,
    /// The delivery sequence of the last cumulative acknowledgement sent ([`Held::flush`]).
    acked_dseq: std::sync::atomic::AtomicU64,
    /// `Explicit`: the consumer's ack wait and the period of the progress signals, for the
    /// deliveries' gates ([`Held::delivery_gate`]).
    deadline: Option<(Duration, Duration)>,
    /// When the last round of progress signals began (monotonic ns).
    last_round: std::sync::atomic::AtomicU64,
    /// `Explicit`: when a round found the one before it older than a delivery's gate allows
    /// (the worker was stopped or starved): what the pull had buffered by then may have been
    /// sent on by the broker ([`Held::lapsed_since`]). 0: never.
    lapsed_at: std::sync::atomic::AtomicU64,
    /// `Explicit`: when the broker connection was last lost (monotonic ns; 0: never), for the
    /// deliveries' gates ([`StartGate::linked`]).
    lost: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// `All`: the consumer's delivery sequence this worker expects next (0: not known yet,
    /// [`Held::expect_anew`]); a delivery above it is a gap ([`Held::take_gap`]).
    expect: std::sync::atomic::AtomicU64,
    /// `All`: deliveries of the consumer never reached this worker since the last
    /// [`Held::take_gap`].
    gap: std::sync::atomic::AtomicBool,
}

impl Held {
    /// For a consumer whose acknowledgement policy is `All` (`ack_all`) or `Explicit`, whose
    /// ack wait is `ack_wait`, tended every `progress` ([`tend`]). An `Explicit` delivery's gate
    /// also shuts once the broker connection is lost after it arrived (`lost`: when it was last
    /// lost, set by the connection's events): a broker that restarts may send it to another
    /// worker as new, saying `delivered` 1.
    pub fn new(
        ack_all: bool,
        ack_wait: Duration,
        progress: Duration,
        lost: Option<Arc<std::sync::atomic::AtomicU64>>,
    ) -> Self {
        Self {
            lost: lost.filter(|_| !ack_all),
            deadline: (!ack_all).then_some((ack_wait, progress)),
            last_round: std::sync::atomic::AtomicU64::new(monotonic_ns()),
            lapsed_at: Default::default(),
            ack_all,
            slots: Mutex::new(BTreeMap::new()),
            next: Default::default(),
            finished: Notify::new(),
            paused: Default::default(),
            gate: Mutex::new(None),
            acked_dseq: Default::default(),
            expect: Default::default(),
            gap: Default::default(),
        }
    }

    /// Sends nothing for these events (acknowledgement, progress, hand-back) once `gate`'s
    /// bound passed (issue 48: the lease, and with it these deliveries, may be another
    /// worker's); `None`: no bound (not a lease holder's events).
    pub fn set_gate(&self, gate: Option<Arc<crate::start_gate::StartGate>>) {
        if let Ok(mut g) = self.gate.lock() {
            *g = gate;
        }
    }

    /// Whether anything may be sent for these events now ([`Held::set_gate`]).
    pub fn may_send(&self) -> bool {
        self.gate
            .lock()
            .map(|g| g.as_ref().is_none_or(|g| g.within_bound()))
            .unwrap_or(false)
    }

    /// Holds back every acknowledgement (`true`) until called with `false`, which flushes what
    /// finished meanwhile.
    pub fn pause(&self, paused: bool) {
        self.paused
            .store(paused, std::sync::atomic::Ordering::SeqCst);
        if !paused {
            self.finished.notify_one();
        }
    }

    /// Messages held (finished ones not yet acknowledged included).
    pub fn count(&self) -> usize {
        self.slots.lock().map_or(0, |s| s.len())
    }

    /// `Explicit`: the ack wait its deliveries' gates are bounded by (`None`: `All`).
    pub fn ack_wait(&self) -> Option<Duration> {
        self.deadline.map(|(wait, _)| wait)
    }

    /// Whether acknowledgements are cumulative (`AckPolicy::All`).
    pub fn ack_all(&self) -> bool {
        self.ack_all
    }

    /// Holds a delivered message of `events` events (a redelivery replaces the message of its
    /// sequence); returns the holding's id, which [`Held::finish`] and [`Held::give_back`] take.
    pub fn hold(&self, seq: u64, msg: Arc<Message>, events: usize) -> u64 {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dseq = msg.info().map_or(0, |i| i.consumer_sequence);
        if self.ack_all && dseq > 0 {
            self.saw_delivery(seq, dseq);
        }
        if let Ok(mut s) = self.slots.lock() {
            let slot = Slot {
                dseq,
                msg,
                id,
                left: events.max(1),
                back: false,
                done: false,
                gate: self.arrival_gate(),
            };
            s.insert(seq, slot);
        }
        id
    }

    /// `All`: the consumer delivered `dseq` (stream sequence `seq`) here. The broker numbers a
    /// consumer's deliveries one by one, and only the lease holder pulls: a number skipped is a
    /// delivery that went where this worker never read it (a pull session that ended with
    /// messages still on their way to it, a previous holder's pull request still open at the
    /// broker). Such a message stays pending at the broker until its ack wait, and one
    /// cumulative acknowledgement of any later stream sequence would settle it unrun (issue 56
    /// row 1: six bundles lost so after a holder froze just under its lease). So nothing is
    /// acknowledged from here until the worker caught up ([`Held::take_gap`]).
    fn saw_delivery(&self, seq: u64, dseq: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        let expected = self.expect.swap(dseq + 1, SeqCst);
        if expected > 0 && dseq > expected {
            self.paused.store(true, SeqCst);
            self.gap.store(true, SeqCst);
            tracing::info!(
                seq,
                missed = dseq - expected,
                "fleet: deliveries of the ordered hook's consumer never reached this worker; it acknowledges nothing until they are back"
            );
        }
    }

    /// `All`: whether deliveries were skipped since the last call ([`Held::saw_delivery`]);
    /// acknowledgements stay held back ([`Held::pause`]) until the caller has every pending
    /// event of the consumer here and unpauses.
    pub fn take_gap(&self) -> bool {
        self.gap.swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// `All`: the next delivery starts the count of deliveries afresh (a new holding of the
    /// lease catches up on what was delivered elsewhere).
    pub fn expect_anew(&self) {
        self.expect.store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// One event of the message at `seq` (holding `id`) is finished: when it was the last one,
    /// the message is acknowledged with `kind` at once (`Explicit`), or marked finished for the
    /// next flush whatever `kind` (`All`: the flush acknowledges in order).
    pub async fn finish(&self, seq: u64, id: u64, msg: &Message, kind: AckKind) {
        let then = match self.slots.lock() {
            Ok(mut s) => match s.get_mut(&seq) {
                Some(slot) if slot.id == id => {
                    slot.left = slot.left.saturating_sub(1);
                    if slot.left > 0 {
                        Then::Nothing
                    } else if slot.back {
                        // Handed back: what comes again is held anew.
                        if !self.ack_all {
                            s.remove(&seq);
                        }
                        Then::Nothing
                    } else if self.ack_all && seq > 0 {
                        // Any final kind: on a cumulative consumer a `Term` of this sequence
                        // would also settle every earlier one still running or handed back,
                        // so the flush acknowledges it in order instead.
                        slot.done = true;
                        Then::Flush
                    } else {
                        s.remove(&seq);
                        Then::Ack
                    }
                }
                // No sequence to hold it by (no delivery info): acknowledged on its own.
                None if seq == 0 => Then::Ack,
                // A holding replaced by a redelivery: never acknowledge for it (the broker
                // redelivers after the ack wait what no holding finishes).
                _ => {
                    tracing::debug!(
                        seq,
                        "fleet: finished event of an older delivery; left to the new one"
                    );
                    Then::Nothing
                }
            },
            Err(_) => Then::Nothing,
        };
        match then {
            Then::Nothing => {}
            Then::Flush => self.finished.notify_one(),
            Then::Ack if !self.may_send() => {}
            Then::Ack => {
                // Boxed: the publish's future would otherwise be part of every event's.
                if let Err(e) = Box::pin(msg.ack_with(kind)).await {
                    tracing::warn!(
                        seq,
                        "fleet: acknowledgement not sent ({e}); the event will come again"
                    );
                }
            }
        }
    }

    /// Hands one event of the message at `seq` (holding `id`) back for redelivery (after
    /// `delay`): the whole message goes back, once. On an `All` consumer it stays held,
    /// unfinished, so no flush acknowledges past it until it is redelivered and finished.
    pub async fn give_back(&self, seq: u64, id: u64, msg: &Message, delay: Option<Duration>) {
        let nak = match self.slots.lock() {
            Ok(mut s) => match s.get_mut(&seq) {
                Some(slot) if slot.id == id => {
                    slot.left = slot.left.saturating_sub(1);
                    let first = !slot.back;
                    slot.back = true;
                    // Past its ack wait the broker may have sent it to another worker, which a
                    // `Nak` would start again: left to the broker (it delivers it on its own).
                    let lapsed = slot.gate.as_ref().is_some_and(|g| !g.within_bound());
                    if !self.ack_all && slot.left == 0 {
                        s.remove(&seq);
                    }
                    first && !lapsed
                }
                None => seq == 0,
                _ => false,
            },
            Err(_) => false,
        };
        if nak && self.may_send() {
            let _ = msg.ack_with(AckKind::Nak(delay)).await;
        }
    }

    /// Leaves the message at `seq` (holding `id`), none of whose events started, to the ack
    /// wait: no more progress signals, never acknowledged from this holding (on an `All`
    /// consumer it stays held, unfinished, so no flush passes it), `Nak`ed when `nak` (the
    /// broker delivers it again at once: only when no pull request of this worker is open).
    /// Returns whether it was held so.
    pub async fn leave(&self, seq: u64, id: u64, nak: bool) -> bool {
        let msg = match self.slots.lock() {
            Ok(mut s) => match s.get_mut(&seq) {
                Some(slot) if slot.id == id && !slot.back => {
                    slot.back = true;
                    slot.left = 0;
                    let msg = slot.msg.clone();
                    if !self.ack_all {
                        s.remove(&seq);
                    }
                    Some(msg)
                }
                _ => None,
            },
            Err(_) => None,
        };
        match msg {
            Some(m) if nak => {
                if self.may_send() {
                    let _ = m.ack_with(AckKind::Nak(None)).await;
                }
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// `Explicit`: the gate of a delivery that arrives now. Its ack wait began when the broker
    /// sent it, which may be long before it is read here (a worker stopped with SIGSTOP reads
    /// on waking what the broker sent before): counted from the last round of progress signals
    /// plus one period at most, which a stopped or starved worker did not have.
    fn arrival_gate(&self) -> Option<Arc<StartGate>> {
        let (ack_wait, progress) = self.deadline?;
        let now = monotonic_ns();
        let round = self
            .last_round
            .load(std::sync::atomic::Ordering::SeqCst)
            .saturating_add(progress.as_nanos() as u64);
        let until = StartGate::bound(now.min(round), ack_wait, delivery_margin(ack_wait));
        Some(Arc::new(match &self.lost {
            Some(lost) => StartGate::linked(until, lost.clone()),
            None => StartGate::new(until),
        }))
    }

    /// `Explicit`: whether the broker connection was lost after `since` (monotonic ns; the
    /// pull session's start): what the session's buffer holds was delivered over the lost
    /// connection, and the session ends unread (the broker delivers it again).
    pub fn link_lost_since(&self, since: u64) -> bool {
        self.lost
            .as_ref()
            .is_some_and(|l| l.load(std::sync::atomic::Ordering::SeqCst) > since)
    }

    /// `Explicit`: whether a round of progress signals found the worker stopped or starved
    /// past a delivery's gate after `since` (monotonic ns; the pull session's start): a message
    /// read from that session's buffer may be one the broker already sent on to another
    /// worker, so the session ends unread (its messages come back with their ack wait).
    pub fn lapsed_since(&self, since: u64) -> bool {
        self.deadline.is_some() && self.lapsed_at.load(std::sync::atomic::Ordering::SeqCst) > since
    }

    /// `Explicit`: the gate of holding `id` of `seq` (`None`: `All`, whose lease holder's gate
    /// governs, or not held). Each of its events starts only while the gate is open: a worker
    /// stopped or starved past its delivery's ack wait starts nothing the broker may have
    /// delivered to another worker meanwhile (issue 56).
    pub fn delivery_gate(&self, seq: u64, id: u64) -> Option<Arc<StartGate>> {
        let slots = self.slots.lock().ok()?;
        let slot = slots.get(&seq).filter(|slot| slot.id == id)?;
        slot.gate.clone()
    }

    /// Whether holding `id` of `seq` is still the one held and not handed back (an event of a
    /// message handed back or delivered again since is brought by the new delivery). True for
    /// a message without a sequence (never held).
    pub fn current(&self, seq: u64, id: u64) -> bool {
        if seq == 0 {
            return true;
        }
        self.slots
            .lock()
            .is_ok_and(|s| s.get(&seq).is_some_and(|slot| slot.id == id && !slot.back))
    }

    /// `All`: acknowledges the highest sequence up to which every held event is finished and
    /// whose acknowledgement keeps every later held event's hand-back valid ([`ack_point`]),
    /// and forgets those events. Returns how many it acknowledged.
    pub async fn flush(&self) -> usize {
        if !self.ack_all
            || self.paused.load(std::sync::atomic::Ordering::SeqCst)
            || !self.may_send()
        {
            return 0;
        }
        let (last, n) = {
            let Ok(mut s) = self.slots.lock() else {
                return 0;
            };
            let acked = self.acked_dseq.load(std::sync::atomic::Ordering::SeqCst);
            let marks: Vec<(bool, bool, u64)> =
                s.values().map(|x| (x.done, x.back, x.dseq)).collect();
            let Some(n) = ack_point(&marks, acked) else {
                return 0;
            };
            let mut last = None;
            for _ in 0..n {
                last = s.pop_first().map(|(_, slot)| slot);
            }
            (last, n)
        };
        if let Some(slot) = last {
            self.acked_dseq
                .fetch_max(slot.dseq, std::sync::atomic::Ordering::SeqCst);
            if let Err(e) = slot.msg.ack().await {
                tracing::warn!(
                    "fleet: acknowledgement of {n} event(s) not sent ({e}); they will come again"
                );
            }
        }
        n
    }

    /// Sends a progress signal for every held message not handed back (that would hold back
    /// its redelivery), the finished ones too: a finished message stays held, unacknowledged,
    /// while a lower one is handed back or still runs, and without signals the broker would
    /// deliver it again after the ack wait (issue 34).
    pub async fn progress(&self) {
        if !self.may_send() {
            return;
        }
        let sent = monotonic_ns();
        let before = self
            .last_round
            .swap(sent, std::sync::atomic::Ordering::SeqCst);
        if let Some((ack_wait, _)) = self.deadline {
            let kept = ack_wait
                .saturating_sub(delivery_margin(ack_wait))
                .as_nanos() as u64;
            if sent.saturating_sub(before) >= kept {
                self.lapsed_at
                    .store(sent, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let msgs: Vec<(Arc<Message>, Option<Arc<StartGate>>)> = match self.slots.lock() {
            Ok(s) => s
                .values()
                .filter(|slot| !slot.back)
                .map(|slot| (slot.msg.clone(), slot.gate.clone()))
                .collect(),
            Err(_) => return,
        };
        for (m, gate) in msgs {
            if m.ack_with(AckKind::Progress).await.is_ok()
                && let (Some(g), Some((ack_wait, _))) = (gate, self.deadline)
            {
                // A delivery whose gate shut stays shut: the broker may have sent it on.
                g.renew(StartGate::bound(sent, ack_wait, delivery_margin(ack_wait)));
            }
        }
    }

    /// Forgets every held event (the lease was lost and the events still held were handed
    /// back: whoever pulls next gets them).
    pub fn forget(&self) {
        if let Ok(mut s) = self.slots.lock() {
            s.clear();
        }
    }

    /// Hands back (nak) every held message not finished, whatever the gate says, and returns
    /// how many: after a broker restart, when no pull request of this worker is open there.
    pub async fn hand_back_unfinished(&self) -> usize {
        let msgs: Vec<Arc<Message>> = match self.slots.lock() {
            Ok(s) => s
                .values()
                .filter(|slot| !slot.done)
                .map(|slot| slot.msg.clone())
                .collect(),
            Err(_) => return 0,
        };
        for m in &msgs {
            let _ = m.ack_with(AckKind::Nak(None)).await;
        }
        msgs.len()
    }

    /// Hands back every held message not finished (stopping: another worker takes them now).
    pub async fn give_back_all(&self) {
        let held: Vec<(u64, u64)> = match self.slots.lock() {
            Ok(s) => s
                .iter()
                .filter(|(_, slot)| !slot.done)
                .map(|(seq, slot)| (*seq, slot.id))
                .collect(),
            Err(_) => return,
        };
        for (seq, id) in held {
            self.leave(seq, id, true).await;
        }
    }
}

/// How many of the first held messages (stream order) one cumulative acknowledgement settles
/// now, `None` for none (issue 48 row 2). The broker keeps its ack floor as a delivery sequence:
/// a cumulative acknowledgement sent through a delivery with sequence `d` is ignored unless `d`
/// is above the floor, and then raises the floor to `d`, after which a hand-back (`Nak`) of any
/// delivery at or below `d` is ignored too (it comes back only when its ack wait runs out). A
/// message delivered again (a hand-over's, a dead holder's) has a newer delivery sequence than
/// later messages delivered before it. So the acknowledgement goes through the latest finished
/// message of the finished prefix whose delivery sequence is above the last one sent (`acked`)
/// and below every later held message's that may still be handed back (finished ones
/// included: they are acknowledged later, through a delivery of their own or a later one).
///
/// `slots`: each held message's (finished, handed back, delivery sequence), in stream order.
fn ack_point(slots: &[(bool, bool, u64)], acked: u64) -> Option<usize> {
    let prefix: Vec<u64> = slots
        .iter()
        .take_while(|(done, _, _)| *done)
        .map(|&(_, _, d)| d)
        .collect();
    let mut below = slots[prefix.len()..]
        .iter()
        .filter(|(_, back, _)| !back)
        .map(|&(_, _, d)| d)
        .min()
        .unwrap_or(u64::MAX);
    for (i, &d) in prefix.iter().enumerate().rev() {
        if d < below && d > acked {
            return Some(i + 1);
        }
        below = below.min(d);
    }
    None
}

/// What a delivery's gate keeps off its ack wait: a quarter of it (the signal's way to the
/// broker, a late timer), at least 100 ms.
fn delivery_margin(ack_wait: Duration) -> Duration {
    (ack_wait / 4).max(Duration::from_millis(100))
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

#[cfg(test)]
mod tests {
    use super::ack_point;

    /// Issue 48 row 2's broker trace: stream 211 delivered again (delivery 223) after 212-214
    /// (deliveries 219-221). An acknowledgement through 223 would raise the broker's ack floor
    /// above 219-221 and their hand-back would be ignored: it waits until they are handed
    /// back or finished, then goes through.
    #[test]
    fn no_acknowledgement_passes_a_delivery_that_may_still_be_handed_back() {
        let (done, open, back) = ((true, false), (false, false), (false, true));
        let at = |(d, b): (bool, bool), dseq| (d, b, dseq);
        let held = [at(done, 223), at(open, 219), at(open, 220), at(open, 221)];
        assert_eq!(ack_point(&held, 200), None);
        // Handed back (nak sent): the acknowledgement may pass them now.
        let held = [at(done, 223), at(back, 219), at(back, 220), at(back, 221)];
        assert_eq!(ack_point(&held, 200), Some(1));
        // Finished in the meantime: one acknowledgement through the last.
        let held = [at(done, 223), at(done, 219), at(done, 220), at(done, 221)];
        assert_eq!(ack_point(&held, 200), Some(4));
        // In order (the common case): the whole finished prefix at once.
        let held = [at(done, 10), at(done, 11), at(open, 12), at(done, 13)];
        assert_eq!(ack_point(&held, 9), Some(2));
        // Never through a delivery at or below the last acknowledgement's (the broker would
        // ignore it), never past an unfinished lower one.
        let held = [at(done, 12), at(open, 30)];
        assert_eq!(ack_point(&held, 12), None);
        let held = [at(done, 40), at(done, 39), at(open, 38)];
        assert_eq!(ack_point(&held, 20), None);
        let held = [at(done, 36), at(done, 35), at(open, 38)];
        assert_eq!(ack_point(&held, 20), Some(2));
        assert_eq!(ack_point(&[], 0), None);
    }
}
