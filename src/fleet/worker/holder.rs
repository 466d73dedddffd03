//! An ordered hook's lease, as the pull loop holds it: waiting to take it, handing it over to
//! a worker with another version, giving back what a stopping worker was delivered.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use tokio::sync::watch;

use crate::fleet::consumer_name;

use super::state::*;

/// How long before the drain timeout a stopping worker stops starting what it holds (what runs
/// then still has that long to finish and be acknowledged).
pub(super) const STOP_MARGIN: Duration = Duration::from_millis(500);

/// An event only another version of the ordered hook matches (`head`, when known): gives the
/// lease up and stands back until another worker took it, or no other live version matches
/// `head` any more (its worker gone: this one takes the lease back), or half the lease's time
/// passed. False when stopping meanwhile.
pub(super) async fn hand_over(
    sh: &Shared,
    s: &Settings,
    lease: Option<crate::fleet::lease::Lease>,
    leases: &Option<(async_nats::jetstream::kv::Store, Duration)>,
    head: Option<&str>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    if let Some(l) = lease {
        l.release().await;
    }
    let most = leases
        .as_ref()
        .map_or(Duration::from_secs(1), |(_, t)| *t / 2);
    tracing::info!(hook = %s.name, event = head.unwrap_or(""), "fleet: an event for another version of this ordered hook: lease handed over");
    let until = tokio::time::Instant::now() + most;
    let key = consumer_name(&s.key);
    loop {
        if let Some((store, _)) = leases
            && crate::fleet::lease::held(store, &key).await
        {
            return true;
        }
        if head.is_some_and(|e| !sh.versions.other_matches(&s.key, e, None))
            || tokio::time::Instant::now() >= until
        {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = stop.changed() => return false,
        }
    }
}

/// Stops the pulls and hands back what they had delivered but nobody took; returns the lowest
/// and highest stream sequence handed back. nats-server 2.9 keeps a pull request until it
/// expires, also once nobody reads it, and delivers to it what is published or given back
/// meanwhile (lost until the ack wait: the next holder stalled that long). So the pulls stay
/// subscribed, not read (they ask for nothing more), for `expired` (their requests' expiry and
/// a margin), then what they brought is taken without a pause (no new request goes out) and
/// given back.
pub(super) async fn drop_and_give_back(
    streams: [jetstream::consumer::pull::Stream; 2],
    expired: Duration,
) -> Option<(u64, u64)> {
    use futures_util::FutureExt;
    tokio::time::sleep(expired).await;
    let mut buffered = Vec::new();
    for mut messages in streams {
        while let Some(Some(item)) = messages.next().now_or_never() {
            if let Ok(msg) = item {
                buffered.push(msg);
            }
        }
    }
    let mut range: Option<(u64, u64)> = None;
    for msg in buffered {
        if let Ok(i) = msg.info() {
            let seq = i.stream_sequence;
            range = Some(range.map_or((seq, seq), |(a, b)| (a.min(seq), b.max(seq))));
        }
        let _ = msg.ack_with(AckKind::Nak(None)).await;
    }
    range
}

/// Waits until this worker holds the ordered hook's lease; `None` when stopping first.
pub(super) async fn take_lease(
    sh: &Shared,
    s: &Settings,
    leases: &mut Option<(async_nats::jetstream::kv::Store, Duration)>,
    stop: &mut watch::Receiver<bool>,
) -> Option<crate::fleet::lease::Lease> {
    let mut logged = false;
    // Woken by the lease's changes: a holder handing over or stopping releases it, and the
    // hook moves on at once, not on this worker's next try.
    let mut watch = None;
    loop {
        let mut wait = Duration::from_millis(500);
        if leases.is_none() {
            match crate::fleet::lease::bucket(&sh.cfg, &sh.js, sh.opts.broker_wait()).await {
                Ok(b) => *leases = Some(b),
                Err(e) => tracing::warn!(hook = %s.name, "fleet: {e}; retrying"),
            }
        }
        if let Some((store, ttl)) = leases.as_ref() {
            wait = *ttl / 4;
            if watch.is_none() {
                watch = store.watch(consumer_name(&s.key)).await.ok();
            }
            match crate::fleet::lease::Lease::try_take(
                store,
                *ttl,
                &consumer_name(&s.key),
                &sh.opts.id,
            )
            .await
            {
                Ok(Some(l)) => {
                    tracing::info!(hook = %s.name, "fleet: this worker pulls the ordered hook (lease taken)");
                    return Some(l);
                }
                Ok(None) => {
                    let key = consumer_name(&s.key);
                    if let Some(left) = crate::fleet::lease::expires_in(store, *ttl, &key).await {
                        let margin = Duration::from_millis(20);
                        wait = (left + margin).clamp(margin, *ttl / 4);
                    }
                    if !logged {
                        tracing::info!(hook = %s.name, "fleet: another worker pulls this ordered hook; standing by");
                        logged = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(hook = %s.name, "fleet: {e}; retrying");
                    *leases = None;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = crate::fleet::lease::changed(&mut watch) => {}
            _ = stop.changed() => return None,
        }
    }
}

/// Stopping: hands back at once what the broker already delivered but no handler started, so
/// that another worker gets it now rather than after the ack wait. Returns the lowest and
/// highest stream sequence handed back.
pub(super) async fn give_back(
    messages: &mut jetstream::consumer::pull::Stream,
) -> Option<(u64, u64)> {
    use futures_util::FutureExt;
    let mut range: Option<(u64, u64)> = None;
    while let Some(Some(Ok(msg))) = messages.next().now_or_never() {
        if let Ok(i) = msg.info() {
            let seq = i.stream_sequence;
            range = Some(range.map_or((seq, seq), |(a, b)| (a.min(seq), b.max(seq))));
        }
        let _ = msg.ack_with(AckKind::Nak(None)).await;
    }
    range
}
