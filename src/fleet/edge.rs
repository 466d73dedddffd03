//! The edge (`serve --fleet URL`): the sink that publishes each accepted event to the JetStream
//! event stream with its event id as `Nats-Msg-Id`.
//!
//! Accepted events go into one bounded in-memory buffer; a publisher task sends them with up to
//! [`WINDOW`] acknowledgements outstanding (pipelined), and an accept answers once the stream has
//! acknowledged its event. While the broker is unreachable, accepts answer at once (the event is
//! buffered), the edge reports itself degraded, a full buffer refuses new events (503 with
//! Retry-After: nothing accepted is ever dropped), and the buffer is sent when the broker is
//! back; the stream's de-duplication absorbs what was sent twice across the outage.
//!
//! An event larger than the broker's `max_payload` can never be stored: it is refused before
//! anything is accepted (413). One the broker refuses for good anyway (its limit lowered, a
//! stream limit) is taken off the buffer, logged with its id and counted as `refused`: it never
//! holds up the events behind it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage as Publish;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use super::envelope::{Envelope, IdGen, VERSION};
use super::status::FleetView;
use super::{FleetConfig, FleetError};
use crate::sink::{Accepted, BoxFuture, ClientId, EventSink, HookOutcome, SinkError};

/// Publish acknowledgements outstanding at once.
pub const WINDOW: usize = 512;
/// Default bound of the buffer.
pub const DEFAULT_BUFFER: usize = 100_000;
/// How long an accept waits for the stream's acknowledgement before answering anyway (the
/// event stays buffered and the edge reports degraded).
pub const PUBLISH_WAIT: Duration = Duration::from_secs(5);

struct Pending {
    subject: String,
    msg_id: String,
    payload: Bytes,
    done: Option<oneshot::Sender<Result<(), SinkError>>>,
}

struct Inner {
    cfg: FleetConfig,
    gateway: String,
    ids: IdGen,
    capacity: usize,
    buf: Mutex<VecDeque<Pending>>,
    wake: Notify,
    idle: Notify,
    inflight: AtomicUsize,
    published: AtomicU64,
    duplicates: AtomicU64,
    full: AtomicU64,
    refused: AtomicU64,
    /// Messages in the dead-letter stream, read every few seconds (`u64::MAX`: unknown).
    dead_letters: AtomicU64,
    failures: AtomicU64,
    degraded: Mutex<Option<String>>,
    closing: AtomicBool,
    view: FleetView,
    client: async_nats::Client,
    /// What the event stream discarded at its limits.
    discards: Arc<super::discards::Discards>,
}

/// The fleet edge; cheap to clone.
#[derive(Clone)]
pub struct Edge {
    inner: Arc<Inner>,
}

impl Edge {
    /// Connects (in the background when the broker is down) and starts publishing.
    pub async fn start(
        cfg: FleetConfig,
        gateway: String,
        capacity: usize,
    ) -> Result<Self, FleetError> {
        let client = cfg
            .connect(&format!("hermes-hooks edge {gateway}"), false)
            .await?;
        let view = FleetView::default();
        let inner = Arc::new(Inner {
            gateway,
            ids: IdGen::default(),
            capacity: capacity.max(1),
            buf: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            idle: Notify::new(),
            inflight: AtomicUsize::new(0),
            published: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            full: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            dead_letters: AtomicU64::new(u64::MAX),
            failures: AtomicU64::new(0),
            degraded: Mutex::new(None),
            closing: AtomicBool::new(false),
            view: view.clone(),
            client: client.clone(),
            cfg: cfg.clone(),
            discards: Default::default(),
        });
        tokio::spawn(super::discards::watch(
            client.clone(),
            cfg.clone(),
            Arc::downgrade(&inner.discards),
        ));
        tokio::spawn(super::status::follow(client, cfg.status_filter(), view));
        tokio::spawn(publisher(inner.clone()));
        tokio::spawn(count_dead_letters(Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    /// Stops accepting and sends what is buffered, for up to `drain`; returns what was left.
    pub async fn stop(&self, drain: Duration) -> usize {
        self.inner.closing.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
        let until_idle = async {
            loop {
                let idle = self.inner.idle.notified();
                if self.inner.held() == 0 {
                    return;
                }
                let _ = tokio::time::timeout(Duration::from_millis(100), idle).await;
            }
        };
        let deadline = tokio::time::Instant::now() + drain;
        let _ = tokio::time::timeout_at(deadline, until_idle).await;
        let left = self.inner.held();
        if left > 0 {
            tracing::warn!(
                "fleet: {left} event(s) not yet stored in the stream at shutdown (broker unreachable)"
            );
        }
        // Bounded: with the broker down a flush never completes.
        let rest = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_millis(100));
        match tokio::time::timeout(rest, self.inner.client.flush()).await {
            Ok(Err(e)) => tracing::debug!("fleet: flush at shutdown: {e}"),
            Err(_) => tracing::debug!("fleet: flush at shutdown: no answer from the broker"),
            Ok(Ok(())) => {}
        }
        left
    }

    /// The event as published; refused when it can never be stored (over the broker's limit).
    fn envelope(
        &self,
        event: String,
        context: Value,
        client_id: ClientId,
    ) -> Result<Pending, SinkError> {
        let env = Envelope {
            v: VERSION,
            client_id: client_id.is_some(),
            id: client_id.unwrap_or_else(|| self.inner.ids.next()),
            gateway: self.inner.gateway.clone(),
            event,
            context,
            time: crate::time::now(),
            hook: None,
        };
        let payload = serde_json::to_vec(&env).unwrap_or_default();
        let msg_id = env.msg_id();
        // Payload plus the header block (`NATS/1.0`, `Nats-Msg-Id: ...`) as the server counts it.
        let size = payload.len() + msg_id.len() + 32;
        let limit = self.inner.client.max_payload();
        if size > limit {
            return Err(SinkError::TooLarge { size, limit });
        }
        Ok(Pending {
            subject: self.inner.cfg.event_subject(&env.event),
            msg_id,
            payload: Bytes::from(payload),
            done: None,
        })
    }
}

impl Inner {
    fn held(&self) -> usize {
        self.buf.lock().map(|b| b.len()).unwrap_or(0) + self.inflight.load(Ordering::Relaxed)
    }

    /// Buffers `items`, all or none: a full buffer refuses them (nothing accepted is dropped).
    fn push(&self, items: Vec<Pending>) -> Result<(), SinkError> {
        {
            let Ok(mut buf) = self.buf.lock() else {
                return Err(SinkError::ShuttingDown);
            };
            if buf.len() + self.inflight.load(Ordering::Relaxed) + items.len() > self.capacity {
                drop(buf);
                let n = self.full.fetch_add(items.len() as u64, Ordering::Relaxed) + 1;
                if n.is_power_of_two() || items.len() > 1 {
                    tracing::warn!(
                        refused = n,
                        "fleet: buffer full ({} events): refusing new events (503) until the broker takes more",
                        self.capacity
                    );
                }
                return Err(SinkError::Full {
                    capacity: self.capacity,
                });
            }
            buf.extend(items);
        }
        self.wake.notify_one();
        Ok(())
    }

    fn pop(&self) -> Option<Pending> {
        self.buf.lock().ok()?.pop_front()
    }

    fn push_front(&self, items: Vec<Pending>) {
        if let Ok(mut buf) = self.buf.lock() {
            for p in items.into_iter().rev() {
                buf.push_front(p);
            }
        }
    }

    /// Takes an event the broker will never store off the buffer: logged with its id, counted,
    /// and its accept (if still waiting) answered with the reason.
    fn refuse(&self, p: Pending, why: String) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::error!(msg_id = %p.msg_id, subject = %p.subject, refused = n, "fleet: the broker refuses this event for good ({why}); dropped from the buffer");
        if let Some(done) = p.done {
            let _ = done.send(Err(SinkError::Refused(why)));
        }
    }

    fn set_degraded(&self, why: String) {
        if let Ok(mut d) = self.degraded.lock() {
            if d.is_none() {
                tracing::warn!("fleet: degraded: {why}; accepting into the buffer");
            }
            *d = Some(why);
        }
    }

    fn clear_degraded(&self) {
        if let Ok(mut d) = self.degraded.lock()
            && d.take().is_some()
        {
            tracing::info!("fleet: broker reachable again; sending the buffer");
        }
    }

    fn degraded(&self) -> Option<String> {
        use async_nats::connection::State;
        if self.client.connection_state() != State::Connected {
            return Some(format!("broker {} unreachable", self.cfg.url));
        }
        self.degraded.lock().ok()?.clone()
    }
}

/// Keeps the count of the dead-letter stream's messages (for `/v1/hooks` and `/metrics`).
async fn count_dead_letters(inner: std::sync::Weak<Inner>) {
    loop {
        let Some(i) = inner.upgrade() else { return };
        let js = i.cfg.jetstream(i.client.clone());
        let n = match js.get_stream(i.cfg.dead_stream()).await {
            Ok(mut s) => s.info().await.map(|info| info.state.messages).ok(),
            Err(_) => Some(0),
        };
        i.dead_letters
            .store(n.unwrap_or(u64::MAX), Ordering::Relaxed);
        drop(i);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Sends the buffer to the stream, keeping up to [`WINDOW`] acknowledgements outstanding.
async fn publisher(inner: Arc<Inner>) {
    use async_nats::connection::State;
    let js = inner.cfg.jetstream(inner.client.clone());
    let mut stream_ok = false;
    let mut backoff = Duration::from_millis(50);
    let mut inflight: VecDeque<(Pending, async_nats::jetstream::context::PublishAckFuture)> =
        VecDeque::new();
    loop {
        let mut failed: Option<String> = None;
        if !stream_ok {
            match inner.cfg.events(&js).await {
                Ok(_) => stream_ok = true,
                Err(e) => failed = Some(e.to_string()),
            }
        }
        while failed.is_none() && inflight.len() < WINDOW {
            if inner.client.connection_state() != State::Connected {
                failed = Some(format!("broker {} unreachable", inner.cfg.url));
                break;
            }
            let Some(p) = inner.pop() else { break };
            let publish = Publish::build()
                .payload(p.payload.clone())
                .message_id(&p.msg_id);
            match js.send_publish(p.subject.clone(), publish).await {
                Ok(f) => {
                    inflight.push_back((p, f));
                    inner.inflight.store(inflight.len(), Ordering::Relaxed);
                }
                Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                    inner.refuse(p, format!("publish: {e}"));
                }
                Err(e) => {
                    inner.push_front(vec![p]);
                    failed = Some(format!("publish: {e}"));
                }
            }
        }
        if let Some((p, f)) = inflight.pop_front() {
            match f.await {
                Ok(ack) => {
                    inner.published.fetch_add(1, Ordering::Relaxed);
                    if ack.duplicate {
                        inner.duplicates.fetch_add(1, Ordering::Relaxed);
                    }
                    if failed.is_none() {
                        inner.clear_degraded();
                        backoff = Duration::from_millis(50);
                    }
                    if let Some(done) = p.done {
                        let _ = done.send(Ok(()));
                    }
                }
                Err(e) if e.kind() == PublishErrorKind::Other => {
                    // The stream answered with an error for this message (too large for it, ...):
                    // sending it again cannot help.
                    inner.refuse(p, format!("stored by no stream: {e}"));
                }
                Err(e) => {
                    // Send this one and every later one again, in order; the stream
                    // de-duplicates those that did arrive.
                    let mut back = vec![p];
                    back.extend(inflight.drain(..).map(|(p, _)| p));
                    inner.push_front(back);
                    failed = Some(format!("no acknowledgement from the stream: {e}"));
                    stream_ok = false;
                }
            }
            inner.inflight.store(inflight.len(), Ordering::Relaxed);
        }
        if let Some(why) = failed {
            inner.failures.fetch_add(1, Ordering::Relaxed);
            inner.set_degraded(why);
            if inflight.is_empty() {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            continue;
        }
        if inflight.is_empty() {
            let wake = inner.wake.notified();
            if inner.buf.lock().map(|b| b.is_empty()).unwrap_or(true) {
                inner.idle.notify_waiters();
                if inner.closing.load(Ordering::SeqCst) {
                    return;
                }
                let _ = tokio::time::timeout(Duration::from_secs(1), wake).await;
            }
        }
    }
}

impl EventSink for Edge {
    fn accept(
        &self,
        event: String,
        context: Value,
        id: ClientId,
    ) -> BoxFuture<'_, Result<Accepted<usize>, SinkError>> {
        Box::pin(async move {
            let mut r = self.accept_batch(vec![(event, context)], vec![id]).await?;
            Ok(Accepted {
                queued: r.queued.pop().unwrap_or(0),
                stored: r.stored,
            })
        })
    }

    fn accept_batch(
        &self,
        events: Vec<(String, Value)>,
        ids: Vec<ClientId>,
    ) -> BoxFuture<'_, Result<Accepted<Vec<usize>>, SinkError>> {
        Box::pin(async move {
            if self.inner.closing.load(Ordering::SeqCst) {
                return Err(SinkError::ShuttingDown);
            }
            let mut counts = Vec::with_capacity(events.len());
            let mut waiting = Vec::with_capacity(events.len());
            let mut items = Vec::with_capacity(events.len());
            let mut ids = ids.into_iter();
            // Every event checked before any is buffered: a batch is taken whole or refused.
            for (event, context) in events {
                counts.push(self.inner.view.matching(&event).len());
                let mut p = self.envelope(event, context, ids.next().flatten())?;
                let (tx, rx) = oneshot::channel();
                p.done = Some(tx);
                waiting.push(rx);
                items.push(p);
            }
            self.inner.push(items)?;
            let mut stored = false;
            if self.inner.degraded().is_none() {
                let deadline = tokio::time::Instant::now() + PUBLISH_WAIT;
                stored = true;
                for rx in waiting {
                    match tokio::time::timeout_at(deadline, rx).await {
                        Ok(Ok(Ok(()))) => {}
                        Ok(Ok(Err(e))) => return Err(e),
                        _ => {
                            stored = false;
                            break;
                        }
                    }
                }
            }
            Ok(Accepted {
                queued: counts,
                stored: Some(stored),
            })
        })
    }

    fn collect(
        &self,
        event: String,
        context: Value,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<HookOutcome>, SinkError>> {
        Box::pin(async move {
            let hooks = self.inner.view.matching(&event);
            Ok(super::collect::request(
                &self.inner.client,
                &self.inner.cfg,
                &self.inner.gateway,
                &self.inner.ids,
                &hooks,
                event,
                context,
                timeout,
            )
            .await)
        })
    }

    fn status(&self) -> Option<Value> {
        let (hooks, workers) = self.inner.view.render();
        let degraded = self.inner.degraded();
        let discards = self.inner.discards.status();
        Some(json!({
            "fleet": {
                "role": "edge",
                "gateway_id": self.inner.gateway,
                "broker": self.inner.cfg.url,
                "stream": self.inner.cfg.events_stream(),
                "state": if degraded.is_some() { "degraded" } else { "connected" },
                "degraded_reason": degraded,
                "buffered": self.inner.held(),
                "buffer_capacity": self.inner.capacity,
                "published": self.inner.published.load(Ordering::Relaxed),
                "duplicates": self.inner.duplicates.load(Ordering::Relaxed),
                "buffer_full": self.inner.full.load(Ordering::Relaxed),
                "refused": self.inner.refused.load(Ordering::Relaxed),
                "stream_discarded": discards.as_ref().map(|d| d["stream_discarded"].clone()),
                "discarded_unhandled": discards.as_ref().map(|d| d["discarded_unhandled"].clone()),
                "stream_consumers": discards.map(|d| d["stream_consumers"].clone()),
                "dead_letters": Some(self.inner.dead_letters.load(Ordering::Relaxed)).filter(|n| *n != u64::MAX),
                "workers": workers,
            },
            "hooks": hooks,
        }))
    }

    fn degraded(&self) -> Option<String> {
        self.inner.degraded()
    }
}
