//! The host: owns the registry snapshot, loads and reloads hooks, and is the API that the
//! service, the CLI, the HTTP server and the tests drive (`emit`, `emit_collect`, `reload`,
//! `shutdown`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::Serialize;
use serde_json::{Map, Value, json};
use thiserror::Error;
use tokio::sync::oneshot;

use crate::discovery::{HookSpec, SkipCode, Skipped};
use crate::events::{EventNameError, validate_event_name};
use crate::handler::context::Context;
use crate::handler::{self, HandlerContext};
use crate::hook::{CallOutcome, HookStats, Job, LoadedHook, Reloader, Tally};
use crate::registry::Registry;

mod info;
mod plan;
mod revoked;
mod scan;

use plan::{Plan, Version};

pub use info::{Counters, HookInfo, LastError, QueueInfo, WorkerStart, sandbox_view};

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
    /// CPU priority of hook processes unless a hook sets its own (`serve --worker-nice`,
    /// `--worker-sched`).
    pub worker_priority: crate::priority::Priority,
    /// The sandbox of hooks without a `sandbox:` key (`serve --sandbox-default`,
    /// `HERMES_HOOKS_SANDBOX_DEFAULT`).
    pub sandbox_default: crate::sandbox::DefaultSandbox,
    /// Host the shell hooks of config.yaml's `hooks:` block too (`$HERMES_HOME/config-hooks`,
    /// issue 49). Off for `check --hooks-dir DIR`, which checks DIR only (issue 60).
    pub config_hooks: bool,
}

impl HostConfig {
    /// Settings from the environment: `HERMES_HOME` (default `~/.hermes`); `roots` or, when empty,
    /// `$HERMES_HOME/hooks`; the default interpreter of `crate::interpreter::default_python`.
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
            worker_priority: crate::priority::Priority::default(),
            sandbox_default: crate::sandbox::DefaultSandbox::from_env(),
            config_hooks: true,
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
    /// The sink cannot take the event now, or ever (fleet mode; see [`SinkError`]).
    #[error(transparent)]
    Sink(SinkError),
}

pub use crate::sink::HookOutcome;

/// A function a fleet worker installs to report its counters (see [`Host::set_worker_status`]).
pub type StatusSource = Arc<dyn Fn() -> Value + Send + Sync>;
use crate::sink::{Accepted, EventSink, SinkError};

impl From<SinkError> for EmitError {
    fn from(e: SinkError) -> Self {
        match e {
            SinkError::ShuttingDown => EmitError::ShuttingDown,
            other => EmitError::Sink(other),
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

/// See [`Host::set_change_hold`]: `(running, found)`, true to keep the running version (asked
/// of unchanged hooks too: `found` then has `running`'s fingerprint).
pub type ChangeHold = Arc<dyn Fn(&HookSpec, &HookSpec) -> bool + Send + Sync>;

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

/// A handler start's result; `None` when its task panicked.
/// Versions trust refused at a reload, with why: they stop at once.
type Refused = Vec<(Arc<LoadedHook>, String)>;
type Started = Option<Result<Box<dyn handler::Handler>, handler::HandlerError>>;

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
    /// What a fleet worker adds to `/metrics` (its per-hook fleet counters).
    worker_status: std::sync::OnceLock<StatusSource>,
    /// Set by a fleet worker: whether a changed hook keeps its running version for now
    /// ([`Host::set_change_hold`]).
    change_hold: std::sync::OnceLock<ChangeHold>,
    /// Versions taken out of the registry (removed or superseded) whose worker may still run:
    /// shutdown waits for them too. Finished ones are pruned at each reload.
    retired: std::sync::Mutex<Vec<Arc<LoadedHook>>>,
    /// The accounts of every hook name: see [`Ledger`].
    ledger: std::sync::Mutex<Ledger>,
    /// Where hooks' workers ask for a reload: see [`Host::reloader`].
    reloader: std::sync::OnceLock<Reloader>,
    /// Set once the history ticker runs ([`Host::start_history_ticker`]).
    history_ticker: std::sync::OnceLock<()>,
}

/// Counter sets of hooks no longer loaded that are kept whole for a hook of the same name to
/// go on with (beyond these, their tallies are folded into sums).
const RESTING: usize = 256;

/// Names of removed hooks whose sums are kept apart; the tallies of any further ones go into
/// one sum, [`OTHER_REMOVED`] (issue 56, suspected: the ledger grew by every name ever seen).
const FOLDED: usize = 1024;

/// The name the sums of removed hooks beyond [`FOLDED`] names are kept under.
pub const OTHER_REMOVED: &str = "(other removed hooks)";

/// The counters of every hook the host ever loaded, by name: live counter sets, and the sums of
/// those no version uses any more (a removed hook), so the accounts survive removal.
#[derive(Default)]
struct Ledger {
    live: Vec<(String, Arc<HookStats>)>,
    folded: std::collections::BTreeMap<String, Tally>,
}

impl Ledger {
    /// Folds the counter sets no hook version holds any more, except the last
    /// [`RESTING`] of them: those wait for a hook of their name to come back.
    fn fold(&mut self) {
        let unused = |stats: &Arc<HookStats>| Arc::strong_count(stats) == 1;
        let mut resting = self.live.iter().filter(|(_, s)| unused(s)).count();
        let folded = &mut self.folded;
        self.live.retain(|(name, stats)| {
            if !unused(stats) || resting <= RESTING {
                return true;
            }
            resting -= 1;
            let under = if folded.contains_key(name) || folded.len() < FOLDED {
                name.clone()
            } else {
                OTHER_REMOVED.to_string()
            };
            folded.entry(under).or_default().add(stats.tally());
            false
        });
    }

    /// The counter set of `name` for which `in_use` says no, if one is kept.
    fn resting(
        &self,
        name: &str,
        in_use: impl Fn(&Arc<HookStats>) -> bool,
    ) -> Option<Arc<HookStats>> {
        self.live
            .iter()
            .find(|(n, s)| n == name && !in_use(s))
            .map(|(_, s)| s.clone())
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

/// The one check of an incoming event: a valid name and an object context (`null` becomes
/// `{}`); the HTTP API uses it to word its errors, the host's entry points through `admit`.
pub fn check_event(event: &str, context: Value) -> Result<Value, EmitError> {
    validate_event_name(event)?;
    normalize_context(context)
}

impl Host {
    /// Lets one event in: checked ([`check_event`]), refused while draining, counted as received.
    fn admit(&self, event: &str, context: Value) -> Result<Value, EmitError> {
        let context = check_event(event, context)?;
        self.let_in()?;
        Ok(context)
    }

    /// Refuses while draining, else counts one event as received.
    fn let_in(&self) -> Result<(), EmitError> {
        if self.is_draining() {
            return Err(EmitError::ShuttingDown);
        }
        self.inner.events_received.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A host with no hooks loaded yet; call [`Host::reload`] to load.
    pub fn new(config: HostConfig) -> Self {
        Self::with_notices(config, crate::notices::Notices::default())
    }

    /// [`Host::new`], reporting loads, reloads and handler failures to `notices`.
    pub fn with_notices(config: HostConfig, notices: crate::notices::Notices) -> Self {
        let registry = Registry::new(Vec::new(), Vec::new(), 0);
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
                worker_status: std::sync::OnceLock::new(),
                change_hold: std::sync::OnceLock::new(),
                retired: std::sync::Mutex::new(Vec::new()),
                ledger: std::sync::Mutex::new(Ledger::default()),
                reloader: std::sync::OnceLock::new(),
                history_ticker: std::sync::OnceLock::new(),
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

    /// Refuses new events from now on (503 `shutting_down`, `/readyz` too), ahead of the
    /// [`Host::shutdown`] that follows: a service that decided to stop says so at once.
    pub fn begin_draining(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
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
            .map(|h| {
                HookInfo::of(
                    h,
                    &self.inner.config.python,
                    &self.inner.config.hermes_home,
                    self.inner.config.sandbox_default,
                    self.events_received(),
                )
            })
            .collect()
    }

    /// One loaded hook, for display.
    pub fn hook(&self, name: &str) -> Option<HookInfo> {
        self.snapshot().get(name).map(|h| {
            HookInfo::of(
                h,
                &self.inner.config.python,
                &self.inner.config.hermes_home,
                self.inner.config.sandbox_default,
                self.events_received(),
            )
        })
    }

    /// Directories that did not load at the last (re)load.
    pub fn skipped(&self) -> Vec<Skipped> {
        self.snapshot().skipped.clone()
    }

    /// Queues `event` to every matching hook and returns how many. Never waits for a handler.
    pub fn emit(&self, event: &str, context: Value) -> Result<usize, EmitError> {
        let context = self.admit(event, context)?;
        let reg = self.inner.registry.load();
        let matching = reg.match_indices(event);
        if matching.is_empty() {
            return Ok(0);
        }
        let event: Arc<str> = Arc::from(event);
        let context = Arc::new(Context::new(context));
        let mut queued = 0;
        for hook in matching.iter().map(|&i| &reg.hooks[i]) {
            let job = Job {
                event: event.clone(),
                context: context.clone(),
                reply: None,
                gate: None,
                queued_for: 0,
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
        events: Vec<(String, Context)>,
    ) -> Result<Vec<(String, Context)>, (usize, EmitError)> {
        let mut checked = Vec::with_capacity(events.len());
        for (i, (event, context)) in events.into_iter().enumerate() {
            let context = validate_event_name(&event)
                .map_err(EmitError::from)
                .and_then(|()| context.checked().map_err(EmitError::ContextNotObject))
                .map_err(|e| (i, e))?;
            checked.push((event, context));
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
        events: Vec<(String, Context)>,
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
                        gate: None,
                        queued_for: 0,
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
        if let Some(name) = only {
            let context = Context::new(check_event(event, context)?);
            let o = self.call_one(event, context, timeout, name, None).await?;
            return Ok(o
                .map(|o| hook_outcome(name.to_string(), o))
                .into_iter()
                .collect());
        }
        let context = self.admit(event, context)?;
        let deadline = tokio::time::Instant::now() + timeout;
        // A decision is the gateway's own work: the service's threads and the processes of the
        // hooks it waits for leave SCHED_IDLE until it is answered (crate::priority).
        let _service = crate::priority::boost_service();
        let waiting: Vec<(String, oneshot::Receiver<CallOutcome>, _)> = {
            let reg = self.inner.registry.load();
            let event: Arc<str> = Arc::from(event);
            let context = Arc::new(Context::new(context));
            reg.matching(&event)
                .into_iter()
                .map(|hook| {
                    let (tx, rx) = oneshot::channel();
                    let job = Job {
                        event: event.clone(),
                        context: context.clone(),
                        reply: Some(tx),
                        gate: None,
                        queued_for: 0,
                    };
                    let boost = hook.signals().boost.boost();
                    hook.enqueue(job);
                    (hook.spec.name.clone(), rx, boost)
                })
                .collect()
        };
        let mut out = Vec::with_capacity(waiting.len());
        for (hook, rx, _boost) in waiting {
            let o = outcome_within(tokio::time::timeout_at(deadline, rx).await, timeout);
            out.push(hook_outcome(hook, o));
        }
        Ok(out)
    }

    /// [`Host::emit_collect_only`] for the one hook named `hook`, as a fleet worker calls it for
    /// each event: `None` when no hook of that name is loaded or it does not match `event`. The
    /// context is a JSON object (a fleet worker's comes as the stream's text, checked there).
    pub async fn call_one(
        &self,
        event: &str,
        context: Context,
        timeout: Duration,
        hook: &str,
        gate: Option<Arc<crate::start_gate::StartGate>>,
    ) -> Result<Option<CallOutcome>, EmitError> {
        validate_event_name(event)?;
        self.let_in()?;
        let _service = crate::priority::boost_service();
        let (rx, _boost) = {
            let reg = self.inner.registry.load();
            let found = reg
                .match_indices(event)
                .iter()
                .map(|&i| &reg.hooks[i])
                .find(|h| h.spec.name == hook);
            let Some(h) = found else { return Ok(None) };
            let (tx, rx) = oneshot::channel();
            let boost = h.signals().boost.boost();
            h.enqueue(Job {
                event: Arc::from(event),
                context: Arc::new(context),
                reply: Some(tx),
                gate,
                queued_for: 0,
            });
            (rx, boost)
        };
        Ok(Some(outcome_within(
            tokio::time::timeout(timeout, rx).await,
            timeout,
        )))
    }

    /// Sends accepted events to `sink` instead of the local queues from now on (the fleet
    /// edge). Set once; returns false if a sink was already installed.
    pub fn set_sink(&self, sink: Arc<dyn EventSink>) -> bool {
        self.inner.sink.set(sink).is_ok()
    }

    /// A fleet worker's counters for `/metrics`, read at each scrape. Set once.
    pub fn set_worker_status(&self, source: StatusSource) -> bool {
        self.inner.worker_status.set(source).is_ok()
    }

    /// Whether a hook changed on disk keeps its running version for now: `hold(running, found)`
    /// true keeps `running` (the reload treats the hook as unchanged) until a later reload that
    /// `hold` lets through. A fleet worker sets it so that a version a rolling update retires
    /// first runs what only it matches in the stream (issue 48). Set once.
    pub fn set_change_hold(&self, hold: ChangeHold) -> bool {
        self.inner.change_hold.set(hold).is_ok()
    }

    /// The fleet worker's counters (`None` unless this host is a fleet worker).
    pub fn worker_status(&self) -> Option<Value> {
        self.inner.worker_status.get().map(|f| f())
    }

    /// The installed sink's view for `/v1/hooks` (`None` in local mode).
    pub fn sink_status(&self) -> Option<Value> {
        self.inner.sink.get().and_then(|s| s.status())
    }

    /// `Some(reason)` while the installed sink accepts events it cannot pass on yet.
    pub fn degraded(&self) -> Option<String> {
        self.inner.sink.get().and_then(|s| s.degraded())
    }

    /// Whether the installed sink keeps dead letters (a fleet edge).
    pub fn keeps_dead_letters(&self) -> bool {
        self.inner
            .sink
            .get()
            .is_some_and(|s| s.keeps_dead_letters())
    }

    /// The dead letters `query` picks (`GET /v1/dead`): `None` unless the installed sink keeps
    /// dead letters (a fleet edge).
    pub async fn dead_letters(
        &self,
        query: crate::sink::DeadQuery,
    ) -> Option<Result<Value, SinkError>> {
        let pending = self.inner.sink.get()?.dead_letters(query)?;
        Some(pending.await)
    }

    /// Replays the dead letters `query` picks (`POST /v1/dead/replay`): `None` unless the
    /// installed sink keeps dead letters (a fleet edge).
    pub async fn replay_dead(
        &self,
        query: crate::sink::DeadQuery,
    ) -> Option<Result<Value, SinkError>> {
        let pending = self.inner.sink.get()?.replay_dead(query)?;
        Some(pending.await)
    }

    /// [`Host::emit`] through the dispatch interface: the installed sink when there is one,
    /// else the local queues.
    pub async fn accept(
        &self,
        event: &str,
        context: Value,
        id: crate::sink::ClientId,
    ) -> Result<Accepted<usize>, EmitError> {
        let Some(sink) = self.inner.sink.get() else {
            return self.emit(event, context).map(Accepted::local);
        };
        let context = self.admit(event, context)?;
        Ok(sink.accept(event.to_string(), context, id).await?)
    }

    /// [`Host::emit_batch`] through the dispatch interface.
    pub async fn accept_batch(
        &self,
        events: Vec<(String, Context)>,
        ids: Vec<crate::sink::ClientId>,
    ) -> Result<Accepted<Vec<usize>>, (usize, EmitError)> {
        let Some(sink) = self.inner.sink.get() else {
            return self.emit_batch(events).map(Accepted::local);
        };
        let checked = self.accept_checked(events)?;
        sink.accept_batch(checked, ids)
            .await
            .map_err(|e| (0, e.into()))
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
        let context = self.admit(event, context)?;
        Ok(sink.collect(event.to_string(), context, timeout).await?)
    }

    /// How long a collect of `event` waits when its caller gives no deadline: the matching
    /// hooks' own timeouts (`crate::decision::collect_budget`; in fleet mode as the workers
    /// report them), `None` when no hook is known to match.
    pub fn collect_budget(&self, event: &str) -> Option<Duration> {
        match self.inner.sink.get() {
            Some(sink) => sink.collect_budget(event),
            None => crate::decision::collect_budget(&self.inner.registry.load(), event),
        }
    }

    /// The hooks matching `event` that cannot answer it because they did not load (refused by
    /// trust, failed to load): `crate::decision::unanswerable`. Empty in fleet mode (an edge
    /// loads nothing; the workers' skipped hooks are theirs).
    pub fn unanswerable(&self, event: &str) -> Vec<crate::decision::Unanswerable> {
        if self.inner.sink.get().is_some() {
            return Vec::new();
        }
        crate::decision::unanswerable(&self.inner.registry.load(), event)
    }

    /// Rescans the roots and applies the difference: unchanged hooks keep their worker, queue and
    /// state; new hooks start; changed hooks get a new worker that takes over the same queue;
    /// removed hooks stop after their queue drains. A hook whose new version fails to load keeps
    /// its last good version running. Emit is never blocked: the new snapshot is swapped in.
    pub async fn reload(&self) -> LoadReport {
        let _guard = self.inner.reload_lock.lock().await;
        if self.is_draining() {
            return LoadReport::default(); // shut down (or shutting down): nothing starts again
        }
        self.start_history_ticker();
        let Some(discovery) = self.scan().await else {
            return LoadReport::default();
        };
        if !self.inner.ready.load(Ordering::Relaxed) {
            self.stop_unneeded_fork_server(&discovery.hooks);
        }
        let old = self.inner.registry.load_full();
        let mut discovery = discovery;
        self.hold_changes(&old, &mut discovery.hooks);
        let running: Vec<Version<'_>> = old.hooks.iter().map(|h| Version::of(&h.spec)).collect();
        let found: Vec<Version<'_>> = discovery.hooks.iter().map(Version::of).collect();
        let plan = Plan::new(&running, &found, self.inner.config.gateway_hooks_only);
        tracing::debug!(
            kept = plan.kept.len(),
            added = plan.to_add().len(),
            changed = plan.to_change().len(),
            removed = plan.to_remove().len(),
            "reload plan"
        );
        let mut specs: Vec<Option<HookSpec>> = discovery.hooks.into_iter().map(Some).collect();
        let to_start: Vec<(HookSpec, Option<Arc<LoadedHook>>)> = plan
            .starts
            .iter()
            .filter_map(|s| {
                Some((
                    specs[s.found].take()?,
                    s.takes_over.map(|p| old.hooks[p].clone()),
                ))
            })
            .collect();
        let mut skipped = discovery.skipped;
        let mut report = LoadReport::default();
        let mut new_hooks: Vec<Arc<LoadedHook>> =
            plan.kept.iter().map(|&i| old.hooks[i].clone()).collect();

        let started = self.start_handlers(&to_start).await;
        for ((spec, prev), (result, signals)) in to_start.into_iter().zip(started) {
            self.install(
                spec,
                prev,
                result,
                signals,
                &mut report,
                &mut new_hooks,
                &mut skipped,
            )
            .await;
        }
        self.keep_last_good(&old, &running, &mut skipped, &mut new_hooks);
        let generation = old.generation + 1;
        report.loaded = self.swap(new_hooks, skipped.clone(), generation);
        let (stopped, refused) = self.retire(&old, &skipped);
        report.stopped = stopped;
        let old_skipped = old.skipped.clone();
        drop(running);
        drop(old);
        revoked::stop_all(refused).await;
        self.ledger().fold();
        self.announce_skipped(&skipped, &old_skipped);
        if self.inner.ready.swap(true, Ordering::Relaxed) {
            self.inner.reloads.fetch_add(1, Ordering::Relaxed);
        }
        report.skipped = skipped;
        report.generation = generation;
        report
    }

    /// Reload phase 1b: a changed hook the change hold keeps ([`Host::set_change_hold`]) is
    /// found as its running version, so the plan keeps it as it runs. The hold is asked of
    /// every hook found running, changed or not (one whose change was reverted while held is
    /// released).
    fn hold_changes(&self, old: &Registry, found: &mut [HookSpec]) {
        let Some(hold) = self.inner.change_hold.get() else {
            return;
        };
        let running: std::collections::HashMap<(&str, &std::path::Path), &HookSpec> = old
            .hooks
            .iter()
            .map(|h| ((h.spec.name.as_str(), h.spec.dir.as_path()), &h.spec))
            .collect();
        for spec in found.iter_mut() {
            let running = running
                .get(&(spec.name.as_str(), spec.dir.as_path()))
                .copied();
            // Asked of unchanged hooks too: a change reverted while it was held ends its hold.
            if let Some(h) = running
                && hold(h, spec)
            {
                *spec = h.clone();
            }
        }
    }

    /// Reload phase 1: scans the roots and applies each kind's settings. `$HERMES_HOME`'s
    /// files (config.yaml's hooks, the approvals, `.env`) are read on a blocking thread; the
    /// roots and each hook directory on the threads for hooks' files, bounded per hook
    /// ([`scan`]): a hook whose files stall keeps its running version and delays no other.
    async fn scan(&self) -> Option<crate::discovery::Discovery> {
        let roots = self.inner.config.roots.clone();
        let (trust, home, config_hooks) = (
            self.inner.config.trust,
            self.inner.config.hermes_home.clone(),
            self.inner.config.config_hooks,
        );
        let home_files = move || {
            // The shell hooks of config.yaml (issue 49) are written out as hooks first.
            let mut roots = roots;
            let explicit = trust.mode == crate::trust::policy::TrustMode::Explicit;
            if config_hooks {
                roots.extend(crate::config_hooks::sync(&home, explicit));
            }
            (roots, trust.gate(&home), crate::dotenv::stamp(&home))
        };
        let (roots, gate, env_stamp) = match tokio::task::spawn_blocking(home_files).await {
            Ok(read) => read,
            Err(e) => {
                tracing::error!("hook discovery failed: {e}");
                return None;
            }
        };
        let mut found = scan::scan(roots, gate, env_stamp, self.confined_fork_server_ahead()).await;
        // The running hooks of a root whose listing did not answer keep running.
        let running = self.inner.registry.load();
        for h in &running.hooks {
            if found.stalled_roots.contains(&h.spec.root)
                && !found.hooks.iter().any(|s| s.dir == h.spec.dir)
            {
                found.skipped.push(Skipped {
                    dir: h.spec.dir.clone(),
                    name: h.spec.name.clone(),
                    file: h.spec.manifest_path.clone(),
                    code: SkipCode::Unreadable,
                    reason: format!(
                        "its hooks directory {} did not answer within {}",
                        h.spec.root.display(),
                        crate::time::fmt_duration(scan::LIST_DEADLINE)
                    ),
                    events: h.spec.manifest.events.clone(),
                });
            }
        }
        Some(found)
    }

    /// Reload phase 2: starts the handlers of new and changed hooks concurrently (Python workers
    /// import in parallel); in-gateway hooks get no handler.
    async fn start_handlers(
        &self,
        to_start: &[(HookSpec, Option<Arc<LoadedHook>>)],
    ) -> Vec<(Started, Arc<handler::Signals>)> {
        let mut set = tokio::task::JoinSet::new();
        let mut signals = Vec::with_capacity(to_start.len());
        for (i, (spec, prev)) in to_start.iter().enumerate() {
            if spec.placement.in_gateway() {
                signals.push(Arc::default());
                continue; // the gateway's client runs it: no worker here
            }
            let mut ctx = HandlerContext::new(
                spec,
                &self.inner.config.hermes_home,
                &self.inner.config.python,
                self.inner.config.runtime_dir.clone(),
            )
            .with_default_priority(self.inner.config.worker_priority, spec)
            .with_sandbox(
                self.inner.config.sandbox_default,
                spec,
                &self.inner.config.hermes_home,
            );
            if let Some(prev) = prev {
                ctx.signals = Arc::new(handler::Signals::sharing_boost(prev.signals()));
            }
            signals.push(ctx.signals.clone());
            let spec = spec.clone();
            set.spawn(async move { (i, handler::start(&spec, ctx).await) });
        }
        let mut started: Vec<Started> = (0..to_start.len()).map(|_| None).collect();
        while let Some(res) = set.join_next().await {
            match res {
                Ok((i, r)) => started[i] = Some(r),
                Err(e) => tracing::error!("starting a handler panicked: {e}"),
            }
        }
        started.into_iter().zip(signals).collect()
    }

    /// Reload phase 3: puts one started hook into the new set (its worker running, the
    /// notice sent); a failed start keeps the previous version, if any, and is reported.
    #[allow(clippy::too_many_arguments)]
    async fn install(
        &self,
        spec: HookSpec,
        prev: Option<Arc<LoadedHook>>,
        result: Started,
        signals: Arc<handler::Signals>,
        report: &mut LoadReport,
        new_hooks: &mut Vec<Arc<LoadedHook>>,
        skipped: &mut Vec<Skipped>,
    ) {
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
            return;
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
                        // The counters of a version of this name that no longer runs go on
                        // (disable, then enable: issue 50); else new ones.
                        let resting = self.resting_stats(&spec.name);
                        let fresh = resting.is_none();
                        let stats = resting.unwrap_or_default();
                        let hook = LoadedHook::new_with_stats(
                            spec,
                            self.inner.notices.clone(),
                            signals,
                            stats,
                        );
                        hook.set_reloader(self.reloader());
                        // Its window starts now: what came before its load does not count.
                        let totals = hook.stats.totals(self.events_received());
                        hook.stats
                            .history
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .tick(std::time::SystemTime::now(), totals);
                        if fresh {
                            self.ledger()
                                .live
                                .push((hook.spec.name.clone(), hook.stats.clone()));
                        }
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
                    p.note_newer_version_failed();
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
                    events: spec.manifest.events.clone(),
                });
            }
        }
    }

    /// Reload phase 4: a loaded hook whose directory now fails discovery keeps running (last
    /// good version), unless it was deliberately disabled or removed ([`plan::keep_last_good`]).
    fn keep_last_good(
        &self,
        old: &Registry,
        running: &[Version<'_>],
        skipped: &mut [Skipped],
        new_hooks: &mut Vec<Arc<LoadedHook>>,
    ) {
        let loaded: Vec<&str> = new_hooks.iter().map(|h| h.spec.name.as_str()).collect();
        let keep = plan::keep_last_good(running, skipped, &loaded);
        for (p, si) in keep {
            let prev = &old.hooks[p];
            let reason = skipped[si]
                .reason
                .strip_suffix(" (the previous version keeps running)")
                .unwrap_or(&skipped[si].reason);
            prev.stats
                .set_last_error(format!("reload failed: {reason}"));
            prev.note_newer_version_failed();
            self.inner.notices.send(
                "hook_reloaded",
                json!({"hook": prev.spec.name, "dir": prev.spec.dir, "error": reason, "kept_previous": true}),
            );
            new_hooks.push(prev.clone());
        }
    }

    /// Reload phase 5: orders the new set (root order, then directory) and swaps it in; returns
    /// the loaded names.
    fn swap(
        &self,
        mut new_hooks: Vec<Arc<LoadedHook>>,
        skipped: Vec<Skipped>,
        generation: u64,
    ) -> Vec<String> {
        let roots = &self.inner.config.roots;
        let root_pos = |p: &Path| roots.iter().position(|r| r == p).unwrap_or(usize::MAX);
        new_hooks.sort_by(|a, b| {
            (root_pos(&a.spec.root), &a.spec.dir).cmp(&(root_pos(&b.spec.root), &b.spec.dir))
        });
        let registry = Registry::new(new_hooks, skipped, generation);
        let loaded = registry.hooks.iter().map(|h| h.spec.name.clone()).collect();
        self.inner.registry.store(Arc::new(registry));
        loaded
    }

    /// Reload phase 6: retires what the new snapshot no longer holds: a superseded version
    /// finishes its call and hands over; a removed one drains and stops, unless trust refused it
    /// in this scan (`skipped`): those are returned with the reason, to stop at once
    /// ([`revoked`]). Returns the stopped names and the refused versions.
    fn retire(&self, old: &Registry, skipped: &[Skipped]) -> (Vec<String>, Refused) {
        let current = self.snapshot();
        let mut stopped = Vec::new();
        let mut refused = Vec::new();
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
                if let Some(why) = revoked::refusal(skipped, &h.spec.dir) {
                    refused.push((h.clone(), why));
                }
                stopped.push(h.spec.name.clone());
                self.inner.notices.send(
                    "hook_unloaded",
                    json!({"hook": h.spec.name, "dir": h.spec.dir, "queued": h.queue.len()}),
                );
            }
        }
        (stopped, refused)
    }

    /// Reload phase 7: reports what is newly wrong; a rescan does not repeat problems already
    /// reported.
    fn announce_skipped(&self, skipped: &[Skipped], old_skipped: &[Skipped]) {
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
    }

    /// Where hooks' workers ask for a reload (a hook's files changed under a worker that must
    /// start a process: its events wait for the new version). The first call starts the task
    /// that serves the requests; it holds the host weakly and ends with it.
    fn reloader(&self) -> Reloader {
        let init = || {
            let (reloader, mut requests) = Reloader::channel();
            let host = Arc::downgrade(&self.inner);
            tokio::spawn(async move {
                while requests.recv().await.is_some() {
                    let Some(inner) = host.upgrade() else { break };
                    let host = Host { inner };
                    if host.is_draining() {
                        break;
                    }
                    tracing::info!("reloading: a hook's files changed under its worker");
                    host.reload().await;
                }
            });
            reloader
        };
        self.inner.reloader.get_or_init(init).clone()
    }

    /// Starts (once) the task that records every loaded hook's counters into its history every
    /// [`crate::hook::history::TICK`] (issue 50); it ends when the host is gone.
    fn start_history_ticker(&self) {
        if self.inner.history_ticker.set(()).is_err() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        // Just before each mark of the wall clock's ten seconds, so that what a minute saw is
        // recorded in that minute, not split with the next (issue 60 row 6); once now too.
        let first = crate::hook::history::to_next_tick(std::time::SystemTime::now());
        self.record_history();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now() + first;
            let mut every = tokio::time::interval_at(start, crate::hook::history::TICK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                every.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                Host { inner }.record_history();
            }
        });
    }

    /// Records every loaded hook's counters now into its history.
    fn record_history(&self) {
        let now = std::time::SystemTime::now();
        let received = self.events_received();
        for h in &self.snapshot().hooks {
            let totals = h.stats.totals(received);
            h.stats
                .history
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .tick(now, totals);
        }
    }

    /// The counters of a hook named `name` that no loaded version and no retired version still
    /// running uses: a new hook of that name goes on with them.
    fn resting_stats(&self, name: &str) -> Option<Arc<HookStats>> {
        let current = self.snapshot();
        let running: Vec<Arc<HookStats>> = self
            .inner
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|h| !h.is_finished())
            .map(|h| h.stats.clone())
            .collect();
        self.ledger().resting(name, |s| {
            current.hooks.iter().any(|h| Arc::ptr_eq(&h.stats, s))
                || running.iter().any(|r| Arc::ptr_eq(r, s))
        })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.inner.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where every event offered to each hook name went so far, over the host's whole life.
    pub fn accounts(&self) -> std::collections::BTreeMap<String, Tally> {
        self.ledger().by_name()
    }

    /// Starts the fork server of the default interpreter before the first load needs it (the
    /// service calls this as it starts, so the interpreter's start overlaps arming the watch and
    /// the scan); see [`Host::stop_unused_fork_server`].
    pub(crate) async fn prestart_fork_server(&self) {
        let config = &self.inner.config;
        handler::python::prestart_fork_server(
            &config.python,
            &config.runtime_dir,
            config.worker_priority.resolved(),
            config.sandbox_default == crate::sandbox::DefaultSandbox::Strict,
        )
        .await;
    }

    /// What the scan calls with each hook it finds: the first confined Python hook of an
    /// interpreter starts that interpreter's confined fork server at once, beside the default
    /// one started as the service started, instead of after the scan when its first worker
    /// asks (issue 46: a strict hook's start-up waited for it).
    fn confined_fork_server_ahead(&self) -> scan::OnFound {
        let host = self.clone();
        let asked = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
        Arc::new(move |spec: &HookSpec| {
            let config = &host.inner.config;
            let confined = spec.kind == crate::discovery::HandlerKind::Python
                && !spec.placement.in_gateway()
                && crate::sandbox::effective(
                    spec.manifest.sandbox.as_ref(),
                    config.sandbox_default,
                )
                .grants
                .is_some()
                && handler::python::zygote::needs_fresh_process(&spec.manifest.env).is_none();
            if !confined {
                return;
            }
            let python = handler::python_of(spec, &config.python);
            let first = asked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(python.clone());
            if first {
                let (runtime_dir, priority) = (
                    config.runtime_dir.clone(),
                    config.worker_priority.resolved(),
                );
                tokio::spawn(async move {
                    handler::python::prestart_fork_server(&python, &runtime_dir, priority, true)
                        .await;
                });
            }
        })
    }

    /// The first load, once its scan is done: when none of `found` forks its workers from the
    /// fork server [`Host::prestart_fork_server`] started (every Python hook confined, or none),
    /// stops it at once, even while it starts: a CPU for the fork server the hooks do need.
    fn stop_unneeded_fork_server(&self, found: &[HookSpec]) {
        let config = &self.inner.config;
        let ahead_confined = config.sandbox_default == crate::sandbox::DefaultSandbox::Strict;
        let needed = found.iter().any(|spec| {
            spec.kind == crate::discovery::HandlerKind::Python
                && !spec.placement.in_gateway()
                && handler::python_of(spec, &config.python) == config.python
                && crate::sandbox::effective(spec.manifest.sandbox.as_ref(), config.sandbox_default)
                    .grants
                    .is_some()
                    == ahead_confined
        });
        if !needed {
            handler::python::zygote::stop_unneeded(&config.python, ahead_confined);
        }
    }

    /// After the first load: stops the fork server [`Host::prestart_fork_server`] started if no
    /// hook forked a worker from it (no Python hook, or none on the default interpreter). Holds
    /// the reload lock, so no worker is being asked of it meanwhile.
    pub(crate) async fn stop_unused_fork_server(&self) {
        let _guard = self.inner.reload_lock.lock().await;
        let config = &self.inner.config;
        handler::python::zygote::stop_if_unused(
            &config.python,
            config.sandbox_default == crate::sandbox::DefaultSandbox::Strict,
        );
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

/// `o` as the outcome of hook `hook` in a collect answer.
fn hook_outcome(hook: String, o: CallOutcome) -> HookOutcome {
    HookOutcome {
        hook,
        duration: (!o.duration.is_zero()).then_some(o.duration),
        result: o.result,
    }
}

/// A call's outcome as its waiter saw it: what the hook reported, or why nothing came.
fn outcome_within(
    waited: Result<Result<CallOutcome, oneshot::error::RecvError>, tokio::time::error::Elapsed>,
    timeout: Duration,
) -> CallOutcome {
    match waited {
        Ok(Ok(o)) => o,
        // The job went with its hook's stop, unanswered ([`crate::hook::NotRun::Stopped`]).
        Ok(Err(_)) => CallOutcome {
            not_run: Some(crate::hook::NotRun::Stopped),
            ..CallOutcome::failed("the hook stopped before handling the event")
        },
        Err(_) => CallOutcome::failed(format!(
            "no result within the deadline of {}",
            crate::time::fmt_duration(timeout)
        )),
    }
}

#[cfg(test)]
mod ledger_tests {
    use super::*;

    /// Issue 56 (suspected): the ledger kept a sum per removed hook name ever seen; beyond
    /// [`FOLDED`] names the sums go into one, and nothing is lost from the totals.
    #[test]
    fn removed_names_beyond_the_bound_are_summed_together() {
        let mut ledger = Ledger::default();
        let n = FOLDED + RESTING + 10;
        for i in 0..n {
            let stats = Arc::new(crate::hook::HookStats::default());
            stats
                .accepted
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            ledger.live.push((format!("h{i}"), stats));
        }
        ledger.fold();
        assert!(ledger.folded.len() <= FOLDED + 1);
        let by_name = ledger.by_name();
        assert_eq!(by_name.values().map(|t| t.accepted).sum::<u64>(), n as u64);
        assert_eq!(
            by_name[OTHER_REMOVED].accepted,
            (n - RESTING - FOLDED) as u64
        );
    }
}
