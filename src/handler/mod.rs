//! Handler kinds behind one small trait.
//!
//! A hook's worker ([`crate::dispatch`]) owns one [`Handler`] and calls it for one event at a
//! time, so a handler needs `&mut self` and no locking. Each kind lives in its own file; adding a
//! kind means one new file and one arm in [`start`].

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;

use crate::discovery::{HandlerKind, HookSpec};

pub mod dylib;
pub mod exec;
pub mod process;
pub mod pylog;
pub mod python;
pub mod webhook;

/// A boxed, sendable future (the trait must be object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Results of a batch, in order (see [`Handler::start_batch`]).
pub type BatchResults = tokio::sync::mpsc::Receiver<HandlerResult>;

/// What one invocation produced: a JSON result (`None` for "nothing") or an error.
pub type HandlerResult = Result<Option<Value>, HandlerError>;

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
    /// Hook directory (working directory of processes).
    pub dir: PathBuf,
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
    /// Where the embedded Python runner is written.
    pub runtime_dir: PathBuf,
    /// URL, secret variable and per-attempt timeout of a webhook hook.
    pub webhook: Option<webhook::WebhookTarget>,
}

impl HandlerContext {
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
        Self {
            name: spec.name.clone(),
            dir: spec.dir.clone(),
            handler_path: spec.handler_path.clone(),
            python: spec
                .manifest
                .python
                .clone()
                .unwrap_or_else(|| default_python.to_string()),
            python_why: crate::interpreter::for_hook(
                spec.manifest.python.as_deref(),
                default_python,
                hermes_home,
            )
            .why,
            env,
            timeout: spec.manifest.timeout,
            runtime_dir,
            webhook: webhook::WebhookTarget::of(spec),
        }
    }
}

/// One handler kind. The dispatcher calls `ready`, then `call` under the hook's timeout; when the
/// timeout fires the `call` future is dropped and `abandon` runs.
pub trait Handler: Send {
    /// Gets ready for the next call: e.g. restarts a crashed worker after its backoff. The default
    /// has nothing to prepare.
    fn ready(&mut self) -> BoxFuture<'_, Result<(), HandlerError>> {
        Box::pin(async { Ok(()) })
    }

    /// Runs the handler for one event.
    fn call<'a>(&'a mut self, event: &'a str, context: &'a Value) -> BoxFuture<'a, HandlerResult>;

    /// Cleans up after a call that exceeded the timeout and was dropped (kill the worker...).
    fn abandon(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Stops for good: lets a worker finish pending background work briefly, then kills it.
    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// How many times a worker process was restarted.
    fn restarts(&self) -> u64 {
        0
    }

    /// Most queued events this handler takes per [`Handler::start_batch`]; 1 (the default)
    /// means one [`Handler::call`] at a time.
    fn batch_limit(&self) -> usize {
        1
    }

    /// Starts the calls for `events`, in order, at once; their results arrive on the returned
    /// channel one by one, in the same order. Only used when [`Handler::batch_limit`] is above 1.
    fn start_batch(
        &mut self,
        events: Vec<(Arc<str>, Arc<Value>)>,
    ) -> Result<BatchResults, HandlerError> {
        let _ = events;
        Err(HandlerError::Failed(
            "this handler kind takes one event at a time".into(),
        ))
    }

    /// The calls of the current batch that have not started are not to be made.
    fn cancel_batch(&mut self) {}

    /// True while a call abandoned at the timeout is still running and cannot be interrupted (a
    /// dynamic library): the worker shows the hook as `stuck` and waits in `ready` for that call
    /// to return before making another.
    fn stuck(&self) -> bool {
        false
    }
}

/// Starts the handler for `spec`: for Python this spawns the worker and waits for its ready
/// handshake, so import errors and a missing `handle` surface here.
pub async fn start(
    kind: HandlerKind,
    ctx: HandlerContext,
) -> Result<Box<dyn Handler>, HandlerError> {
    match kind {
        HandlerKind::Python => Ok(Box::new(python::PythonHandler::start(ctx).await?)),
        HandlerKind::Exec => Ok(Box::new(exec::ExecHandler::new(ctx)?)),
        HandlerKind::Dylib => Ok(Box::new(dylib::DylibHandler::start(ctx).await?)),
        HandlerKind::Webhook => Ok(Box::new(webhook::WebhookHandler::new(&ctx)?)),
    }
}
