//! Fleet options of `serve` and `worker`, and the `dead list|replay` command. The work is in
//! [`crate::fleet`]; this file turns options into its settings and prints.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::fleet::{FleetConfig, dead, edge::Edge, worker};
use crate::host::{Host, HostConfig};

/// Broker connection options (shared by `serve --fleet`, `worker` and `dead`).
#[derive(Debug, Clone, clap::Args)]
pub struct ConnArgs {
    /// NATS JetStream broker(s), comma-separated: nats://HOST:PORT (credentials in the URL,
    /// nats://USER:PASSWORD@HOST:PORT or nats://TOKEN@HOST:PORT, are used for the login and
    /// never shown). With `serve`, makes it a fleet edge that publishes events instead of
    /// running hooks.
    #[arg(long, value_name = "URL", env = "HERMES_HOOKS_FLEET")]
    pub fleet: Option<String>,
    /// User name for the broker (password from --fleet-password-file).
    #[arg(long, value_name = "USER", requires = "fleet_password_file")]
    pub fleet_user: Option<String>,
    /// File holding the broker password.
    #[arg(long, value_name = "FILE")]
    pub fleet_password_file: Option<PathBuf>,
    /// File holding a broker token.
    #[arg(long, value_name = "FILE")]
    pub fleet_token_file: Option<PathBuf>,
    /// NATS credentials file (`.creds`: user JWT and nkey seed, as `nsc` writes it).
    #[arg(long, value_name = "FILE", env = "HERMES_HOOKS_FLEET_CREDS")]
    pub fleet_creds: Option<PathBuf>,
    /// File holding an nkey seed (`SU...`) for a broker user given as `nkey:`.
    #[arg(long, value_name = "FILE", env = "HERMES_HOOKS_FLEET_NKEY")]
    pub fleet_nkey: Option<PathBuf>,
    /// Extra root certificate (PEM) to trust for the broker's TLS.
    #[arg(long, value_name = "FILE")]
    pub fleet_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS (with --fleet-tls-key).
    #[arg(long, value_name = "FILE", requires = "fleet_tls_key")]
    pub fleet_tls_cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS.
    #[arg(long, value_name = "FILE", requires = "fleet_tls_cert")]
    pub fleet_tls_key: Option<PathBuf>,
    /// Refuse a broker connection without TLS.
    #[arg(long)]
    pub fleet_require_tls: bool,
    /// Subject prefix; streams are named after it (HERMES_EVENTS, HERMES_DEAD).
    #[arg(long, value_name = "PREFIX", default_value = "hermes")]
    pub fleet_prefix: String,
    /// Event stream limit, when it is created: oldest event kept, in hours.
    #[arg(long, value_name = "HOURS", default_value_t = 168.0)]
    pub stream_max_age_hours: f64,
    /// Event stream limit, when it is created: most bytes kept.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    pub stream_max_bytes: i64,
    /// Replicas of the streams and the lease bucket when they are created (3 or 5 in a NATS
    /// cluster; at most the cluster's size).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub stream_replicas: usize,
    /// Window in which a re-sent event id is recognised as a duplicate, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub stream_duplicate_window: u64,
}

/// Fleet options of `serve` and `worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// The broker.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// This edge's id in every event it publishes (default: the host name).
    #[arg(long, value_name = "NAME")]
    pub gateway_id: Option<String>,
    /// Events the edge keeps in memory while the broker is unreachable or slow (beyond it, new
    /// events are refused with 503 and Retry-After; nothing accepted is dropped).
    #[arg(long, value_name = "N", default_value_t = crate::fleet::edge::DEFAULT_BUFFER)]
    pub fleet_buffer: usize,
    /// Most events of one name from one request that go to the stream as one message (a
    /// bundle: one message for the broker to store, deliver and acknowledge); 1 sends each
    /// event alone (`lag` and stream discards then count events exactly).
    #[arg(long, value_name = "N", default_value_t = crate::fleet::envelope::BUNDLE_EVENTS as u16,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub fleet_bundle: u16,
    /// Worker id in the fleet view (default: HOST-PID).
    #[arg(long, value_name = "NAME")]
    pub worker_id: Option<String>,
    /// The longest, in seconds, an event of a worker that died waits before another worker
    /// runs it (the broker's ack wait is a tenth shorter, at most 1 s, for that start).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub ack_wait: f64,
    /// Delay before the first retry of a failed event, ms (doubles per delivery, at most 60 s).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub retry_backoff_ms: u64,
    /// Seconds a removed hook's consumer (its place in the stream) is kept before it is deleted,
    /// in case the hook comes back or other workers still serve it.
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    pub consumer_grace: f64,
    /// Seconds a stopping worker keeps running a version of an ordered or concurrent hook that
    /// no other live worker runs while another version is live (a rolling update): events only
    /// it matches that were in the stream when the stop began run, rather than being
    /// dead-lettered. 0: stop at once.
    #[arg(long, value_name = "SECS", default_value_t = crate::fleet::worker::RETIRE_DRAIN.as_secs_f64())]
    pub retire_drain: f64,
    /// How often a worker publishes its status for the fleet view, ms.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub status_interval_ms: u64,
    /// Set by the `worker` command.
    #[arg(skip)]
    pub worker: bool,
}

/// Options only a worker uses, hidden from `serve --help`.
const WORKER_ONLY: &[&str] = &[
    "worker_id",
    "ack_wait",
    "retry_backoff_ms",
    "status_interval_ms",
    "retire_drain",
];
/// Options only an edge uses, hidden from `worker --help`.
const EDGE_ONLY: &[&str] = &["gateway_id", "fleet_buffer", "fleet_bundle"];

/// `serve` without the worker's options in its help, `worker` without the edge's (both still
/// parse them, so a shared unit file keeps working).
pub fn hide_inapplicable(cmd: clap::Command) -> clap::Command {
    let hide = |ids: &'static [&'static str]| {
        move |c: clap::Command| ids.iter().fold(c, |c, id| c.mut_arg(*id, |a| a.hide(true)))
    };
    cmd.mut_subcommand("serve", hide(WORKER_ONLY))
        .mut_subcommand("worker", hide(EDGE_ONLY))
}

fn read_secret(path: &PathBuf, what: &str) -> Result<String, String> {
    let t = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    Ok(t.trim().to_string())
}

impl ConnArgs {
    /// The fleet settings, when `--fleet` is given.
    pub fn config(&self) -> Result<Option<FleetConfig>, String> {
        let Some(url) = self.fleet.as_ref().filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        let mut c = FleetConfig::new(url.clone());
        if self.fleet_user.is_some() {
            c.user = self.fleet_user.clone();
        }
        if let Some(p) = &self.fleet_password_file {
            c.password = Some(read_secret(p, "--fleet-password-file")?);
        }
        if let Some(p) = &self.fleet_token_file {
            c.token = Some(read_secret(p, "--fleet-token-file")?);
        }
        if let Some(p) = &self.fleet_nkey {
            let seed = read_secret(p, "--fleet-nkey")?;
            if !seed.starts_with('S') {
                return Err(format!(
                    "--fleet-nkey {}: not an nkey seed (a seed starts with S, e.g. SU... for a user)",
                    p.display()
                ));
            }
            c.nkey_seed = Some(seed);
        }
        if let Some(p) = &self.fleet_creds {
            std::fs::metadata(p)
                .map_err(|e| format!("cannot read --fleet-creds {}: {e}", p.display()))?;
            c.creds = Some(p.clone());
        }
        c.tls_ca = self.fleet_tls_ca.clone();
        c.tls_cert = self.fleet_tls_cert.clone().zip(self.fleet_tls_key.clone());
        c.require_tls = self.fleet_require_tls;
        if self.fleet_prefix.is_empty()
            || crate::fleet::token(&self.fleet_prefix) != self.fleet_prefix
        {
            return Err(format!(
                "--fleet-prefix {:?} must be one subject token (no dots, spaces, * or >)",
                self.fleet_prefix
            ));
        }
        c.prefix = self.fleet_prefix.clone();
        if self.stream_max_age_hours.is_nan() || self.stream_max_age_hours <= 0.0 {
            return Err("--stream-max-age-hours must be more than 0".into());
        }
        c.stream.max_age = Duration::from_secs_f64(self.stream_max_age_hours * 3600.0);
        c.stream.max_bytes = self.stream_max_bytes;
        c.stream.duplicate_window = Duration::from_secs(self.stream_duplicate_window.max(1));
        if !(1..=5).contains(&self.stream_replicas) {
            return Err("--stream-replicas must be from 1 to 5".into());
        }
        c.replicas = self.stream_replicas;
        Ok(Some(c))
    }
}

/// What `serve`/`worker` started for the fleet; stopped before the host.
pub enum Running {
    /// Local mode.
    None,
    /// An edge.
    Edge(Edge),
    /// A worker.
    Worker(worker::Worker),
}

impl FleetArgs {
    /// Adjusts the host settings before the host exists: an edge runs no hooks itself; it loads
    /// its roots only to list the hooks that run inside the gateway (`runs: gateway`), which the
    /// gateway's client imports.
    pub fn adjust(&self, config: &mut HostConfig) {
        if self.conn.fleet.is_some() && !self.worker {
            config.gateway_hooks_only = true;
        }
    }

    /// Starts the edge or the worker on `host`.
    pub async fn attach(&self, host: &Host) -> Result<Running, String> {
        let cfg = self.conn.config()?;
        let Some(cfg) = cfg else {
            if self.worker {
                return Err("worker needs --fleet nats://HOST:PORT (or HERMES_HOOKS_FLEET)".into());
            }
            return Ok(Running::None);
        };
        if self.worker {
            let ack_wait = self.ack_wait;
            if !(0.1..=3600.0).contains(&ack_wait) {
                return Err("--ack-wait must be from 0.1 to 3600 seconds".into());
            }
            let mut opts = worker::WorkerOptions {
                ack_wait: Duration::from_secs_f64(ack_wait),
                retry_backoff: Duration::from_millis(self.retry_backoff_ms.max(1)),
                status_interval: Duration::from_millis(self.status_interval_ms.max(50)),
                consumer_grace: Duration::from_secs_f64(self.consumer_grace.clamp(0.0, 1e7)),
                retire_drain: Duration::from_secs_f64(self.retire_drain.clamp(0.0, 3600.0)),
                ..Default::default()
            };
            if let Some(id) = &self.worker_id {
                opts.id = id.clone();
            }
            tracing::info!(worker = %opts.id, broker = %cfg.url, "fleet worker: taking events from the stream");
            let w = worker::Worker::start(host.clone(), cfg, opts)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(Running::Worker(w));
        }
        let gateway = self
            .gateway_id
            .clone()
            .unwrap_or_else(crate::fleet::host_name);
        tracing::info!(gateway = %gateway, broker = %cfg.url, "fleet edge: publishing events to the stream");
        let edge = Edge::start(cfg, gateway, self.fleet_buffer, self.fleet_bundle.into())
            .await
            .map_err(|e| e.to_string())?;
        host.set_sink(Arc::new(edge.clone()));
        Ok(Running::Edge(edge))
    }
}

impl Running {
    /// The stop, for [`crate::service::ServiceConfig::before_drain`] (runs once).
    pub fn into_before_drain(self) -> crate::service::BeforeDrain {
        let me = Arc::new(std::sync::Mutex::new(Some(self)));
        Arc::new(move |drain| {
            let running = me.lock().unwrap_or_else(|p| p.into_inner()).take();
            Box::pin(async move {
                if let Some(r) = running {
                    r.stop(drain).await;
                }
            })
        })
    }

    /// Stops the edge (sending what is buffered) or the worker (finishing events in flight).
    pub async fn stop(self, drain: Duration) {
        match self {
            Running::None => {}
            Running::Edge(e) => {
                e.stop(drain).await;
            }
            Running::Worker(w) => w.stop(drain).await,
        }
    }
}

/// `dead list|replay`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum DeadCommand {
    /// Show the events that failed on their last delivery.
    ///
    /// Example: hermes-hooks dead list --fleet nats://127.0.0.1:4222 --hook mailer
    List {
        /// The broker.
        #[command(flatten)]
        conn: ConnArgs,
        /// Only this hook's.
        #[arg(long, value_name = "NAME")]
        hook: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Queue dead events again for the hook that failed them (and remove them from the list).
    ///
    /// Example: hermes-hooks dead replay --fleet nats://127.0.0.1:4222 --hook mailer --all
    Replay {
        /// The broker.
        #[command(flatten)]
        conn: ConnArgs,
        /// Only this hook's.
        #[arg(long, value_name = "NAME")]
        hook: Option<String>,
        /// Run them on this hook (its current name; its patterns must match the events)
        /// instead of the one that failed them.
        #[arg(long, value_name = "HOOK")]
        to: Option<String>,
        /// Every dead letter (of --hook, when given).
        #[arg(long, conflicts_with = "seq")]
        all: bool,
        /// Sequences shown by `dead list`.
        seq: Vec<u64>,
    },
}

/// Runs `dead list|replay`; returns the exit code.
pub async fn dead(cmd: DeadCommand) -> i32 {
    use std::io::Write;
    let (conn, sel, replay, json) = match cmd {
        DeadCommand::List { conn, hook, json } => (
            conn,
            dead::Selection {
                hook,
                ..Default::default()
            },
            false,
            json,
        ),
        DeadCommand::Replay {
            conn,
            hook,
            to,
            all,
            seq,
        } => {
            if !all && seq.is_empty() {
                return super::exit::usage(
                    "dead replay: give sequences (see `dead list`) or --all",
                );
            }
            (
                conn,
                dead::Selection {
                    hook,
                    seqs: seq,
                    to,
                },
                true,
                false,
            )
        }
    };
    let cfg = match conn.config() {
        Ok(Some(c)) => c,
        Ok(None) => {
            return super::exit::usage(
                "dead: give --fleet nats://HOST:PORT (or HERMES_HOOKS_FLEET)",
            );
        }
        Err(e) => return super::exit::usage(e),
    };
    let result = if replay {
        dead::replay(&cfg, &sel).await
    } else {
        dead::list(&cfg, &sel).await
    };
    let entries = match result {
        Ok(e) => e,
        Err(e) => return super::exit::fail(e),
    };
    let mut out = std::io::stdout().lock();
    if json {
        for e in &entries {
            let _ = writeln!(out, "{}", serde_json::json!(e));
        }
        return 0;
    }
    if replay {
        let _ = writeln!(out, "re-queued {} event(s)", entries.len());
    } else if entries.is_empty() {
        let _ = writeln!(out, "no dead letters");
        return 0;
    }
    for e in &entries {
        let l = &e.letter;
        let _ = writeln!(
            out,
            "{:>6}  {:<20} {:<20} deliveries={} {}  {}",
            e.seq, l.hook, l.envelope.event, l.deliveries, l.time, l.error
        );
    }
    0
}
