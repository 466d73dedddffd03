//! After the handler: acknowledgement, retry through the hook's retry subject, hand-over to
//! another version, dead letter.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use crate::fleet::envelope::{DeadLetter, VERSION};
use crate::fleet::versions::Fate;

use super::deliver::*;
use super::state::*;

/// Whether the hook no longer runs under `s.name` but does under another name with the same
/// identity (renamed while the call waited).
pub(super) fn renamed_away(sh: &Shared, s: &Settings) -> bool {
    let snap = sh.host.snapshot();
    snap.get(&s.name).is_none()
        && snap
            .hooks
            .iter()
            .any(|h| crate::fleet::identity::of(&h.spec) == s.key)
}

pub(super) type Outcome = Result<Option<crate::hook::CallOutcome>, crate::host::EmitError>;

/// After the handler: acknowledge, or [`settle_other`].
pub(super) async fn settle(
    sh: &Shared,
    s: &Settings,
    counters: &Counters,
    d: Delivery,
    outcome: Outcome,
) {
    match outcome {
        Ok(Some(o)) if o.result.is_ok() => acknowledge(counters, d).await,
        // Boxed: the rare paths (publishing a retry or a dead letter) would make every event's
        // future several times larger.
        other => Box::pin(settle_other(sh, s, counters, d, other)).await,
    }
}

/// Acknowledges a delivery whose handler succeeded.
pub(super) async fn acknowledge(counters: &Counters, d: Delivery) {
    d.settled(counters).await;
    counters.acked.fetch_add(1, Ordering::Relaxed);
}

/// After a handler failed, or did not run: retry later through the hook's retry subject (the
/// hook goes on with the next events meanwhile), or dead-letter, or hand the event back.
pub(super) async fn settle_other(
    sh: &Shared,
    s: &Settings,
    counters: &Counters,
    d: Delivery,
    outcome: Outcome,
) {
    let (msg, delivered, seq) = (&d.msg, d.delivered, d.seq);
    let error = match outcome {
        Err(_) => {
            // Shutting down: give it back now, another worker takes it.
            d.give_back(None).await;
            return;
        }
        Ok(v) => match v {
            None => {
                if sh.host.snapshot().get(&s.name).is_some() {
                    // A consumer narrowed to subjects, and this one outside this version's
                    // own: routed for another version (a retry is on its hook's retry
                    // subject, which they never cover). On a consumer of every event, only
                    // the other versions' patterns tell.
                    let subject = msg.subject.as_str();
                    let routed = s.filters != [sh.cfg.events_filter()]
                        && !crate::fleet::retry::is_retry(&sh.cfg, subject)
                        && !s
                            .own
                            .iter()
                            .any(|f| crate::fleet::subject_matches(f, subject));
                    // A version changed just before the event was accepted may not be heard
                    // of yet.
                    sh.versions
                        .wait_known(accepted(&d), sh.opts.status_interval)
                        .await;
                    let unrouted = !routed || sh.versions.settled(sh.opts.status_interval);
                    match not_run_here(sh, s, &d) {
                        Fate::Owed(why) => {
                            return dead_letter(sh, s, counters, d, delivered, why).await;
                        }
                        // A version this worker has not heard of yet may have asked for it.
                        Fate::Nobody(proof) if unrouted => d.skip(proof, counters).await,
                        Fate::Elsewhere | Fate::Nobody(_) => {
                            return for_another_version(sh, s, counters, d).await;
                        }
                    }
                } else {
                    d.give_back(None).await;
                }
                return;
            }
            Some(o) => o.result.err(),
        },
    };
    let Some(error) = error else {
        return acknowledge(counters, d).await;
    };
    if delivered < s.max_deliver {
        let shift = (delivered.max(1) - 1).min(16) as u32;
        let delay = (sh.opts.retry_backoff * 2u32.pow(shift)).min(Duration::from_secs(60));
        tracing::warn!(hook = %s.name, seq, delivered, "fleet: handler failed ({error}); retry in {}", crate::time::fmt_duration(delay));
        let retry = crate::fleet::retry::due_in(delivered, seq, delay);
        match crate::fleet::retry::publish(&sh.js, &sh.cfg, &s.key, &d.env, retry).await {
            Ok(()) => d.settled(counters).await,
            Err(e) => {
                // Not stored: the broker redelivers this one after the delay instead.
                tracing::warn!(hook = %s.name, seq, "fleet: retry not published ({e}); handing the event back");
                d.give_back(Some(delay)).await;
            }
        }
        counters.retried.fetch_add(1, Ordering::Relaxed);
        return;
    }
    dead_letter(sh, s, counters, d, delivered, error).await;
}

/// What becomes of delivery `d`, which this worker's version of the hook does not run
/// ([`crate::fleet::versions::Versions::fate`]).
pub(super) fn not_run_here(sh: &Shared, s: &Settings, d: &Delivery) -> Fate {
    sh.versions.fate(
        &s.key,
        &d.env.event,
        Some(d.seq),
        accepted(d),
        sh.opts.consumer_grace,
    )
}

/// Settles delivery `d`, which this worker's version of the hook does not run, as
/// [`not_run_here`] decides: handed on to another live version, dead-lettered with the reason,
/// or skipped with the proof that no version matches it.
pub(super) async fn settle_unrun(sh: &Shared, s: &Settings, counters: &Counters, d: Delivery) {
    let fate = not_run_here(sh, s, &d);
    settle_fate(sh, s, counters, d, fate).await;
}

/// Settles delivery `d`, which this worker's version of the hook does not run, as `fate`
/// says ([`settle_unrun`]).
pub(super) async fn settle_fate(
    sh: &Shared,
    s: &Settings,
    counters: &Counters,
    d: Delivery,
    fate: Fate,
) {
    match fate {
        Fate::Nobody(proof) => d.skip(proof, counters).await,
        Fate::Elsewhere => for_another_version(sh, s, counters, d).await,
        Fate::Owed(why) => {
            let delivered = d.delivered;
            dead_letter(sh, s, counters, d, delivered, why).await;
        }
    }
}

/// When the edge accepted the event (its envelope's time; else the broker's time of the
/// message, a retry's being later than the original's).
pub(super) fn accepted(d: &Delivery) -> std::time::SystemTime {
    humantime::parse_rfc3339_weak(&d.env.time)
        .ok()
        .or_else(|| d.msg.info().ok().map(|i| i.published.into()))
        .unwrap_or_else(std::time::SystemTime::now)
}

/// Another version of the hook matches the delivery, this one does not (a rolling update): it
/// goes to the hook's retry subject for a worker with that version (the original is finished),
/// and an ordered hook's lease holder hands the lease over so that such a worker pulls; on the
/// last delivery it is dead-lettered, never silently skipped.
///
/// An ordered hook's event from the stream (not a retry of one that ran) never goes to the
/// retry subject: a worker with the other version would run it after the events behind it.
/// Its feed routes such events before anything after them starts ([`super::handover`]'s
/// in-order hand-over), and a call its version, changed by a reload, no longer matches goes
/// back in order ([`super::feed`]'s `after_call`). One that still comes here (no lease gate
/// to stop the queue with, or a retirement that began between its route and its start) may
/// have events behind it started already: it is dead-lettered with that reason.
pub(super) async fn for_another_version(
    sh: &Shared,
    s: &Settings,
    counters: &Counters,
    d: Delivery,
) {
    let (delivered, seq) = (d.delivered, d.seq);
    if s.ordered() {
        counters.handover.notify_one();
        if !crate::fleet::retry::is_retry(&sh.cfg, d.msg.subject.as_str()) {
            let error = format!(
                "another live version of the ordered hook matches {:?}, this worker's does not, and the events after it may have started here: not run out of stream order (`dead replay` runs it)",
                d.env.event
            );
            return dead_letter(sh, s, counters, d, delivered, error).await;
        }
    }
    if delivered >= s.max_deliver {
        let error =
            "no pattern of this worker's version of the hook matches the event (a rolling update?)"
                .to_string();
        return dead_letter(sh, s, counters, d, delivered, error).await;
    }
    counters.mismatched.fetch_add(1, Ordering::Relaxed);
    let later = Duration::from_millis(200);
    let retry = crate::fleet::retry::due_in(delivered, seq, later);
    match crate::fleet::retry::publish(&sh.js, &sh.cfg, &s.key, &d.env, retry).await {
        Ok(()) => d.settled(counters).await,
        Err(e) => {
            tracing::warn!(hook = %s.name, seq, "fleet: event for another version not republished ({e}); handing it back");
            d.give_back(Some(later)).await;
        }
    }
}

/// Publishes the event to the dead-letter subject, then finishes it.
pub(super) async fn dead_letter(
    sh: &Shared,
    s: &Settings,
    counters: &Counters,
    d: Delivery,
    delivered: i64,
    error: String,
) {
    let Delivery {
        env,
        msg,
        seq,
        hseq,
        slot,
        key,
        held,
        ..
    } = d;
    let dead = DeadLetter {
        v: VERSION,
        hook: s.name.clone(),
        hook_id: Some(s.key.clone()),
        error: error.clone(),
        deliveries: delivered,
        worker: sh.opts.id.clone(),
        time: crate::time::now(),
        stream_seq: seq,
        envelope: env,
    };
    let id = format!("{}:{}:{seq}", dead.envelope.msg_id(), s.name);
    let payload = bytes::Bytes::from(serde_json::to_vec(&dead).unwrap_or_default());
    // Tried again in place until the dead-letter stream takes it: the event stays held (with
    // progress signals) meanwhile, never handed back (that would cost its message a delivery,
    // and on the last one the broker would drop it).
    let mut pause = sh.opts.retry_backoff.max(Duration::from_millis(100));
    loop {
        let publish = jetstream::message::PublishMessage::build()
            .payload(payload.clone())
            .message_id(id.as_str());
        let stored = match sh
            .js
            .send_publish(sh.cfg.dead_subject(&s.name), publish)
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match stored {
            Ok(()) => break,
            Err(e) => {
                tracing::error!(hook = %s.name, seq, "fleet: cannot publish the dead letter ({e}); trying again in {} (the event stays held at sequence {seq})", crate::time::fmt_duration(pause));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    }
    tracing::error!(hook = %s.name, seq, deliveries = delivered, "fleet: event moved to the dead-letter subject after {delivered} deliveries: {error}");
    held.finish(hseq, slot, &msg, AckKind::Ack).await;
    counters.dead.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut d) = counters.done.lock() {
        d.insert(key);
    }
}
