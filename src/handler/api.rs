//! What every handler kind is built on: the [`Handler`] trait, the [`HandlerContext`] a kind
//! starts from, calls, results, errors and the [`Signals`] a handler shares with its hook's
//! worker. The kinds (`python`, `exec`, `dylib`, `webhook`) import this file; `handler/mod.rs`
//! starts them, so nothing here knows any kind.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;
use tokio::sync::Notify;

use crate::discovery::HookSpec;

/// A boxed, sendable future (the trait must be object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What one invocation produced: a JSON result (`None` for "nothing") or an error.
pub type HandlerResult = Result<Option<Value>, HandlerError>;

/// Where a handler reports the outcome of call `i` of the calls it was given (see
/// [`Handler::call`]).
pub type Report<'a> = dyn FnMut(usize, HandlerResult) + Send + 'a;

/// One event handed to a handler. Name and context are shared with the other hooks the event
/// was queued to.
#[derive(Debug, Clone)]
pub struct Call {
    /// Event name.
    pub event: Arc<str>,
    /// Event context (its JSON text is made once for every hook the event went to).
    pub context: Arc<super::context::Context>,
    /// A fleet lease holder's bound on starting it ([`crate::start_gate`]): a Python worker is
    /// told it and refuses the call past it.
    pub gate: Option<Arc<crate::start_gate::StartGate>>,
}

/// What a hook's worker ([`crate::hook`]) and its handler share, for one version of the hook:
/// the handler says when it restarted a process or is stuck in a call it cannot interrupt; the
/// worker says when a newer version of the hook takes over.
#[derive(Debug, Default)]
pub struct Signals {
    /// Worker processes (re)started after the first start.
    restarts: AtomicU64,
    /// A call past its timeout that cannot be interrupted is still running.
    stuck: AtomicBool,
    /// A newer version of the hook takes over its queue.
    superseded: AtomicBool,
    /// Wakes whoever waits for `superseded`.
    supersede_notify: Notify,
    /// How the handler's current process was started (`forked`, `fresh`) and why, for `list`.
    start: std::sync::Mutex<Option<(String, String)>>,
    /// The handler's process, raised while a collect waits for the hook (issue 33).
    pub boost: Arc<crate::priority::BoostCell>,
}

impl Signals {
    /// The signals of a hook's next version: its own, but the boost cell of `prev` (a collect
    /// that waits across a reload raises the new version's process too; issue 47).
    pub fn sharing_boost(prev: &Signals) -> Self {
        Self {
            boost: prev.boost.clone(),
            ..Self::default()
        }
    }

    /// Counts one process restart.
    pub fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Process restarts so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Marks (or clears) a call that exceeded its timeout and cannot be interrupted.
    pub fn set_stuck(&self, stuck: bool) {
        self.stuck.store(stuck, Ordering::Relaxed);
    }

    /// True while such a call runs.
    pub fn stuck(&self) -> bool {
        self.stuck.load(Ordering::Relaxed)
    }

    /// A newer version takes over: the handler finishes what it is doing, starts nothing new.
    pub fn supersede(&self) {
        self.superseded.store(true, Ordering::SeqCst);
        self.supersede_notify.notify_waiters();
        self.supersede_notify.notify_one();
    }

    /// Records how the handler's process was started (`forked` / `fresh`) and why.
    pub fn set_start(&self, how: &str, why: String) {
        *self.start.lock().unwrap_or_else(|p| p.into_inner()) = Some((how.to_string(), why));
    }

    /// How the handler's process was started and why, once it was.
    pub fn start(&self) -> Option<(String, String)> {
        self.start.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// True once superseded.
    pub fn superseded(&self) -> bool {
        self.superseded.load(Ordering::SeqCst)
    }

    /// Returns when the hook is superseded (at once if it already is).
    pub async fn wait_superseded(&self) {
        loop {
            let notified = self.supersede_notify.notified();
            if self.superseded() {
                return;
            }
            notified.await;
        }
    }
}

/// A failed invocation or start, worded for an operator.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum HandlerError {
    /// The handler ran and reported an error (a Python exception, a non-zero exit...).
    #[error("{0}")]
    Failed(String),
    /// The handler process died or broke its protocol; it will be restarted.
    #[error("{0}")]
    Crashed(String),
    /// The handler could not be started or loaded.
    #[error("{0}")]
    Load(String),
    /// The call exceeded the hook's timeout (its process was killed, its request cancelled, or,
    /// for a library call that cannot be interrupted, it was abandoned).
    #[error("timed out after {}", crate::time::fmt_duration(*.0))]
    TimedOut(Duration),
    /// The call was never started (the hook was reloaded while an earlier call was stuck); the
    /// event goes back to the front of the hook's queue for the new version.
    #[error("not started")]
    NotStarted,
    /// The call was not started because its start-by bound had passed when its turn came (a
    /// fleet lease holder's, [`crate::start_gate`]): the lease may be another worker's now.
    #[error("not started: its fleet lease's start-by bound had passed")]
    Expired,
    /// The call was not started because the hook's files changed since this version was loaded
    /// (a process may start only from the files it was loaded with): the event waits for the
    /// version being loaded from the new files.
    #[error("{0}")]
    Changed(String),
}

impl From<crate::trust::prestart::StartRefused> for HandlerError {
    fn from(e: crate::trust::prestart::StartRefused) -> Self {
        if e.changed {
            HandlerError::Changed(e.to_string())
        } else {
            HandlerError::Load(e.to_string())
        }
    }
}

/// Runs `call` under `timeout`: past it the future is dropped (a child process with it) and the
/// call is [`HandlerError::TimedOut`].
pub async fn within(timeout: Duration, call: impl Future<Output = HandlerResult>) -> HandlerResult {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or(Err(HandlerError::TimedOut(timeout)))
}

/// The `call` of a kind whose calls are independent (executable, webhook): each call runs
/// `one(call)` under `timeout` (past it the call is dropped, which cancels it), with
/// `concurrency` independent slots: further queued calls come from `feed` as slots free up, and
/// each call is reported as it completes.
pub async fn call_each<F, Fut>(
    calls: Vec<Call>,
    feed: &mut dyn Feed,
    timeout: Duration,
    concurrency: usize,
    report: &mut Report<'_>,
    one: F,
) where
    F: Fn(Call) -> Fut,
    Fut: Future<Output = HandlerResult>,
{
    let run = |call: Call| within(timeout, one(call));
    run_slots(calls, concurrency, feed, run, report).await;
}

/// More queued calls for a handler that takes them as its slots free up (`concurrency: N`): the
/// hook's worker hands out its queue, numbering the calls after those passed to
/// [`Handler::call_fed`].
pub trait Feed: Send {
    /// A queued call, without waiting; `None` when none waits or the hook was superseded.
    fn try_next(&mut self) -> Option<(usize, Call)>;
    /// The next queued call, waiting for one; `None` once the hook stops or is superseded.
    fn next(&mut self) -> BoxFuture<'_, Option<(usize, Call)>>;
}

/// A feed with nothing more: a handler given it runs exactly the calls it was passed.
#[derive(Debug, Default)]
pub struct NoFeed;

impl Feed for NoFeed {
    fn try_next(&mut self) -> Option<(usize, Call)> {
        None
    }

    fn next(&mut self) -> BoxFuture<'_, Option<(usize, Call)>> {
        Box::pin(async { None })
    }
}

/// Runs `calls` (numbered `0..`) and then what `feed` brings, with at most `limit` in flight,
/// on the calling task, reporting each through `report` as soon as it completes: the
/// `concurrency:` of a hook as `limit` independent slots (a new call starts as soon as any slot
/// frees). Returns when every slot is free and nothing is queued. With `limit` 1 the calls run
/// one after the other, in order.
pub async fn run_slots<F, Fut>(
    calls: Vec<Call>,
    limit: usize,
    feed: &mut dyn Feed,
    mut run: F,
    report: &mut Report<'_>,
) where
    F: FnMut(Call) -> Fut,
    Fut: Future<Output = HandlerResult>,
{
    use std::task::Poll;
    enum Next {
        Done(usize, usize, HandlerResult),
        Fed(Option<(usize, Call)>),
    }
    let limit = limit.max(1);
    let mut given = calls.into_iter().enumerate();
    let mut fed_out = false;
    let mut running: Vec<(usize, Pin<Box<Fut>>)> = Vec::with_capacity(limit);
    loop {
        while running.len() < limit {
            let next = match given.next() {
                Some(c) => Some(c),
                None if !fed_out => feed.try_next(),
                None => None,
            };
            let Some((i, call)) = next else { break };
            running.push((i, Box::pin(run(call))));
        }
        if running.is_empty() {
            return;
        }
        let wait_feed = running.len() < limit && !fed_out;
        let next = {
            let mut fed = wait_feed.then(|| feed.next());
            std::future::poll_fn(|cx| {
                for (slot, (i, fut)) in running.iter_mut().enumerate() {
                    if let Poll::Ready(r) = fut.as_mut().poll(cx) {
                        return Poll::Ready(Next::Done(slot, *i, r));
                    }
                }
                if let Some(f) = fed.as_mut()
                    && let Poll::Ready(c) = f.as_mut().poll(cx)
                {
                    return Poll::Ready(Next::Fed(c));
                }
                Poll::Pending
            })
            .await
        };
        match next {
            Next::Done(slot, i, result) => {
                running.swap_remove(slot);
                report(i, result);
            }
            Next::Fed(Some((i, call))) => running.push((i, Box::pin(run(call)))),
            Next::Fed(None) => fed_out = true,
        }
    }
}

/// A handler's textual answer as a result: empty or `null` is no result, anything else must
/// be one JSON value. `what` names the source and `hint` says how to fix a bad answer.
pub fn parse_json_result(text: &str, what: &str, hint: &str) -> HandlerResult {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Null) => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            let snippet: String = text.chars().take(120).collect();
            Err(HandlerError::Failed(format!(
                "{what} is not one JSON value ({e}): {snippet:?}{hint}"
            )))
        }
    }
}

/// Everything a handler needs to start, independent of the manifest format.
#[derive(Debug, Clone)]
pub struct HandlerContext {
    /// Hook name (logs, environment).
    pub name: String,
    /// Hook directory.
    pub dir: PathBuf,
    /// Working directory of the hook's processes: the service's own (`cwd: service`, the
    /// default, as inside the gateway) or the hook directory (`cwd: hook`).
    pub cwd: PathBuf,
    /// The handler file.
    pub handler_path: Option<PathBuf>,
    /// Interpreter for Python handlers.
    pub python: String,
    /// Why that interpreter (for the hint on a missing module).
    pub python_why: String,
    /// Environment added to the host's: HERMES_HOME, HERMES_HOOK_NAME, HERMES_HOOK_DIR, `env:`.
    pub env: BTreeMap<String, String>,
    /// Time allowed per invocation (and for a Python worker to start).
    pub timeout: Duration,
    /// Calls in flight at once (`concurrency:`; executable and webhook hooks).
    pub concurrency: usize,
    /// Where the embedded Python runner is written.
    pub runtime_dir: PathBuf,
    /// Shared with the hook's worker (restarts, stuck, superseded).
    pub signals: Arc<Signals>,
    /// The files that can run as this version loaded them: [`crate::trust::prestart::check`]
    /// compares the tree with them before every process start.
    pub files: Arc<crate::trust::files::RunFiles>,
    /// CPU priority of the hook's processes (worker, executable).
    pub priority: crate::priority::Priority,
    /// The service's default priority for hook processes: the Python fork server's.
    pub default_priority: crate::priority::Priority,
    /// What the hook's processes may do (`sandbox:`, or the service's default); `None`: not
    /// confined.
    pub sandbox: Option<Arc<crate::sandbox::Policy>>,
    /// The hook's own threads for the checks of its files and its process starts (issue 47).
    pub starter: Arc<super::starter::Starter>,
}

impl HandlerContext {
    /// Takes `default` (the service's `--worker-nice` / `--worker-sched`) as the priority, with
    /// the hook's own `nice:` / `sched:` over it.
    pub fn with_default_priority(
        mut self,
        default: crate::priority::Priority,
        spec: &HookSpec,
    ) -> Self {
        self.priority = default.overridden(spec.manifest.nice, spec.manifest.sched);
        self.default_priority = default;
        self
    }

    /// Builds the context for `spec` under the host settings.
    pub fn new(
        spec: &HookSpec,
        hermes_home: &std::path::Path,
        default_python: &str,
        runtime_dir: PathBuf,
    ) -> Self {
        let mut env = BTreeMap::new();
        env.insert("HERMES_HOME".to_string(), hermes_home.display().to_string());
        env.insert("HERMES_HOOK_NAME".to_string(), spec.name.clone());
        env.insert(
            "HERMES_HOOK_DIR".to_string(),
            spec.dir.display().to_string(),
        );
        for (k, v) in &spec.manifest.env {
            env.insert(k.clone(), v.clone());
        }
        let cwd = match spec.manifest.cwd {
            crate::manifest::Cwd::Hook => spec.dir.clone(),
            crate::manifest::Cwd::Service => {
                std::env::current_dir().unwrap_or_else(|_| spec.dir.clone())
            }
        };
        Self {
            name: spec.name.clone(),
            dir: spec.dir.clone(),
            cwd,
            handler_path: spec.handler_path.clone(),
            python: python_of(spec, default_python),
            python_why: crate::interpreter::for_hook(
                spec.manifest.python.as_deref(),
                default_python,
                hermes_home,
            )
            .why,
            env,
            timeout: spec.manifest.timeout,
            concurrency: spec.manifest.concurrency.max(1),
            runtime_dir,
            signals: Arc::new(Signals::default()),
            files: spec.files.clone(),
            priority: crate::priority::Priority::default()
                .overridden(spec.manifest.nice, spec.manifest.sched),
            default_priority: crate::priority::Priority::default(),
            sandbox: None,
            starter: Arc::new(super::starter::Starter::new(
                &spec.name,
                spec.manifest.concurrency,
            )),
        }
    }

    /// Takes the hook's sandbox (its `sandbox:`, else `default`): the policy its processes are
    /// held to, and `HERMES_HOOK_STATE_DIR` naming its private state directory.
    pub fn with_sandbox(
        mut self,
        default: crate::sandbox::DefaultSandbox,
        spec: &HookSpec,
        hermes_home: &std::path::Path,
    ) -> Self {
        self.sandbox = super::hook_sandbox::policy_of(spec, default, hermes_home).map(Arc::new);
        if let Some(p) = &self.sandbox {
            self.env.insert(
                crate::sandbox::policy::STATE_DIR_ENV.to_string(),
                p.state_dir.display().to_string(),
            );
        }
        self
    }
}

/// The interpreter `spec`'s Python processes run: its `python:`, else `default_python`.
pub fn python_of(spec: &HookSpec, default_python: &str) -> String {
    match spec.manifest.python.as_deref() {
        // A relative path names a file of the hook, as trust checks it: resolved against the
        // hook directory, not the working directory of whoever starts it.
        Some(p) if p.contains('/') && !std::path::Path::new(p).is_absolute() => {
            spec.dir.join(p).display().to_string()
        }
        Some(p) => p.to_string(),
        None => default_python.to_string(),
    }
}

impl HandlerContext {
    /// Checks the hook's tree before a process starts ([`crate::trust::prestart`]) on the
    /// service's threads for hooks' files ([`crate::file_lanes`], one check per hook at a time),
    /// within [`super::starter::CHECK_DEADLINE`]: a tree that stalls refuses this start and
    /// delays no other hook's.
    pub async fn check_files(&self) -> Result<(), HandlerError> {
        let (files, hook) = (self.files.clone(), self.name.clone());
        crate::file_lanes::run(
            &self.dir.to_string_lossy(),
            "the check of the hook's files",
            super::starter::CHECK_DEADLINE,
            move || crate::trust::prestart::check_blocking(&files, &hook),
        )
        .await
        .map_err(|e| HandlerError::Load(format!("not started: {e}")))?
        .map_err(HandlerError::from)
    }

    /// The environment a process of this hook gets on top of the service's, read now:
    /// `$HERMES_HOME/.env` as the gateway loads it, then [`HandlerContext::env`]
    /// ([`crate::dotenv`]).
    pub fn process_env(&self) -> BTreeMap<String, String> {
        let home = self.env.get("HERMES_HOME").map(std::path::Path::new);
        crate::dotenv::for_process(home, &self.env)
    }

    /// For a confined hook, the whole environment of its processes (the service's, then
    /// [`HandlerContext::process_env`]) holding only what its sandbox allows; `None` when it is
    /// not confined (its processes inherit the service's).
    pub fn confined_env(&self) -> Option<BTreeMap<String, String>> {
        self.sandbox.as_ref()?;
        self.confine_env(self.process_env())
    }

    /// [`HandlerContext::confined_env`] with `own` as [`HandlerContext::process_env`].
    pub fn confine_env(&self, own: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
        let policy = self.sandbox.as_ref()?;
        let mut all: BTreeMap<String, String> = std::env::vars().collect();
        all.extend(own);
        Some(policy.filter_env(all))
    }
}

/// One handler kind: readiness, calls, shutdown.
///
/// The hook's worker takes up to [`Handler::max_calls`] queued events, waits for
/// [`Handler::ready`], hands them to [`Handler::call`] and counts each outcome as the handler
/// reports it. Everything specific to a kind stays inside it: the hook's timeout (a Python
/// worker killed and replaced, an executable's process group killed, a webhook request
/// cancelled, a library call abandoned while the hook shows `stuck`), restarts after a crash,
/// batching (a library takes a batch in one hand-off) and concurrency.
pub trait Handler: Send {
    /// Most queued events one [`Handler::call`] takes. The default, 1, is one at a time.
    fn max_calls(&self) -> usize {
        1
    }

    /// Gets ready for the next call: e.g. restarts a crashed worker after its backoff. The default
    /// has nothing to prepare.
    fn ready(&mut self) -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async { Ok(()) })
    }

    /// Runs `calls` (at most [`Handler::max_calls`]), each under the hook's timeout, in order
    /// unless the kind allows concurrency, and reports every call exactly once through `report`
    /// (by its index), as soon as its outcome is known. A call that was never started is
    /// reported `HandlerError::NotStarted`.
    fn call<'a>(&'a mut self, calls: Vec<Call>, report: &'a mut Report<'_>) -> BoxFuture<'a, ()>;

    /// [`Handler::call`] for a kind with independent slots (`concurrency: N`) or a pipelined
    /// one (a Python worker's window): it may also take further queued calls from `feed` while
    /// others run, and report them by the index the feed gave. The default runs `calls` only.
    fn call_fed<'a>(
        &'a mut self,
        calls: Vec<Call>,
        feed: &'a mut dyn Feed,
        report: &'a mut Report<'_>,
    ) -> BoxFuture<'a, ()> {
        let _ = feed;
        self.call(calls, report)
    }

    /// Stops for good: lets a worker finish pending background work briefly, then kills it.
    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}
