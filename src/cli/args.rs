//! The command line as clap parses it: the commands and their options, and the host settings
//! the common options describe. No command's work happens here.

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use crate::host::HostConfig;
use crate::trust::policy::{TrustMode, TrustPolicy};

/// Hosts the event hooks of a messaging gateway.
#[derive(Debug, Parser)]
#[command(name = "hermes-hooks", version, about, long_about = None)]
pub struct Cli {
    /// Log format on stderr: text, or json (one JSON object per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true, hide_possible_values = true)]
    pub log_format: LogFormat,
    /// More detail on stderr: the traceback of a hook that cannot load (the log's `hook=debug`).
    #[arg(short = 'v', long, global = true)]
    pub verbose: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The command line as parsed, completed and documented: the derived one, with each fleet
/// option shown only where it applies (`serve` hides the worker's, `worker` the edge's).
pub fn command() -> clap::Command {
    let cmd = Cli::command();
    #[cfg(feature = "fleet")]
    let cmd = crate::cli::fleet::hide_inapplicable(cmd);
    cmd
}

/// Parses the process's arguments with [`command`].
pub fn parse() -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    let matches = command().try_get_matches()?;
    Cli::from_arg_matches(&matches)
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
    /// Which hooks may load: all, or explicit (only those approved with `enable NAME --trust
    /// explicit`, with unchanged files).
    #[arg(long, value_enum, value_name = "MODE", env = "HERMES_HOOKS_TRUST", default_value_t = TrustMode::All, hide_possible_values = true)]
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

    /// [`RootArgs::config`], after checking that every `--hooks-dir` given is a directory: a
    /// mistyped root is an error naming it, not an empty hook list. (The default root may be
    /// missing: it is created by `new` and watched by `serve`.)
    pub fn checked_config(&self) -> Result<HostConfig, String> {
        for dir in &self.hooks_dir {
            let Some(meta) = metadata_within(dir, ROOT_STAT_DEADLINE) else {
                // A mount that does not answer: the service listens, and loads the root once it
                // answers (issue 59); no thread the service needs waits on it.
                tracing::warn!(
                    "--hooks-dir {}: did not answer within {} (a file system that does not answer?): its hooks load once it answers",
                    dir.display(),
                    crate::time::fmt_duration(ROOT_STAT_DEADLINE)
                );
                continue;
            };
            match meta {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(format!(
                        "--hooks-dir {}: not a directory (a hook root is a directory of hook directories)",
                        dir.display()
                    ));
                }
                Err(e) => {
                    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
                    let why = if e.kind() == std::io::ErrorKind::NotFound {
                        "no such directory".to_string()
                    } else {
                        e.to_string()
                    };
                    return Err(format!(
                        "--hooks-dir {}: {why} ({}); check the path, or create the root first (mkdir -p)",
                        dir.display(),
                        abs.display()
                    ));
                }
            }
        }
        Ok(self.config())
    }
}

/// How long the start of a command waits for a hook root's attributes.
pub const ROOT_STAT_DEADLINE: Duration = Duration::from_secs(1);

/// `path`'s attributes, asked on a thread of its own (`None`: no answer within `deadline`; the
/// thread is left to the file system that does not answer).
pub fn metadata_within(
    path: &std::path::Path,
    deadline: Duration,
) -> Option<std::io::Result<std::fs::Metadata>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let p = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("hermes-root-stat".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let _ = tx.send(std::fs::metadata(&p));
        });
    if let Err(e) = spawned {
        return Some(Err(e));
    }
    rx.recv_timeout(deadline).ok()
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
    ///
    /// Example: hermes-hooks dead list --fleet nats://127.0.0.1:4222 --hook mailer
    #[cfg(feature = "fleet")]
    Dead {
        /// list or replay.
        #[command(subcommand)]
        command: crate::cli::fleet::DeadCommand,
    },
    /// The Hooks tab of the Hermes dashboard: install it into $HERMES_HOME/plugins (and enable
    /// it in config.yaml's plugins.enabled), or uninstall it.
    ///
    /// Example: hermes-hooks dashboard install
    Dashboard {
        /// install or uninstall.
        #[command(subcommand)]
        command: crate::cli::dashboard::DashboardCommand,
    },
    /// The Hermes plugin forwarding the agent's hook events (pre_tool_call, pre_llm_call...) to
    /// the service: enable it in config.yaml's plugins.enabled, or remove it from there.
    ///
    /// Example: hermes-hooks plugin install
    Plugin {
        /// install or uninstall.
        #[command(subcommand)]
        command: crate::cli::plugin::PluginCommand,
    },
    /// What stands between Hermes's agent events and the hooks here: the plugin, the service,
    /// and each shell hook of config.yaml's hooks: block (its script, consent, changes since
    /// approval, whether it is hosted, a run on a sample call), as `hermes hooks doctor` checks.
    ///
    /// Example: hermes-hooks doctor
    Doctor {
        /// Do not run the shell hooks on a sample call (by default each consented one runs once,
        /// said before it runs: a hook that posts somewhere posts).
        #[arg(long)]
        no_run: bool,
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
        /// Ask the running service (its live status and counters) instead of scanning here:
        /// a socket path, HOST:PORT or http://HOST:PORT (default: $HERMES_HOOKS_ADDRESS, else
        /// $HERMES_HOME/hooks.sock).
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
        /// Check the shell hooks of config.yaml's `hooks:` block too when a --hooks-dir is given
        /// (without one they are always checked).
        #[arg(long)]
        config_hooks: bool,
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
    /// Install hooks from a git repository (owner/repo[/PATH], a git URL[#PATH], a browser
    /// URL .../tree/REF/PATH), a directory or a .tar.gz/.zip archive; each is checked first.
    ///
    /// Example: hermes-hooks install acme/hermes-hooks/hooks/boot-md --ref v1.2.0
    Install(InstallArgs),
    /// Fetch installed hooks again, show what changes (files, HOOK.yaml) and apply it.
    ///
    /// Example: hermes-hooks update --all --dry-run
    Update(UpdateArgs),
    /// Remove an installed hook and its hooks.lock entry (its state directory with --purge).
    ///
    /// Example: hermes-hooks remove boot-md
    Remove {
        /// The hook's name.
        name: String,
        /// Also delete its state directory ($HERMES_HOME/hook-state/NAME).
        #[arg(long)]
        purge: bool,
        /// Hook roots.
        #[command(flatten)]
        roots: RootArgs,
    },
    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell) on stdout.
    ///
    /// Example: hermes-hooks completions bash > ~/.local/share/bash-completion/completions/hermes-hooks
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page hermes-hooks(1) (roff) on stdout, or write every page into --out DIR.
    ///
    /// Example: hermes-hooks man --out /usr/local/share/man/man1
    Man {
        /// Write hermes-hooks.1 and one page per command (hermes-hooks-serve.1, ...) here.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

/// Options of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Hook roots.
    #[command(flatten)]
    pub roots: RootArgs,
    /// Listen on TCP HOST:PORT instead of the Unix socket (port 0 picks a free port).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Unix socket path. Default: $HERMES_HOME/hooks.sock.
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// File holding the bearer token required on every request (needed for non-loopback TCP).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Seconds to let queues drain on SIGINT/SIGTERM before stopping workers (0 to 3600).
    #[arg(long, value_name = "SECS", default_value_t = 5.0, value_parser = drain_secs, allow_negative_numbers = true)]
    pub drain_timeout: f64,
    /// Do not watch the hook roots (reload only on POST /v1/reload or SIGHUP).
    #[arg(long)]
    pub no_watch: bool,
    /// text (nothing on stdout), or json: one JSON object per line on stdout for what the host
    /// does (host_start, hook_loaded, handler_error, ..., host_stop); logs stay on stderr.
    #[arg(long, value_enum, default_value_t = Output::Text, hide_possible_values = true)]
    pub output: Output,
    /// CPU priority of the processes that run hooks (Python workers, executables, the Python
    /// fork server), as a nice increment over the service's own: hook work yields the CPU to the
    /// gateway. A hook's `nice:` in HOOK.yaml overrides it.
    #[arg(long, value_name = "N", env = crate::priority::NICE_ENV, default_value_t = crate::priority::DEFAULT_NICE, value_parser = crate::priority::parse_nice, allow_negative_numbers = true)]
    pub worker_nice: i32,
    /// idle (SCHED_IDLE, hook work only on CPU time the gateway does not want; a waking gateway
    /// preempts it at once; a hook a collect waits for is raised meanwhile) or normal. Default:
    /// idle when the service may raise it for a collect (CAP_SYS_NICE), else normal. A hook's
    /// `sched:` overrides it.
    #[arg(long, value_enum, value_name = "POLICY", env = crate::priority::SCHED_ENV, hide_possible_values = true)]
    pub worker_sched: Option<crate::priority::Sched>,
    /// none (default: hooks without a `sandbox:` key run unconfined) or strict (they get
    /// `sandbox: strict`: their own directory read-only, a private state directory, no network,
    /// only HERMES_*/locale/time-zone variables). A hook's own `sandbox:` wins.
    #[arg(long, value_enum, value_name = "MODE", env = crate::sandbox::DEFAULT_ENV, default_value_t = crate::sandbox::DefaultSandbox::None, hide_possible_values = true)]
    pub sandbox_default: crate::sandbox::DefaultSandbox,
    /// CPU priority of the service's own threads (HTTP, queues, the pipes to the workers), as a
    /// nice increment over the service's starting value; hook processes are still started at
    /// --worker-nice over the starting value.
    #[arg(long, value_name = "N", env = crate::priority::SERVICE_NICE_ENV, default_value_t = crate::priority::DEFAULT_SERVICE_NICE, value_parser = crate::priority::parse_nice, allow_negative_numbers = true)]
    pub service_nice: i32,
    /// idle (SCHED_IDLE, the gateway preempts the service's threads at once when it wakes;
    /// raised while a collect is pending) or normal, for the service's own threads. Default as
    /// --worker-sched; normal for a fleet `worker` (its leases and progress signals have
    /// deadlines).
    #[arg(long, value_enum, value_name = "POLICY", env = crate::priority::SERVICE_SCHED_ENV, hide_possible_values = true)]
    pub service_sched: Option<crate::priority::Sched>,
    /// Threads of the service's async runtime (0: one per core). Default: one per core for
    /// `serve`; one for the fleet's edge (`serve --fleet`) and `worker`: their own work per
    /// event is small, and a second thread costs more CPU per event in cross-thread wake-ups
    /// than it adds (handlers never run on these threads).
    #[arg(long, value_name = "N", env = "HERMES_HOOKS_RUNTIME_THREADS", value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub runtime_threads: Option<u16>,
    /// Stop (draining, as on SIGTERM) once no process has held a shared flock on FILE for
    /// --linger seconds: the gateways that autostarted this service hold it while they run.
    #[arg(long, value_name = "FILE")]
    pub gateway_lease: Option<PathBuf>,
    /// With --gateway-lease: seconds without any gateway before the service stops (0 to 86400).
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = linger_secs, requires = "gateway_lease")]
    pub linger: f64,
    /// Fleet mode (`--fleet nats://...`): publish to JetStream (serve) or take from it (worker).
    #[cfg(feature = "fleet")]
    #[command(flatten, next_help_heading = "Fleet mode (README, Fleet mode)")]
    pub fleet: crate::cli::fleet::FleetArgs,
}

impl ServeArgs {
    /// Threads for the async runtime (`None`: one per core), for `serve` or a `worker`.
    pub fn runtime_threads(&self, worker: bool) -> Option<usize> {
        #[cfg(feature = "fleet")]
        let fleet = worker || self.fleet.conn.fleet.is_some();
        #[cfg(not(feature = "fleet"))]
        let fleet = worker;
        match self.runtime_threads {
            Some(0) => None,
            Some(n) => Some(n as usize),
            None if fleet => Some(1),
            None => None,
        }
    }

    /// The priority of the service's own runtime threads (`worker`: a fleet worker's, which
    /// default to the normal class: they renew ordered hooks' leases and send the progress
    /// signals of held events, deadlines the broker keeps that a busy CPU must not starve under
    /// `SCHED_IDLE`; its hook processes keep their default).
    pub fn service_threads(&self, worker: bool) -> crate::priority::ServiceThreads {
        let default = if worker {
            crate::priority::Sched::Normal
        } else {
            crate::priority::default_sched()
        };
        crate::priority::ServiceThreads(crate::priority::Priority {
            nice: self.service_nice,
            sched: self.service_sched.unwrap_or(default),
        })
    }
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
    pub event: String,
    /// Context as a JSON object.
    #[arg(long, value_name = "JSON", conflicts_with = "context_file")]
    pub context: Option<String>,
    /// File holding the context as a JSON object.
    #[arg(long, value_name = "FILE")]
    pub context_file: Option<PathBuf>,
    /// Wait for the handlers' results (POST /v1/collect) instead of only queuing the event.
    #[arg(long)]
    pub collect: bool,
    /// Deadline for --collect, in milliseconds (default: as long as the matching hooks' own
    /// timeouts allow).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// The service's TCP address HOST:PORT (default: the Unix socket).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// The service's Unix socket. Default: $HERMES_HOOKS_ADDRESS, else $HERMES_HOME/hooks.sock.
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// File holding the bearer token (default: $HERMES_HOOKS_TOKEN when set).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// Options of `install`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    /// owner/repo[/PATH] (against $HERMES_HOOKS_GIT_BASE, default https://github.com/), a git
    /// URL (https, ssh, git@, file; #PATH for a subdirectory), a browser URL with tree/REF/PATH,
    /// a directory, or a .tar.gz/.tgz/.zip archive.
    pub source: String,
    /// Branch, tag or commit to install (default: the repository's default branch).
    #[arg(long = "ref", value_name = "REF")]
    pub reference: Option<String>,
    /// Install the hook under this name (its directory; HOOK.yaml must not name another).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Install every hook of the package (otherwise a package with several is listed).
    #[arg(long)]
    pub all: bool,
    /// Use a local directory in place (a link in the hook root) instead of copying it.
    #[arg(long)]
    pub link: bool,
    /// With --trust explicit: approve what is installed (as `enable NAME` would).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Hook roots (hooks are installed into the first).
    #[command(flatten)]
    pub roots: RootArgs,
}

/// Options of `update`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpdateArgs {
    /// The installed hook to update.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub name: Option<String>,
    /// Update every installed hook.
    #[arg(long)]
    pub all: bool,
    /// Show what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Move to this branch, tag or commit (recorded for later updates).
    #[arg(long = "ref", value_name = "REF")]
    pub reference: Option<String>,
    /// Apply without asking: replace files edited by hand since the install; with --trust
    /// explicit, also approve the new version (needed to apply it).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Hook roots.
    #[command(flatten)]
    pub roots: RootArgs,
}

/// Options of `test`.
#[derive(Debug, Clone, clap::Args)]
pub struct TestArgs {
    /// Event name, e.g. agent:start or command:reset.
    pub event: String,
    /// Hook roots.
    #[command(flatten)]
    pub roots: RootArgs,
    /// Context as a JSON object.
    #[arg(long, value_name = "JSON", conflicts_with = "context_file")]
    pub context: Option<String>,
    /// File holding the context as a JSON object.
    #[arg(long, value_name = "FILE")]
    pub context_file: Option<PathBuf>,
    /// Run only this hook.
    #[arg(long, value_name = "NAME")]
    pub hook: Option<String>,
    /// An agent event (pre_tool_call...): the tool the call is for (its tool_name).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["context", "context_file"])]
    pub for_tool: Option<String>,
    /// An agent event: a JSON object of the arguments Hermes calls its hooks with (tool_name,
    /// args, session_id, result...), merged over a sample call; the context is made from them
    /// as the Hermes plugin makes it (as `hermes hooks test --payload-file` does). The keys of a
    /// context are read too: tool_input is args, extra's keys are arguments, cwd the directory.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["context", "context_file"])]
    pub payload_file: Option<PathBuf>,
    /// One JSON line per hook instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Longest `--drain-timeout` accepted, in seconds.
pub const MAX_DRAIN_SECS: f64 = 3600.0;

/// `--drain-timeout`: a finite number of seconds from 0 to [`MAX_DRAIN_SECS`] (a usage error
/// otherwise, never a panic later).
fn drain_secs(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !secs.is_finite() || !(0.0..=MAX_DRAIN_SECS).contains(&secs) {
        return Err(format!(
            "{text:?} is not a number of seconds from 0 to {MAX_DRAIN_SECS}"
        ));
    }
    Ok(secs)
}

/// Longest `--linger` accepted, in seconds (a day).
const MAX_LINGER_SECS: f64 = 86400.0;

/// Parses `--linger`: a finite number of seconds from 0 to a day.
fn linger_secs(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !secs.is_finite() || !(0.0..=MAX_LINGER_SECS).contains(&secs) {
        return Err(format!(
            "{text:?} is not a number of seconds from 0 to {MAX_LINGER_SECS}"
        ));
    }
    Ok(secs)
}
