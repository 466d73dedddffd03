//! A fleet worker (`worker --fleet URL`): runs the hooks of its roots on its own host (every
//! handler kind, hot reload, trust, as `serve` does) and feeds them from the event stream.
//!
//! Each hook gets one durable pull consumer named after it, shared by every worker that has the
//! hook: `max_ack_pending` = `concurrency:` (1 keeps the hook's order across the fleet),
//! `max_deliver` = `retries:` + 1. An event is acknowledged after its handler finished (with
//! progress signals while it runs, so a slow handler is not redelivered); a failure or a timeout
//! is handed back with a growing delay; on the last delivery the event is published to the
//! dead-letter subject with its error and delivery count, then acknowledged. A worker that dies
//! mid-event leaves the event unacknowledged: the broker redelivers it after the ack wait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use super::envelope::{DeadLetter, Envelope, VERSION};
use super::status::{FleetCounters, HookStatus, WorkerStatus};
use super::{FleetConfig, FleetError, consumer_name};
use crate::host::Host;

/// Settings of a worker.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Worker id in the fleet view.
    pub id: String,
    /// Time the broker waits for an acknowledgement before redelivering (failover time).
    pub ack_wait: Duration,
    /// Delay before the first retry; doubles per delivery, at most a minute.
    pub retry_backoff: Duration,
    /// Interval between status messages.
    pub status_interval: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            id: format!("{}-{}", super::host_name(), std::process::id()),
            ack_wait: Duration::from_secs(30),
            retry_backoff: Duration::from_secs(1),
            status_interval: Duration::from_secs(2),
        }
    }
}

/// Stream sequences this worker finished for a hook, most recent [`RECENT`]: a broker that
/// crashed may have lost their acknowledgements and deliver them again (as first deliveries).
const RECENT: usize = 65_536;

#[derive(Default)]
struct Recent {
    set: std::collections::HashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

impl Recent {
    fn insert(&mut self, seq: u64) {
        if self.set.insert(seq) {
            self.order.push_back(seq);
            if self.order.len() > RECENT
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}

#[derive(Default)]
struct Counters {
    done: Mutex<Recent>,
    already_done: AtomicU64,
    delivered: AtomicU64,
    redelivered: AtomicU64,
    acked: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    skipped: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> FleetCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FleetCounters {
            delivered: g(&self.delivered),
            redelivered: g(&self.redelivered),
            acked: g(&self.acked),
            retried: g(&self.retried),
            dead: g(&self.dead),
            skipped: g(&self.skipped),
            already_done: g(&self.already_done),
        }
    }
}

/// What a hook's consumer is configured from; a change restarts the hook's consumer task.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    name: String,
    timeout: Duration,
    max_deliver: i64,
    concurrency: u32,
}

struct HookTask {
    settings: Settings,
    stop: watch::Sender<bool>,
    consume: JoinHandle<()>,
    collect: JoinHandle<()>,
    consumer: Arc<Mutex<Option<jetstream::consumer::PullConsumer>>>,
    counters: Arc<Counters>,
}

struct Shared {
    host: Host,
    cfg: FleetConfig,
    opts: WorkerOptions,
    client: async_nats::Client,
    js: jetstream::Context,
}

/// A running worker.
pub struct Worker {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Worker {
    /// Connects (retrying in the background while the broker is down) and starts feeding the
    /// host's hooks from the stream.
    pub async fn start(
        host: Host,
        cfg: FleetConfig,
        opts: WorkerOptions,
    ) -> Result<Self, FleetError> {
        let client = cfg
            .connect(&format!("hermes-hooks worker {}", opts.id), false)
            .await?;
        let js = cfg.jetstream(client.clone());
        let shared = Arc::new(Shared {
            host,
            cfg,
            opts,
            client,
            js,
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(shared, stop_rx));
        Ok(Self { stop, task })
    }

    /// Stops taking events, lets the events in flight finish for up to `drain` (they are
    /// acknowledged; what is left comes back to another worker after the ack wait).
    pub async fn stop(self, drain: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(drain + Duration::from_secs(1), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

async fn run(sh: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    // The streams, once the broker answers.
    let stream = loop {
        let r = async {
            let s = sh.cfg.events(&sh.js).await?;
            sh.cfg.dead(&sh.js).await?;
            Ok::<_, FleetError>(s)
        };
        match r.await {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!("{e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    };
    tracing::info!(worker = %sh.opts.id, stream = %sh.cfg.events_stream(), "fleet worker connected");
    let mut tasks: HashMap<String, HookTask> = HashMap::new();
    let mut reconcile = tokio::time::interval(Duration::from_millis(200));
    let mut status = tokio::time::interval(sh.opts.status_interval);
    let mut generation = u64::MAX;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = reconcile.tick() => {
                let snap = sh.host.snapshot();
                if snap.generation != generation {
                    generation = snap.generation;
                    apply(&sh, &stream, &snap, &mut tasks);
                }
            }
            _ = status.tick() => publish_status(&sh, &tasks, true).await,
        }
    }
    // Stop pulling everywhere, then wait for the events in flight.
    for t in tasks.values() {
        let _ = t.stop.send(true);
        t.collect.abort();
    }
    for (_, t) in tasks.drain() {
        let _ = t.consume.await;
    }
    publish_status(&sh, &HashMap::new(), false).await;
    let _ = sh.client.flush().await;
}

/// Starts, restarts and stops hook tasks to match the registry snapshot.
fn apply(
    sh: &Arc<Shared>,
    stream: &jetstream::stream::Stream,
    snap: &crate::registry::Registry,
    tasks: &mut HashMap<String, HookTask>,
) {
    let mut wanted: HashMap<String, Settings> = HashMap::new();
    for h in &snap.hooks {
        let m = &h.spec.manifest;
        wanted.insert(
            h.spec.name.clone(),
            Settings {
                name: h.spec.name.clone(),
                timeout: m.timeout,
                max_deliver: m.retries as i64 + 1,
                concurrency: m.concurrency as u32,
            },
        );
    }
    tasks.retain(|name, t| {
        let keep = wanted.get(name) == Some(&t.settings);
        if !keep {
            tracing::info!(hook = %name, "fleet: stopping this hook's consumer");
            let _ = t.stop.send(true);
            t.collect.abort();
        }
        keep
    });
    for (name, settings) in wanted {
        if tasks.contains_key(&name) {
            continue;
        }
        let (stop, stop_rx) = watch::channel(false);
        let consumer = Arc::new(Mutex::new(None));
        let counters = Arc::new(Counters::default());
        let consume = tokio::spawn(consume(
            sh.clone(),
            stream.clone(),
            settings.clone(),
            counters.clone(),
            consumer.clone(),
            stop_rx,
        ));
        let collect = tokio::spawn(super::collect::serve(
            sh.client.clone(),
            sh.cfg.collect_subject(&name),
            sh.host.clone(),
            name.clone(),
            sh.opts.id.clone(),
        ));
        tasks.insert(
            name,
            HookTask {
                settings,
                stop,
                consume,
                collect,
                consumer,
                counters,
            },
        );
    }
}

async fn ensure_consumer(
    sh: &Shared,
    stream: &jetstream::stream::Stream,
    s: &Settings,
) -> Result<jetstream::consumer::PullConsumer, String> {
    let name = consumer_name(&s.name);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some(format!("hermes-hooks hook {}", s.name)),
        // A hook sees the events published from the time it first joined the fleet.
        deliver_policy: jetstream::consumer::DeliverPolicy::New,
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: sh.opts.ack_wait,
        max_deliver: s.max_deliver,
        max_ack_pending: s.concurrency as i64,
        filter_subject: sh.cfg.events_filter(),
        ..Default::default()
    };
    match stream.get_consumer::<pull::Config>(&name).await {
        Ok(c) => {
            let have = &c.cached_info().config;
            if have.ack_wait != config.ack_wait
                || have.max_deliver != config.max_deliver
                || have.max_ack_pending != config.max_ack_pending
            {
                tracing::info!(hook = %s.name, "fleet: updating consumer {name} (ack wait, retries or concurrency changed)");
                // The 2.9 server updates the editable fields of an existing durable on create.
                stream
                    .create_consumer(config)
                    .await
                    .map_err(|e| format!("cannot update consumer {name}: {e}"))
            } else {
                Ok(c)
            }
        }
        Err(_) => stream
            .create_consumer(config)
            .await
            .map_err(|e| format!("cannot create consumer {name}: {e}")),
    }
}

/// Pulls the hook's events and hands each to the host, at most `concurrency` at a time.
async fn consume(
    sh: Arc<Shared>,
    stream: jetstream::stream::Stream,
    s: Settings,
    counters: Arc<Counters>,
    slot: Arc<Mutex<Option<jetstream::consumer::PullConsumer>>>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(s.concurrency.max(1) as usize));
    let mut running = tokio::task::JoinSet::new();
    let mut pause = Duration::from_millis(100);
    'outer: while !*stop.borrow() {
        let consumer = match ensure_consumer(&sh, &stream, &s).await {
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
        let messages = consumer
            .stream()
            // Twice what may be in flight: a pull request is always waiting at the broker when
            // an acknowledgement frees a slot (with exactly one, nats-server 2.9 only delivered
            // after a delay: 30 events/s at concurrency 1; with two, ~1,100/s).
            .max_messages_per_batch((2 * s.concurrency.max(1) as usize).max(4))
            .expires(Duration::from_secs(5))
            .heartbeat(Duration::from_secs(2))
            .messages()
            .await;
        let mut messages = match messages {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(hook = %s.name, "fleet: cannot pull: {e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.changed() => break 'outer,
                }
                continue;
            }
        };
        loop {
            // Take a message only when it can start at once: its ack wait runs from delivery.
            let permit = tokio::select! {
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'outer },
                _ = stop.changed() => {
                    give_back(&mut messages).await;
                    break 'outer;
                }
            };
            let next = tokio::select! {
                m = messages.next() => m,
                _ = stop.changed() => {
                    give_back(&mut messages).await;
                    break 'outer;
                }
            };
            match next {
                Some(Ok(msg)) => {
                    pause = Duration::from_millis(100);
                    let (sh, s, counters) = (sh.clone(), s.clone(), counters.clone());
                    running.spawn(async move {
                        handle(&sh, &s, &counters, msg).await;
                        drop(permit);
                    });
                }
                Some(Err(e)) => {
                    tracing::debug!(hook = %s.name, "fleet: pull interrupted: {e}; pulling again");
                    break;
                }
                None => break,
            }
            while running.try_join_next().is_some() {}
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => break 'outer,
        }
        pause = (pause * 2).min(Duration::from_secs(1));
    }
    while running.join_next().await.is_some() {}
}

/// Stopping: hands back at once what the broker already delivered but no handler started, so
/// that another worker gets it now rather than after the ack wait.
async fn give_back(messages: &mut jetstream::consumer::pull::Stream) {
    use futures_util::FutureExt;
    while let Some(Some(Ok(msg))) = messages.next().now_or_never() {
        let _ = msg.ack_with(AckKind::Nak(None)).await;
    }
}

/// One delivery: run the handler, then acknowledge, hand back for a retry, or dead-letter.
async fn handle(sh: &Shared, s: &Settings, counters: &Counters, msg: jetstream::Message) {
    let (delivered, seq) = match msg.info() {
        Ok(i) => (i.delivered, i.stream_sequence),
        Err(_) => (1, 0),
    };
    counters.delivered.fetch_add(1, Ordering::Relaxed);
    if seq > 0
        && counters
            .done
            .lock()
            .map(|d| d.set.contains(&seq))
            .unwrap_or(false)
    {
        // Finished here already; the broker lost the acknowledgement (it crashed): ack again.
        let _ = msg.ack().await;
        counters.already_done.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if delivered > 1 {
        counters.redelivered.fetch_add(1, Ordering::Relaxed);
    }
    let env: Envelope = match serde_json::from_slice(&msg.payload) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(hook = %s.name, seq, "fleet: unreadable event in the stream ({e}); dropping it");
            let _ = msg.ack_with(AckKind::Term).await;
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    if env.hook.as_deref().is_some_and(|h| h != s.name) {
        let _ = msg.ack().await;
        counters.skipped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let msg = Arc::new(msg);
    // Progress signals while the handler runs, so that a slow handler is not redelivered.
    let keepalive = {
        let msg = msg.clone();
        let every = (sh.opts.ack_wait / 3).max(Duration::from_millis(100));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let _ = msg.ack_with(AckKind::Progress).await;
            }
        })
    };
    let outcome = sh
        .host
        .emit_collect_only(
            &env.event,
            env.handler_context(delivered, seq),
            s.timeout + Duration::from_secs(5),
            Some(&s.name),
        )
        .await;
    keepalive.abort();
    let error = match outcome {
        Err(_) => {
            // Shutting down: give it back now, another worker takes it.
            let _ = msg.ack_with(AckKind::Nak(None)).await;
            return;
        }
        Ok(v) => match v.into_iter().next() {
            None => {
                if sh.host.snapshot().get(&s.name).is_some() {
                    // Loaded, but none of its patterns matches this event.
                    let _ = msg.ack().await;
                    counters.skipped.fetch_add(1, Ordering::Relaxed);
                } else {
                    let _ = msg.ack_with(AckKind::Nak(None)).await;
                }
                return;
            }
            Some(o) => o.result.err(),
        },
    };
    let Some(error) = error else {
        if let Err(e) = msg.ack().await {
            tracing::warn!(hook = %s.name, seq, "fleet: acknowledgement not sent ({e}); the event will come again");
        }
        counters.acked.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut d) = counters.done.lock() {
            d.insert(seq);
        }
        return;
    };
    if delivered < s.max_deliver {
        let shift = (delivered.max(1) - 1).min(16) as u32;
        let delay = (sh.opts.retry_backoff * 2u32.pow(shift)).min(Duration::from_secs(60));
        tracing::warn!(hook = %s.name, seq, delivered, "fleet: handler failed ({error}); retry in {}", crate::time::fmt_duration(delay));
        let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
        counters.retried.fetch_add(1, Ordering::Relaxed);
        return;
    }
    dead_letter(sh, s, counters, &msg, env, error, delivered, seq).await;
}

/// The last delivery failed: publishes the dead letter, then acknowledges the event (or, when
/// the dead letter cannot be stored, leaves it in the stream and logs where).
#[allow(clippy::too_many_arguments)]
async fn dead_letter(
    sh: &Shared,
    s: &Settings,
    counters: &Counters,
    msg: &jetstream::Message,
    env: Envelope,
    error: String,
    delivered: i64,
    seq: u64,
) {
    let dead = DeadLetter {
        v: VERSION,
        hook: s.name.clone(),
        error: error.clone(),
        deliveries: delivered,
        worker: sh.opts.id.clone(),
        time: crate::time::now(),
        stream_seq: seq,
        envelope: env,
    };
    let id = format!("{}:{}:{seq}", dead.envelope.msg_id(), s.name);
    let payload = serde_json::to_vec(&dead).unwrap_or_default();
    let publish = jetstream::message::PublishMessage::build()
        .payload(payload.into())
        .message_id(id);
    let stored = match sh
        .js
        .send_publish(sh.cfg.dead_subject(&s.name), publish)
        .await
    {
        Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match stored {
        Ok(()) => {
            tracing::error!(hook = %s.name, seq, deliveries = delivered, "fleet: handler failed on the last delivery ({error}); event moved to the dead-letter subject");
            let _ = msg.ack().await;
            counters.dead.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut d) = counters.done.lock() {
                d.insert(seq);
            }
        }
        Err(e) => {
            // Not acknowledged: the broker stops delivering it (max_deliver); log what is lost.
            tracing::error!(hook = %s.name, seq, "fleet: cannot publish the dead letter ({e}); the event stays in the stream at sequence {seq}");
        }
    }
}

async fn publish_status(sh: &Shared, tasks: &HashMap<String, HookTask>, running: bool) {
    let mut hooks = Vec::new();
    for (name, t) in tasks {
        let consumer = t.consumer.lock().ok().and_then(|g| g.clone());
        // A hook joins the fleet view once its consumer exists (events from then on reach it).
        let Some(consumer) = consumer else { continue };
        let Some(info) = sh.host.hook(name) else {
            continue;
        };
        let lag = match tokio::time::timeout(Duration::from_secs(1), consumer.get_info()).await {
            Ok(Ok(i)) => Some(i.num_pending + i.num_ack_pending as u64),
            _ => None,
        };
        hooks.push(HookStatus {
            name: name.clone(),
            events: info.events.clone(),
            kind: info.kind.to_string(),
            status: info.status.to_string(),
            timeout_s: info.timeout_s,
            max_deliver: t.settings.max_deliver,
            concurrency: t.settings.concurrency as i64,
            lag,
            counters: json!(info.counters),
            fleet: t.counters.snapshot(),
            last_error: info.last_error.as_ref().map(|e| json!(e)),
        });
    }
    hooks.sort_by(|a, b| a.name.cmp(&b.name));
    let status = WorkerStatus {
        worker: sh.opts.id.clone(),
        host: super::host_name(),
        pid: std::process::id(),
        interval_ms: sh.opts.status_interval.as_millis() as u64,
        time: crate::time::now(),
        running,
        hooks,
    };
    let body = serde_json::to_vec(&status).unwrap_or_default();
    if let Err(e) = sh
        .client
        .publish(sh.cfg.status_subject(&sh.opts.id), body.into())
        .await
    {
        tracing::debug!("fleet: status not published: {e}");
    }
}
