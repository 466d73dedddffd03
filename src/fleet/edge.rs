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
//! Events of one name accepted in one request go to the stream together, as bundles
//! ([`super::envelope`]) of up to `--fleet-bundle` events (default
//! [`super::envelope::BUNDLE_EVENTS`]): one message to store, deliver and acknowledge instead
//! of one per event. Only while every live worker says it reads bundles (an older
//! worker would drop one as unreadable), never for an event a hook with `concurrency` above 1
//! takes ([`super::status::FleetView::route`]), and never an event with a client event id (its
//! `Nats-Msg-Id` is its own, for the stream's de-duplication).
//!
//! An event larger than the broker's `max_payload` can never be stored: it is refused before
//! anything is accepted (413). One the broker refuses for good anyway (its limit lowered, a
//! stream limit) is taken off the buffer, logged with its id and counted as `refused`: it never
//! holds up the events behind it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use serde_json::value::RawValue;

use super::envelope::{
    BUNDLE_BYTES, BUNDLE_ITEM_EXTRA, Envelope, IdGen, VERSION, bundle_head_len, write_bundle,
};
use super::status::FleetView;
use super::{FleetConfig, FleetError};
use crate::handler::context::Context;
use crate::sink::{Accepted, BoxFuture, ClientId, DeadQuery, EventSink, HookOutcome, SinkError};

/// Publish acknowledgements outstanding at once.
pub const WINDOW: usize = 512;
/// Default bound of the buffer.
pub const DEFAULT_BUFFER: usize = 100_000;
/// How long an accept waits for the stream's acknowledgement before answering anyway (the
/// event stays buffered and the edge reports degraded).
pub const PUBLISH_WAIT: Duration = Duration::from_secs(5);

/// One stream message to send: an event, or a bundle of events.
struct Pending {
    subject: async_nats::Subject,
    msg_id: String,
    payload: Bytes,
    /// Events in it.
    events: usize,
    /// The accept waiting for this event (shared by a batch's events).
    done: Option<Arc<Waiter>>,
}

/// The buffer: messages not yet sent, and how many events they hold.
#[derive(Default)]
struct Buf {
    q: VecDeque<Pending>,
    events: usize,
}

impl Buf {
    fn push_back(&mut self, p: Pending) {
        self.events += p.events;
        self.q.push_back(p);
    }

    fn push_front(&mut self, p: Pending) {
        self.events += p.events;
        self.q.push_front(p);
    }

    fn pop_front(&mut self) -> Option<Pending> {
        let p = self.q.pop_front()?;
        self.events -= p.events;
        Some(p)
    }
}

/// Events of one name, in order, to go to the stream as one bundle.
struct Run {
    event: String,
    subject: async_nats::Subject,
    /// Event id and context text.
    items: Vec<(String, Box<RawValue>)>,
    /// The bundle's size, at most.
    bytes: usize,
}

/// One accept waiting for its messages: answered once every one is stored, or at the first one
/// refused (one channel per request, not one per event).
struct Waiter {
    left: AtomicUsize,
    tx: Mutex<Option<oneshot::Sender<Result<(), SinkError>>>>,
}

impl Waiter {
    fn new(events: usize) -> (Arc<Self>, oneshot::Receiver<Result<(), SinkError>>) {
        let (tx, rx) = oneshot::channel();
        let w = Self {
            left: AtomicUsize::new(events),
            tx: Mutex::new(Some(tx)),
        };
        (Arc::new(w), rx)
    }

    fn answer(&self, r: Result<(), SinkError>) {
        let last = r.is_err() || self.left.fetch_sub(1, Ordering::AcqRel) == 1;
        if last && let Some(tx) = self.tx.lock().ok().and_then(|mut t| t.take()) {
            let _ = tx.send(r);
        }
    }
}

struct Inner {
    cfg: FleetConfig,
    gateway: String,
    ids: IdGen,
    capacity: usize,
    /// Most events in one bundle (1: none).
    bundle: usize,
    buf: Mutex<Buf>,
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
        bundle: usize,
    ) -> Result<Self, FleetError> {
        let client = cfg
            .connect(&format!("hermes-hooks edge {gateway}"), false)
            .await?;
        let view = FleetView::default();
        let inner = Arc::new(Inner {
            gateway,
            ids: IdGen::default(),
            capacity: capacity.max(1),
            bundle: bundle.max(1),
            buf: Mutex::new(Buf::default()),
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

    /// How many hooks take `event` (for the answer), the subject it is published to, and
    /// whether it may go in bundles ([`super::status::FleetView::route`]).
    fn route(&self, event: &str) -> (usize, async_nats::Subject, bool) {
        let (hooks, bundles) = self.inner.view.route(event);
        (
            hooks.len(),
            self.inner.cfg.event_subject(event).into(),
            bundles,
        )
    }

    /// The event as published alone, accepted at `time` and sent to `subject` (its event's);
    /// refused when it can never be stored (over the broker's limit).
    fn envelope(
        &self,
        event: String,
        context: Box<RawValue>,
        (id, client_id): (String, bool),
        time: &str,
        subject: async_nats::Subject,
    ) -> Result<Pending, SinkError> {
        let env = Envelope {
            v: VERSION,
            client_id,
            id,
            gateway: self.inner.gateway.clone(),
            event,
            context,
            time: time.to_string(),
            hook: None,
        };
        let payload = serde_json::to_vec(&env).unwrap_or_default();
        self.pending(subject, env.msg_id(), payload, 1)
    }

    /// A run of events as one message: alone when it is one, else a bundle (its id is its first
    /// event's).
    fn seal(&self, mut run: Run, time: &str) -> Result<Pending, SinkError> {
        if run.items.len() == 1
            && let Some((id, context)) = run.items.pop()
        {
            return self.envelope(run.event, context, (id, false), time, run.subject);
        }
        let gateway = &self.inner.gateway;
        let payload = write_bundle(
            gateway,
            &run.event,
            time,
            run.items.iter().map(|(id, c)| (id.as_str(), &**c)),
        );
        let first = run.items.first().map(|(id, _)| id.as_str()).unwrap_or("");
        let msg_id = format!("{gateway}:{first}");
        self.pending(run.subject, msg_id, payload, run.items.len())
    }

    /// A message to send; refused when it can never be stored (over the broker's limit).
    fn pending(
        &self,
        subject: async_nats::Subject,
        msg_id: String,
        payload: Vec<u8>,
        events: usize,
    ) -> Result<Pending, SinkError> {
        // Payload plus the header block (`NATS/1.0`, `Nats-Msg-Id: ...`) as the server counts it.
        let size = payload.len() + msg_id.len() + 32;
        let limit = self.inner.client.max_payload();
        if size > limit {
            return Err(SinkError::TooLarge { size, limit });
        }
        Ok(Pending {
            subject,
            msg_id,
            payload: Bytes::from(payload),
            events,
            done: None,
        })
    }

    /// The largest bundle to write: [`BUNDLE_BYTES`], less when the broker takes less.
    fn bundle_limit(&self) -> usize {
        BUNDLE_BYTES.min(self.inner.client.max_payload().saturating_sub(512))
    }
}

impl Inner {
    /// Events buffered or sent and not yet stored.
    fn held(&self) -> usize {
        self.buf.lock().map(|b| b.events).unwrap_or(0) + self.inflight.load(Ordering::Relaxed)
    }

    /// Buffers `items`, all or none: a full buffer refuses them (nothing accepted is dropped).
    fn push(&self, items: Vec<Pending>) -> Result<(), SinkError> {
        let events: usize = items.iter().map(|p| p.events).sum();
        {
            let Ok(mut buf) = self.buf.lock() else {
                return Err(SinkError::ShuttingDown);
            };
            if buf.events + self.inflight.load(Ordering::Relaxed) + events > self.capacity {
                drop(buf);
                let n = self.full.fetch_add(events as u64, Ordering::Relaxed) + 1;
                if n.is_power_of_two() || events > 1 {
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
            for p in items {
                buf.push_back(p);
            }
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

    /// Puts `first` (when given) and everything sent back at the buffer's front, in order, no
    /// longer counted in flight; their late acknowledgements are ignored.
    fn send_again(&self, first: Option<Pending>, window: &mut Window) {
        let mut back: Vec<Pending> = first.into_iter().collect();
        back.extend(window.take_back());
        self.inflight.store(0, Ordering::Relaxed);
        self.push_front(back);
    }

    /// Takes a message the broker will never store off the buffer: logged with its id, its
    /// events counted, and its accept (if still waiting) answered with the reason.
    fn refuse(&self, p: Pending, why: String) {
        let n = self.refused.fetch_add(p.events as u64, Ordering::Relaxed) + p.events as u64;
        tracing::error!(msg_id = %p.msg_id, subject = %p.subject, events = p.events, refused = n, "fleet: the broker refuses this message for good ({why}); dropped from the buffer");
        if let Some(done) = p.done {
            done.answer(Err(SinkError::Refused(why)));
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

/// An event sent to the stream, waiting for its acknowledgement.
struct Sent {
    p: Pending,
    at: tokio::time::Instant,
    ack: Option<Ack>,
}

/// The stream's answer to one publish.
enum Ack {
    Stored {
        duplicate: bool,
    },
    /// An error from the stream (too large for it, a limit, ...): sending it again cannot help.
    Refused(String),
    /// No stream listens on the subject (deleted, or the broker lost its store).
    NoStream,
}

/// How long a publish waits for its acknowledgement before it and every later one are sent
/// again (the stream de-duplicates those that did arrive).
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The body of a JetStream publish acknowledgement (`{"stream","seq","duplicate"}` or
/// `{"error": {...}}`), read without copying.
#[derive(serde::Deserialize)]
struct AckBody<'a> {
    #[serde(default)]
    duplicate: bool,
    #[serde(default, borrow)]
    error: Option<AckError<'a>>,
}

#[derive(serde::Deserialize)]
struct AckError<'a> {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    err_code: u16,
    #[serde(default, borrow)]
    description: std::borrow::Cow<'a, str>,
}

impl Ack {
    fn read(m: &async_nats::Message) -> Self {
        if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return Ack::NoStream;
        }
        match serde_json::from_slice::<AckBody>(&m.payload) {
            Ok(AckBody {
                error: None,
                duplicate,
            }) => Ack::Stored { duplicate },
            Ok(AckBody { error: Some(e), .. }) => Ack::Refused(format!(
                "{} (code {}, error {})",
                e.description, e.code, e.err_code
            )),
            Err(e) => Ack::Refused(format!("unreadable acknowledgement from the stream ({e})")),
        }
    }
}

/// The events sent and not yet acknowledged, in order: `sent[i]` went out with reply subject
/// `{inbox}.{first + i}`.
struct Window {
    inbox: String,
    sent: VecDeque<Sent>,
    first: u64,
    /// Events in `sent`.
    events: usize,
}

impl Window {
    fn next_reply(&self) -> String {
        format!("{}.{}", self.inbox, self.first + self.sent.len() as u64)
    }

    /// Notes an acknowledgement; one for an event no longer waiting (sent again since) is
    /// ignored.
    fn note(&mut self, m: &async_nats::Message) {
        let n = m
            .subject
            .rsplit_once('.')
            .and_then(|(_, n)| n.parse::<u64>().ok());
        if let Some(i) = n.and_then(|n| n.checked_sub(self.first))
            && let Some(s) = self.sent.get_mut(i as usize)
            && s.ack.is_none()
        {
            s.ack = Some(Ack::read(m));
        }
    }

    /// Everything sent goes back to the buffer's front, in order; their late acknowledgements
    /// are ignored.
    fn take_back(&mut self) -> Vec<Pending> {
        self.first += self.sent.len() as u64;
        self.events = 0;
        self.sent.drain(..).map(|s| s.p).collect()
    }
}

/// Sends buffered events until the window is full or the buffer empty; the reason when the
/// broker cannot take them now (the event goes back to the buffer's front).
async fn send_more(inner: &Inner, window: &mut Window) -> Result<(), String> {
    use async_nats::connection::State;
    while window.sent.len() < WINDOW {
        if inner.client.connection_state() != State::Connected {
            return Err(format!("broker {} unreachable", inner.cfg.url));
        }
        let Some(p) = inner.pop() else { break };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, p.msg_id.as_str());
        let publish = inner.client.publish_with_reply_and_headers(
            p.subject.clone(),
            window.next_reply(),
            headers,
            p.payload.clone(),
        );
        match publish.await {
            Ok(()) => {
                window.events += p.events;
                window.sent.push_back(Sent {
                    p,
                    at: tokio::time::Instant::now(),
                    ack: None,
                });
                inner.inflight.store(window.events, Ordering::Relaxed);
            }
            Err(e) if e.kind() == async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                inner.refuse(p, format!("publish: {e}"));
            }
            Err(e) => {
                inner.push_front(vec![p]);
                return Err(format!("publish: {e}"));
            }
        }
    }
    Ok(())
}

/// Settles the acknowledged front of the window, in order: whether any event was stored, and
/// the reason when the stream was missing (that event and every later one went back to the
/// buffer's front, to be sent again once it is there; the stream de-duplicates those that did
/// arrive).
fn settle_front(inner: &Inner, window: &mut Window) -> (bool, Option<String>) {
    let mut stored = false;
    while window.sent.front().is_some_and(|s| s.ack.is_some()) {
        let Some(Sent { p, ack, .. }) = window.sent.pop_front() else {
            break;
        };
        window.first += 1;
        window.events -= p.events;
        match ack {
            Some(Ack::Stored { duplicate }) => {
                stored = true;
                inner
                    .published
                    .fetch_add(p.events as u64, Ordering::Relaxed);
                inner.discards.stored(p.events);
                if duplicate {
                    inner
                        .duplicates
                        .fetch_add(p.events as u64, Ordering::Relaxed);
                }
                if let Some(done) = p.done {
                    done.answer(Ok(()));
                }
            }
            Some(Ack::Refused(why)) => inner.refuse(p, format!("stored by no stream: {why}")),
            Some(Ack::NoStream) | None => {
                inner.send_again(Some(p), window);
                return (
                    stored,
                    Some("no stream took the event (stream deleted?)".into()),
                );
            }
        }
    }
    inner.inflight.store(window.events, Ordering::Relaxed);
    (stored, None)
}

/// Sends the buffer to the stream, keeping up to [`WINDOW`] acknowledgements outstanding. The
/// acknowledgements come to one subscription (the reply subject numbers the event), so a
/// publish costs no request bookkeeping of its own.
async fn publisher(inner: Arc<Inner>) {
    use futures_util::StreamExt;
    let js = inner.cfg.jetstream(inner.client.clone());
    let mut stream_ok = false;
    let mut backoff = Duration::from_millis(50);
    let mut window = Window {
        inbox: inner.client.new_inbox(),
        sent: VecDeque::new(),
        first: 0,
        events: 0,
    };
    let mut acks: Option<async_nats::Subscriber> = None;
    loop {
        let mut failed: Option<String> = None;
        if acks.is_none() {
            match inner.client.subscribe(format!("{}.*", window.inbox)).await {
                Ok(s) => acks = Some(s),
                Err(e) => failed = Some(format!("cannot subscribe to acknowledgements: {e}")),
            }
        }
        if failed.is_none() && !stream_ok {
            match inner.cfg.events(&js).await {
                Ok(_) => stream_ok = true,
                Err(e) => failed = Some(e.to_string()),
            }
        }
        if failed.is_none()
            && let Err(why) = send_more(&inner, &mut window).await
        {
            failed = Some(why);
        }
        let (stored, missing) = settle_front(&inner, &mut window);
        if stored && failed.is_none() {
            inner.clear_degraded();
            backoff = Duration::from_millis(50);
        }
        if let Some(why) = missing {
            failed = Some(why);
            stream_ok = false;
        }
        if let Some(why) = failed {
            inner.failures.fetch_add(1, Ordering::Relaxed);
            inner.set_degraded(why);
            if window.sent.is_empty() {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        }
        if let Some(front) = window.sent.front() {
            let deadline = front.at + ACK_TIMEOUT;
            let room = window.sent.len() < WINDOW;
            let wake = inner.wake.notified();
            let Some(sub) = acks.as_mut() else { continue };
            tokio::select! {
                m = sub.next() => match m {
                    Some(m) => {
                        window.note(&m);
                        // Whatever else already arrived, without waiting.
                        while let Some(Some(m)) = futures_util::FutureExt::now_or_never(sub.next()) {
                            window.note(&m);
                        }
                    }
                    None => {
                        // The subscription ended (the client closed): send them again.
                        acks = None;
                        inner.send_again(None, &mut window);
                    }
                },
                _ = tokio::time::sleep_until(deadline) => {
                    inner.send_again(None, &mut window);
                    inner.failures.fetch_add(1, Ordering::Relaxed);
                    inner.set_degraded(format!(
                        "no acknowledgement from the stream within {}",
                        crate::time::fmt_duration(ACK_TIMEOUT)
                    ));
                    stream_ok = false;
                }
                _ = wake, if room => {}
            }
            continue;
        }
        let wake = inner.wake.notified();
        if inner.buf.lock().map(|b| b.q.is_empty()).unwrap_or(true) {
            inner.idle.notify_waiters();
            if inner.closing.load(Ordering::SeqCst) {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), wake).await;
        }
    }
}

impl Edge {
    /// The messages that carry a request's `events` to the stream (bundles where it can), and
    /// each event's hook count in `counts`. Every event is checked before any is buffered: a
    /// request is taken whole or refused.
    fn messages(
        &self,
        events: Vec<(String, Context)>,
        ids: Vec<ClientId>,
        counts: &mut Vec<usize>,
    ) -> Result<Vec<Pending>, SinkError> {
        let mut items = Vec::with_capacity(events.len().min(self.inner.bundle));
        let mut ids = ids.into_iter();
        let limit = self.bundle_limit();
        // One time of acceptance for the request; requests repeat event names, so the last
        // name's hook count and subject are reused.
        let time = crate::time::now();
        let mut last: Option<(String, (usize, async_nats::Subject, bool))> = None;
        let mut run: Option<Run> = None;
        for (event, context) in events {
            let (count, subject, bundles) = match &last {
                Some((name, route)) if *name == event => route.clone(),
                _ => {
                    let route = self.route(&event);
                    last = Some((event.clone(), route.clone()));
                    route
                }
            };
            counts.push(count);
            let context = context.into_raw().unwrap_or_default();
            let client_id = ids.next().flatten();
            if !bundles || self.inner.bundle == 1 || client_id.is_some() {
                if let Some(r) = run.take() {
                    items.push(self.seal(r, &time)?);
                }
                let id = match client_id {
                    Some(id) => (id, true),
                    None => (self.inner.ids.next(), false),
                };
                items.push(self.envelope(event, context, id, &time, subject)?);
                continue;
            }
            let id = self.inner.ids.next();
            let size = id.len() + context.get().len() + BUNDLE_ITEM_EXTRA;
            if let Some(r) = &run
                && (r.event != event
                    || r.items.len() >= self.inner.bundle
                    || r.bytes + size > limit)
                && let Some(r) = run.take()
            {
                items.push(self.seal(r, &time)?);
            }
            let r = run.get_or_insert_with(|| Run {
                bytes: bundle_head_len(&self.inner.gateway, &event, &time),
                event,
                subject,
                items: Vec::new(),
            });
            r.bytes += size;
            r.items.push((id, context));
        }
        if let Some(r) = run.take() {
            items.push(self.seal(r, &time)?);
        }
        Ok(items)
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
            let events = vec![(event, Context::new(context))];
            let mut r = self.accept_batch(events, vec![id]).await?;
            Ok(Accepted {
                queued: r.queued.pop().unwrap_or(0),
                stored: r.stored,
            })
        })
    }

    fn accept_batch(
        &self,
        events: Vec<(String, Context)>,
        ids: Vec<ClientId>,
    ) -> BoxFuture<'_, Result<Accepted<Vec<usize>>, SinkError>> {
        Box::pin(async move {
            if self.inner.closing.load(Ordering::SeqCst) {
                return Err(SinkError::ShuttingDown);
            }
            let mut counts = Vec::with_capacity(events.len());
            let mut items = self.messages(events, ids, &mut counts)?;
            let (waiter, stored_rx) = Waiter::new(items.len());
            for p in &mut items {
                p.done = Some(waiter.clone());
            }
            drop(waiter);
            self.inner.push(items)?;
            let mut stored = counts.is_empty();
            if !stored && self.inner.degraded().is_none() {
                match tokio::time::timeout(PUBLISH_WAIT, stored_rx).await {
                    Ok(Ok(Ok(()))) => stored = true,
                    Ok(Ok(Err(e))) => return Err(e),
                    // Still buffered (the broker is slow or went away): answered as buffered.
                    _ => {}
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

    fn collect_budget(&self, event: &str) -> Option<Duration> {
        let hooks = self.inner.view.matching(event);
        self.inner.view.collect_budget(&hooks)
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

    fn keeps_dead_letters(&self) -> bool {
        true
    }

    fn dead_letters(&self, query: DeadQuery) -> Option<BoxFuture<'_, Result<Value, SinkError>>> {
        Some(Box::pin(async move {
            let (sel, limit) = (selection(&query), query.limit);
            let js = self.inner.cfg.jetstream(self.inner.client.clone());
            let page = super::dead::page_on(&self.inner.cfg, &js, &sel, limit)
                .await
                .map_err(|e| SinkError::Fleet(e.to_string()))?;
            let letters: Vec<Value> = page.entries.iter().map(|e| e.summary()).collect();
            Ok(json!({"letters": letters, "more": page.more}))
        }))
    }

    fn replay_dead(&self, query: DeadQuery) -> Option<BoxFuture<'_, Result<Value, SinkError>>> {
        Some(Box::pin(async move {
            let js = self.inner.cfg.jetstream(self.inner.client.clone());
            let done = super::dead::replay_on(&self.inner.cfg, &js, &selection(&query))
                .await
                .map_err(|e| SinkError::Fleet(e.to_string()))?;
            let replayed: Vec<Value> = done.iter().map(|e| e.summary()).collect();
            tracing::info!(count = replayed.len(), hook = ?query.hook, "fleet: dead letters replayed through the API");
            Ok(json!({"replayed": replayed}))
        }))
    }
}

/// The dead-letter selection of an API query.
fn selection(q: &DeadQuery) -> super::dead::Selection {
    super::dead::Selection {
        hook: q.hook.clone(),
        seqs: q.seqs.clone(),
        to: None,
    }
}
