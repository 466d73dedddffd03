//! The dispatch interface (docs/architecture.md, "The path of an event"): where an accepted event
//! goes. In local mode no sink is installed and the host queues the event to its own per-hook
//! queues ([`crate::host::Host::emit`]); fleet mode installs one that publishes it to NATS
//! JetStream (`crate::fleet::edge`). The HTTP API and the CLI call [`crate::host::Host`], which
//! consults the installed sink; nothing above the host knows which implementation runs.

use std::time::Duration;

use serde_json::Value;

use crate::handler::context::Context;

/// The crate's one boxed future (so that the trait can be used as `dyn EventSink`).
pub use crate::handler::BoxFuture;

/// Why a sink refused an event.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The sink is stopping and takes no new events.
    #[error("the host is shutting down and accepts no new events")]
    ShuttingDown,
    /// The event can never be passed on: larger than the broker takes.
    #[error(
        "the event is {size} bytes as published, over the broker's limit of {limit} bytes: it can never be stored"
    )]
    TooLarge {
        /// Bytes the event takes as published.
        size: usize,
        /// The broker's limit.
        limit: usize,
    },
    /// The sink's buffer is full (the broker is unreachable or slower than the clients): retry
    /// after a moment.
    #[error("the buffer is full ({capacity} events waiting for the broker); retry shortly")]
    Full {
        /// The buffer's capacity.
        capacity: usize,
    },
    /// The broker refused the event for good.
    #[error("the broker refused the event: {0}")]
    Refused(String),
    /// A fleet operation other than accepting an event failed (reading or replaying dead
    /// letters): the broker's error, with what was being done.
    #[error("{0}")]
    Fleet(String),
}

/// What a sink answers for accepted events.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted<T> {
    /// For how many hooks each event was queued (as far as the sink knows).
    pub queued: T,
    /// Fleet mode: `Some(true)` when the broker stored every event before the answer,
    /// `Some(false)` when some wait in the edge's buffer; `None` in local mode.
    pub stored: Option<bool>,
}

impl<T> Accepted<T> {
    /// Local mode: queued, nothing stored anywhere.
    pub fn local(queued: T) -> Self {
        Self {
            queued,
            stored: None,
        }
    }

    /// The answer's `state`: `stored` or `buffered` in fleet mode.
    pub fn state(&self) -> Option<&'static str> {
        self.stored.map(|s| if s { "stored" } else { "buffered" })
    }
}

/// An event id given by the client (`"id"` in the request): in fleet mode it is the broker's
/// de-duplication id, so a client resending after a lost answer is not stored twice.
pub type ClientId = Option<String>;

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

/// Which dead letters to list or replay (fleet mode; `dead list|replay` of the CLI).
#[derive(Debug, Clone, Default)]
pub struct DeadQuery {
    /// Only this hook's.
    pub hook: Option<String>,
    /// Only these sequences of the dead-letter stream (empty: all that match `hook`).
    pub seqs: Vec<u64>,
    /// Listing: at most this many (oldest first).
    pub limit: usize,
}

/// Where accepted events go. Events reach a sink already validated (name checked, context an
/// object) and counted by the host.
pub trait EventSink: Send + Sync {
    /// Takes one event; returns for how many hooks it was queued (as far as the sink knows).
    fn accept(
        &self,
        event: String,
        context: Value,
        id: ClientId,
    ) -> BoxFuture<'_, Result<Accepted<usize>, SinkError>>;
    /// Takes many events at once (`ids` empty or one per event); one count per event, in order.
    fn accept_batch(
        &self,
        events: Vec<(String, Context)>,
        ids: Vec<ClientId>,
    ) -> BoxFuture<'_, Result<Accepted<Vec<usize>>, SinkError>>;
    /// Runs the matching hooks and returns their outcomes in match order, waiting at most
    /// `timeout`.
    fn collect(
        &self,
        event: String,
        context: Value,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<HookOutcome>, SinkError>>;
    /// How long a collect of `event` waits when its caller gives no deadline: the matching
    /// hooks' own timeouts as far as the sink knows them (`None`: the caller's default).
    fn collect_budget(&self, _event: &str) -> Option<Duration> {
        None
    }
    /// What the sink adds to `/v1/hooks`: `{"fleet": {...}, "hooks": [...]}`, or `None`.
    fn status(&self) -> Option<Value>;
    /// `Some(reason)` while events are accepted but cannot be passed on (a broker down).
    fn degraded(&self) -> Option<String>;
    /// Whether this sink keeps dead letters (only the fleet edge does): the API answers
    /// `not_fleet` otherwise.
    fn keeps_dead_letters(&self) -> bool {
        false
    }
    /// The dead letters `query` picks, `{"letters": [...], "more": bool}`; `None` when this
    /// sink keeps none (only the fleet edge does).
    fn dead_letters(&self, _query: DeadQuery) -> Option<BoxFuture<'_, Result<Value, SinkError>>> {
        None
    }
    /// Queues the dead letters `query` picks again for the hooks that failed them and removes
    /// them from the list, `{"replayed": [...]}`; `None` when this sink keeps none.
    fn replay_dead(&self, _query: DeadQuery) -> Option<BoxFuture<'_, Result<Value, SinkError>>> {
        None
    }
}
