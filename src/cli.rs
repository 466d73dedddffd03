//! The command-line interface: argument parsing (clap) and the commands `serve`, `list`, `check`
//! and `test`. Each command is a function returning an exit code; errors become one line on
//! stderr saying what to do. Exit codes: 0 ok, 1 a problem was found or the service failed,
//! 2 usage error.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::discovery::Skipped;
use crate::host::{Host, HostConfig};
use crate::server::{self, ApiConfig};
use crate::trust::{TrustMode, TrustPolicy};

#[cfg(feature = "fleet")]
mod fleet;

/// Hosts the event hooks of a messaging gateway.
#[derive(Debug, Parser)]
#[command(name = "hermes-hooks", version, about, long_about = None)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (tracing's JSON format).
    Json,
}

/// Options naming the hook roots, shared by every command.
#[derive(Debug, Clone, clap::Args)]
pub struct RootArgs {
    /// A hook root (repeatable; earlier roots win name clashes). Default: $HERMES_HOME/hooks.
    #[arg(long = "hooks-dir", value_name = "DIR")]
    pub hooks_dir: Vec<PathBuf>,
    /// Load hooks whose directory or files are writable by group/others or owned by another user.
    #[arg(long)]
    pub insecure_permissions: bool,
    /// Which hooks may load: all, or only those approved with `enable NAME` (explicit).
    #[arg(long, value_enum, value_name = "MODE", env = "HERMES_HOOKS_TRUST", default_value_t = TrustMode::All)]
    pub trust: TrustMode,
}

impl RootArgs {
    /// The host settings these options describe.
    pub fn config(&self) -> HostConfig {
        let mut config = HostConfig::from_env(self.hooks_dir.clone());
        config.trust = TrustPolicy {
            mode: self.trust,
            insecure_permissions: self.insecure_permissions,
        };
        if self.insecure_permissions {
            tracing::warn!("--insecure-permissions: hooks writable by other users will load");
        }
        config
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service: load hooks, listen for events, dispatch them.
    ///
    /// Example: hermes-hooks serve --hooks-dir hooks-examples --listen 127.0.0.1:8787
    Serve(ServeArgs),
    /// Run hooks for a fleet: take their events from NATS JetStream (serve's options apply).
    ///
    /// Example: hermes-hooks worker --fleet nats://broker:4222 --hooks-dir /srv/hooks --listen 127.0.0.1:8788
    #[cfg(feature = "fleet")]
    Worker(ServeArgs),
    /// Events that failed on every delivery in fleet mode: list them, or queue them again.
    #[cfg(feature = "fleet")]
    Dead {
        /// list or replay.
        #[command(subcommand)]
        command: fleet::DeadCommand,
    },
    /// List loaded hooks and why other directories were not loaded.
    ///
    /// Example: hermes-hooks list --hooks-dir hooks-examples --json
    List {
        /// Hook roots.
        #[command(flatten)]
        roots: RootArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Ask the running service (its live status and counters) instead of scanning here;
        /// the address is $HERMES_HOOKS_ADDRESS or $HERMES_HOME/hooks.sock unless given.
        #[arg(long, value_name = "ADDRESS", num_args = 0..=1, default_missing_value = "")]
        live: Option<String>,
    },
    /// Validate every hook directory (Python handlers are import-checked); exit 1 on any problem.
    ///
    /// Example: hermes-hooks check --hooks-dir ~/.hermes/hooks
    Check {
        /// Hook roots.
        #[command(flatten)]
        roots: RootArgs,
    },
    /// Send an event to the running service (its Unix socket by default) and print the answer.
    ///
    /// Example: hermes-hooks emit message:pre_route --context '{"message": "hi"}' --collect
    Emit(EmitArgs),
    /// Run the handlers matching EVENT here and print each result, error and duration.
    ///
    /// Example: hermes-hooks test command:reset --context '{"user_id": "42"}'
    Test(TestArgs),
    /// Scaffold a working hook directory NAME in the first hook root (never overwrites).
    ///
    /// Example: hermes-hooks new command-logger --kind python --hooks-dir ~/.hermes/hooks
    New {
        /// The hook's name (also its directory name).
        name: String,
        /// What runs it.
        #[arg(long, value_enum, default_value_t = crate::scaffold::Kind::Python)]
        kind: crate::scaffold::Kind,
        /// Endpoint for --kind webhook.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Where --kind rust puts the crate (default: $HERMES_HOME/hook-src/NAME).
        #[arg(long, value_name = "DIR")]
        src: Option<PathBuf>,
        /// Hook roots (the hook is written into the first).
        #[command(flatten)]
        roots: RootArgs,
    },
    /// Allow hook NAME: approve it (--trust explicit) or set `enabled: true` in its HOOK.yaml.
    ///
    /// Example: hermes-hooks enable command-logger --trust explicit
    Enable {
        /// The hook's name.
        name: String,
        /// Hook roots.
        #[command(flatten)]
        roots: RootArgs,
    },
    /// Stop hook NAME: revoke its approval (--trust explicit) or set `enabled: false` in HOOK.yaml.
    ///
    /// Example: hermes-hooks disable command-logger
    Disable {
        /// The hook's name.
        name: String,
        /// Hook roots.
        #[command(flatten)]
        roots: RootArgs,
    },
}

/// Options of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    roots: RootArgs,
    /// Listen on TCP HOST:PORT instead of the Unix socket (port 0 picks a free port).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// Unix socket path. Default: $HERMES_HOME/hooks.sock.
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    socket: Option<PathBuf>,
    /// File holding the bearer token required on every request (needed for non-loopback TCP).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Seconds to let queues drain on SIGINT/SIGTERM before stopping workers.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    drain_timeout: f64,
    /// Do not watch the hook roots (reload only on POST /v1/reload or SIGHUP).
    #[arg(long)]
    no_watch: bool,
    /// `json`: one JSON object per line on stdout for what the host does (host_start,
    /// hook_loaded, handler_error, ..., host_stop); logs stay on stderr.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[cfg(feature = "fleet")]
    #[command(flatten)]
    fleet: fleet::FleetArgs,
}

/// What `serve` writes on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Nothing (logs go to stderr).
    Text,
    /// The JSON event stream.
    Json,
}

/// Options of `emit`.
#[derive(Debug, Clone, clap::Args)]
pub struct EmitArgs {
    /// Event name, e.g. agent:start or command:reset.
    event: String,
    /// Context as a JSON object.
    #[arg(long, value_name = "JSON", conflicts_with = "context_file")]
    context: Option<String>,
    /// File holding the context as a JSON object.
    #[arg(long, value_name = "FILE")]
    context_file: Option<PathBuf>,
    /// Wait for the handlers' results (POST /v1/collect) instead of only queuing the event.
    #[arg(long)]
    collect: bool,
    /// Deadline for --collect, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    timeout_ms: u64,
    /// The service's TCP address HOST:PORT (default: the Unix socket).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// The service's Unix socket. Default: $HERMES_HOOKS_ADDRESS, else $HERMES_HOME/hooks.sock.
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    socket: Option<PathBuf>,
    /// File holding the bearer token (default: $HERMES_HOOKS_TOKEN when set).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

/// Options of `test`.
#[derive(Debug, Clone, clap::Args)]
pub struct TestArgs {
    /// Event name, e.g. agent:start or command:reset.
    event: String,
    #[command(flatten)]
    roots: RootArgs,
    /// Context as a JSON object.
    #[arg(long, value_name = "JSON", conflicts_with = "context_file")]
    context: Option<String>,
    /// File holding the context as a JSON object.
    #[arg(long, value_name = "FILE")]
    context_file: Option<PathBuf>,
    /// Run only this hook.
    #[arg(long, value_name = "NAME")]
    hook: Option<String>,
    /// One JSON line per hook instead of text.
    #[arg(long)]
    json: bool,
}

/// Parses the arguments, sets up logging, runs the command; returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    let default_filter = match cli.command {
        Command::Serve(_) => "info",
        #[cfg(feature = "fleet")]
        Command::Worker(_) => "info",
        // The command prints what matters; the handlers' own output is still shown.
        Command::Test(_) => "error,hook=info",
        _ => "error",
    };
    init_logging(cli.log_format, default_filter);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hermes-hooks: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve(args).await,
            #[cfg(feature = "fleet")]
            Command::Worker(mut args) => {
                args.fleet.worker = true;
                serve(args).await
            }
            #[cfg(feature = "fleet")]
            Command::Dead { command } => fleet::dead(command).await,
            Command::List { roots, json, live } => match live {
                Some(address) => list_live(&address, json).await,
                None => list(roots, json).await,
            },
            Command::Check { roots } => check(roots).await,
            Command::Test(args) => test(args).await,
            Command::Emit(args) => emit(args).await,
            Command::New {
                name,
                kind,
                url,
                src,
                roots,
            } => new_hook(&roots, &name, kind, url.as_deref(), src),
            Command::Enable { name, roots } => set_enabled(&roots, &name, true),
            Command::Disable { name, roots } => set_enabled(&roots, &name, false),
        }
    });
    // Workers were stopped by the commands; do not wait for stray blocking tasks.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

fn init_logging(format: LogFormat, default: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("HERMES_HOOKS_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
            eprintln!("hermes-hooks: ignoring HERMES_HOOKS_LOG={v:?} ({e}); using {default:?}");
            EnvFilter::new(default)
        }),
        _ => EnvFilter::new(default),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.with_target(false).try_init(),
    };
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("hermes-hooks: {msg}");
    1
}

/// A usage error (bad argument value): one line, exit code 2.
fn usage(msg: impl std::fmt::Display) -> i32 {
    eprintln!("hermes-hooks: {msg}");
    2
}

/// The listener `serve` binds.
enum Bound {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, PathBuf),
}

async fn bind(args: &ServeArgs, config: &HostConfig) -> Result<(Bound, Option<String>), String> {
    let token = match &args.token_file {
        Some(f) => {
            let t = std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read --token-file {}: {e}", f.display()))?;
            let t = t.trim().to_string();
            if t.is_empty() {
                return Err(format!("--token-file {} is empty", f.display()));
            }
            Some(t)
        }
        None => None,
    };
    if let Some(addr) = &args.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        if !local.ip().is_loopback() && token.is_none() {
            return Err(format!(
                "refusing to listen on non-loopback address {local} without --token-file (anyone on the network could send events)"
            ));
        }
        return Ok((Bound::Tcp(listener), token));
    }
    let path = args
        .socket
        .clone()
        .unwrap_or_else(|| config.hermes_home.join("hooks.sock"));
    let listener = server::bind_unix(&path).map_err(|e| e.to_string())?;
    Ok((Bound::Unix(listener, path), token))
}

async fn serve(args: ServeArgs) -> i32 {
    #[allow(unused_mut)]
    let mut config = args.roots.config();
    #[cfg(feature = "fleet")]
    args.fleet.adjust(&mut config);
    let notices = match args.output {
        Output::Json => crate::notices::Notices::to_writer(private_stdout()),
        Output::Text => crate::notices::Notices::default(),
    };
    let start_notice = |listen: Option<String>| {
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "listen": listen,
            "roots": config.roots,
            "watch": !args.no_watch,
        })
    };
    let (bound, token) = match bind(&args, &config).await {
        Ok(b) => b,
        Err(e) => {
            notices.send("host_start", start_notice(None));
            notices.finish("host_stop", json!({"error": e, "exit_code": 1}));
            return fail(e);
        }
    };
    let host = Host::with_notices(config.clone(), notices.clone());
    #[cfg(feature = "fleet")]
    let fleet = match args.fleet.attach(&host).await {
        Ok(f) => f,
        Err(e) => {
            notices.send("host_start", start_notice(None));
            notices.finish("host_stop", json!({"error": e, "exit_code": 1}));
            return fail(e);
        }
    };
    let router = server::app(host.clone(), ApiConfig { token });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutdown_signal = {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let server_task = match bound {
        Bound::Tcp(l) => {
            let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::info!("listening on http://{addr}");
            notices.send("host_start", start_notice(Some(format!("http://{addr}"))));
            tokio::spawn(server::serve(l, router, shutdown_signal))
        }
        Bound::Unix(l, path) => {
            tracing::info!("listening on unix:{}", path.display());
            notices.send(
                "host_start",
                start_notice(Some(format!("unix:{}", path.display()))),
            );
            tokio::spawn(server::serve(l, router, shutdown_signal))
        }
    };
    // Watch before the first load, so that a change made while loading is not missed.
    let _watch = if args.no_watch {
        tracing::info!(
            "not watching the hook roots (--no-watch): reload with POST /v1/reload or SIGHUP"
        );
        None
    } else {
        match crate::watch::spawn(host.clone(), crate::watch::DEBOUNCE) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::error!("{e}; hooks reload only on POST /v1/reload or SIGHUP");
                None
            }
        }
    };
    tracing::info!(roots = ?config.roots, "loading hooks");
    let report = host.reload().await;
    tracing::info!(
        loaded = report.loaded.len(),
        skipped = report.skipped.len(),
        "hooks loaded: {}",
        report.loaded.join(", ")
    );

    let signals = wait_for_stop(host.clone()).await;
    if let Err(e) = signals {
        tracing::error!("cannot install signal handlers: {e}");
    }
    tracing::info!(
        "shutting down: draining queues for up to {}s",
        args.drain_timeout
    );
    let drain = Duration::from_secs_f64(args.drain_timeout.clamp(0.0, 3600.0));
    // Fleet: the edge sends its buffer, the worker finishes its events in flight, first.
    #[cfg(feature = "fleet")]
    fleet.stop(drain).await;
    // The API stays up while the queues drain: events get 503 (clients keep them and retry),
    // /v1/hooks and /metrics keep answering. Then the listener closes.
    let report = host.shutdown(drain).await;
    let _ = stop_tx.send(true);
    match tokio::time::timeout(Duration::from_secs(5), server_task).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::error!("server error: {e}"),
        _ => tracing::warn!("server did not stop within 5s"),
    }
    if let Some(path) = &args.socket.clone().or_else(|| {
        args.listen
            .is_none()
            .then(|| config.hermes_home.join("hooks.sock"))
    }) {
        let _ = std::fs::remove_file(path);
    }
    let undelivered: usize = report.undelivered.iter().map(|(_, n)| n).sum();
    tracing::info!(undelivered, drain_ms = report.drain_ms, "stopped");
    let per_hook: serde_json::Map<String, Value> = report
        .undelivered
        .iter()
        .map(|(h, n)| (h.clone(), json!(n)))
        .collect();
    notices.finish(
        "host_stop",
        json!({"undelivered": undelivered, "undelivered_by_hook": per_hook, "drain_ms": report.drain_ms, "exit_code": 0}),
    );
    0
}

/// Takes the real stdout for the JSON stream and points fd 1 at stderr, so nothing else (a
/// dynamic library's `printf`, a stray `println!`) can write into the stream.
fn private_stdout() -> Box<dyn std::io::Write + Send> {
    use std::os::fd::FromRawFd;
    // SAFETY: dup/dup2 on this process's own standard descriptors; the duplicate is owned by the
    // File created from it and nothing else.
    unsafe {
        let fd = libc::dup(1);
        if fd >= 0 && libc::dup2(2, 1) >= 0 {
            return Box::new(std::fs::File::from_raw_fd(fd));
        }
        if fd >= 0 {
            libc::close(fd);
        }
    }
    Box::new(std::io::stdout())
}

/// Waits for SIGINT or SIGTERM; reloads on SIGHUP meanwhile.
async fn wait_for_stop(host: Host) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading hooks");
                let r = host.reload().await;
                tracing::info!(loaded = r.loaded.len(), skipped = r.skipped.len(), "reloaded");
            }
        }
    }
}

/// Loads the hooks in this process (Python handlers are import-checked), runs `f`, stops them.
async fn with_loaded_hooks<T>(
    roots: RootArgs,
    f: impl AsyncFnOnce(&Host, &crate::host::LoadReport) -> T,
) -> T {
    let config = roots.config();
    let (host, report) = Host::start(config).await;
    let out = f(&host, &report).await;
    host.shutdown(Duration::from_secs(5)).await;
    out
}

fn new_hook(
    roots: &RootArgs,
    name: &str,
    kind: crate::scaffold::Kind,
    url: Option<&str>,
    src: Option<PathBuf>,
) -> i32 {
    let config = roots.config();
    let Some(root) = config.roots.first() else {
        return fail("no hook root");
    };
    let src = src.unwrap_or_else(|| crate::scaffold::rust_source_dir(&config.hermes_home, name));
    match crate::scaffold::new_hook(root, name, kind, url, Some(&src)) {
        Ok(s) => {
            println!("created {} ({})", s.dir.display(), s.files.join(", "));
            println!("next: {}", s.next);
            0
        }
        Err(e) => fail(e),
    }
}

/// `enable NAME` / `disable NAME`: the work is in [`crate::trust::set_enabled`].
fn set_enabled(roots: &RootArgs, name: &str, on: bool) -> i32 {
    let config = roots.config();
    match crate::trust::set_enabled(&config.roots, &config.hermes_home, &config.trust, name, on) {
        Ok(msg) => {
            println!("{msg}");
            0
        }
        Err(e) => fail(e),
    }
}

fn skipped_json(s: &Skipped) -> Value {
    json!({"dir": s.dir, "name": s.name, "file": s.file, "code": s.code, "reason": s.reason})
}

async fn list(roots: RootArgs, as_json: bool) -> i32 {
    with_loaded_hooks(roots, async |host, report| {
        let hooks: Vec<Value> = host.hooks().iter().map(|h| json!(h)).collect();
        let skipped: Vec<Value> = report.skipped.iter().map(skipped_json).collect();
        print_list(
            &hooks,
            &skipped,
            as_json,
            &display_roots(&host.config().roots),
        );
        0
    })
    .await
}

/// Where the running service is when no option says: `$HERMES_HOOKS_ADDRESS`, else
/// `$HERMES_HOME/hooks.sock` (as the Python client finds it).
fn default_address() -> crate::client::Address {
    match std::env::var("HERMES_HOOKS_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
    {
        Some(a) => crate::client::Address::parse(&a),
        None => crate::client::Address::Unix(crate::host::hermes_home().join("hooks.sock")),
    }
}

/// `list --live`: the running service's view, with live status and counters.
async fn list_live(address: &str, as_json: bool) -> i32 {
    use crate::client::{Address, request};
    let address = if address.is_empty() {
        default_address()
    } else {
        Address::parse(address)
    };
    let token = std::env::var("HERMES_HOOKS_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    match request(
        &address,
        "GET",
        "/v1/hooks",
        token.as_deref(),
        None,
        Duration::from_secs(10),
    )
    .await
    {
        Ok((200, body)) => {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let hooks = v["hooks"].as_array().cloned().unwrap_or_default();
            let skipped = v["skipped"].as_array().cloned().unwrap_or_default();
            print_list(&hooks, &skipped, as_json, &address.to_string());
            0
        }
        Ok((status, body)) => fail(format!("HTTP {status}: {}", String::from_utf8_lossy(&body))),
        Err(e) => fail(e),
    }
}

/// Prints hooks (as `/v1/hooks` shows them) and the directories that did not load.
fn print_list(hooks: &[Value], skipped: &[Value], as_json: bool, source: &str) {
    let mut out = std::io::stdout().lock();
    if as_json {
        let _ = writeln!(out, "{}", json!({"hooks": hooks, "skipped": skipped}));
        return;
    }
    if hooks.is_empty() {
        let _ = writeln!(out, "no hooks loaded ({source})");
    } else {
        let _ = writeln!(
            out,
            "{:<24} {:<8} {:<10} {:<34} {:>7} {:>7} {:>7}  ROOT",
            "NAME", "KIND", "STATUS", "EVENTS", "OK", "FAILED", "DROPPED"
        );
    }
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    for h in hooks {
        let events: Vec<String> = h["events"]
            .as_array()
            .map(|a| a.iter().map(s).collect())
            .unwrap_or_default();
        let c = &h["counters"];
        let _ = writeln!(
            out,
            "{:<24} {:<8} {:<10} {:<34} {:>7} {:>7} {:>7}  {}{}",
            s(&h["name"]),
            s(&h["kind"]),
            s(&h["status"]),
            events.join(","),
            c["ok"].as_u64().unwrap_or(0),
            c["failed"].as_u64().unwrap_or(0),
            c["dropped"].as_u64().unwrap_or(0),
            s(&h["root"]),
            if h["signed"] == json!(false) {
                "  UNSIGNED"
            } else {
                ""
            }
        );
        if let Some(workers) = h["workers"].as_array() {
            let names: Vec<String> = workers.iter().map(s).collect();
            let lag = h["lag"]
                .as_u64()
                .map(|l| l.to_string())
                .unwrap_or("?".into());
            let _ = writeln!(out, "    workers: {}; lag {lag}", names.join(", "));
        }
        if let Some(e) = h["last_error"]["message"].as_str() {
            let _ = writeln!(out, "    last error: {e}");
        }
    }
    if !skipped.is_empty() {
        let _ = writeln!(out, "\nnot loaded:");
        for k in skipped {
            let _ = writeln!(
                out,
                "  {:<22} {}: {}",
                s(&k["name"]),
                s(&k["file"]),
                s(&k["reason"])
            );
        }
    }
}

fn display_roots(roots: &[PathBuf]) -> String {
    roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

async fn check(roots: RootArgs) -> i32 {
    with_loaded_hooks(roots, async |host, report| {
        let mut out = std::io::stdout().lock();
        let snapshot = host.snapshot();
        let mut warnings = 0;
        for h in &snapshot.hooks {
            let _ = writeln!(
                out,
                "ok      {} ({}, {})",
                h.spec.name,
                h.spec.kind.as_str(),
                h.spec.manifest.events.join(", ")
            );
            for w in &h.spec.manifest.warnings {
                warnings += 1;
                let _ = writeln!(out, "warning {}: {w}", h.spec.manifest_path.display());
            }
            for p in h.spec.patterns.patterns() {
                if !crate::pattern::matches_known_event(p) {
                    warnings += 1;
                    let hint = match crate::events::suggest(p) {
                        Some(s) => format!("; did you mean {s:?}?"),
                        None => " (fine for custom events)".to_string(),
                    };
                    let _ = writeln!(
                        out,
                        "warning {}: pattern {p:?} matches no known gateway event{hint}",
                        h.spec.manifest_path.display()
                    );
                }
            }
        }
        let mut problems = 0;
        for s in &report.skipped {
            if s.is_problem() {
                problems += 1;
                let _ = writeln!(out, "error   {s}");
            } else {
                let _ = writeln!(out, "skip    {s}");
            }
        }
        let _ = writeln!(
            out,
            "{} hook(s) ok, {problems} problem(s), {warnings} warning(s) in {}",
            snapshot.hooks.len(),
            display_roots(&host.config().roots)
        );
        i32::from(problems > 0)
    })
    .await
}

/// The context given by `--context JSON` or `--context-file F` (`null` when neither).
fn read_context(text: Option<&str>, file: Option<&std::path::Path>) -> Result<Value, String> {
    match (text, file) {
        (Some(text), _) => {
            serde_json::from_str(text).map_err(|e| format!("--context is not valid JSON: {e}"))
        }
        (None, Some(f)) => {
            let t = std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            serde_json::from_str(&t).map_err(|e| format!("{} is not valid JSON: {e}", f.display()))
        }
        (None, None) => Ok(Value::Null),
    }
}

async fn emit(args: EmitArgs) -> i32 {
    use crate::client::{Address, request};
    let context = match read_context(args.context.as_deref(), args.context_file.as_deref()) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let address = match (&args.listen, &args.socket) {
        (Some(l), _) => Address::Tcp(l.clone()),
        (None, Some(p)) => Address::Unix(p.clone()),
        (None, None) => default_address(),
    };
    let token = match &args.token_file {
        Some(f) => match std::fs::read_to_string(f) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) => return fail(format!("cannot read --token-file {}: {e}", f.display())),
        },
        None => std::env::var("HERMES_HOOKS_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
    };
    let (path, body) = if args.collect {
        (
            "/v1/collect",
            json!({"event": args.event, "context": context, "timeout_ms": args.timeout_ms}),
        )
    } else {
        (
            "/v1/events",
            json!({"event": args.event, "context": context}),
        )
    };
    let wait = Duration::from_millis(args.timeout_ms.saturating_add(5000));
    let body = body.to_string();
    match request(
        &address,
        "POST",
        path,
        token.as_deref(),
        Some(body.as_bytes()),
        wait,
    )
    .await
    {
        Ok((status, answer)) if (200..300).contains(&status) => {
            println!("{}", String::from_utf8_lossy(&answer).trim());
            0
        }
        Ok((status, answer)) => {
            let v: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
            let msg = v["error"]["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&answer).into_owned());
            fail(format!("HTTP {status}: {msg}"))
        }
        Err(e) => fail(e),
    }
}

async fn test(args: TestArgs) -> i32 {
    let context = match read_context(args.context.as_deref(), args.context_file.as_deref()) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    if let Err(e) = crate::events::validate_event_name(&args.event) {
        return usage(format!("{e}"));
    }
    let context = match crate::host::normalize_context(context) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let event = args.event.clone();
    let only = args.hook.clone();
    let as_json = args.json;
    with_loaded_hooks(args.roots, async move |host, report| {
        for s in report.skipped.iter().filter(|s| s.is_problem()) {
            eprintln!("not loaded: {s}");
        }
        let snapshot = host.snapshot();
        let matching: Vec<String> = snapshot
            .matching(&event)
            .into_iter()
            .map(|h| h.spec.name.clone())
            .filter(|n| only.as_ref().is_none_or(|o| o == n))
            .collect();
        if matching.is_empty() {
            return fail(match &only {
                Some(o) => format!("hook {o:?} is not loaded or does not match {event:?}"),
                None => format!("no loaded hook matches {event:?}"),
            });
        }
        let timeout = snapshot
            .hooks
            .iter()
            .filter(|h| matching.contains(&h.spec.name))
            .map(|h| h.spec.manifest.timeout)
            .max()
            .unwrap_or(Duration::from_secs(30))
            + Duration::from_secs(1);
        let started = Instant::now();
        let outcomes = match host
            .emit_collect_only(&event, context, timeout, only.as_deref())
            .await
        {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        let mut out = std::io::stdout().lock();
        let mut errors = 0;
        for o in &outcomes {
            let ms = o.duration.map(|d| d.as_secs_f64() * 1000.0);
            if o.result.is_err() {
                errors += 1;
            }
            if as_json {
                let line = match &o.result {
                    Ok(r) => json!({"hook": o.hook, "ok": true, "result": r, "duration_ms": ms}),
                    Err(e) => json!({"hook": o.hook, "ok": false, "error": e, "duration_ms": ms}),
                };
                let _ = writeln!(out, "{line}");
            } else {
                let dur = ms
                    .map(|m| format!("{m:.1} ms"))
                    .unwrap_or_else(|| "-".into());
                match &o.result {
                    Ok(Some(v)) => {
                        let _ = writeln!(out, "{:<24} ok     {dur:>10}  result: {v}", o.hook);
                    }
                    Ok(None) => {
                        let _ = writeln!(out, "{:<24} ok     {dur:>10}  (no result)", o.hook);
                    }
                    Err(e) => {
                        let _ = writeln!(out, "{:<24} error  {dur:>10}  {e}", o.hook);
                    }
                }
            }
        }
        if !as_json {
            let _ = writeln!(
                out,
                "{} hook(s) ran for {event} in {:.1} ms, {errors} error(s)",
                outcomes.len(),
                started.elapsed().as_secs_f64() * 1000.0
            );
        }
        i32::from(errors > 0)
    })
    .await
}
