//! A fleet worker (`worker --fleet URL`): runs the hooks of its roots on its own host (every
//! handler kind, hot reload, trust, as `serve` does) and feeds them from the event stream.
//!
//! Each hook gets one durable pull consumer named after it, shared by every worker that has the
//! hook, and a second one on its retry subject ([`super::retry`]). An ordered hook
//! (`concurrency: 1`) is pulled by one worker at a time (the lease holder, [`super::lease`]) with
//! up to [`WINDOW`] events in flight, fed in stream order into the hook's local queue, and its
//! consumer acknowledges cumulatively ([`super::held`]); a hook with `concurrency: N` lets every
//! worker pull, N in flight, explicit acknowledgements. A new consumer starts at the time the
//! hook appeared (its HOOK.yaml written on a running worker, or the worker's start), so events
//! published while it was being created are not missed, and a stream recreated empty by its
//! broker is read from its start.
//!
//! A stream message holds one event or a bundle of them ([`super::envelope`]): its events are
//! run one by one, in order, each with its own retry and dead letter, and the message is
//! acknowledged once every one is finished ([`super::held`]). At most the hook's window of
//! events is in its local queue at once; the rest of what was delivered waits in a backlog,
//! held (with progress signals).
//!
//! An event is acknowledged after its handler finished, with progress signals from the moment
//! it arrives (also while it waits in the hook's local queue, so it is never redelivered while
//! it waits); a failure or a timeout is published to the hook's retry subject with a growing
//! delay and the event finished; on the last allowed delivery (`retries:` + 1) the event is
//! published to the dead-letter subject with its error and delivery count, then acknowledged.
//! The consumer allows one delivery more than that: a worker killed during the last allowed
//! delivery leaves the event unacknowledged, the broker delivers it once more after the ack
//! wait, and that delivery goes to the dead letters without running the handler again.
//!
//! A worker that takes an ordered hook's lease starts nothing and acknowledges nothing until
//! every event the broker counts as pending for the hook is delivered to it ([`CatchUp`]): a
//! dead or late previous holder's events come back in the order their ack waits ran out, and a
//! cumulative acknowledgement must never pass one still on its way.
//!
//! A removed hook's consumers are deleted after `consumer_grace` when no worker pulls from them.
//!
//! A hook's consumer, lease and dead letters are named by its identity ([`super::identity`]:
//! `id:`, else the name), so a renamed hook keeps its place in the stream; a rename on a running
//! worker is a hand-over inside the hook's task ([`Run::renamed`]), not a stop and a start. Its
//! filter covers the patterns of every live version of the hook ([`super::versions`]), and an event this version
//! does not match goes back (nak) when another version does, for a worker that has it (an
//! ordered hook's lease holder hands the lease over for it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::envelope::{DeadLetter, Envelope, VERSION};
use super::held::Held;
use super::status::{FleetCounters, HookStatus, WorkerStatus};
use super::versions::Versions;
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
    /// How long a removed hook's consumer is kept (a hook coming back, or other workers still
    /// serving it) before it is deleted.
    pub consumer_grace: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            id: format!("{}-{}", super::host_name(), std::process::id()),
            ack_wait: Duration::from_secs(30),
            retry_backoff: Duration::from_secs(1),
            status_interval: Duration::from_secs(2),
            consumer_grace: Duration::from_secs(600),
        }
    }
}

/// Events this worker finished for a hook, at least the most recent `RECENT / 2` and at most
/// `RECENT`: a broker that crashed may have lost their acknowledgements and deliver them again
/// (as first deliveries). Each is known by its stream sequence and its message id together: a
/// broker back with an empty store reuses sequences for other events.
const RECENT: usize = 65_536;

type DoneKey = (u64, u64);

/// Two generations of keys: inserts go to `young`; when it holds half of [`RECENT`] it becomes
/// `old` (the previous `old` is dropped). No per-insert eviction and no tombstones to rehash.
#[derive(Default)]
struct Recent {
    young: std::collections::HashSet<DoneKey, KeyHash>,
    old: std::collections::HashSet<DoneKey, KeyHash>,
}

/// Hashes a [`DoneKey`] by mixing its two words (the second is already a hash of the id).
#[derive(Default, Clone, Copy)]
struct KeyHash;

impl std::hash::BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The key of a delivered message in [`Recent`].
fn done_key(msg: &jetstream::Message, seq: u64) -> DoneKey {
    let id = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|v| v.as_str())
        .unwrap_or("");
    // FNV-1a over the message id.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (seq, h)
}

impl Recent {
    fn insert(&mut self, key: DoneKey) {
        if self.old.contains(&key) || !self.young.insert(key) {
            return;
        }
        if self.young.len() >= RECENT / 2 {
            self.old = std::mem::take(&mut self.young);
            self.young.reserve(RECENT / 2);
        }
    }

    fn contains(&self, key: &DoneKey) -> bool {
        self.young.contains(key) || self.old.contains(key)
    }
}

#[derive(Default)]
struct Counters {
    done: Mutex<Recent>,
    already_done: AtomicU64,
    delivered: AtomicU64,
    /// Stream messages delivered (`delivered` counts their events: a bundle holds several).
    messages: AtomicU64,
    redelivered: AtomicU64,
    acked: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    skipped: AtomicU64,
    mismatched: AtomicU64,
    /// An ordered hook's event only another version matches: the lease holder hands over.
    handover: tokio::sync::Notify,
    /// First deliveries replayed by a broker that lost consumer state ([`super::replayed`]).
    high: super::replayed::HighWater,
    duplicate: AtomicU64,
}

impl Counters {
    /// `messages` of the stream in events: times the events per message this worker was
    /// delivered (exact while each event goes alone; an estimate with bundles).
    fn events(&self, messages: u64) -> u64 {
        let events = self.delivered.load(Ordering::Relaxed);
        let delivered = self.messages.load(Ordering::Relaxed);
        if delivered == 0 || events <= delivered {
            return messages;
        }
        (messages as f64 * events as f64 / delivered as f64).round() as u64
    }

    fn snapshot(&self) -> FleetCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FleetCounters {
            delivered: g(&self.delivered),
            redelivered: g(&self.redelivered),
            acked: g(&self.acked),
            retried: g(&self.retried),
            dead: g(&self.dead),
            skipped: g(&self.skipped),
            mismatched: g(&self.mismatched),
            already_done: g(&self.already_done),
            duplicate: g(&self.duplicate),
        }
    }
}

/// What a hook's consumer is configured from; a change restarts the hook's consumer task.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    name: String,
    /// The hook's identity ([`super::identity`]): names its consumer and lease.
    key: String,
    timeout: Duration,
    max_deliver: i64,
    concurrency: u32,
    /// Events this worker may hold for the hook at once (the consumer's `max_ack_pending`):
    /// `concurrency` for a hook that runs several at once, up to [`WINDOW`] (and half its local
    /// queue) for an ordered hook, whose one active puller (the lease holder) feeds them in
    /// stream order into the hook's local queue.
    window: u32,
    /// When the hook appeared: the start of a consumer created for it.
    since: std::time::SystemTime,
    /// The consumer's filter subjects: this version's and every other live version's patterns
    /// ([`super::versions::filters`]).
    filters: Vec<String>,
    /// This version's own filter subjects (an event outside them was routed for another).
    own: Vec<String>,
}

impl Settings {
    fn ordered(&self) -> bool {
        self.concurrency <= 1
    }
}

/// Most events in flight for an ordered hook.
pub const WINDOW: u32 = 512;

struct HookTask {
    settings: Settings,
    stop: watch::Sender<bool>,
    consume: JoinHandle<()>,
    collect: JoinHandle<()>,
    consumer: Arc<Mutex<Option<jetstream::consumer::PullConsumer>>>,
    counters: Arc<Counters>,
    /// The hook's name, for a rename that keeps its identity ([`Run::renamed`]).
    rename: watch::Sender<String>,
}

struct Shared {
    /// Each hook's counters, for `/metrics` (kept across a hook's restarts).
    counters: Mutex<HashMap<String, Arc<Counters>>>,
    host: Host,
    cfg: FleetConfig,
    opts: WorkerOptions,
    client: async_nats::Client,
    js: jetstream::Context,
    /// The other live versions of the hooks.
    versions: Versions,
    /// The broker takes several filter subjects per consumer (nats-server ≥ 2.10).
    multi: std::sync::atomic::AtomicBool,
    /// Stopping: when the service stops waiting for the events in flight.
    stop_by: Mutex<Option<tokio::time::Instant>>,
}

/// A running worker.
pub struct Worker {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    shared: Arc<Shared>,
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
            counters: Mutex::new(HashMap::new()),
            host,
            cfg,
            opts,
            client,
            js,
            versions: Versions::default(),
            multi: Default::default(),
            stop_by: Mutex::new(None),
        });
        tokio::spawn(super::versions::follow(
            shared.client.clone(),
            shared.cfg.status_filter(),
            shared.opts.id.clone(),
            shared.versions.clone(),
        ));
        let (stop, stop_rx) = watch::channel(false);
        let metrics = Arc::downgrade(&shared);
        shared.host.set_worker_status(Arc::new(move || {
            let Some(sh) = metrics.upgrade() else {
                return json!({});
            };
            let hooks: serde_json::Map<String, serde_json::Value> = sh
                .counters
                .lock()
                .map(|m| {
                    m.iter()
                        .map(|(k, c)| (k.clone(), json!(c.snapshot())))
                        .collect()
                })
                .unwrap_or_default();
            json!({ "hooks": hooks })
        }));
        let task = tokio::spawn(run(shared.clone(), stop_rx));
        Ok(Self { stop, task, shared })
    }

    /// Stops taking events, lets the events in flight finish for up to `drain` (they are
    /// acknowledged; what is left comes back to another worker after the ack wait).
    pub async fn stop(self, drain: Duration) {
        if let Ok(mut by) = self.shared.stop_by.lock() {
            *by = Some(tokio::time::Instant::now() + drain);
        }
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
    let started = std::time::SystemTime::now();
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
    let version = sh.client.server_info().version;
    let multi = super::versions::multi_filter(&version);
    sh.multi.store(multi, Ordering::Relaxed);
    tracing::info!(worker = %sh.opts.id, stream = %sh.cfg.events_stream(), server = %version, "fleet worker connected{}", if multi { "" } else { " (nats-server < 2.10: one filter subject per consumer; a hook needing several reads every event)" });
    let mut tasks: HashMap<String, HookTask> = HashMap::new();
    let mut seen: HashMap<String, std::time::SystemTime> = HashMap::new();
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
                    apply(&sh, &stream, &snap, &mut tasks, &mut seen, started);
                    // Announced before any consumer changes: the other versions' workers then
                    // hand back what only this one matches.
                    publish_status(&sh, &tasks, true).await;
                }
            }
            _ = status.tick() => {
                // Other versions of the hooks come and go: filters follow.
                apply(&sh, &stream, &sh.host.snapshot(), &mut tasks, &mut seen, started);
                publish_status(&sh, &tasks, true).await
            }
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
    // Bounded: with the broker down neither completes.
    let bye = async {
        publish_status(&sh, &HashMap::new(), false).await;
        let _ = sh.client.flush().await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), bye).await;
}

/// When a hook appeared, as the start of a consumer created for it: its HOOK.yaml's time when
/// written while this worker runs, else the worker's start.
fn appeared(
    spec: &crate::discovery::HookSpec,
    started: std::time::SystemTime,
) -> std::time::SystemTime {
    std::fs::metadata(&spec.manifest_path)
        .and_then(|m| m.modified())
        .ok()
        .filter(|t| *t > started && *t <= std::time::SystemTime::now())
        .unwrap_or(started)
}

/// Starts, restarts and stops hook tasks to match the registry snapshot.
fn apply(
    sh: &Arc<Shared>,
    stream: &jetstream::stream::Stream,
    snap: &crate::registry::Registry,
    tasks: &mut HashMap<String, HookTask>,
    seen: &mut HashMap<String, std::time::SystemTime>,
    started: std::time::SystemTime,
) {
    let mut wanted: HashMap<String, Settings> = HashMap::new();
    for h in &snap.hooks {
        let key = super::identity::of(&h.spec);
        if let Some(other) = wanted.get(&key) {
            tracing::error!(hook = %h.spec.name, "fleet: hooks {} and {} have the same identity {key:?} (id:); only the first is fed from the stream", other.name, h.spec.name);
            continue;
        }
        let since = *seen
            .entry(key.clone())
            .or_insert_with(|| appeared(&h.spec, started));
        wanted.insert(key.clone(), settings(sh, &h.spec, key, since));
    }
    seen.retain(|name, _| wanted.contains_key(name));
    tasks.retain(|name, t| {
        if let Some(w) = wanted.get(name).filter(|w| only_renamed(&t.settings, w)) {
            // The same identity under a new name: a hand-over inside the running task (its
            // lease, held events and order go on), not a stop and a start.
            tracing::info!(hook = %w.name, from = %t.settings.name, "fleet: hook renamed; its consumer goes on under the new name");
            let _ = t.rename.send(w.name.clone());
            t.collect.abort();
            t.collect = tokio::spawn(super::collect::serve(
                sh.client.clone(),
                (sh.cfg.collect_subject(&w.name), sh.cfg.cancel_subject(&w.name)),
                sh.host.clone(),
                w.name.clone(),
                sh.opts.id.clone(),
            ));
            t.settings = w.clone();
        }
        let keep = wanted.get(name) == Some(&t.settings);
        if !keep {
            tracing::info!(hook = %name, "fleet: stopping this hook's consumer");
            let _ = t.stop.send(true);
            t.collect.abort();
            if !wanted.contains_key(name) {
                tokio::spawn(remove_after_grace(sh.clone(), stream.clone(), name.clone()));
            }
        }
        keep
    });
    for (key, settings) in wanted {
        if tasks.contains_key(&key) {
            continue;
        }
        let name = settings.name.clone();
        let (stop, stop_rx) = watch::channel(false);
        let (rename, renamed) = watch::channel(name.clone());
        let consumer = Arc::new(Mutex::new(None));
        let counters = sh
            .counters
            .lock()
            .map(|mut m| m.entry(name.clone()).or_default().clone())
            .unwrap_or_default();
        let consume = tokio::spawn(consume(
            sh.clone(),
            stream.clone(),
            settings.clone(),
            counters.clone(),
            consumer.clone(),
            (stop_rx, renamed),
        ));
        let collect = tokio::spawn(super::collect::serve(
            sh.client.clone(),
            (sh.cfg.collect_subject(&name), sh.cfg.cancel_subject(&name)),
            sh.host.clone(),
            name.clone(),
            sh.opts.id.clone(),
        ));
        tasks.insert(
            key,
            HookTask {
                settings,
                stop,
                consume,
                collect,
                consumer,
                counters,
                rename,
            },
        );
    }
}

/// Whether `new` differs from `old` by the hook's name alone (a rename keeping its `id:`).
fn only_renamed(old: &Settings, new: &Settings) -> bool {
    old.name != new.name
        && *old
            == Settings {
                name: old.name.clone(),
                ..new.clone()
            }
}

/// What a hook's consumer task is configured from.
fn settings(
    sh: &Shared,
    spec: &crate::discovery::HookSpec,
    key: String,
    since: std::time::SystemTime,
) -> Settings {
    let m = &spec.manifest;
    let concurrency = (m.concurrency as u32).max(1);
    let window = if concurrency == 1 {
        WINDOW.min((m.queue_capacity / 2) as u32).max(1)
    } else {
        concurrency
    };
    let mine = spec.patterns.patterns().to_vec();
    let mut versions = vec![mine.clone()];
    versions.extend(sh.versions.others(&key));
    let multi = sh.multi.load(Ordering::Relaxed);
    Settings {
        name: spec.name.clone(),
        timeout: m.timeout,
        max_deliver: m.retries as i64 + 1,
        concurrency,
        window,
        since,
        filters: super::versions::filters(&sh.cfg, &versions, multi),
        own: super::versions::filters(&sh.cfg, &[mine], true),
        key,
    }
}

/// A hook left this worker: after the grace, its consumer is deleted unless this worker has the
/// hook again or another worker still pulls from it (checked three times, a second apart: a
/// serving worker always has a pull request waiting, renewed every few seconds).
async fn remove_after_grace(sh: Arc<Shared>, stream: jetstream::stream::Stream, hook: String) {
    tokio::time::sleep(sh.opts.consumer_grace).await;
    if sh
        .host
        .snapshot()
        .hooks
        .iter()
        .any(|h| super::identity::of(&h.spec) == hook)
    {
        return;
    }
    let name = consumer_name(&hook);
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        match stream.get_consumer::<pull::Config>(&name).await {
            Ok(mut c) => match c.info().await {
                Ok(info) if info.num_waiting == 0 && info.num_ack_pending == 0 => {}
                _ => return,
            },
            Err(_) => return,
        }
    }
    let _ = stream.delete_consumer(&super::retry::consumer(&hook)).await;
    match stream.delete_consumer(&name).await {
        Ok(_) => {
            tracing::info!(hook = %hook, "fleet: removed hook: consumer {name} deleted after the grace")
        }
        Err(e) => tracing::debug!(hook = %hook, "fleet: consumer {name} not deleted: {e}"),
    }
}

async fn ensure_consumer(
    sh: &Shared,
    stream: &jetstream::stream::Stream,
    s: &Settings,
) -> Result<jetstream::consumer::PullConsumer, String> {
    let name = consumer_name(&s.key);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some(super::identity::description(&s.name)),
        // From the time the hook appeared (not "new": events published while the consumer was
        // being created would be missed); a stream recreated since is read from its start.
        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::from(s.since),
        },
        // An ordered hook's events finish in stream order: one acknowledgement of the highest
        // finished sequence acknowledges a batch (held.rs).
        ack_policy: if s.ordered() {
            jetstream::consumer::AckPolicy::All
        } else {
            jetstream::consumer::AckPolicy::Explicit
        },
        ack_wait: sh.opts.ack_wait,
        // One more than allowed: the extra one is the dead letter of a worker killed during
        // the last allowed delivery.
        max_deliver: s.max_deliver + 1,
        max_ack_pending: s.window as i64,
        ..Default::default()
    };
    match stream.get_consumer::<pull::Config>(&name).await {
        Ok(c) => {
            let have = &c.cached_info().config;
            let filters = super::versions::update_filters(
                &sh.cfg,
                &s.filters,
                have,
                sh.multi.load(Ordering::Relaxed),
                sh.versions.settled(sh.opts.status_interval),
            );
            let config = super::versions::with_filters(config, &filters);
            if have.ack_wait != config.ack_wait
                || have.max_deliver != config.max_deliver
                || have.max_ack_pending != config.max_ack_pending
                || have.description != config.description
                || super::identity::of_config(have) != filters
            {
                tracing::info!(hook = %s.name, "fleet: updating consumer {name} (ack wait, retries, concurrency, name or patterns changed)");
                // The server's own config with the changed fields: its start time sent back
                // through a typed config is refused as a change ("start time can not be
                // updated", 2.9 and 2.15 alike).
                let changes = serde_json::json!({
                    "ack_wait": config.ack_wait.as_nanos() as u64,
                    "max_deliver": config.max_deliver,
                    "max_ack_pending": config.max_ack_pending,
                    "description": config.description,
                });
                match super::versions::update_consumer(
                    &sh.js,
                    &sh.cfg.events_stream(),
                    &name,
                    changes,
                    &filters,
                )
                .await
                {
                    Ok(()) => Ok(stream
                        .get_consumer::<pull::Config>(&name)
                        .await
                        .unwrap_or(c)),
                    Err(e) => {
                        tracing::warn!(hook = %s.name, "fleet: cannot update consumer {name} ({e}); using it as it is");
                        Ok(c)
                    }
                }
            } else {
                Ok(c)
            }
        }
        Err(_) => stream
            .create_consumer(super::versions::with_filters(config, &s.filters))
            .await
            .map_err(|e| format!("cannot create consumer {name}: {e}")),
    }
}

/// What one hook's consume task keeps across its pull sessions: the held events of its two
/// consumers, the handler calls in flight, and the retries waiting for their time.
struct Run {
    sh: Arc<Shared>,
    /// Shared with every call in flight (an `Arc`: cloned per event).
    s: Arc<Settings>,
    counters: Arc<Counters>,
    /// The hook's consumer's events.
    main: Arc<Held>,
    /// The retry consumer's events.
    retry: Arc<Held>,
    _tend: [AbortOnDrop; 2],
    /// Handler calls in flight, polled by the pull session itself (no task, no cross-thread
    /// wake-up per event); moved to `background` when the session ends.
    running: futures_util::stream::FuturesUnordered<InFlight>,
    background: tokio::task::JoinSet<()>,
    /// Retries held until their time (one sleeping task each; there are at most
    /// [`super::retry::WINDOW`]).
    waiting: tokio::task::JoinSet<()>,
    due_tx: tokio::sync::mpsc::Sender<Arc<jetstream::Message>>,
    due_rx: tokio::sync::mpsc::Receiver<Arc<jetstream::Message>>,
    /// Something was delivered since the last look (the pause between pulls starts over).
    pulled: bool,
    /// Delivered events not started yet, in stream order: a message may hold many (a bundle),
    /// and at most the window enter the hook's local queue at once ([`Run::feed`]).
    backlog: std::collections::VecDeque<Delivery>,
    /// Just took an ordered hook's lease: nothing starts until the broker's pending events are
    /// all held here ([`Run::check_caught_up`]).
    catch_up: Option<CatchUp>,
    /// The hook's current name ([`Run::renamed`]).
    rename: watch::Receiver<String>,
    /// Renamed: nothing starts until every call of the old name is finished or back here.
    renaming: bool,
    /// Events whose call the old name's hook dropped (renamed meanwhile): run again, in order,
    /// under the new name, as the same delivery.
    redo_tx: tokio::sync::mpsc::Sender<Delivery>,
    redo_rx: tokio::sync::mpsc::Receiver<Delivery>,
}

/// A new lease holder waiting for what the previous one left pending (issue 34): the broker
/// redelivers those events in the order their ack waits ran out (progress signals and
/// deliveries interleave, so not in stream order), and a cumulative acknowledgement of one that
/// came back early would settle the lower ones still on their way, never run. So nothing starts
/// and nothing is acknowledged until the broker's count of pending events is what this worker
/// holds (every one is here, whatever the previous holder still does); then the backlog is put
/// in stream order and runs. A previous holder still running (its lease lost but not its
/// process) keeps its events pending with progress signals: this waits for it.
struct CatchUp {
    /// The broker's pending count and this worker's held count at the last change.
    last: (u64, usize),
    since: tokio::time::Instant,
}

/// How often a new lease holder asks the broker what is still pending.
const CATCH_UP_EVERY: Duration = Duration::from_millis(100);

/// A handler call in flight and what follows it (acknowledgement, retry, dead letter).
type InFlight = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Where a delivery came from.
#[derive(Clone, Copy, PartialEq)]
enum Source {
    Main,
    Retry,
}

/// How a pull session ended.
enum Ended {
    Stop,
    Again,
    /// An event only another version of the ordered hook matches: let that version pull.
    HandOver,
}

impl Run {
    fn new(
        sh: Arc<Shared>,
        s: Settings,
        counters: Arc<Counters>,
        ack_all: bool,
        rename: watch::Receiver<String>,
    ) -> Self {
        let (main, retry) = (Arc::new(Held::new(ack_all)), Arc::new(Held::new(false)));
        let progress = (sh.opts.ack_wait / 3).max(Duration::from_millis(100));
        let tend = |h: &Arc<Held>| {
            AbortOnDrop(tokio::spawn(super::held::tend(
                h.clone(),
                ACK_BATCH_EVERY,
                progress,
            )))
        };
        let (due_tx, due_rx) = tokio::sync::mpsc::channel(super::retry::WINDOW as usize);
        // Every call in flight may come back once.
        let (redo_tx, redo_rx) =
            tokio::sync::mpsc::channel(s.window as usize + super::retry::WINDOW as usize + 1);
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
            rename,
            renaming: false,
            redo_tx,
            redo_rx,
        }
    }

    /// Gives back the retries this worker holds until their time (standing by: whoever pulls
    /// the hook next runs them).
    async fn forget_retries(&mut self) {
        self.waiting.abort_all();
        while self.waiting.join_next().await.is_some() {}
        while self.due_rx.try_recv().is_ok() {}
        self.retry.give_back_all().await;
    }

    /// Runs what was delivered (the backlog too) and waits for it, then acknowledges what
    /// finished. With `start_by`, no message is started after that time: the backlog's
    /// messages none of whose events started by then are left to the ack wait
    /// ([`Run::release_backlog`]); the events of a message partly started still run.
    async fn drain(&mut self, mut start_by: Option<tokio::time::Instant>) {
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
            self.feed().await;
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
        self.main.flush().await;
    }

    /// Pulls both consumers until the pull breaks (`Again`) or the task stops (`Stop`); the
    /// handler calls still in flight then go on in tasks of their own.
    async fn session(
        &mut self,
        consumer: &jetstream::consumer::PullConsumer,
        retries: &jetstream::consumer::PullConsumer,
        lease: &mut Option<super::lease::Lease>,
        stop: &mut watch::Receiver<bool>,
    ) -> Ended {
        let ended = self.pull(consumer, retries, lease, stop).await;
        for f in std::mem::take(&mut self.running) {
            self.background.spawn(f);
        }
        ended
    }

    async fn pull(
        &mut self,
        consumer: &jetstream::consumer::PullConsumer,
        retries: &jetstream::consumer::PullConsumer,
        lease: &mut Option<super::lease::Lease>,
        stop: &mut watch::Receiver<bool>,
    ) -> Ended {
        fn pull(
            c: &jetstream::consumer::PullConsumer,
            batch: usize,
        ) -> impl std::future::Future<
            Output = Result<jetstream::consumer::pull::Stream, jetstream::consumer::StreamError>,
        > + '_ {
            c.stream()
                // More than may be in flight: a pull request is always waiting at the broker
                // when an acknowledgement frees a slot (with exactly one, nats-server 2.9 only
                // delivered after a delay: 30 events/s at concurrency 1; with two, ~1,100/s).
                .max_messages_per_batch(batch)
                .expires(Duration::from_secs(5))
                .heartbeat(Duration::from_secs(2))
                .messages()
        }
        let batch = (2 * self.s.window as usize).max(4);
        let (mut messages, mut retried) = match futures_util::future::try_join(
            pull(consumer, batch),
            pull(retries, 2 * super::retry::WINDOW as usize),
        )
        .await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(hook = %self.s.name, "fleet: cannot pull: {e}; retrying");
                return Ended::Again;
            }
        };
        // What an earlier session left in the backlog goes on.
        while self.background.try_join_next().is_some() {}
        self.feed().await;
        let mut catching = tokio::time::interval(CATCH_UP_EVERY);
        loop {
            let holding = lease.is_some();
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
                    give_back(&mut messages).await;
                    give_back(&mut retried).await;
                    return Ended::Stop;
                }
                _ = lost => {
                    // Another worker may take over: hand back what no handler started.
                    give_back(&mut messages).await;
                    give_back(&mut retried).await;
                    *lease = None;
                    return Ended::Again;
                }
                _ = self.counters.handover.notified(), if holding => {
                    give_back(&mut messages).await;
                    give_back(&mut retried).await;
                    return Ended::HandOver;
                }
            };
            match next {
                Some(Ok(msg)) => {
                    let msg = Arc::new(msg);
                    if source == Source::Retry && !self.hold_until_due(&msg) {
                        continue;
                    }
                    self.dispatch(msg, source).await;
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

    /// A retry before its time is held (with progress signals) until then: false. True when
    /// it is due (or unreadable: triage drops it).
    fn hold_until_due(&mut self, msg: &Arc<jetstream::Message>) -> bool {
        let Some(wait) = super::retry::Retry::read(msg)
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

/// Most often an ordered hook's finished events are acknowledged (one acknowledgement of the
/// highest finished sequence for all that finished meanwhile).
const ACK_BATCH_EVERY: Duration = Duration::from_millis(2);

/// Pulls the hook's events and hands each to the host as soon as it arrives, in stream order
/// (the broker holds back more than `window` unacknowledged ones; the hook's local queue keeps
/// them in order and the handler's own concurrency and pipelining apply), and its retries when
/// they are due. An ordered hook is pulled only while this worker holds its lease.
async fn consume(
    sh: Arc<Shared>,
    stream: jetstream::stream::Stream,
    s: Settings,
    counters: Arc<Counters>,
    slot: Arc<Mutex<Option<jetstream::consumer::PullConsumer>>>,
    (mut stop, renamed): (watch::Receiver<bool>, watch::Receiver<String>),
) {
    let mut run: Option<Run> = None;
    let mut pause = Duration::from_millis(100);
    let mut lease: Option<super::lease::Lease> = None;
    let mut leases: Option<(async_nats::jetstream::kv::Store, Duration)> = None;
    'outer: while !*stop.borrow() {
        // The consumers first (the hook joins the fleet view with it, also on a standby worker).
        let consumers = async {
            let c = ensure_consumer(&sh, &stream, &s).await?;
            let r =
                super::retry::ensure_consumer(&stream, &sh.cfg, &s.key, sh.opts.ack_wait, s.since)
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
        if let Some(r) = run.as_mut().filter(|r| r.main.ack_all() != ack_all) {
            r.drain(None).await;
            run = None;
        }
        let r = run.get_or_insert_with(|| {
            Run::new(
                sh.clone(),
                s.clone(),
                counters.clone(),
                ack_all,
                renamed.clone(),
            )
        });
        if s.ordered() && lease.is_none() {
            match take_lease(&sh, &s, &mut leases, &mut stop).await {
                Some(l) => lease = Some(l),
                None => break 'outer,
            }
            // A previous holder may have left events pending: they come back as their ack
            // waits run out, in no useful order; nothing runs until all are here.
            r.catch_up = Some(CatchUp {
                last: (u64::MAX, 0),
                since: tokio::time::Instant::now(),
            });
            r.main.pause(true);
        }
        match r.session(&consumer, &retries, &mut lease, &mut stop).await {
            Ended::Stop => break 'outer,
            Ended::HandOver => {
                // Everything this worker holds settled before the lease goes (it still holds
                // it: no other worker pulls meanwhile).
                r.drain(None).await;
                r.forget_retries().await;
                r.main.forget();
                if !hand_over(&s, lease.take(), &leases, &mut stop).await {
                    break 'outer;
                }
            }
            Ended::Again => {}
        }
        if s.ordered() && lease.is_none() {
            // The lease was lost (another worker may hold it now): start nothing more, finish
            // what runs (the rest of a bundle partly started too), acknowledge it, and forget
            // what was handed back or left (it goes to whoever holds the lease next: that
            // worker waits for it, up to twice the ack wait) before standing by.
            r.drain(Some(tokio::time::Instant::now())).await;
            r.forget_retries().await;
            r.main.forget();
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
    if let Some(mut r) = run {
        // Stopping: what was delivered runs until shortly before the service's drain timeout;
        // what has not started then is left to the ack wait (another worker gets it).
        let stop_by = sh.stop_by.lock().ok().and_then(|by| *by);
        r.drain(stop_by.map(|t| t.checked_sub(STOP_MARGIN).unwrap_or(t)))
            .await;
        // Retries still waiting for their time: back to the broker for the next worker.
        r.waiting.abort_all();
        r.retry.give_back_all().await;
    }
    // Only now (every event this worker held is settled) may the next worker start.
    if let Some(l) = lease {
        l.release().await;
    }
}

/// How long before the drain timeout a stopping worker stops starting what it holds (what runs
/// then still has that long to finish and be acknowledged).
const STOP_MARGIN: Duration = Duration::from_millis(500);

/// An event only another version of the ordered hook matches: gives the lease up and stands
/// back for half its time, so that a worker with that version takes it (an ordered hook has one
/// puller). False when stopping meanwhile.
async fn hand_over(
    s: &Settings,
    lease: Option<super::lease::Lease>,
    leases: &Option<(async_nats::jetstream::kv::Store, Duration)>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    if let Some(l) = lease {
        l.release().await;
    }
    let back = leases
        .as_ref()
        .map_or(Duration::from_secs(1), |(_, t)| *t / 2);
    tracing::info!(hook = %s.name, "fleet: an event for another version of this ordered hook: lease handed over for {}", crate::time::fmt_duration(back));
    tokio::select! {
        _ = tokio::time::sleep(back) => true,
        _ = stop.changed() => false,
    }
}

/// Waits until this worker holds the ordered hook's lease; `None` when stopping first.
async fn take_lease(
    sh: &Shared,
    s: &Settings,
    leases: &mut Option<(async_nats::jetstream::kv::Store, Duration)>,
    stop: &mut watch::Receiver<bool>,
) -> Option<super::lease::Lease> {
    let mut logged = false;
    loop {
        let mut wait = Duration::from_millis(500);
        if leases.is_none() {
            match super::lease::bucket(&sh.cfg, &sh.js, sh.opts.ack_wait).await {
                Ok(b) => *leases = Some(b),
                Err(e) => tracing::warn!(hook = %s.name, "fleet: {e}; retrying"),
            }
        }
        if let Some((store, ttl)) = leases.as_ref() {
            wait = *ttl / 4;
            match super::lease::Lease::try_take(store, *ttl, &consumer_name(&s.key), &sh.opts.id)
                .await
            {
                Ok(Some(l)) => {
                    tracing::info!(hook = %s.name, "fleet: this worker pulls the ordered hook (lease taken)");
                    return Some(l);
                }
                Ok(None) => {
                    let key = consumer_name(&s.key);
                    if let Some(left) = super::lease::expires_in(store, *ttl, &key).await {
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
            _ = stop.changed() => return None,
        }
    }
}

/// Stopping: hands back at once what the broker already delivered but no handler started, so
/// that another worker gets it now rather than after the ack wait.
async fn give_back(messages: &mut jetstream::consumer::pull::Stream) {
    use futures_util::FutureExt;
    while let Some(Some(Ok(msg))) = messages.next().now_or_never() {
        let _ = msg.ack_with(AckKind::Nak(None)).await;
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One event of a delivered message, about to run.
struct Delivery {
    msg: Arc<jetstream::Message>,
    /// Deliveries of the event so far, this one included (a retry's count goes on).
    delivered: i64,
    /// The event's stream sequence (a retry's: the original's).
    seq: u64,
    /// This message's own stream sequence (where it is held).
    hseq: u64,
    /// The message's holding ([`Held::hold`]).
    slot: u64,
    /// Its place in the message (a bundle's events are 0, 1, ...; an event alone is 0).
    index: usize,
    key: DoneKey,
    env: Envelope,
    held: Arc<Held>,
}

impl Delivery {
    /// This event is finished (the message is once all its events are).
    async fn finish(&self, kind: AckKind) {
        self.held
            .finish(self.hseq, self.slot, &self.msg, kind)
            .await;
    }

    /// This event is settled for good here (handled, or handed on to the retry subject): finished,
    /// and known as done, so a delivery of its message again (a bundle handed back for another
    /// of its events, a broker that lost the acknowledgement) does not run it twice here.
    async fn settled(&self, counters: &Counters) {
        self.finish(AckKind::Ack).await;
        if let Ok(mut done) = counters.done.lock() {
            done.insert(self.key);
        }
    }

    /// Hands this event back: its whole message comes again (after `delay`).
    async fn give_back(&self, delay: Option<Duration>) {
        self.held
            .give_back(self.hseq, self.slot, &self.msg, delay)
            .await;
    }
}

/// What to do with a delivered message.
enum Triage {
    /// Finish it without running a handler (already counted).
    Settle(Arc<jetstream::Message>, u64, AckKind),
    /// Its events (held from here), each to run, or to settle on its own ([`Run::start`]).
    Events(Vec<Delivery>),
}

impl Run {
    /// The held messages of the consumer a delivery came from.
    fn held(&self, source: Source) -> &Arc<Held> {
        match source {
            Source::Main => &self.main,
            Source::Retry => &self.retry,
        }
    }

    fn triage(&self, msg: Arc<jetstream::Message>, source: Source) -> Triage {
        let (s, counters) = (&self.s, &self.counters);
        let (broker_delivered, hseq, replayed) = match msg.info() {
            Ok(i) => {
                let at = i.published.unix_timestamp_nanos();
                let replayed = source == Source::Main
                    && counters.high.replayed(i.delivered, i.stream_sequence, at);
                (i.delivered, i.stream_sequence, replayed)
            }
            Err(_) => (1, 0, false),
        };
        // Counted per event: the message's first here, the rest of a bundle's below.
        counters.messages.fetch_add(1, Ordering::Relaxed);
        counters.delivered.fetch_add(1, Ordering::Relaxed);
        if replayed {
            counters.duplicate.fetch_add(1, Ordering::Relaxed);
        }
        let (delivered, seq) = match source {
            // A retry on a consumer of every event: its hook's retry consumer runs it.
            Source::Main if super::retry::is_retry(&self.sh.cfg, &msg.subject) => {
                return Triage::Settle(msg, hseq, AckKind::Ack);
            }
            Source::Main => (broker_delivered, hseq),
            Source::Retry => match super::retry::Retry::read(&msg) {
                Some(r) => (r.delivered + broker_delivered, r.seq),
                None => (i64::MAX, hseq),
            },
        };
        let envs = match super::envelope::read(&msg.payload) {
            Ok(e) if delivered != i64::MAX => e,
            Ok(_) => {
                tracing::warn!(hook = %s.name, seq, "fleet: retry without its headers in the stream; dropping it");
                counters.skipped.fetch_add(1, Ordering::Relaxed);
                return Triage::Settle(msg, hseq, AckKind::Term);
            }
            Err(e) => {
                tracing::warn!(hook = %s.name, seq, "fleet: unreadable event in the stream ({e}); dropping it");
                counters.skipped.fetch_add(1, Ordering::Relaxed);
                return Triage::Settle(msg, hseq, AckKind::Term);
            }
        };
        let n = envs.len() as u64;
        counters.delivered.fetch_add(n - 1, Ordering::Relaxed);
        if replayed {
            counters.duplicate.fetch_add(n - 1, Ordering::Relaxed);
        }
        if broker_delivered > 1 {
            counters.redelivered.fetch_add(n, Ordering::Relaxed);
        }
        let held = self.held(source);
        // Held from here: progress signals while its events wait and run.
        let slot = held.hold(hseq, msg.clone(), envs.len());
        let (seq_key, id_key) = done_key(&msg, hseq);
        let events = envs
            .into_iter()
            .enumerate()
            .map(|(index, env)| Delivery {
                msg: msg.clone(),
                delivered,
                seq,
                hseq,
                slot,
                index,
                key: (seq_key, id_key.wrapping_add(index as u64)),
                env,
                held: held.clone(),
            })
            .collect();
        Triage::Events(events)
    }

    /// Takes one delivered message: its events go to the backlog (a retry's straight to the
    /// host), and as many as the window allows enter the hook's local queue now.
    async fn dispatch(&mut self, msg: Arc<jetstream::Message>, source: Source) {
        self.pulled = true;
        match self.triage(msg, source) {
            Triage::Settle(msg, hseq, kind) => {
                let held = self.held(source);
                let slot = held.hold(hseq, msg.clone(), 1);
                held.finish(hseq, slot, &msg, kind).await;
            }
            Triage::Events(events) if source == Source::Retry => {
                for d in events {
                    self.start(d).await;
                }
            }
            Triage::Events(events) => {
                self.insert(events);
                self.feed().await;
            }
        }
    }

    /// Puts a message's events in the backlog in stream order: a message handed back (or left
    /// by a previous holder) may come again after higher ones were delivered.
    fn insert(&mut self, events: Vec<Delivery>) {
        let Some(first) = events.first() else { return };
        let key = (first.hseq, first.index);
        let at = self.backlog.partition_point(|d| (d.hseq, d.index) <= key);
        for (i, d) in events.into_iter().enumerate() {
            self.backlog.insert(at + i, d);
        }
    }

    /// The hook was renamed (same identity): what starts from now on runs under the new name,
    /// once every call made under the old one is settled or back ([`Run::feed`]).
    fn renamed(&mut self) {
        let name = self.rename.borrow_and_update().clone();
        if name == self.s.name {
            return;
        }
        let mut s = (*self.s).clone();
        s.name = name;
        self.s = Arc::new(s);
        self.renaming = true;
    }

    /// Starts events from the backlog, in order, while fewer than the window are in flight
    /// (the hook's local queue holds what starts; the rest waits here, held).
    async fn feed(&mut self) {
        while let Ok(d) = self.redo_rx.try_recv() {
            self.insert(vec![d]);
        }
        if self.renaming {
            if !self.running.is_empty() || !self.background.is_empty() {
                return;
            }
            // Every call of the old name is settled or back: in stream order again.
            self.renaming = false;
            self.backlog
                .make_contiguous()
                .sort_by_key(|d| (d.hseq, d.index));
        }
        if self.catch_up.is_some() {
            return;
        }
        let window = self.s.window.max(1) as usize;
        while self.running.len() + self.background.len() < window {
            let Some(d) = self.backlog.pop_front() else {
                return;
            };
            self.start(d).await;
        }
    }

    /// Taking over ([`CatchUp`]): asks the broker how many events of the hook are pending; when
    /// this worker holds them all, sorts the backlog and starts it. Events nobody renews come
    /// back within an ack wait; a count that stays above what is held longer is a previous
    /// holder still running what it started (a long bundle): waited for, with a warning every
    /// four ack waits.
    async fn check_caught_up(&mut self, consumer: &jetstream::consumer::PullConsumer) {
        let Some(c) = self.catch_up.as_mut() else {
            return;
        };
        let Ok(info) = consumer.get_info().await else {
            return;
        };
        let now = (info.num_ack_pending as u64, self.main.count());
        if now.0 > now.1 as u64 {
            if c.last != now {
                c.last = now;
                c.since = tokio::time::Instant::now();
                tracing::debug!(hook = %self.s.name, pending = now.0, held = now.1, "fleet: waiting for the previous holder's events to come back");
                return;
            }
            if c.since.elapsed() >= self.sh.opts.ack_wait * 4 {
                c.since = tokio::time::Instant::now();
                tracing::warn!(hook = %self.s.name, pending = now.0, held = now.1, "fleet: still waiting for events another worker holds (a previous holder still running them?) before this one pulls the ordered hook");
            }
            return;
        }
        self.catch_up = None;
        self.backlog
            .make_contiguous()
            .sort_by_key(|d| (d.hseq, d.index));
        self.main.pause(false);
        tracing::debug!(hook = %self.s.name, held = now.1, "fleet: every pending event of the hook is here; running them in stream order");
        self.feed().await;
    }

    /// Leaves the backlog's messages none of whose events started to the ack wait (no more
    /// progress signals: the broker delivers them again after it, to whoever pulls then, in
    /// order; a `Nak` now would go to this session's pull request, still open at the broker,
    /// and cost a delivery). The events of a message partly started stay, for [`Run::drain`].
    async fn release_backlog(&mut self) {
        let mut untouched = false;
        let mut current = None;
        let mut left = 0;
        for d in std::mem::take(&mut self.backlog) {
            if current != Some((d.hseq, d.slot)) {
                current = Some((d.hseq, d.slot));
                untouched = d.index == 0;
                if untouched && d.held.leave(d.hseq, d.slot, false).await {
                    left += 1;
                }
            }
            if !untouched {
                self.backlog.push_back(d);
            }
        }
        if left > 0 {
            tracing::info!(hook = %self.s.name, messages = left, "fleet: delivered events not started here are left to the ack wait (another worker, or this one, gets them then)");
        }
    }

    /// Runs one event: settles it at once when it needs no handler (finished here before, for
    /// another hook, unreadable), dead-letters it past its last delivery, else puts it in the
    /// hook's local queue before this returns (so events enter it in stream order); the rest
    /// runs in `running`.
    async fn start(&mut self, d: Delivery) {
        let (s, counters) = (&self.s, &self.counters);
        if !d.held.current(d.hseq, d.slot) {
            // Its message was handed back (for another of its events) or delivered again
            // since: the new delivery brings it.
            return;
        }
        if d.hseq > 0
            && counters
                .done
                .lock()
                .map(|done| done.contains(&d.key))
                .unwrap_or(false)
        {
            // Finished here already; the broker lost the acknowledgement (it crashed): ack again.
            counters.already_done.fetch_add(1, Ordering::Relaxed);
            return d.finish(AckKind::Ack).await;
        }
        if d.env
            .hook
            .as_deref()
            .is_some_and(|h| h != s.name && h != s.key)
        {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return d.finish(AckKind::Ack).await;
        }
        let Some(ctx) = d.env.handler_context(d.delivered, d.seq) else {
            tracing::warn!(hook = %s.name, seq = d.seq, "fleet: event in the stream whose context is not a JSON object; dropping it");
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return d.finish(AckKind::Term).await;
        };
        let (sh, s, counters) = (self.sh.clone(), self.s.clone(), self.counters.clone());
        if d.delivered > s.max_deliver {
            // Its last allowed delivery went to a worker that stopped before finishing it.
            self.running.push(Box::pin(async move {
                let error = format!(
                    "the worker running the last allowed delivery ({} of {}) stopped before it finished (killed?)",
                    s.max_deliver, s.max_deliver
                );
                let delivered = d.delivered - 1;
                dead_letter(&sh, &s, &counters, d, delivered, error).await;
            }));
            return;
        }
        // The host enforces the hook's timeout per call; this bound only covers the wait in the
        // hook's local queue behind the others this worker holds.
        let wait = (s.timeout + Duration::from_secs(5)) * (s.window.max(1) + 1);
        // One future per event: the handler call, then what follows it.
        let redo = self.redo_tx.clone();
        let mut call: InFlight = Box::pin(async move {
            let outcome = sh.host.call_one(&d.env.event, ctx, wait, &s.name).await;
            if !matches!(&outcome, Ok(Some(o)) if o.result.is_ok()) && renamed_away(&sh, &s) {
                // Dropped by the old name's hook: the same delivery runs under the new name.
                if let Err(e) = redo.send(d).await {
                    let d = e.0;
                    return d.give_back(None).await;
                }
                return;
            }
            settle(&sh, &s, &counters, d, outcome).await;
        });
        // The first poll puts the event in the hook's queue (so events enter it in stream order).
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
        if first.is_pending() {
            self.running.push(call);
        }
    }
}

/// Whether the hook no longer runs under `s.name` but does under another name with the same
/// identity (renamed while the call waited).
fn renamed_away(sh: &Shared, s: &Settings) -> bool {
    let snap = sh.host.snapshot();
    snap.get(&s.name).is_none()
        && snap
            .hooks
            .iter()
            .any(|h| super::identity::of(&h.spec) == s.key)
}

type Outcome = Result<Option<crate::hook::CallOutcome>, crate::host::EmitError>;

/// After the handler: acknowledge, or [`settle_other`].
async fn settle(sh: &Shared, s: &Settings, counters: &Counters, d: Delivery, outcome: Outcome) {
    match outcome {
        Ok(Some(o)) if o.result.is_ok() => acknowledge(counters, d).await,
        // Boxed: the rare paths (publishing a retry or a dead letter) would make every event's
        // future several times larger.
        other => Box::pin(settle_other(sh, s, counters, d, other)).await,
    }
}

/// Acknowledges a delivery whose handler succeeded.
async fn acknowledge(counters: &Counters, d: Delivery) {
    d.settled(counters).await;
    counters.acked.fetch_add(1, Ordering::Relaxed);
}

/// After a handler failed, or did not run: retry later through the hook's retry subject (the
/// hook goes on with the next events meanwhile), or dead-letter, or hand the event back.
async fn settle_other(
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
                        && !super::retry::is_retry(&sh.cfg, subject)
                        && !s.own.iter().any(|f| super::subject_matches(f, subject));
                    if routed || sh.versions.other_matches(&s.key, &d.env.event) {
                        return for_another_version(sh, s, counters, d).await;
                    }
                    // Loaded, but none of its patterns matches this event.
                    d.settled(counters).await;
                    counters.skipped.fetch_add(1, Ordering::Relaxed);
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
        let retry = super::retry::due_in(delivered, seq, delay);
        match super::retry::publish(&sh.js, &sh.cfg, &s.key, &d.env, retry).await {
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

/// Another version of the hook matches the delivery, this one does not (a rolling update): it
/// goes to the hook's retry subject for a worker with that version (the original is finished,
/// so an ordered hook's cumulative acknowledgements go on), and an ordered hook's lease holder
/// hands the lease over so that such a worker pulls; on the last delivery it is dead-lettered,
/// never silently skipped.
async fn for_another_version(sh: &Shared, s: &Settings, counters: &Counters, d: Delivery) {
    if s.ordered() {
        counters.handover.notify_one();
    }
    let (delivered, seq) = (d.delivered, d.seq);
    if delivered >= s.max_deliver {
        let error =
            "no pattern of this worker's version of the hook matches the event (a rolling update?)"
                .to_string();
        return dead_letter(sh, s, counters, d, delivered, error).await;
    }
    counters.mismatched.fetch_add(1, Ordering::Relaxed);
    let later = Duration::from_millis(200);
    let retry = super::retry::due_in(delivered, seq, later);
    match super::retry::publish(&sh.js, &sh.cfg, &s.key, &d.env, retry).await {
        Ok(()) => d.settled(counters).await,
        Err(e) => {
            tracing::warn!(hook = %s.name, seq, "fleet: event for another version not republished ({e}); handing it back");
            d.give_back(Some(later)).await;
        }
    }
}

/// Publishes the event to the dead-letter subject, then finishes it.
async fn dead_letter(
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
    tracing::error!(hook = %s.name, seq, deliveries = delivered, "fleet: handler failed on the last delivery ({error}); event moved to the dead-letter subject");
    held.finish(hseq, slot, &msg, AckKind::Ack).await;
    counters.dead.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut d) = counters.done.lock() {
        d.insert(key);
    }
}

async fn publish_status(sh: &Shared, tasks: &HashMap<String, HookTask>, running: bool) {
    let mut hooks = Vec::new();
    let mut patterns = std::collections::BTreeMap::new();
    for (key, t) in tasks {
        let name = &t.settings.name;
        let Some(info) = sh.host.hook(name) else {
            continue;
        };
        patterns.insert(key.clone(), info.events.clone());
        let consumer = t.consumer.lock().ok().and_then(|g| g.clone());
        // A hook joins the fleet view once its consumer exists (events from then on reach it).
        let Some(consumer) = consumer else { continue };
        let lag = match tokio::time::timeout(Duration::from_secs(1), consumer.get_info()).await {
            Ok(Ok(i)) => Some(t.counters.events(i.num_pending + i.num_ack_pending as u64)),
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
        patterns,
        bundles: true,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_keeps_at_least_half_its_size_of_the_latest_keys() {
        let mut r = Recent::default();
        let n = RECENT as u64 * 2 + 17;
        for seq in 1..=n {
            r.insert((seq, seq.wrapping_mul(31)));
        }
        // The latest RECENT / 2 are always there; the oldest are gone.
        for seq in n - RECENT as u64 / 2 + 1..=n {
            assert!(r.contains(&(seq, seq.wrapping_mul(31))), "{seq} forgotten");
        }
        assert!(!r.contains(&(1, 31)));
        assert!(r.young.len() + r.old.len() <= RECENT);
        // The same sequence with another id (a broker that lost its store) is not done.
        assert!(!r.contains(&(n, 0)));
        // Inserting a known key again changes nothing.
        let before = r.young.len();
        r.insert((n, n.wrapping_mul(31)));
        assert_eq!(r.young.len(), before);
    }
}
