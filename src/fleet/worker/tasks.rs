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
        tokio::spawn(crate::fleet::versions::follow(
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

pub(super) async fn publish_status(sh: &Shared, tasks: &HashMap<String, HookTask>, running: bool) {
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
        host: crate::fleet::host_name(),
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
