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
//! No time to live (a handler may run for minutes); the bucket lives in the broker's memory, as
//! the leases do. A span left by a worker that died long ago covers events long acknowledged:
//! it matters only for events still pending.

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

/// The bucket, created when missing.
pub async fn bucket(cfg: &FleetConfig, js: &jetstream::Context) -> Result<kv::Store, String> {
    let name = cfg.attempts_bucket();
    let config = super::lease::memory_bucket(
        cfg,
        &name,
        "hermes-hooks: what each ordered hook's holder may have started on a last delivery",
    );
    open_bucket(js, config, &name, WAIT * 2).await
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

#[cfg(test)]
mod tests {
    use super::*;

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
