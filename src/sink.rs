//! The dispatch interface (docs/architecture.md, "The path of an event"): where an accepted event
//! goes. In local mode no sink is installed and the host queues the event to its own per-hook
//! queues ([`crate::host::Host::emit`]); fleet mode installs one that publishes it to NATS
//! JetStream (`crate::fleet::edge`). The HTTP API and the CLI call [`crate::host::Host`], which
//! consults the installed sink; nothing above the host knows which implementation runs.

use std::time::Duration;

use serde_json::Value;

/// The crate's one boxed future (so that the trait can be used as `dyn EventSink`).
pub use crate::handler::BoxFuture;

/// Why a sink refused an event.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The sink is stopping and takes no new events.
    #[error("the host is shutting down and accepts no new events")]
    ShuttingDown,
}

/// One hook's part in a collect.
#[derive(Debug, Clone)]
pub struct HookOutcome {
    /// Hook name.
    pub hook: String,
    /// Its result (`None` when it returned nothing) or its error.
    pub result: Result<Option<Value>, String>,
    /// Time in the handler, when it ran.
    pub duration: Option<Duration>,
}

/// Where accepted events go. Events reach a sink already validated (name checked, context an
/// object) and counted by the host.
pub trait EventSink: Send + Sync {
    /// Takes one event; returns for how many hooks it was queued (as far as the sink knows).
    fn accept(&self, event: String, context: Value) -> BoxFuture<'_, Result<usize, SinkError>>;
    /// Takes many events at once; one count per event, in order.
    fn accept_batch(
        &self,
        events: Vec<(String, Value)>,
    ) -> BoxFuture<'_, Result<Vec<usize>, SinkError>>;
    /// Runs the matching hooks and returns their outcomes in match order, waiting at most
    /// `timeout`.
    fn collect(
        &self,
        event: String,
        context: Value,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<HookOutcome>, SinkError>>;
    /// What the sink adds to `/v1/hooks`: `{"fleet": {...}, "hooks": [...]}`, or `None`.
    fn status(&self) -> Option<Value>;
    /// `Some(reason)` while events are accepted but cannot be passed on (a broker down).
    fn degraded(&self) -> Option<String>;
}
