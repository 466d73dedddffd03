//! Which events an ordered hook's lease holder may have started on their last allowed delivery
//! (issue 48): the key-value bucket `<PREFIX>_ATTEMPTS`, one key per hook and worker.
//!
//! A holder that vanishes (its lease ran out: killed, or starved past its lease) leaves pending
//! what it held; the next holder gets them again, past their allowed deliveries by the broker's
//! count when they were on their last one. Only an event the vanished holder may have started
//! is dead-lettered unrun ("killed?"); the others never ran and run as their last attempt.
//! The holder runs one event at a time in stream order, so what it may have started is a short
//! span of positions (stream sequence, place in a bundle): before an event starts on its last
//! allowed delivery, the holder writes the span from its lowest such event not finished to a
//! few events ahead (as many as start within a few milliseconds at the hook's pace) unless the
//! span written covers it already. The key is taken back once everything it started finished
//! (a stand-down, a hand-over, a stop). A new holder reads every span of the hook.
//!
//! A key lives a day ([`KEEP`]; a handler runs for minutes at most, and an event still pending
//! a day after its mark is long past its ack wait), so the keys of holders that died (a worker
//! id is new with each process by default) do not pile up; the bucket is on the broker's file
//! storage, as the leases are (a broker restart keeps them). A span left by a worker that died
//! covers events long acknowledged: it matters only for events still pending.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::FleetConfig;

/// A place in the stream: an event's message sequence and its place in the message (a
/// bundle's events are 0, 1, ...).
pub type Pos = (u64, usize);

/// The positions from the first to the last, both included.
pub type Span = (Pos, Pos);

/// How long a write or read of the bucket may take before the holder goes on without it.
const WAIT: Duration = Duration::from_secs(1);

#[derive(Serialize, Deserialize)]
struct Mark {
    from: Pos,
    to: Pos,
}

/// How long a holder's marks live in the bucket.
pub const KEEP: Duration = Duration::from_secs(24 * 3600);

/// The bucket, created when missing (a bucket made before keys had a time to live gets one).
pub async fn bucket(cfg: &FleetConfig, js: &jetstream::Context) -> Result<kv::Store, String> {
    let name = cfg.attempts_bucket();
    let config = jetstream::stream::Config {
        max_age: KEEP,
        ..super::lease::kv_stream(
            cfg,
            &name,
            "hermes-hooks: what each ordered hook's holder may have started on a last delivery",
        )
    };
    let store = open_bucket(js, config.clone(), &name, WAIT * 2).await?;
    if let Ok(mut s) = js.get_stream(format!("KV_{name}")).await
        && let Ok(info) = s.info().await
        && info.config.max_age.is_zero()
    {
        let _ = js.update_stream(&config).await;
    }
    Ok(store)
}

/// Opens the key-value bucket `name` whose stream is `config`, made when missing, within
/// `wait`.
pub(super) async fn open_bucket(
    js: &jetstream::Context,
    config: jetstream::stream::Config,
    name: &str,
    wait: Duration,
) -> Result<kv::Store, String> {
    let made = async {
        js.get_or_create_stream(config)
            .await
            .map_err(|e| format!("cannot create the bucket {name}: {e}"))?;
        js.get_key_value(name)
            .await
            .map_err(|e| format!("cannot open the bucket {name}: {e}"))
    };
    tokio::time::timeout(wait, made)
        .await
        .map_err(|_| format!("the bucket {name} did not answer"))?
}

/// The key of `worker`'s span for the hook whose consumer is `consumer`: a key takes letters,
/// digits, `-` and `_` (anything else is written as `=` and its hex bytes).
pub(super) fn key(consumer: &str, worker: &str) -> String {
    use std::fmt::Write;
    let mut k = format!("{consumer}.");
    for b in worker.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            k.push(b as char);
        } else {
            let _ = write!(k, "={b:02x}");
        }
    }
    k
}

/// Says that `worker` may have started, on their last allowed delivery, the events of the
/// hook (`consumer`) from `span.0` to `span.1`; false when it could not be written in time.
pub async fn mark(store: &kv::Store, consumer: &str, worker: &str, span: Span) -> bool {
    let body = serde_json::to_vec(&Mark {
        from: span.0,
        to: span.1,
    })
    .unwrap_or_default();
    matches!(
        tokio::time::timeout(WAIT, store.put(key(consumer, worker), body.into())).await,
        Ok(Ok(_))
    )
}

/// Takes `worker`'s span for the hook back: everything it started finished.
pub async fn clear(store: &kv::Store, consumer: &str, worker: &str) {
    let _ = tokio::time::timeout(WAIT, store.purge(key(consumer, worker))).await;
}

/// Every worker's span for the hook (`consumer`); `None` when the bucket could not be read.
pub async fn spans(store: &kv::Store, consumer: &str) -> Option<Vec<Span>> {
    let prefix = format!("{consumer}.");
    let read = async {
        let mut keys = store.keys().await.ok()?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.ok()?;
            if !k.starts_with(&prefix) {
                continue;
            }
            if let Some(body) = store.get(&k).await.ok()?
                && let Ok(m) = serde_json::from_slice::<Mark>(&body)
            {
                out.push((m.from, m.to));
            }
        }
        Some(out)
    };
    tokio::time::timeout(WAIT * 2, read).await.ok().flatten()
}

/// Keeps at most `max` spans covering every position `spans` covers: the two spans nearest to
/// each other (by stream sequence) are joined into one until few enough are left. A span is
/// never dropped: a vanished holder's event it covers would lose its protection and run again
/// as if never started (issue 56, suspected); a joined span covers a few positions more, which
/// at worst dead-letters an unstarted event on its last allowed delivery.
pub fn bound_spans(spans: &mut Vec<Span>, max: usize) {
    spans.sort();
    spans.dedup();
    while spans.len() > max.max(1) {
        let Some(i) =
            (0..spans.len() - 1).min_by_key(|&i| spans[i + 1].0.0.saturating_sub(spans[i].1.0))
        else {
            return;
        };
        let next = spans.remove(i + 1);
        spans[i] = (spans[i].0.min(next.0), spans[i].1.max(next.1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_beyond_the_bound_are_joined_never_dropped() {
        let mut spans: Vec<Span> = (0..20u64).map(|i| ((i * 10, 0), (i * 10 + 2, 3))).collect();
        spans.push(((1000, 0), (1001, 0)));
        let all = spans.clone();
        bound_spans(&mut spans, 16);
        assert_eq!(spans.len(), 16);
        for (a, b) in all {
            assert!(
                spans.iter().any(|(x, y)| *x <= a && b <= *y),
                "({a:?}, {b:?}) still covered: {spans:?}"
            );
        }
    }

    #[test]
    fn keys_are_per_hook_and_worker_and_valid() {
        assert_eq!(key("hook_kf", "wa"), "hook_kf.wa");
        assert_eq!(key("hook_kf", "host.1:2"), "hook_kf.host=2e1=3a2");
        let k = key("hook_x", "é w");
        assert!(
            k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_=.".contains(c)),
            "{k}"
        );
    }
}
