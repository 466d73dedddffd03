//! hermes-hooks: hosts the event hooks of a messaging gateway off the gateway's message path.
//!
//! # Layout
//! - [`events`]: event names, their validation, the catalogue of gateway events.
//! - [`pattern`]: `events:` patterns compiled with globset; exact before wildcard.
//! - [`manifest`]: the HOOK.yaml schema and its validation.
//! - [`discovery`]: hook roots -> [`discovery::HookSpec`]s plus a report of what did not load.
//! - [`registry`]: the immutable snapshot of loaded hooks, swapped atomically on reload.
//! - [`dispatch`]: per-hook bounded queues and workers, overflow accounting.
//! - [`handler`]: the handler kinds behind one trait (Python workers, executables).
//! - [`host`]: the API everything else drives: `emit`, `emit_collect`, `reload`, `shutdown`.
//! - [`server`]: the HTTP API (axum), thin over [`host::Host`].
//! - [`sink`]: the dispatch interface: local queues or (feature `fleet`) NATS JetStream.
//! - `fleet` (feature `fleet`): edge sink, workers, collect, fleet view, dead letters.
//! - [`metrics`]: Prometheus text.
//! - [`notices`]: the JSON event stream of `serve --output json`.
//! - [`scaffold`]: `new NAME --kind ...`.
//! - [`watch`]: hot reload: watches the roots, debounces, rescans.
//! - [`client`]: the tiny HTTP client the CLI's `emit` uses.
//! - [`cli`]: the command-line interface; `main.rs` only calls [`cli::main`].
//!
//! # The path of an event
//! receive (`POST /v1/events` or [`host::Host::emit`]) -> validate the name and context ->
//! load the registry snapshot (a pointer read) -> match every hook's pattern set (exact hooks
//! first, then wildcard hooks, each in discovery order) -> push a job onto each matching hook's
//! bounded queue -> return the count. Later, on the hook's own worker task: pop -> get the
//! handler ready (restart a crashed worker after backoff) -> call it under the hook's timeout ->
//! count the outcome and hand it to whoever waits (`emit_collect`).
#![warn(missing_docs, clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod cli;
pub mod client;
pub mod discovery;
pub mod dispatch;
pub mod events;
#[cfg(feature = "fleet")]
pub mod fleet;
pub mod handler;
pub mod host;
pub mod manifest;
pub mod metrics;
pub mod notices;
pub mod pattern;
pub mod registry;
pub mod scaffold;
pub mod server;
pub mod sink;
pub mod time;
pub mod trust;
pub mod watch;

pub use discovery::{HandlerKind, HookSpec, SkipCode, Skipped};
pub use host::{EmitError, HookOutcome, Host, HostConfig, LoadReport};
pub use registry::Registry;
