//! hermes-hooks: hosts the event hooks of a messaging gateway off the gateway's message path.
//!
//! # Layout
//! Top-down: each module uses only modules below it (`tests/it/modules.rs` checks that no
//! import cycle exists, between files or between folders, and that no function is over 120
//! lines). `docs/architecture.md` describes the layers, the path of an event, the path of a
//! HOOK.yaml and where each handler kind lives.
//! - [`cli`]: the command-line interface, one file per command; `main.rs` only calls
//!   [`cli::main`]; `enable`/`disable`'s work is `set_enabled` (the service's
//!   enable/disable endpoints share it).
//! - [`service`]: the service's lifecycle: API server, watcher, signals, first load, drain;
//!   usable without the CLI ([`service::run`]).
//! - [`server`]: the HTTP API (axum), thin over [`Host`].
//! - `metrics`: OpenMetrics exposition of the host's counters (prometheus-client).
//! - `client`: the CLI's HTTP client (hyper, TCP or Unix socket) for `emit` and `list --live`.
//! - `watch`: hot reload: watches the roots, debounces, rescans.
//! - `host`: the API everything else drives: `emit`, `emit_collect`, `reload`, `shutdown`;
//!   `host/plan.rs` is reload as a pure value, `host/info.rs` the `/v1/hooks` view.
//! - `registry`: the immutable snapshot of loaded hooks, swapped atomically on reload.
//! - `hook`: a loaded hook (`hook::LoadedHook`): its bounded queue (`hook/queue.rs`),
//!   counters (`hook/stats.rs`) and worker task (`hook/worker.rs`), overflow accounting.
//! - `handler`: the four handler kinds behind one trait: `handler::python` (a persistent
//!   Python worker, its fork server, `runner.py` and the pipe protocol), `handler::exec` (a process per event), `handler::dylib` (a dynamic
//!   library, C ABI v1), `handler::webhook` (an HTTP endpoint); `handler::process` is their
//!   shared child-process plumbing.
//! - `ingateway`: hooks that run inside the gateway: what `list`/`check` say about them.
//! - `discovery`: hook roots -> [`HookSpec`]s plus a report of what did not load.
//! - [`config_hooks`]: the shell hooks of config.yaml's `hooks:` block, written out as hooks
//!   under `$HERMES_HOME/config-hooks/` before each scan (issue 49).
//! - `placement`: `runs: service | gateway | auto`, decided by reading the hook's source.
//! - `interpreter`: which Python runs a hook's handler.py, and why.
//! - `trust`: which hooks may run: `trust::policy` (permissions, `--trust`),
//!   `trust::approvals` (`hooks-trust.json`), `trust::edit` (the `enabled:` editor),
//!   `trust::files` (what can run, the tree's
//!   permissions), `trust::prestart` (the check before every process start).
//! - `manifest`: the HOOK.yaml schema and its validation.
//! - [`priority`]: the CPU priority of hook processes (`nice`, `SCHED_IDLE`).
//! - `pattern`: `events:` patterns compiled with globset; exact before wildcard.
//! - [`events`]: event names, their validation, the catalogues of the gateway's and the
//!   agent's events.
//! - `sink`: the dispatch interface: local queues or (feature `fleet`) NATS JetStream.
//! - `fleet` (feature `fleet`): edge sink, workers, collect, fleet view, dead letters.
//! - `scaffold`: `new NAME --kind ...`.
//! - `package`: hook packages: `install`, `update`, `remove` and `$HERMES_HOME/hooks.lock`.
//! - `notices`: the JSON event stream of `serve --output json`.
//! - `kind`: one descriptor per handler kind (its files, Python or not, what runs locally, what
//!   an approval covers), consulted by layout, discovery and trust instead of matching the kind.
//! - Leaves shared by several of the above: `layout` (the layout of a hook directory and
//!   `$HERMES_HOME`), `atomic` (atomic file writes), `time` (RFC 3339 timestamps),
//!   `text` (error texts capped, URLs redacted), `diff` (a line diff for reviews), `proof` (the service's proof that it
//!   knows the API token, `POST /v1/proof`), `caller` (whether an API connection comes from
//!   one of the service's own hook processes), `connections` (how many API connections, from
//!   whom, for how long; the open-file limit), `sock_diag` (one TCP socket's uid and inode, from
//!   the kernel's netlink lookup).
//!
//! # The path of an event
//! receive (`POST /v1/events` or [`Host::emit`]) -> validate the name and context ->
//! load the registry snapshot (a pointer read) -> match every hook's pattern set (exact hooks
//! first, then wildcard hooks, each in discovery order) -> push a job onto each matching hook's
//! bounded queue -> return the count. Later, on the hook's own worker task: pop -> get the
//! handler ready (restart a crashed worker after backoff) -> call it under the hook's timeout ->
//! count the outcome and hand it to whoever waits (`emit_collect`).
#![warn(missing_docs, clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub(crate) mod atomic;
pub(crate) mod caller;
pub mod cli;
pub(crate) mod client;
pub mod config_hooks;
pub mod connections;
pub(crate) mod decision;
pub(crate) mod diff;
pub(crate) mod discovery;
pub(crate) mod dotenv;
pub mod events;
pub(crate) mod file_lanes;
#[cfg(feature = "fleet")]
pub(crate) mod fleet;
pub(crate) mod handler;
pub(crate) mod hook;
pub(crate) mod hook_name;
pub(crate) mod host;
pub(crate) mod ingateway;
pub(crate) mod interpreter;
pub(crate) mod kind;
pub(crate) mod layout;
pub(crate) mod manifest;
pub(crate) mod metrics;
pub(crate) mod notices;
pub(crate) mod package;
pub(crate) mod pattern;
pub(crate) mod placement;
pub mod priority;
pub(crate) mod proof;
pub(crate) mod reaper;
pub(crate) mod registry;
pub(crate) mod request_guard;
pub(crate) mod sandbox;
pub(crate) mod scaffold;
pub mod server;
pub mod service;
pub(crate) mod set_enabled;
pub(crate) mod sink;
pub(crate) mod sock_diag;
pub mod start_gate;
#[cfg(test)]
mod testing;
pub(crate) mod text;
pub(crate) mod time;
pub(crate) mod trust;
pub(crate) mod watch;

pub use discovery::{HandlerKind, HookSpec, SkipCode, Skipped};
pub use hook::Tally;
pub use host::{
    Counters, EmitError, HookInfo, HookOutcome, Host, HostConfig, LastError, LoadReport, QueueInfo,
    ShutdownReport, StatusSource, WorkerStart,
};
pub use trust::{TrustMode, TrustPolicy};

pub use notices::Notices;
pub use priority::{Priority, Sched};
pub use registry::Registry;
pub use sandbox::DefaultSandbox;
pub use server::ApiConfig;
pub use service::{BeforeDrain, Listener, ServiceConfig, ServiceError};
pub use sink::{EventSink, SinkError};

/// Internals the benchmarks and a few integration tests drive directly (not part of the API;
/// may change at any time).
#[doc(hidden)]
pub mod bench_support {
    pub use crate::discovery::discover;
    pub use crate::handler::python::zygote::zygote_pid;
    pub use crate::handler::{BoxFuture, Call, Handler, Report};
    pub use crate::hook::{Job, LoadedHook};

    /// The calling thread's nice value (`crate::priority::own_nice`).
    pub fn own_nice() -> i32 {
        crate::priority::own_nice()
    }

    /// Every (method, path) the router serves (`crate::server::routes`).
    pub fn routes() -> Vec<(&'static str, &'static str)> {
        crate::server::routes()
    }
}
