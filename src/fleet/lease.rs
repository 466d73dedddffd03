//! One active puller per ordered hook (`concurrency: 1`) across the fleet, on any JetStream
//! server (2.9 included): a lease in the key-value bucket `<PREFIX>_LEASES`, one key per hook.
//!
//! A worker that creates the key holds the lease and is the only one pulling the hook's events,
//! so the hook's consumer can let many events be in flight (batches fed in stream order into the
//! hook's local queue) without losing the order. The holder renews the key (compare-and-set on
//! its revision) four times per bucket `max_age`; the others try to create it at the same pace.
//! A holder that dies stops renewing and the key expires with the bucket's `max_age` (the
//! worker's `--ack-wait` when the bucket is created): another worker takes over then (it tries
//! again when the key is due to run out, [`expires_in`]). A worker
//! that stops cleanly deletes the key so that the next takes over at once. A worker that lost
//! the lease while it still runs events it started keeps a second key, `<key>.finishing`, until
//! they are done ([`Finishing`]): the next holder waits for those events as long as it is there.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use tokio::sync::watch;

use super::FleetConfig;
use crate::start_gate::{StartGate, monotonic_ns};

/// The broker's ack wait and an ordered hook's lease time to live for an `--ack-wait`: less a
/// tenth (at most a second), so that the next worker's pull and start fit within `--ack-wait`
/// (`WorkerOptions::broker_wait`).
pub fn broker_wait(ack_wait: Duration) -> Duration {
    ack_wait - (ack_wait / 10).min(Duration::from_secs(1))
}

/// How much of the lease's time to live the holder gives up as a margin: it starts nothing
/// (and acknowledges nothing) later than its last renewal's sending plus the time to live less
/// this ([`StartGate`]).
pub fn gate_margin(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(100))
}

/// The stream of the key-value bucket `name`, one value per key, on file storage: a lease, a
/// holder's marks and the versions outlive a broker restart (issue 56: a bucket in the broker's
/// memory was emptied by a restart while its old holder still ran what it held, so another
/// worker took the lease at once and two holders ran the hook; the marks of what a killed
/// holder had started went with it). A holder that keeps its lease across a restart starts
/// nothing more until every event the new broker counts as pending is back with it (messages
/// on their way to it were lost in flight: acknowledged past cumulatively, they were lost for
/// good; the worker's `Run::after_broker_change`). A bucket an older release made in memory stays there
/// until the broker's next restart, which empties it; the first worker to open it then makes
/// it on file. Made here as a key-value bucket's is: async-nats's own `create_key_value` first
/// reads the account info, which it cannot parse from a 2.9 server.
pub fn kv_stream(cfg: &FleetConfig, name: &str, description: &str) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: format!("KV_{name}"),
        description: Some(description.into()),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_bytes: -1,
        max_message_size: -1,
        storage: jetstream::stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        num_replicas: cfg.replicas.max(1),
        discard: jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    }
}

/// The lease bucket, created when missing with `ttl` as its `max_age`.
pub async fn bucket(
    cfg: &FleetConfig,
    js: &jetstream::Context,
    ttl: Duration,
) -> Result<(kv::Store, Duration), String> {
    let name = cfg.lease_bucket();
    let config = jetstream::stream::Config {
        max_age: ttl.max(Duration::from_secs(1)),
        ..kv_stream(
            cfg,
            &name,
            "hermes-hooks: which worker pulls each ordered hook",
        )
    };
    let stream = js
        .get_or_create_stream(config)
        .await
        .map_err(|e| format!("cannot create the lease bucket {name}: {e}"))?;
    let store = js
        .get_key_value(&name)
        .await
        .map_err(|e| format!("cannot open the lease bucket {name}: {e}"))?;
    shorten_older(js, &stream.cached_info().config, ttl).await;
    let ttl = store
        .status()
        .await
        .map(|s| s.max_age())
        .map_err(|e| format!("cannot read the lease bucket {name}: {e}"))?;
    Ok((store, ttl))
}

/// A bucket made by a release before the lease's time to live became the broker's wait (an
/// `--ack-wait` less a margin, `WorkerOptions::broker_wait`) has the `--ack-wait` itself as its
/// `max_age`: shortened to `ttl`, so failover fits in the ack wait after an upgrade too. Only
/// that case: a bucket made by a worker with another `--ack-wait` is left as it was made, as
/// workers would otherwise take it from each other back and forth.
async fn shorten_older(js: &jetstream::Context, made: &jetstream::stream::Config, ttl: Duration) {
    if made.max_age <= ttl || broker_wait(made.max_age) != ttl {
        return;
    }
    tracing::info!(bucket = %made.name, from = ?made.max_age, to = ?ttl, "fleet: shortening the lease bucket's time to live to the broker's wait (made by an older release)");
    let config = jetstream::stream::Config {
        max_age: ttl,
        ..made.clone()
    };
    if let Err(e) = js.update_stream(&config).await {
        tracing::warn!(bucket = %made.name, "fleet: cannot shorten the lease bucket's time to live ({e}); failover may take up to its old time to live");
    }
}

/// How long until the lease on `key`, held by another worker, runs out unless renewed (its
/// last write plus `ttl`, by the broker's clock); `None` when unknown. A standby tries again
/// just then rather than on its next round: the hook fails over within one ack wait of its
/// holder's death, not up to a quarter more.
pub async fn expires_in(store: &kv::Store, ttl: Duration, key: &str) -> Option<Duration> {
    let entry = store.entry(key).await.ok()??;
    let ends = entry.created + ttl;
    let left = ends - time::OffsetDateTime::now_utc();
    Some(Duration::try_from(left).unwrap_or(Duration::ZERO))
}

/// The key a worker that lost the lease on `key` keeps while it finishes what it had started
/// ([`Finishing`]): the next holder waits for the events it still holds pending.
fn finishing_key(key: &str) -> String {
    format!("{key}.finishing")
}

/// Whether a worker that lost the lease on `key` says it still finishes events it started
/// (`false` also when the bucket cannot be read).
pub async fn finishing(store: &kv::Store, key: &str) -> bool {
    matches!(store.get(finishing_key(key)).await, Ok(Some(_)))
}

/// Said by a worker that lost the lease while it finishes what it started (written again four
/// times per `ttl`, the bucket's `max_age`, so it runs out with a worker that dies meanwhile);
/// taken back by [`Finishing::end`].
pub struct Finishing {
    task: tokio::task::JoinHandle<()>,
    store: kv::Store,
    key: String,
}

impl Finishing {
    pub fn start(store: &kv::Store, ttl: Duration, key: &str, holder: &str) -> Self {
        let (store2, key2, holder) = (store.clone(), finishing_key(key), holder.to_string());
        let task = tokio::spawn(async move {
            loop {
                // Not there yet when the broker restarted with an empty bucket: tried again.
                if let Err(e) = store2.put(&key2, holder.clone().into()).await {
                    tracing::debug!(key = %key2, "fleet: cannot say this worker still finishes the hook's events ({e}); trying again");
                }
                tokio::time::sleep(ttl / 4).await;
            }
        });
        Self {
            task,
            store: store.clone(),
            key: finishing_key(key),
        }
    }

    /// Everything started is finished: the next holder need not wait for this worker.
    pub async fn end(self) {
        self.task.abort();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.store.delete(&self.key)).await;
    }
}

impl Drop for Finishing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether a worker holds the lease on `key` now (false when unknown).
pub async fn held(store: &kv::Store, key: &str) -> bool {
    matches!(store.entry(key).await, Ok(Some(e)) if e.operation == kv::Operation::Put)
}

/// Resolves at the next change of the lease on `key` (taken, renewed, released); never when
/// it cannot be watched (the caller's own timer then applies).
pub async fn changed(watch: &mut Option<kv::Watch>) {
    use futures_util::StreamExt;
    match watch.as_mut() {
        Some(w) => {
            if w.next().await.is_none() {
                *watch = None;
            }
        }
        None => std::future::pending().await,
    }
}

/// The key of the note a holder that handed the lease on `key` over leaves for the next one.
fn note_key(key: &str) -> String {
    format!("{key}.note")
}

/// Leaves `note` for the next holder of the lease on `key` (it lives the bucket's `max_age`).
pub async fn leave_note(store: &kv::Store, key: &str, note: Vec<u8>) {
    let put = store.put(note_key(key), note.into());
    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(1), put).await {
        tracing::warn!(key, "fleet: hand-over note not written ({e})");
    }
}

/// The note the last holder of the lease on `key` that handed it over left, if still there.
pub async fn read_note(store: &kv::Store, key: &str) -> Option<bytes::Bytes> {
    store.get(note_key(key)).await.ok().flatten()
}

/// A held lease: renewed in the background until dropped or lost. Its [`StartGate`] says, on
/// the monotonic clock, until when it is surely still this worker's (issue 48).
pub struct Lease {
    lost: watch::Receiver<bool>,
    gate: Arc<StartGate>,
    /// The renewal found the bucket gone: the broker restarted (a bucket an older release made in memory),
    /// and with it every pull request this worker had open.
    bucket_gone: Arc<std::sync::atomic::AtomicBool>,
    renew: tokio::task::JoinHandle<()>,
    store: kv::Store,
    key: String,
    /// Taken after the previous holder's key ran out rather than being released ([`Lease::vanished`]).
    vanished: bool,
}

impl Lease {
    /// Tries to take the lease on `key` for `holder`; `None` when another worker holds it.
    pub async fn try_take(
        store: &kv::Store,
        ttl: Duration,
        key: &str,
        holder: &str,
    ) -> Result<Option<Lease>, String> {
        // A holder that released the lease left a delete marker (it lives the bucket's
        // `max_age`); no entry at all: the key ran out (or the hook was never pulled).
        let entry = store.entry(key).await.ok().flatten();
        let vanished = entry.is_none();
        let margin = gate_margin(ttl);
        let sent = monotonic_ns();
        // Bounded: on nats-server 2.9 a write to a bucket a broker restart emptied (one an older
        // release made in memory) is not refused but times out after 10 s; the caller makes the bucket again.
        let quick = (ttl / 2).clamp(Duration::from_millis(200), Duration::from_secs(2));
        let created = tokio::time::timeout(quick, store.create(key, holder.to_string().into()))
            .await
            .map_err(|_| format!("lease {key}: no answer within {quick:?} (bucket gone?)"))?;
        let revision = match created {
            Ok(r) => r,
            // Held, also when it still names this worker: the holding a reload replaces may
            // still finish its events in this process (taking it back would make two holders),
            // and a worker restarted with the same id waits for its old key to run out.
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(format!("lease {key}: {e}")),
        };
        let gate = Arc::new(StartGate::in_order(StartGate::bound(sent, ttl, margin)));
        let (tx, lost) = watch::channel(false);
        let (store2, key2, holder) = (store.clone(), key.to_string(), holder.to_string());
        let gate2 = gate.clone();
        let bucket_gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gone = bucket_gone.clone();
        let renew = tokio::spawn(async move {
            let mut revision = revision;
            let every = ttl / 4;
            loop {
                tokio::time::sleep(every).await;
                if !gate2.within_bound() {
                    // Woken past the bound (stopped, starved): another worker may hold the
                    // lease; this one stands down before it looks again.
                    tracing::warn!(key = %key2, "fleet: lease not renewed in time (this worker was paused or starved); it stops pulling the hook and hands back what it holds");
                    gate2.shut();
                    let _ = tx.send(true);
                    return;
                }
                let sent = monotonic_ns();
                match store2.update(&key2, holder.clone().into(), revision).await {
                    Ok(r) => {
                        revision = r;
                        gate2.extend(StartGate::bound(sent, ttl, margin));
                    }
                    Err(e) => {
                        tracing::warn!(key = %key2, "fleet: lease lost ({e}); this worker stops pulling the hook");
                        // async-nats's words for a write no stream takes.
                        if e.to_string().contains("no stream") {
                            gone.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                        gate2.shut();
                        let _ = tx.send(true);
                        return;
                    }
                }
            }
        });
        Ok(Some(Lease {
            lost,
            gate,
            bucket_gone,
            renew,
            store: store.clone(),
            key: key.to_string(),
            vanished,
        }))
    }

    /// Whether the previous holder let the lease run out instead of releasing it (killed, cut
    /// off, or no previous holder within the bucket's `max_age`): only then may an event have
    /// been started by a holder that never finished it.
    pub fn vanished(&self) -> bool {
        self.vanished
    }

    /// Whether the lease was lost because its bucket is gone (a broker restart): the pull
    /// requests this worker had open went with it, so what it holds can be handed back at once.
    pub fn bucket_gone(&self) -> bool {
        self.bucket_gone.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// This holding's bound on starting work.
    pub fn gate(&self) -> Arc<StartGate> {
        self.gate.clone()
    }

    /// Resolves when the lease is lost (not renewed in time) or its gate shut (its bound
    /// passed, or a process refused a call past it).
    pub async fn lost(&mut self) {
        let gate = self.gate.clone();
        let lost = async {
            while !*self.lost.borrow() {
                if self.lost.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = lost => {}
            _ = gate.closed() => {}
        }
    }

    /// Whether the lease is surely still this worker's though its gate shut: the renewals go
    /// on and the bound has not passed, so this worker shut it itself (an ordered hook's queued
    /// job its reloaded version no longer matches, [`StartGate::in_order`]). Such a holder
    /// hands the lease over (released, not left to run out): the next holder takes over at
    /// once, not a time to live later.
    pub fn still_ours(&self) -> bool {
        !*self.lost.borrow() && self.gate.within_bound()
    }

    /// Gives the lease up at once (clean stop): the next worker takes over without waiting.
    pub async fn release(self) {
        self.renew.abort();
        self.gate.shut();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.store.delete(&self.key)).await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renew.abort();
        self.gate.shut();
    }
}
