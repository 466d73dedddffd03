//! The host: owns the registry snapshot, loads and reloads hooks, and is the API that the
//! service, the CLI, the HTTP server and the tests drive (`emit`, `emit_collect`, `reload`,
//! `shutdown`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::Serialize;
use serde_json::{Map, Value, json};
use thiserror::Error;
use tokio::sync::oneshot;

use crate::discovery::{HookSpec, SkipCode, Skipped, discover_with};
use crate::dispatch::{CallOutcome, HookStats, Job, LoadedHook, Tally};
use crate::events::{EventNameError, validate_event_name};
use crate::handler::{self, HandlerContext};
use crate::registry::Registry;

/// Settings of a host.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Hook roots, earlier ones win name clashes.
    pub roots: Vec<PathBuf>,
    /// `HERMES_HOME`, passed to handlers.
    pub hermes_home: PathBuf,
    /// Default Python interpreter for handler.py.
    pub python: String,
    /// Where the Python runner is written.
    pub runtime_dir: PathBuf,
    /// `--trust` and `--insecure-permissions`.
    pub trust: crate::trust::TrustPolicy,
    /// Load only the hooks that run inside the gateway (`runs: gateway`): a fleet edge, whose
    /// other hooks run on the fleet's workers.
    pub gateway_hooks_only: bool,
}

impl HostConfig {
    /// Settings from the environment: `HERMES_HOME` (default `~/.hermes`); `roots` or, when empty,
    /// `$HERMES_HOME/hooks`; the default interpreter of [`crate::interpreter::default_python`].
    pub fn from_env(roots: Vec<PathBuf>) -> Self {
        let hermes_home = hermes_home();
        let roots = if roots.is_empty() {
            vec![hermes_home.join("hooks")]
        } else {
            roots
        };
        // Absolute paths: handlers run with the hook directory as working directory.
        let roots = roots
            .into_iter()
            .map(|r| std::path::absolute(&r).unwrap_or(r))
            .collect();
        let hermes_home = std::path::absolute(&hermes_home).unwrap_or(hermes_home);
        let python = crate::interpreter::default_python(&hermes_home);
        let runtime_dir = hermes_home.join("cache").join("hermes-hooks");
        Self {
            roots,
            hermes_home,
            python,
            runtime_dir,
            trust: crate::trust::TrustPolicy::default(),
            gateway_hooks_only: false,
        }
    }
}

pub use crate::layout::hermes_home;

/// Why an event was refused.
#[derive(Debug, Error)]
pub enum EmitError {
    /// The event name is invalid.
    #[error(transparent)]
    InvalidEvent(#[from] EventNameError),
    /// The context is not a JSON object.
    #[error("context must be a JSON object, got {0}")]
    ContextNotObject(&'static str),
    /// The host is shutting down.
    #[error("the host is shutting down and accepts no new events")]
    ShuttingDown,
}

pub use crate::sink::HookOutcome;
use crate::sink::{EventSink, SinkError};

impl From<SinkError> for EmitError {
    fn from(e: SinkError) -> Self {
        match e {
            SinkError::ShuttingDown => EmitError::ShuttingDown,
        }
    }
}

/// Outcome of a load or reload.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadReport {
    /// Names of loaded hooks, in discovery order.
    pub loaded: Vec<String>,
    /// Hooks started by this load (new or changed).
    pub started: Vec<String>,
    /// Hooks stopped by this load (removed, or disabled).
    pub stopped: Vec<String>,
    /// Directories that did not load.
    pub skipped: Vec<Skipped>,
    /// Registry generation after the load.
    pub generation: u64,
}

impl LoadReport {
    /// True when any directory has a problem (deliberately disabled hooks are not problems).
    pub fn has_problems(&self) -> bool {
        self.skipped.iter().any(Skipped::is_problem)
    }
}

/// What a shutdown left behind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ShutdownReport {
    /// Events still queued or running when the drain deadline passed, per hook (every version,
    /// removed and superseded ones included).
    pub undelivered: Vec<(String, usize)>,
    /// Time the drain took.
    pub drain_ms: u64,
    /// Where every event offered to each hook name went, over the host's whole life (every
    /// version, removed ones included).
    pub by_hook: std::collections::BTreeMap<String, Tally>,
    /// The sum of `by_hook`.
    pub total: Tally,
}

/// A hook as shown by `/v1/hooks` and `list`.
#[derive(Debug, Clone, Serialize)]
pub struct HookInfo {
    /// Hook name.
    pub name: String,
    /// `description:`.
    pub description: String,
    /// `events:` patterns.
    pub events: Vec<String>,
    /// Handler kind.
    pub kind: &'static str,
    /// Hook directory.
    pub path: PathBuf,
    /// Handler file or URL.
    pub handler: String,
    /// Root the hook came from.
    pub root: PathBuf,
    /// Worker state.
    pub status: &'static str,
    /// Timeout per invocation, seconds.
    pub timeout_s: f64,
    /// Queue state.
    pub queue: QueueInfo,
    /// Counters.
    pub counters: Counters,
    /// Last error, if any.
    pub last_error: Option<LastError>,
    /// Warnings from HOOK.yaml.
    pub warnings: Vec<String>,
    /// Webhooks only: false when deliveries go out UNSIGNED (`secret_env` unset or absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed: Option<bool>,
    /// Where it runs (`runs`, `why`), its interpreter, the handler's SHA-256.
    #[serde(flatten)]
    pub placement: crate::ingateway::HookPlacement,
    /// Python only: how the worker process was started (`forked` from the fork server, or
    /// `fresh`) and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerStart>,
    /// Calls in flight at once (`concurrency:`; locally for executable and webhook hooks, across
    /// the fleet for every kind in fleet mode).
    pub concurrency: usize,
}

/// How a hook's worker process was started, as shown by `/v1/hooks`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStart {
    /// `forked` or `fresh`.
    pub start: String,
    /// Why.
    pub reason: String,
}

/// Queue part of [`HookInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct QueueInfo {
    /// Events waiting.
    pub depth: usize,
    /// Bound.
    pub capacity: usize,
    /// Policy.
    pub overflow: &'static str,
}

/// Counter part of [`HookInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct Counters {
    /// Events accepted.
    pub queued: u64,
    /// Successful invocations.
    pub ok: u64,
    /// Failed invocations.
    pub failed: u64,
    /// Timed-out invocations.
    pub timeouts: u64,
    /// Dropped by the overflow policy.
    pub dropped: u64,
    /// Worker restarts.
    pub restarts: u64,
    /// Events offered and not refused for a stopping hook (`queued` plus `drop_newest` drops).
    pub accepted: u64,
    /// Events still queued or running when the host stopped.
    pub undelivered: u64,
}

/// Last error part of [`HookInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct LastError {
    /// RFC 3339 time.
    pub time: String,
    /// Message.
    pub message: String,
}

impl HookInfo {
    fn of(h: &LoadedHook, config: &HostConfig) -> Self {
        let s = &h.stats;
        let spec = &h.spec;
        Self {
            name: spec.name.clone(),
            description: spec.manifest.description.clone(),
            events: spec.manifest.events.clone(),
            kind: spec.kind.as_str(),
            path: spec.dir.clone(),
            handler: match (&spec.handler_path, &spec.manifest.url) {
                (Some(p), _) => p.display().to_string(),
                // Path and query may carry a token: scheme, host and port only.
                (None, Some(u)) => crate::text::redact_url(u),
                _ => String::new(),
            },
            root: spec.root.clone(),
            status: if spec.placement.in_gateway() {
                "in_gateway"
            } else {
                h.status().as_str()
            },
            timeout_s: spec.manifest.timeout.as_secs_f64(),
            queue: QueueInfo {
                depth: h.queue.len(),
                capacity: h.queue.capacity(),
                overflow: h.queue.overflow().as_str(),
            },
            counters: Counters {
                queued: s.queued.load(Ordering::Relaxed),
                ok: s.ok.load(Ordering::Relaxed),
                failed: s.failed.load(Ordering::Relaxed),
                timeouts: s.timeouts.load(Ordering::Relaxed),
                dropped: s.dropped.load(Ordering::Relaxed),
                restarts: s.restarts.load(Ordering::Relaxed),
                accepted: s.accepted.load(Ordering::Relaxed),
                undelivered: s.undelivered.load(Ordering::Relaxed),
            },
            last_error: s.last_error().map(|(t, m)| LastError {
                time: crate::time::rfc3339(t),
                message: m,
            }),
            warnings: spec.manifest.warnings.clone(),
            signed: (spec.kind == crate::discovery::HandlerKind::Webhook)
                .then(|| crate::handler::webhook::is_signed(&spec.manifest)),
            placement: crate::ingateway::HookPlacement::of(
                spec,
                &config.python,
                &config.hermes_home,
            ),
            worker: h
                .signals()
                .start()
                .map(|(start, reason)| WorkerStart { start, reason }),
            concurrency: spec.manifest.concurrency,
        }
    }
}

struct Inner {
    config: HostConfig,
    registry: ArcSwap<Registry>,
    /// Serialises reloads; emit never takes it.
    reload_lock: tokio::sync::Mutex<()>,
    /// Set by shutdown: new events are refused.
    draining: AtomicBool,
    /// Set after the first load.
    ready: AtomicBool,
    /// Events accepted by emit/emit_collect.
    events_received: AtomicU64,
    /// Completed reloads (not counting the first load).
    reloads: AtomicU64,
    /// The JSON event stream (`serve --output json`); off by default.
    notices: crate::notices::Notices,
    /// Where accepted events go instead of the local queues (fleet edge); unset = local mode.
    sink: std::sync::OnceLock<Arc<dyn EventSink>>,
    /// Versions taken out of the registry (removed or superseded) whose worker may still run:
    /// shutdown waits for them too. Finished ones are pruned at each reload.
    retired: std::sync::Mutex<Vec<Arc<LoadedHook>>>,
    /// The accounts of every hook name: see [`Ledger`].
    ledger: std::sync::Mutex<Ledger>,
}

/// The counters of every hook the host ever loaded, by name: live counter sets, and the sums of
/// those no version uses any more (a removed hook), so the accounts survive removal.
#[derive(Default)]
struct Ledger {
    live: Vec<(String, Arc<HookStats>)>,
    folded: std::collections::BTreeMap<String, Tally>,
}

impl Ledger {
    /// Folds the counter sets no hook version holds any more.
    fn fold(&mut self) {
        let folded = &mut self.folded;
        self.live.retain(|(name, stats)| {
            if Arc::strong_count(stats) > 1 {
                return true;
            }
            folded.entry(name.clone()).or_default().add(stats.tally());
            false
        });
    }

    /// Accounts by name.
    fn by_name(&self) -> std::collections::BTreeMap<String, Tally> {
        let mut out = self.folded.clone();
        for (name, stats) in &self.live {
            out.entry(name.clone()).or_default().add(stats.tally());
        }
        out
    }
}

/// The hook host. Cheap to clone; all clones share one registry.
#[derive(Clone)]
pub struct Host {
    inner: Arc<Inner>,
}

/// Normalises a context: `null` becomes `{}`, anything but an object is refused.
pub fn normalize_context(context: Value) -> Result<Value, EmitError> {
    match context {
        Value::Null => Ok(Value::Object(Map::new())),
        Value::Object(_) => Ok(context),
        Value::Array(_) => Err(EmitError::ContextNotObject("a list")),
        Value::String(_) => Err(EmitError::ContextNotObject("a string")),
        Value::Number(_) => Err(EmitError::ContextNotObject("a number")),
        Value::Bool(_) => Err(EmitError::ContextNotObject("a boolean")),
    }
}

impl Host {
    /// A host with no hooks loaded yet; call [`Host::reload`] to load.
    pub fn new(config: HostConfig) -> Self {
        Self::with_notices(config, crate::notices::Notices::default())
    }

    /// [`Host::new`], reporting loads, reloads and handler failures to `notices`.
    pub fn with_notices(config: HostConfig, notices: crate::notices::Notices) -> Self {
        let registry = Registry::new(Vec::new(), Vec::new(), config.roots.clone(), 0);
        Self {
            inner: Arc::new(Inner {
                config,
                registry: ArcSwap::from_pointee(registry),
                reload_lock: tokio::sync::Mutex::new(()),
                draining: AtomicBool::new(false),
                ready: AtomicBool::new(false),
                events_received: AtomicU64::new(0),
                reloads: AtomicU64::new(0),
                notices,
                sink: std::sync::OnceLock::new(),
                retired: std::sync::Mutex::new(Vec::new()),
                ledger: std::sync::Mutex::new(Ledger::default()),
            }),
        }
    }

    /// Creates a host and loads its hooks.
    pub async fn start(config: HostConfig) -> (Self, LoadReport) {
        let host = Self::new(config);
        let report = host.reload().await;
        (host, report)
    }

    /// Where loads, reloads, handler failures and the service's start and stop are reported.
    pub fn notices(&self) -> &crate::notices::Notices {
        &self.inner.notices
    }

    /// The settings.
    pub fn config(&self) -> &HostConfig {
        &self.inner.config
    }

    /// True once the first load has finished.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Relaxed)
    }

    /// True once shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Relaxed)
    }

    /// Events accepted so far.
    pub fn events_received(&self) -> u64 {
        self.inner.events_received.load(Ordering::Relaxed)
    }

    /// Reloads done so far.
    pub fn reloads(&self) -> u64 {
        self.inner.reloads.load(Ordering::Relaxed)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Registry> {
        self.inner.registry.load_full()
    }

    /// Loaded hooks, for display.
    pub fn hooks(&self) -> Vec<HookInfo> {
        self.snapshot()
            .hooks
            .iter()
            .map(|h| HookInfo::of(h, &self.inner.config))
            .collect()
    }

    /// One loaded hook, for display.
    pub fn hook(&self, name: &str) -> Option<HookInfo> {
        self.snapshot()
            .get(name)
            .map(|h| HookInfo::of(h, &self.inner.config))
    }

    /// Directories that did not load at the last (re)load.
    pub fn skipped(&self) -> Vec<Skipped> {
        self.snapshot().skipped.clone()
    }

    /// Queues `event` to every matching hook and returns how many. Never waits for a handler.
    pub fn emit(&self, event: &str, context: Value) -> Result<usize, EmitError> {
        validate_event_name(event)?;
        let context = normalize_context(context)?;
        if self.is_draining() {
            return Err(EmitError::ShuttingDown);
        }
        self.inner.events_received.fetch_add(1, Ordering::Relaxed);
        let reg = self.inner.registry.load();
        let matching = reg.match_indices(event);
        if matching.is_empty() {
            return Ok(0);
        }
        let event: Arc<str> = Arc::from(event);
        let context = Arc::new(context);
        let mut queued = 0;
        for hook in matching.iter().map(|&i| &reg.hooks[i]) {
            let job = Job {
                event: event.clone(),
                context: context.clone(),
                reply: None,
            };
            if hook.enqueue(job) {
                queued += 1;
            }
        }
        Ok(queued)
    }

    /// Validates every event of a batch first (one bad event refuses the whole batch, so nothing
    /// is half-delivered) and counts them as received.
    fn accept_checked(
        &self,
        events: Vec<(String, Value)>,
    ) -> Result<Vec<(String, Value)>, (usize, EmitError)> {
        let mut checked = Vec::with_capacity(events.len());
        for (i, (event, context)) in events.into_iter().enumerate() {
            validate_event_name(&event).map_err(|e| (i, e.into()))?;
            checked.push((event, normalize_context(context).map_err(|e| (i, e))?));
        }
        if self.is_draining() {
            return Err((0, EmitError::ShuttingDown));
        }
        self.inner
            .events_received
            .fetch_add(checked.len() as u64, Ordering::Relaxed);
        Ok(checked)
    }

    /// Queues many events at once (the batch endpoint): every event is validated first, so a bad
    /// one refuses the whole batch (its index is returned with the error) and nothing is
    /// half-delivered; then each hook's share is pushed under one lock. Returns, per event, the
    /// number of hooks it was queued to.
    pub fn emit_batch(
        &self,
        events: Vec<(String, Value)>,
    ) -> Result<Vec<usize>, (usize, EmitError)> {
        let checked = self.accept_checked(events)?;
        let reg = self.inner.registry.load();
        let mut per_hook: Vec<Vec<(usize, Job)>> =
            (0..reg.hooks.len()).map(|_| Vec::new()).collect();
        let mut counts = Vec::with_capacity(checked.len());
        // Batches repeat event names: reuse the last name's match list and shared string.
        let mut last: Option<(Arc<str>, Arc<[usize]>)> = None;
        for (i, (event, context)) in checked.into_iter().enumerate() {
            let (name, matching) = match &last {
                Some((n, m)) if **n == *event => (n.clone(), m.clone()),
                _ => {
                    let m = reg.match_indices(&event);
                    let n: Arc<str> = Arc::from(event);
                    last = Some((n.clone(), m.clone()));
                    (n, m)
                }
            };
            counts.push(matching.len());
            if matching.is_empty() {
                continue;
            }
            let context = Arc::new(context);
            for &h in matching.iter() {
                per_hook[h].push((
                    i,
                    Job {
                        event: name.clone(),
                        context: context.clone(),
                        reply: None,
                    },
                ));
            }
        }
        for (h, jobs) in per_hook.into_iter().enumerate() {
            if jobs.is_empty() {
                continue;
            }
            let (idx, jobs): (Vec<usize>, Vec<Job>) = jobs.into_iter().unzip();
            for (i, ok) in idx.into_iter().zip(reg.hooks[h].enqueue_many(jobs)) {
                if !ok {
                    counts[i] -= 1;
                }
            }
        }
        Ok(counts)
    }

    /// Runs the matching handlers and waits for their outcomes until `timeout` has passed.
    /// Outcomes come in match order; a hook that has not answered by then gets an error entry.
    pub async fn emit_collect(
        &self,
        event: &str,
        context: Value,
        timeout: Duration,
    ) -> Result<Vec<HookOutcome>, EmitError> {
        self.emit_collect_only(event, context, timeout, None).await
    }

    /// [`Host::emit_collect`] restricted to the hook named `only`, when given (`test --hook`).
    pub async fn emit_collect_only(
        &self,
        event: &str,
        context: Value,
        timeout: Duration,
        only: Option<&str>,
    ) -> Result<Vec<HookOutcome>, EmitError> {
        validate_event_name(event)?;
        let context = normalize_context(context)?;
        if self.is_draining() {
            return Err(EmitError::ShuttingDown);
        }
        self.inner.events_received.fetch_add(1, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + timeout;
        let waiting: Vec<(String, oneshot::Receiver<CallOutcome>)> = {
            let reg = self.inner.registry.load();
            let event: Arc<str> = Arc::from(event);
            let context = Arc::new(context);
            reg.matching(&event)
                .into_iter()
                .filter(|hook| only.is_none_or(|o| o == hook.spec.name))
                .map(|hook| {
                    let (tx, rx) = oneshot::channel();
                    let job = Job {
                        event: event.clone(),
                        context: context.clone(),
                        reply: Some(tx),
                    };
                    hook.enqueue(job);
                    (hook.spec.name.clone(), rx)
                })
                .collect()
        };
        let mut out = Vec::with_capacity(waiting.len());
        for (hook, rx) in waiting {
            let outcome = match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(o)) => HookOutcome {
                    hook,
                    duration: (!o.duration.is_zero()).then_some(o.duration),
                    result: o.result,
                },
                Ok(Err(_)) => HookOutcome {
                    hook,
                    result: Err("the hook stopped before handling the event".into()),
                    duration: None,
                },
                Err(_) => HookOutcome {
                    hook,
                    result: Err(format!(
                        "no result within the deadline of {}",
                        crate::time::fmt_duration(timeout)
                    )),
                    duration: None,
                },
            };
            out.push(outcome);
        }
        Ok(out)
    }

    /// Sends accepted events to `sink` instead of the local queues from now on (the fleet
    /// edge). Set once; returns false if a sink was already installed.
    pub fn set_sink(&self, sink: Arc<dyn EventSink>) -> bool {
        self.inner.sink.set(sink).is_ok()
    }

    /// The installed sink's view for `/v1/hooks` (`None` in local mode).
    pub fn sink_status(&self) -> Option<Value> {
        self.inner.sink.get().and_then(|s| s.status())
    }

    /// `Some(reason)` while the installed sink accepts events it cannot pass on yet.
    pub fn degraded(&self) -> Option<String> {
        self.inner.sink.get().and_then(|s| s.degraded())
    }

    /// [`Host::emit`] through the dispatch interface: the installed sink when there is one,
    /// else the local queues.
    pub async fn accept(&self, event: &str, context: Value) -> Result<usize, EmitError> {
        let Some(sink) = self.inner.sink.get() else {
            return self.emit(event, context);
        };
        validate_event_name(event)?;
        let context = normalize_context(context)?;
        if self.is_draining() {
            return Err(EmitError::ShuttingDown);
        }
        self.inner.events_received.fetch_add(1, Ordering::Relaxed);
        Ok(sink.accept(event.to_string(), context).await?)
    }

    /// [`Host::emit_batch`] through the dispatch interface.
    pub async fn accept_batch(
        &self,
        events: Vec<(String, Value)>,
    ) -> Result<Vec<usize>, (usize, EmitError)> {
        let Some(sink) = self.inner.sink.get() else {
            return self.emit_batch(events);
        };
        let checked = self.accept_checked(events)?;
        sink.accept_batch(checked).await.map_err(|e| (0, e.into()))
    }

    /// [`Host::emit_collect`] through the dispatch interface.
    pub async fn collect(
        &self,
        event: &str,
        context: Value,
        timeout: Duration,
    ) -> Result<Vec<HookOutcome>, EmitError> {
        let Some(sink) = self.inner.sink.get() else {
            return self.emit_collect(event, context, timeout).await;
        };
        validate_event_name(event)?;
        let context = normalize_context(context)?;
        if self.is_draining() {
            return Err(EmitError::ShuttingDown);
        }
        self.inner.events_received.fetch_add(1, Ordering::Relaxed);
        Ok(sink.collect(event.to_string(), context, timeout).await?)
    }

    /// Rescans the roots and applies the difference: unchanged hooks keep their worker, queue and
    /// state; new hooks start; changed hooks get a new worker that takes over the same queue;
    /// removed hooks stop after their queue drains. A hook whose new version fails to load keeps
    /// its last good version running. Emit is never blocked: the new snapshot is swapped in.
    pub async fn reload(&self) -> LoadReport {
        let _guard = self.inner.reload_lock.lock().await;
        let roots = self.inner.config.roots.clone();
        let (trust, home) = (
            self.inner.config.trust,
            self.inner.config.hermes_home.clone(),
        );
        let scan = move || {
            let mut found = discover_with(&roots, &trust.gate(&home));
            for spec in &mut found.hooks {
                with_kind_settings(spec);
            }
            found
        };
        let discovery = match tokio::task::spawn_blocking(scan).await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("hook discovery failed: {e}");
                return LoadReport::default();
            }
        };
        let old = self.inner.registry.load_full();
        let old_skipped = old.skipped.clone();
        let old_by_name: HashMap<&str, &Arc<LoadedHook>> = old
            .hooks
            .iter()
            .map(|h| (h.spec.name.as_str(), h))
            .collect();

        let mut kept: Vec<Arc<LoadedHook>> = Vec::new();
        let mut to_start: Vec<(HookSpec, Option<Arc<LoadedHook>>)> = Vec::new();
        for spec in discovery.hooks {
            if self.inner.config.gateway_hooks_only && !spec.placement.in_gateway() {
                continue; // a fleet edge: the workers run it
            }
            match old_by_name.get(spec.name.as_str()) {
                Some(prev)
                    if prev.spec.dir == spec.dir && prev.spec.fingerprint == spec.fingerprint =>
                {
                    kept.push((*prev).clone());
                }
                // An in-gateway version has no worker and a closed queue: nothing to take over.
                Some(prev) if prev.spec.dir == spec.dir && !prev.spec.placement.in_gateway() => {
                    to_start.push((spec, Some((*prev).clone())))
                }
                _ => to_start.push((spec, None)),
            }
        }
        let mut skipped = discovery.skipped;

        // Start new and changed hooks concurrently (Python workers import in parallel).
        let mut set = tokio::task::JoinSet::new();
        let mut signals = Vec::with_capacity(to_start.len());
        for (i, (spec, _)) in to_start.iter().enumerate() {
            if spec.placement.in_gateway() {
                signals.push(Arc::default());
                continue; // the gateway's client runs it: no worker here
            }
            let ctx = HandlerContext::new(
                spec,
                &self.inner.config.hermes_home,
                &self.inner.config.python,
                self.inner.config.runtime_dir.clone(),
            );
            signals.push(ctx.signals.clone());
            let spec = spec.clone();
            set.spawn(async move { (i, handler::start(&spec, ctx).await) });
        }
        let mut started: Vec<Option<Result<Box<dyn handler::Handler>, handler::HandlerError>>> =
            (0..to_start.len()).map(|_| None).collect();
        while let Some(res) = set.join_next().await {
            match res {
                Ok((i, r)) => started[i] = Some(r),
                Err(e) => tracing::error!("starting a handler panicked: {e}"),
            }
        }

        let mut report = LoadReport::default();
        let mut new_hooks: Vec<Arc<LoadedHook>> = kept;
        for (((spec, prev), result), signals) in to_start.into_iter().zip(started).zip(signals) {
            if spec.placement.in_gateway() {
                let hook = LoadedHook::new_with(spec, self.inner.notices.clone(), signals);
                // No worker: close the queue and mark it finished, so shutdown waits for nothing.
                hook.abort().await;
                tracing::info!(hook = %hook.spec.name, "runs in the gateway ({}); no worker here", hook.spec.placement.why);
                self.inner.notices.send(
                    "hook_loaded",
                    json!({"hook": hook.spec.name, "kind": hook.spec.kind.as_str(), "runs": "gateway",
                           "events": hook.spec.manifest.events, "dir": hook.spec.dir, "root": hook.spec.root}),
                );
                report.started.push(hook.spec.name.clone());
                new_hooks.push(hook);
                continue;
            }
            let result = result.unwrap_or_else(|| {
                Err(handler::HandlerError::Load(
                    "handler start was interrupted".into(),
                ))
            });
            match result {
                Ok(h) => {
                    let hook = match &prev {
                        Some(p) => LoadedHook::successor(spec, p, signals),
                        None => {
                            let hook =
                                LoadedHook::new_with(spec, self.inner.notices.clone(), signals);
                            self.ledger()
                                .live
                                .push((hook.spec.name.clone(), hook.stats.clone()));
                            hook
                        }
                    };
                    let spec = &hook.spec;
                    let what = json!({
                        "hook": spec.name,
                        "kind": spec.kind.as_str(),
                        "events": spec.manifest.events,
                        "dir": spec.dir,
                        "root": spec.root,
                    });
                    match &prev {
                        Some(_) => self.inner.notices.send("hook_reloaded", what),
                        None => self.inner.notices.send("hook_loaded", what),
                    }
                    for w in &hook.spec.manifest.warnings {
                        tracing::warn!(hook = %hook.spec.name, file = %hook.spec.manifest_path.display(), "{w}");
                    }
                    hook.start_worker(h, prev.clone());
                    report.started.push(hook.spec.name.clone());
                    new_hooks.push(hook);
                }
                Err(e) => {
                    let file = spec
                        .handler_path
                        .clone()
                        .unwrap_or_else(|| spec.manifest_path.clone());
                    let mut reason = crate::text::cap(e.to_string());
                    if let Some(p) = &prev {
                        reason.push_str(" (the previous version keeps running)");
                        p.stats.set_last_error(format!("reload failed: {e}"));
                        self.inner.notices.send(
                            "hook_reloaded",
                            json!({"hook": p.spec.name, "dir": p.spec.dir, "error": e.to_string(), "kept_previous": true}),
                        );
                        new_hooks.push(p.clone());
                    }
                    skipped.push(Skipped {
                        dir: spec.dir.clone(),
                        name: spec.name.clone(),
                        file,
                        code: SkipCode::LoadFailed,
                        reason,
                    });
                }
            }
        }
        // A loaded hook whose directory now fails discovery keeps running (last good version),
        // unless it was deliberately disabled or removed.
        for s in skipped.iter_mut() {
            // Trust refusals stop the old version too: an executable re-reads its file per event.
            if matches!(
                s.code,
                SkipCode::Disabled
                    | SkipCode::Shadowed
                    | SkipCode::LoadFailed
                    | SkipCode::Permissions
                    | SkipCode::NotApproved
                    | SkipCode::HandlerOutside
            ) {
                continue;
            }
            if let Some(prev) = old.hooks.iter().find(|h| h.spec.dir == s.dir)
                && !new_hooks.iter().any(|h| h.spec.name == prev.spec.name)
            {
                prev.stats
                    .set_last_error(format!("reload failed: {}", s.reason));
                self.inner.notices.send(
                    "hook_reloaded",
                    json!({"hook": prev.spec.name, "dir": prev.spec.dir, "error": s.reason, "kept_previous": true}),
                );
                s.reason.push_str(" (the previous version keeps running)");
                new_hooks.push(prev.clone());
            }
        }
        let root_pos = |p: &Path| {
            self.inner
                .config
                .roots
                .iter()
                .position(|r| r == p)
                .unwrap_or(usize::MAX)
        };
        new_hooks.sort_by(|a, b| {
            (root_pos(&a.spec.root), &a.spec.dir).cmp(&(root_pos(&b.spec.root), &b.spec.dir))
        });

        let generation = old.generation + 1;
        let registry = Registry::new(
            new_hooks,
            skipped.clone(),
            self.inner.config.roots.clone(),
            generation,
        );
        report.loaded = registry.hooks.iter().map(|h| h.spec.name.clone()).collect();
        self.inner.registry.store(Arc::new(registry));

        // Retire what the new snapshot no longer holds.
        let current = self.snapshot();
        let mut refused = Vec::new();
        {
            let mut retired = self.inner.retired.lock().unwrap_or_else(|p| p.into_inner());
            retired.retain(|h| !h.is_finished());
            for h in &old.hooks {
                if current.hooks.iter().any(|n| Arc::ptr_eq(n, h)) {
                    continue;
                }
                retired.push(h.clone());
                if current
                    .hooks
                    .iter()
                    .any(|n| Arc::ptr_eq(&n.queue, &h.queue))
                {
                    h.supersede();
                } else {
                    h.close();
                    if let Some(why) = crate::trust::revoked::refusal(&skipped, &h.spec.dir) {
                        refused.push((h.clone(), why));
                    }
                    report.stopped.push(h.spec.name.clone());
                    self.inner.notices.send(
                        "hook_unloaded",
                        json!({"hook": h.spec.name, "dir": h.spec.dir, "queued": h.queue.len()}),
                    );
                }
            }
        }
        crate::trust::revoked::stop_all(refused).await;
        drop(old);
        self.ledger().fold();
        // Report what is newly wrong; a rescan does not repeat problems already reported.
        let fresh = skipped.iter().filter(|s| {
            !old_skipped
                .iter()
                .any(|o| o.dir == s.dir && o.code == s.code && o.reason == s.reason)
        });
        for s in fresh {
            self.inner.notices.send(
                "hook_skipped",
                json!({"name": s.name, "dir": s.dir, "file": s.file, "code": s.code, "reason": s.reason}),
            );
            if s.is_problem() {
                tracing::warn!(hook = %s.name, file = %s.file.display(), "not loaded: {}", s.reason);
            } else {
                tracing::info!(hook = %s.name, file = %s.file.display(), "not loaded: {}", s.reason);
            }
        }
        if self.inner.ready.swap(true, Ordering::Relaxed) {
            self.inner.reloads.fetch_add(1, Ordering::Relaxed);
        }
        report.skipped = skipped;
        report.generation = generation;
        report
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.inner.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where every event offered to each hook name went so far, over the host's whole life.
    pub fn accounts(&self) -> std::collections::BTreeMap<String, Tally> {
        self.ledger().by_name()
    }

    /// Stops accepting events, waits for a reload in progress (the first load included), lets
    /// every worker drain its queue for up to `drain` (the versions a reload removed or
    /// superseded included), then stops the rest and reports what was left undelivered and where
    /// every event went.
    pub async fn shutdown(&self, drain: Duration) -> ShutdownReport {
        self.inner.draining.store(true, Ordering::SeqCst);
        let _guard = self.inner.reload_lock.lock().await;
        let started = Instant::now();
        let reg = self.snapshot();
        // Older versions first: a superseded version hands the shared queue to its successor.
        let mut all: Vec<Arc<LoadedHook>> = self
            .inner
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        all.extend(reg.hooks.iter().cloned());
        for h in &all {
            h.close();
        }
        let drained = async {
            for h in &all {
                h.finished().await;
            }
        };
        let _ = tokio::time::timeout(drain, drained).await;
        let mut report = ShutdownReport::default();
        let mut left_by_name: std::collections::BTreeMap<String, usize> = Default::default();
        for h in &all {
            let left = h.abort().await;
            if left > 0 {
                *left_by_name.entry(h.spec.name.clone()).or_default() += left;
            }
        }
        for (name, left) in left_by_name {
            tracing::warn!(hook = %name, "{left} event(s) undelivered at shutdown");
            report.undelivered.push((name, left));
        }
        drop(all);
        report.by_hook = self.accounts();
        for t in report.by_hook.values() {
            report.total.add(*t);
        }
        // `abort` cancelled the workers still running: each handler is dropped when its task is
        // cancelled, which SIGKILLs the process group of a process-based handler (python,
        // exec); tokio collects the exit statuses in the background. Nothing here waits for
        // those processes to be gone.
        report.drain_ms = started.elapsed().as_millis() as u64;
        report
    }
}

/// What a handler kind derives from its manifest, applied to a freshly discovered spec: a
/// webhook's worker timeout covers the whole delivery (both attempts; `timeout:` is per
/// attempt), and an unset `secret_env` is a load-time warning.
fn with_kind_settings(spec: &mut HookSpec) {
    if spec.kind == crate::discovery::HandlerKind::Webhook {
        spec.manifest.timeout = crate::handler::webhook::delivery_budget(&spec.manifest);
        let warning = crate::handler::webhook::unsigned_warning(&spec.manifest);
        spec.manifest.warnings.extend(warning);
    }
}

/// Local mode behind the dispatch interface: a thin adapter over the host's own queues.
pub struct LocalDispatch(pub Host);

impl EventSink for LocalDispatch {
    fn accept(
        &self,
        event: String,
        context: Value,
    ) -> crate::sink::SinkFuture<'_, Result<usize, SinkError>> {
        let r = self
            .0
            .emit(&event, context)
            .map_err(|_| SinkError::ShuttingDown);
        Box::pin(async move { r })
    }

    fn accept_batch(
        &self,
        events: Vec<(String, Value)>,
    ) -> crate::sink::SinkFuture<'_, Result<Vec<usize>, SinkError>> {
        let r = self
            .0
            .emit_batch(events)
            .map_err(|_| SinkError::ShuttingDown);
        Box::pin(async move { r })
    }

    fn collect(
        &self,
        event: String,
        context: Value,
        timeout: Duration,
    ) -> crate::sink::SinkFuture<'_, Result<Vec<HookOutcome>, SinkError>> {
        Box::pin(async move {
            self.0
                .emit_collect(&event, context, timeout)
                .await
                .map_err(|_| SinkError::ShuttingDown)
        })
    }

    fn status(&self) -> Option<Value> {
        None
    }

    fn degraded(&self) -> Option<String> {
        None
    }
}
