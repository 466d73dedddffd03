//! The worker ([`Worker`]): its start and stop, the hook tasks matched to the registry
//! snapshot, their settings, and the worker's status messages.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::fleet::status::{HookStatus, WorkerStatus};
use crate::fleet::versions::Versions;
use crate::fleet::{FleetConfig, FleetError};
use crate::host::Host;

use super::consumer::*;
use super::pull::*;
use super::state::*;

/// A running worker.
pub struct Worker {
    pub(super) stop: watch::Sender<bool>,
    pub(super) task: JoinHandle<()>,
    pub(super) shared: Arc<Shared>,
}

impl Worker {
    /// Connects (retrying in the background while the broker is down) and starts feeding the
    /// host's hooks from the stream.
    pub async fn start(
        host: Host,
        cfg: FleetConfig,
        opts: WorkerOptions,
    ) -> Result<Self, FleetError> {
        let lost = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let client = cfg
            .connect_watched(
                &format!("hermes-hooks worker {}", opts.id),
                false,
                Some(lost.clone()),
            )
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
            retire_until: Mutex::new(None),
            holds: Mutex::new(HashMap::new()),
            lost,
            said_ack_wait: Mutex::new(Default::default()),
        });
        tokio::spawn(crate::fleet::versions::follow(
            shared.client.clone(),
            shared.cfg.status_filter(),
            shared.opts.id.clone(),
            shared.versions.clone(),
        ));
        shared
            .host
            .set_change_hold(change_hold(Arc::downgrade(&shared)));
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
    /// acknowledged; what is left comes back to another worker after the ack wait). During a
    /// rolling update a version of a hook that only this worker runs first runs, for up to
    /// [`WorkerOptions::retire_drain`], what was in the stream when the stop began ([`retire`]).
    pub async fn stop(self, drain: Duration) {
        if let Ok(mut by) = self.shared.stop_by.lock() {
            *by = Some(tokio::time::Instant::now() + drain);
        }
        let _ = self.stop.send(true);
        let mut task = self.task;
        // Until the drain timeout, or the end of a retirement the stop began (it moves the
        // deadline), and a second more.
        let until = |sh: &Shared| {
            let by = sh.stop_by.lock().ok().and_then(|b| *b);
            let retire = sh.retire_until.lock().ok().and_then(|b| *b);
            by.max(retire).unwrap_or_else(tokio::time::Instant::now) + Duration::from_secs(1)
        };
        loop {
            let deadline = until(&self.shared);
            if tokio::time::timeout_at(deadline, &mut task).await.is_ok() {
                return;
            }
            if until(&self.shared) <= deadline {
                task.abort();
                return;
            }
        }
    }
}

pub(super) async fn run(sh: Arc<Shared>, mut stop: watch::Receiver<bool>) {
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
    let multi = crate::fleet::versions::multi_filter(&version);
    sh.multi.store(multi, Ordering::Relaxed);
    tracing::info!(worker = %sh.opts.id, stream = %sh.cfg.events_stream(), server = %version, "fleet worker connected{}", if multi { "" } else { " (nats-server < 2.10: one filter subject per consumer; a hook needing several reads every event)" });
    // What this worker and its peers ran before (a restart forgot it): read before anything runs.
    let mut log = VersionLog::open(&sh).await;
    let mut tasks: HashMap<String, HookTask> = HashMap::new();
    let mut seen: HashMap<String, std::time::SystemTime> = HashMap::new();
    let mut reconcile = tokio::time::interval(Duration::from_millis(200));
    let mut status = tokio::time::interval(sh.opts.status_interval);
    let mut generation = u64::MAX;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = reconcile.tick() => {
                drain_holds(&sh, &stream, &tasks).await;
                let snap = sh.host.snapshot();
                if snap.generation != generation {
                    generation = snap.generation;
                    apply(&sh, &stream, &snap, &mut tasks, &mut seen, started);
                    // Announced before any consumer changes: the other versions' workers then
                    // hand back what only this one matches.
                    publish_status(&sh, &tasks, None).await;
                }
            }
            _ = status.tick() => {
                // Other versions of the hooks come and go: filters follow.
                apply(&sh, &stream, &sh.host.snapshot(), &mut tasks, &mut seen, started);
                publish_status(&sh, &tasks, None).await;
                log.write(&sh);
                for (key, t) in &tasks {
                    super::consumer::say_ack_wait(&sh, key, &t.settings.name);
                }
            }
        }
    }
    // A version only this worker runs drains first (a rolling update), then every hook stops
    // pulling and the events in flight finish.
    retire(&sh, &stream, &tasks).await;
    for t in tasks.values() {
        let _ = t.stop.send(true);
        t.collect.abort();
    }
    for (_, t) in tasks.drain() {
        let _ = t.consume.await;
    }
    // Bounded: with the broker down neither completes.
    let bye = async {
        publish_status(&sh, &HashMap::new(), Some(&Default::default())).await;
        let _ = sh.client.flush().await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), bye).await;
}

/// Identity -> the patterns last written (or tried) and when.
type Written = HashMap<String, (Vec<String>, std::time::Instant)>;

/// This worker's records in the broker's log of versions ([`crate::fleet::version_log`]).
struct VersionLog {
    store: Option<async_nats::jetstream::kv::Store>,
    /// What was written, shared with the writer.
    written: Arc<Mutex<Written>>,
    /// The writer of the records due, off the control loop (a slow broker would hold up the
    /// drains and the status for seconds per hook); one at a time.
    writer: Option<tokio::task::JoinHandle<()>>,
}

impl VersionLog {
    /// Opens the bucket and seeds the worker's memory of the versions with what it holds.
    async fn open(sh: &Shared) -> Self {
        use crate::fleet::version_log;
        let store = match version_log::bucket(&sh.cfg, &sh.js).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(
                    "fleet: {e}; the versions this worker and the others ran before it started are unknown to it (an event only such a version matched may be skipped)"
                );
                None
            }
        };
        if let Some(s) = &store {
            match version_log::read_all(s, sh.opts.consumer_grace).await {
                Some(records) => sh.versions.seed(&sh.opts.id, &records),
                None => tracing::warn!(
                    "fleet: the bucket {} did not answer; the versions ran before this worker started are unknown to it",
                    sh.cfg.versions_bucket()
                ),
            }
        }
        Self {
            store,
            written: Default::default(),
            writer: None,
        }
    }

    /// Writes, in a task of its own, this worker's versions that changed or whose record is
    /// due again (none while the last such task still runs).
    fn write(&mut self, sh: &Shared) {
        use crate::fleet::version_log::REFRESH;
        let Some(store) = self.store.clone() else {
            return;
        };
        if self.writer.as_ref().is_some_and(|w| !w.is_finished()) {
            return;
        }
        let due: Vec<(String, Vec<String>)> = {
            let Ok(written) = self.written.lock() else {
                return;
            };
            sh.versions
                .own_versions()
                .into_iter()
                .filter(|(key, patterns)| {
                    written
                        .get(key)
                        .is_none_or(|(p, at)| p != patterns || at.elapsed() >= REFRESH)
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let (written, me) = (self.written.clone(), sh.opts.id.clone());
        self.writer = Some(tokio::spawn(async move {
            for (key, patterns) in due {
                let ok = crate::fleet::version_log::write(&store, &key, &me, &patterns).await;
                // A failed write is tried again a little later, not at every tick.
                let now = std::time::Instant::now();
                let at = if ok {
                    now
                } else {
                    now.checked_sub(REFRESH - Duration::from_secs(5))
                        .unwrap_or(now)
                };
                if let Ok(mut w) = written.lock() {
                    w.insert(key, (patterns, at));
                }
            }
        }));
    }
}

/// When a hook appeared, as the start of a consumer created for it: its HOOK.yaml's time when
/// written while this worker runs, else the worker's start.
pub(super) fn appeared(
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
pub(super) fn apply(
    sh: &Arc<Shared>,
    stream: &jetstream::stream::Stream,
    snap: &crate::registry::Registry,
    tasks: &mut HashMap<String, HookTask>,
    seen: &mut HashMap<String, std::time::SystemTime>,
    started: std::time::SystemTime,
) {
    // This worker's versions first: one it no longer runs is retired (settings keep it in the
    // consumer's filter for a while).
    let own = snap
        .hooks
        .iter()
        // The first of two with one identity is the one fed (below).
        .rev()
        .map(|h| {
            let key = crate::fleet::identity::of(&h.spec);
            (key, h.spec.patterns.patterns().to_vec())
        })
        .collect();
    sh.versions.set_own(&sh.opts.id, own);
    let mut wanted: HashMap<String, Settings> = HashMap::new();
    for h in &snap.hooks {
        let key = crate::fleet::identity::of(&h.spec);
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
            t.collect = tokio::spawn(crate::fleet::collect::serve(
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
        let retiring = Arc::new(std::sync::atomic::AtomicU64::new(0));
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
            (stop_rx, renamed, retiring.clone()),
        ));
        let collect = tokio::spawn(crate::fleet::collect::serve(
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
                retiring,
            },
        );
    }
}

/// Whether `new` differs from `old` by the hook's name alone (a rename keeping its `id:`).
pub(super) fn only_renamed(old: &Settings, new: &Settings) -> bool {
    old.name != new.name
        && *old
            == Settings {
                name: old.name.clone(),
                ..new.clone()
            }
}

/// What a hook's consumer task is configured from.
pub(super) fn settings(
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
    // Events a retired version matched, published before it went and not read yet, are still
    // delivered: dead-lettered with a reason, not passed over unseen.
    versions.extend(sh.versions.recently_retired(&key, sh.opts.consumer_grace));
    let multi = sh.multi.load(Ordering::Relaxed);
    Settings {
        name: spec.name.clone(),
        timeout: m.timeout,
        max_deliver: m.retries as i64 + 1,
        concurrency,
        window,
        since,
        filters: crate::fleet::versions::filters(&sh.cfg, &versions, multi),
        own: crate::fleet::versions::filters(&sh.cfg, &[mine], true),
        key,
    }
}

/// Publishes this worker's status: running with every hook task (`retiring` `None`), running
/// with only the versions it retires as it stops (`retiring`: identity -> the highest stream
/// sequence each still runs; empty: the last status, not running).
pub(super) async fn publish_status(
    sh: &Shared,
    tasks: &HashMap<String, HookTask>,
    retiring: Option<&std::collections::BTreeMap<String, u64>>,
) {
    let running = retiring.is_none_or(|r| !r.is_empty());
    // Loaded: the first load is done and every hook loaded has its task (read in this order,
    // so the snapshot is the loaded one).
    let ready = sh.host.is_ready();
    let loaded = ready
        && sh
            .host
            .snapshot()
            .hooks
            .iter()
            .all(|h| tasks.contains_key(&crate::fleet::identity::of(&h.spec)));
    let mut hooks = Vec::new();
    let mut patterns = std::collections::BTreeMap::new();
    for (key, t) in tasks {
        if retiring.is_some_and(|r| !r.contains_key(key)) {
            continue;
        }
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
        host: crate::fleet::host_name(),
        pid: std::process::id(),
        interval_ms: sh.opts.status_interval.as_millis() as u64,
        time: crate::time::now(),
        running,
        hooks,
        patterns,
        bundles: true,
        ack_wait_ms: sh.opts.ack_wait.as_millis() as u64,
        loaded,
        retiring: match retiring {
            Some(r) => r.clone(),
            // Changes held while their old version drains.
            None => sh
                .holds
                .lock()
                .map(|h| {
                    h.iter()
                        .filter_map(|(key, hold)| match hold {
                            Hold::Draining { bound, .. } => Some((key.clone(), *bound)),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        },
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

/// Stopping during a rolling update (issue 48): each hook whose version no other live worker
/// runs while another version of it is live (events only it matches would be dead-lettered)
/// keeps running until everything that was in the stream when the stop began is settled, by
/// this version or another, or for at most [`WorkerOptions::retire_drain`]; meanwhile this
/// worker's status names those versions and that bound, so other versions hand them only those
/// events and what enters the stream later is theirs alone. Every other hook stops at once.
/// What only a retired version matched and did not run by the deadline is dead-lettered by the
/// other versions, never skipped.
async fn retire(
    sh: &Arc<Shared>,
    stream: &jetstream::stream::Stream,
    tasks: &HashMap<String, HookTask>,
) {
    let most = sh.opts.retire_drain;
    let mut keys: Vec<&String> = if most.is_zero() {
        Vec::new()
    } else {
        tasks
            .iter()
            .filter(|(key, t)| {
                sh.host
                    .hook(&t.settings.name)
                    .is_some_and(|i| sh.versions.sole_version(key, &i.events))
            })
            .map(|(key, _)| key)
            .collect()
    };
    let stop_now = |t: &HookTask| {
        let _ = t.stop.send(true);
        t.collect.abort();
    };
    for (key, t) in tasks {
        if !keys.contains(&key) {
            stop_now(t);
        }
    }
    if keys.is_empty() {
        return;
    }
    let last = async { stream.clone().info().await.map(|i| i.state.last_sequence) };
    let bound = match tokio::time::timeout(Duration::from_secs(2), last).await {
        Ok(Ok(b)) if b > 0 => b,
        _ => return,
    };
    let began = tokio::time::Instant::now();
    // The stop's own drain, given again to each hook when its retirement ends.
    let drain = sh
        .stop_by
        .lock()
        .ok()
        .and_then(|by| *by)
        .map_or(Duration::ZERO, |by| by.saturating_duration_since(began));
    if let Ok(mut until) = sh.retire_until.lock() {
        *until = Some(began + most + drain);
    }
    let mut retiring = std::collections::BTreeMap::new();
    for key in &keys {
        tasks[*key].retiring.store(bound, Ordering::Relaxed);
        retiring.insert((*key).clone(), bound);
    }
    tracing::info!(hooks = ?keys, "fleet: stopping during a rolling update: no other live worker runs this worker's version of these hooks; it runs what the stream held (up to sequence {bound}) and only it matches, for up to {}, before it stops", crate::time::fmt_duration(most));
    publish_status(sh, tasks, Some(&retiring)).await;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut status = tokio::time::interval(sh.opts.status_interval);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = status.tick() => {
                publish_status(sh, tasks, Some(&retiring)).await;
                continue;
            }
        }
        let mut done = Vec::new();
        for key in &keys {
            let t = &tasks[*key];
            if t.consume.is_finished() || drained(t, bound).await {
                tracing::info!(hook = %t.settings.name, "fleet: what the retired version had to run is settled ({}); it stops", crate::time::fmt_duration(began.elapsed()));
                done.push(*key);
            }
        }
        let left: Vec<&str> = keys
            .iter()
            .filter(|k| !done.contains(k))
            .map(|k| tasks[*k].settings.name.as_str())
            .collect();
        if began.elapsed() >= most && !left.is_empty() {
            let names = left;
            tracing::warn!(hooks = ?names, "fleet: the retired versions did not settle what the stream held when the stop began within --retire-drain ({}): what only they match and did not run is dead-lettered by the other versions", crate::time::fmt_duration(most));
            done = keys.clone();
        }
        if done.is_empty() {
            continue;
        }
        for key in done {
            if let Ok(mut by) = sh.stop_by.lock() {
                *by = Some(tokio::time::Instant::now() + drain);
            }
            stop_now(&tasks[key]);
            keys.retain(|k| *k != key);
            retiring.remove(key);
        }
        if keys.is_empty() {
            return;
        }
        publish_status(sh, tasks, Some(&retiring)).await;
    }
}

/// Whether a retiring hook's consumer settled everything up to stream sequence `bound`: its
/// acknowledgement floor passed it, or nothing is pending or waiting for an acknowledgement.
async fn drained(t: &HookTask, bound: u64) -> bool {
    let consumer = t.consumer.lock().ok().and_then(|g| g.clone());
    let Some(consumer) = consumer else {
        return false;
    };
    match tokio::time::timeout(Duration::from_secs(1), consumer.get_info()).await {
        Ok(Ok(i)) => {
            i.ack_floor.stream_sequence >= bound || (i.num_pending == 0 && i.num_ack_pending == 0)
        }
        _ => false,
    }
}

/// A hook's consumer's acknowledgement floor (a stream sequence), when the broker answers.
async fn ack_floor(t: &HookTask) -> Option<u64> {
    let consumer = t.consumer.lock().ok().and_then(|g| g.clone())?;
    match tokio::time::timeout(Duration::from_secs(1), consumer.get_info()).await {
        Ok(Ok(i)) => Some(i.ack_floor.stream_sequence),
        _ => None,
    }
}

/// The host's change hold of a worker ([`Host::set_change_hold`]): a hook changed on disk keeps
/// its running version while that version is the last live one to match some of its patterns
/// (the change drops them and no other live version has them: a rolling update by reload), so
/// that it first runs what only it matches among the events already in the stream
/// ([`drain_holds`]); then the change goes through.
fn change_hold(sh: std::sync::Weak<Shared>) -> crate::host::ChangeHold {
    Arc::new(move |running, found| {
        let Some(sh) = sh.upgrade() else {
            return false;
        };
        let key = crate::fleet::identity::of(running);
        if sh.opts.retire_drain.is_zero() || crate::fleet::identity::of(found) != key {
            return false;
        }
        let Ok(mut holds) = sh.holds.lock() else {
            return false;
        };
        if running.fingerprint == found.fingerprint {
            // Unchanged, or a held change reverted: a hold still draining ends.
            match holds.get(&key) {
                Some(Hold::Released) => {
                    holds.remove(&key);
                }
                Some(Hold::Pending(_) | Hold::Draining { .. }) => {
                    tracing::info!(hook = %running.name, "fleet: the held change of this hook was reverted; its version stays and its drain ends");
                    holds.insert(key, Hold::Cancelled);
                }
                _ => {}
            }
            return false;
        }
        match holds.get(&key) {
            Some(Hold::Released) => {
                holds.remove(&key);
                return false;
            }
            Some(Hold::Cancelled) => {
                // Reverted, then changed again before the worker's next look: weighed afresh.
                sh.versions.not_retiring_own(&key);
                holds.remove(&key);
            }
            Some(_) => return true,
            None => {}
        }
        let (old, new) = (running.patterns.patterns(), found.patterns.patterns());
        let others = sh.versions.others(&key);
        let dropped = old
            .iter()
            .any(|p| !new.contains(p) && !others.iter().any(|o| o.contains(p)));
        if dropped {
            tracing::info!(hook = %running.name, "fleet: the change of this hook drops patterns no other live version has: its running version first runs what only it matches in the stream (up to --retire-drain, {}), then the change loads", crate::time::fmt_duration(sh.opts.retire_drain));
            sh.versions.holding_own(&key, new);
            holds.insert(key, Hold::Pending(next_hold()));
        }
        dropped
    })
}

/// The changes held back ([`change_hold`]): each starts its drain (the stream's last sequence
/// as its bound, announced in the status), and once what the stream held then is settled, or
/// after `--retire-drain`, is released and the hooks reloaded.
async fn drain_holds(
    sh: &Arc<Shared>,
    stream: &jetstream::stream::Stream,
    tasks: &HashMap<String, HookTask>,
) {
    let holds: Vec<(String, Hold)> = match sh.holds.lock() {
        Ok(h) => h.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        Err(_) => return,
    };
    let mut released = false;
    for (key, hold) in holds {
        let next = match (hold, tasks.get(&key)) {
            (Hold::Released, _) => continue,
            (Hold::Cancelled, t) | (Hold::Pending(_) | Hold::Draining { .. }, t @ None) => {
                // Reverted, or the hook is gone: no change to load; the bound is taken back.
                if let Some(t) = t {
                    t.retiring.store(0, Ordering::Relaxed);
                }
                sh.versions.not_retiring_own(&key);
                if let Ok(mut h) = sh.holds.lock()
                    && h.get(&key) == Some(&hold)
                {
                    h.remove(&key);
                }
                publish_status(sh, tasks, None).await;
                continue;
            }
            (Hold::Pending(_), Some(t)) => {
                let last = async { stream.clone().info().await.map(|i| i.state.last_sequence) };
                let Ok(Ok(bound)) = tokio::time::timeout(Duration::from_secs(2), last).await else {
                    continue;
                };
                t.retiring.store(bound.max(1), Ordering::Relaxed);
                sh.versions.retiring_own(&key);
                tracing::info!(hook = %t.settings.name, bound, "fleet: the held change's drain begins: the running version runs what only it matches up to this stream sequence");
                Hold::Draining {
                    bound: bound.max(1),
                    from: ack_floor(t).await.unwrap_or(0),
                    began: tokio::time::Instant::now(),
                }
            }
            (Hold::Draining { bound, from, began }, Some(t)) => {
                if began.elapsed() >= sh.opts.retire_drain {
                    // How far it got: with the events of two versions interleaved, each change
                    // of version in the stream is a hand-over of the lease (about 1.3 s).
                    let floor = ack_floor(t).await.map_or("?".into(), |f| f.to_string());
                    tracing::warn!(hook = %t.settings.name, "fleet: the old version did not settle what the stream held when the change was made within --retire-drain ({}; settled up to sequence {floor} of {bound}, from {from}): the change loads; what only the old version matched and did not run is dead-lettered", crate::time::fmt_duration(sh.opts.retire_drain));
                } else if drained(t, bound).await {
                    tracing::info!(hook = %t.settings.name, "fleet: what the old version had to run is settled ({}, sequences {from} to {bound}); the change loads", crate::time::fmt_duration(began.elapsed()));
                } else {
                    continue;
                }
                t.retiring.store(0, Ordering::Relaxed);
                Hold::Released
            }
        };
        // Written only over the state it was computed from: a revert (or a new edit) handled
        // during the awaits above stays, and is acted on in the next round (a revert written
        // over with `Draining` drained and loaded a change that was no longer there).
        let stored = match sh.holds.lock() {
            Ok(mut h) if h.get(&key) == Some(&hold) => {
                h.insert(key, next);
                true
            }
            _ => false,
        };
        if !stored {
            continue;
        }
        released |= next == Hold::Released;
        let announce = matches!(next, Hold::Draining { .. });
        if announce {
            publish_status(sh, tasks, None).await;
        }
    }
    if released {
        let host = sh.host.clone();
        tokio::spawn(async move {
            host.reload().await;
        });
    }
}
