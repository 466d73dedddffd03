//! The service's lifecycle, usable without the CLI: [`run`] takes a bound [`Listener`], a
//! [`Host`] and a shutdown future, and owns everything between: the HTTP API (axum, graceful
//! shutdown), the watcher on the hook roots, SIGHUP reloads and SIGINT/SIGTERM stops (when
//! [`ServiceConfig::signals`] is on), the first load, the drain and the `host_start` /
//! `host_stop` notices.
//!
//! Signal handlers are installed before anything else, so a SIGHUP while the first load runs
//! reloads once that load is done (instead of killing the process), and a SIGTERM then still
//! drains and reports `host_stop`.
//!
//! ```no_run
//! # async fn demo(config: hermes_hooks::HostConfig) -> Result<(), Box<dyn std::error::Error>> {
//! use hermes_hooks::service::{self, Listener, ServiceConfig};
//! let listener = Listener::Tcp(tokio::net::TcpListener::bind("127.0.0.1:0").await?);
//! let host = hermes_hooks::Host::new(config);
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let service = tokio::spawn(service::run(listener, host, ServiceConfig::default(), async {
//!     let _ = stopped.await;
//! }));
//! // ... later:
//! let _ = stop.send(());
//! let report = service.await??;
//! println!("{} event(s) undelivered", report.undelivered());
//! # Ok(()) }
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use thiserror::Error;

use crate::host::{Host, LoadReport, ShutdownReport};
use crate::server::{self, ApiConfig};

/// How long the HTTP server may take to finish in-flight requests once the drain is over.
const SERVER_STOP_GRACE: Duration = Duration::from_secs(5);

/// A bound listener for the API.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(tokio::net::TcpListener),
    /// A Unix socket, and its path (removed when the service stops).
    Unix(tokio::net::UnixListener, PathBuf),
}

impl Listener {
    /// Where it listens, as `http://HOST:PORT` or `unix:PATH` (`None` when the OS will not say).
    pub fn address(&self) -> Option<String> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok().map(|a| format!("http://{a}")),
            Listener::Unix(_, path) => Some(format!("unix:{}", path.display())),
        }
    }
}

/// Settings of [`run`].
#[derive(Clone)]
pub struct ServiceConfig {
    /// The API's settings (bearer token).
    pub api: ApiConfig,
    /// How long queued events may take to drain when stopping.
    pub drain: Duration,
    /// Watch the hook roots and reload on change.
    pub watch: bool,
    /// Handle SIGINT/SIGTERM (stop) and SIGHUP (reload) for the whole process. Off for a
    /// service embedded in a program that handles signals itself.
    pub signals: bool,
    /// Runs when the stop begins, before the host drains, with the drain time (fleet mode: the
    /// edge sends its buffer, a worker finishes the events it took).
    pub before_drain: Option<BeforeDrain>,
}

/// See [`ServiceConfig::before_drain`].
pub type BeforeDrain = std::sync::Arc<
    dyn Fn(Duration) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync,
>;

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            api: ApiConfig::default(),
            drain: Duration::from_secs(5),
            watch: true,
            signals: false,
            before_drain: None,
        }
    }
}

impl std::fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceConfig")
            .field("api", &self.api)
            .field("drain", &self.drain)
            .field("watch", &self.watch)
            .field("signals", &self.signals)
            .field("before_drain", &self.before_drain.is_some())
            .finish()
    }
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    /// The first load, when it finished before the stop.
    pub first_load: Option<LoadReport>,
    /// The drain.
    pub shutdown: ShutdownReport,
}

impl Report {
    /// Events still queued when the drain deadline passed, over all hooks.
    pub fn undelivered(&self) -> usize {
        self.shutdown.undelivered.iter().map(|(_, n)| n).sum()
    }
}

/// Why the service could not run.
#[derive(Debug, Error)]
pub enum ServiceError {
    /// The signal handlers could not be installed (nothing was started).
    #[error("cannot install the signal handlers: {0}")]
    Signals(std::io::Error),
}

/// The signals the service handles, installed once.
struct OsSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl OsSignals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// What woke the service's loop.
enum Wake {
    Stop(&'static str),
    Reload,
}

/// Waits for the next signal; never returns without signals.
async fn next_signal(signals: &mut Option<OsSignals>) -> Wake {
    let Some(s) = signals else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = s.term.recv() => Wake::Stop("SIGTERM"),
        _ = s.int.recv() => Wake::Stop("SIGINT"),
        _ = s.hup.recv() => Wake::Reload,
    }
}

/// Runs the service on `listener` until `shutdown` resolves (or, with
/// [`ServiceConfig::signals`], SIGINT/SIGTERM arrives): serves the API, loads the hooks, watches
/// the roots, then drains the queues for up to [`ServiceConfig::drain`] while the API still
/// answers (events get 503), stops the API and removes a Unix socket. Sends `host_start` once
/// listening and `host_stop` at the end to the host's notices.
pub async fn run(
    listener: Listener,
    host: Host,
    config: ServiceConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<Report, ServiceError> {
    let mut signals = if config.signals {
        Some(OsSignals::install().map_err(ServiceError::Signals)?)
    } else {
        None
    };
    // The real service (which owns the signals) also reaps its hooks' orphans as PID 1.
    let _reaper = config.signals.then(crate::reaper::start).flatten();
    let address = listener.address();
    // Connections are capped against it (crate::connections; issue 57 row 6).
    crate::connections::raise_open_files();
    if let Listener::Tcp(l) = &listener
        && let Ok(a) = l.local_addr()
    {
        // Before any hook loads: a confined hook may not be granted this port (issue 57).
        crate::sandbox::policy::note_service_port(a.port());
    }
    let router = server::app(host.clone(), config.api.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server_stop = {
        let mut rx = stop_rx;
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    tracing::info!("listening on {}", address.as_deref().unwrap_or("?"));
    host.notices()
        .send("host_start", start_notice(&host, address, config.watch));
    let (server_task, socket, accepts) = start_server(listener, router, server_stop);
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
    let fork_server = tokio::spawn(fork_server_ahead(host.clone(), loaded_rx));
    let watch = start_watch(&host, config.watch).await;

    tracing::info!(roots = ?host.config().roots, "loading hooks");
    // The first load runs as its own task, so signals are handled while it runs.
    let mut first_load = tokio::spawn(first_load(host.clone(), loaded_tx));
    let mut report = Report::default();
    let mut loading = true;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            r = &mut first_load, if loading => {
                loading = false;
                match r {
                    Ok(load) => {
                        tracing::info!(
                            loaded = load.loaded.len(),
                            skipped = load.skipped.len(),
                            "hooks loaded: {}",
                            load.loaded.join(", ")
                        );
                        report.first_load = Some(load);
                    }
                    Err(e) => tracing::error!("the first load failed: {e}"),
                }
            }
            wake = next_signal(&mut signals) => match wake {
                Wake::Stop(name) => {
                    tracing::info!("{name}: stopping");
                    break;
                }
                Wake::Reload => {
                    if loading {
                        tracing::info!("SIGHUP during the first load: reloading once it is done");
                    } else {
                        tracing::info!("SIGHUP: reloading hooks");
                    }
                    // Waits for a load in progress (the reload lock), then rescans.
                    let r = host.reload().await;
                    tracing::info!(loaded = r.loaded.len(), skipped = r.skipped.len(), "reloaded");
                }
            },
            _ = &mut shutdown => {
                tracing::info!("shutdown requested: stopping");
                break;
            }
        }
    }

    tracing::info!(
        "shutting down: draining queues for up to {}s",
        config.drain.as_secs_f64()
    );
    // The API stays up while the queues drain: events get 503 (clients keep them and retry),
    // /v1/hooks and /metrics keep answering. Then the listener closes. A first load still
    // running finishes first (the drain waits for the reload lock).
    if let Some(before) = &config.before_drain {
        before(config.drain).await;
    }
    report.shutdown = host.shutdown(config.drain).await;
    // Done by now (the first load is over, or gone): a fork server it started is in the pool
    // the caller stops, or stopped.
    let _ = fork_server.await;
    drop(watch);
    drop(accepts);
    let _ = stop_tx.send(true);
    match tokio::time::timeout(SERVER_STOP_GRACE, server_task).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::error!("server error: {e}"),
        Ok(Err(e)) => tracing::error!("server task failed: {e}"),
        Err(_) => tracing::warn!(
            "server did not stop within {}s",
            SERVER_STOP_GRACE.as_secs()
        ),
    }
    // Only our own socket: a new service may have taken the path over while this one drained.
    if let Some((path, mine)) = &socket
        && mine.is_some()
        && server::file_identity(path) == *mine
    {
        let _ = std::fs::remove_file(path);
    }
    announce_stop(&host, &report);
    Ok(report)
}

/// The API server's task; the Unix socket's path and identity (removed at the end if still
/// ours); the watch that raises the service for a new connection's request (crate::priority:
/// a collect on a new connection is read at once on a busy CPU).
type Started = (
    tokio::task::JoinHandle<std::io::Result<()>>,
    Option<(PathBuf, Option<(u64, u64)>)>,
    Option<crate::priority::ConnectionWatch>,
);

fn start_server(
    listener: Listener,
    router: axum::Router,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Started {
    use std::os::fd::AsRawFd;
    let fd = match &listener {
        Listener::Tcp(l) => l.as_raw_fd(),
        Listener::Unix(l, _) => l.as_raw_fd(),
    };
    let accepts = crate::priority::watch_connections(fd);
    match listener {
        Listener::Tcp(l) => (tokio::spawn(server::serve(l, router, stop)), None, accepts),
        Listener::Unix(l, path) => {
            let mine = server::file_identity(&path);
            let task = tokio::spawn(server::serve(l, router, stop));
            (task, Some((path, mine)), accepts)
        }
    }
}

/// The first load. Collects answer 503 until it is done: it is the service's own work a
/// decision waits for, raised like a collect (crate::priority).
async fn first_load(host: Host, loaded: tokio::sync::oneshot::Sender<()>) -> LoadReport {
    let _loading = crate::priority::boost_service();
    let report = host.reload().await;
    let _ = loaded.send(());
    report
}

/// The default interpreter's Python fork server, started while the watch is armed and the roots
/// are scanned rather than after (a Python interpreter takes 100-300 ms to import and warm up;
/// issue 37), and stopped again once the first load is over (`loaded`) if no hook used it.
async fn fork_server_ahead(host: Host, loaded: tokio::sync::oneshot::Receiver<()>) {
    host.prestart_fork_server().await;
    let _ = loaded.await;
    host.stop_unused_fork_server().await;
}

/// The fields of `host_start`.
fn start_notice(host: &Host, listen: Option<String>, watch: bool) -> Value {
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "listen": listen,
        "roots": host.config().roots,
        "watch": watch,
    })
}

/// `host_start` then `host_stop` with the error, for a service that could not start (the
/// listener could not be bound, ...).
pub(crate) fn report_failed_start(
    notices: &crate::notices::Notices,
    roots: &[PathBuf],
    watch: bool,
    error: &str,
) {
    notices.send(
        "host_start",
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "listen": Value::Null,
            "roots": roots,
            "watch": watch,
        }),
    );
    notices.finish("host_stop", json!({"error": error, "exit_code": 1}));
}

/// Watches the roots (with `enabled`); a watcher that cannot start is logged and the service
/// goes on. The watches are armed off the start path (issue 59): this waits for them only until
/// each root and hook directory answered or passed its arming deadline, so that a change made
/// while the first load runs is seen; one that answers later is watched and rescanned then.
async fn start_watch(host: &Host, enabled: bool) -> Option<crate::watch::WatchHandle> {
    if !enabled {
        tracing::info!(
            "not watching the hook roots (--no-watch): reload with POST /v1/reload or SIGHUP"
        );
        return None;
    }
    match crate::watch::spawn(host.clone(), crate::watch::DEBOUNCE) {
        Ok((handle, armed)) => {
            let bound = crate::watch::ARM_DEADLINE + Duration::from_secs(1);
            let _ = tokio::time::timeout(bound, armed.wait()).await;
            Some(handle)
        }
        Err(e) => {
            tracing::error!("{e}; hooks reload only on POST /v1/reload or SIGHUP");
            None
        }
    }
}

/// Logs the stop and sends `host_stop` (the last notice) with the accounts.
fn announce_stop(host: &Host, report: &Report) {
    let undelivered = report.undelivered();
    tracing::info!(undelivered, drain_ms = report.shutdown.drain_ms, "stopped");
    let per_hook: serde_json::Map<String, Value> = report
        .shutdown
        .undelivered
        .iter()
        .map(|(h, n)| (h.clone(), json!(n)))
        .collect();
    host.notices().finish(
        "host_stop",
        json!({
            "undelivered": undelivered,
            "undelivered_by_hook": per_hook,
            "drain_ms": report.shutdown.drain_ms,
            "accounts": report.shutdown.by_hook,
            "totals": report.shutdown.total,
            "exit_code": 0
        }),
    );
}
