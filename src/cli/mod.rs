//! The command-line interface: [`main`] parses the arguments (`args`), sets up logging and
//! the runtime, and hands each command to its own module, which does the work and returns the
//! exit code: 0 ok, 1 a problem was found or the service failed, 2 usage error (errors are one
//! line on stderr saying what to do).

pub(crate) mod args;
pub(crate) mod check;
pub(crate) mod common;
pub(crate) mod completions;
pub(crate) mod dashboard;
pub(crate) mod doctor;
pub(crate) mod emit;
pub(crate) mod enable;
pub(crate) mod exit;
#[cfg(feature = "fleet")]
pub(crate) mod fleet;
pub(crate) mod hermes_python;
pub(crate) mod install;
pub(crate) mod lease;
pub(crate) mod list;
pub(crate) mod new;
pub(crate) mod plugin;
pub(crate) mod remove;
pub(crate) mod serve;
pub(crate) mod test_cmd;
pub(crate) mod update;

use std::time::Duration;

pub use crate::set_enabled::set_enabled;
pub(crate) use args::{Command, LogFormat};

/// Most threads of the service's blocking pool (tokio's default is 512). Its jobs are short
/// file-system work (a hook's tree checked before each process start, the scan, arming the
/// watch); starting 50 hooks at once used to grow the pool to ~135 threads, and each thread that
/// allocates keeps its own allocator pages: 47 MB of the service's PSS, 0.9 MB per hook
/// (BENCHMARKS.md, issue 37). Jobs beyond this wait for a free thread.
const SERVICE_BLOCKING_THREADS: usize = 8;

/// Parses the arguments, sets up logging, runs the command; returns the exit code.
pub fn main() -> i32 {
    let cli = match args::parse() {
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
    // -v: a hook's load traceback too (logged at debug under the target `hook`).
    let default_filter = match cli.verbose {
        true => format!("{default_filter},hook=debug"),
        false => default_filter.to_string(),
    };
    init_logging(cli.log_format, &default_filter);
    let service_threads = match &cli.command {
        Command::Serve(args) => Some(args.service_threads(false)),
        #[cfg(feature = "fleet")]
        Command::Worker(args) => Some(args.service_threads(true)),
        _ => None,
    };
    if service_threads.is_some() {
        crate::priority::record_base_nice();
    }
    let runtime_threads = match &cli.command {
        Command::Serve(args) => args.runtime_threads(false),
        #[cfg(feature = "fleet")]
        Command::Worker(args) => args.runtime_threads(true),
        _ => None,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = runtime_threads {
        builder.worker_threads(n);
    }
    if service_threads.is_some() {
        builder.max_blocking_threads(SERVICE_BLOCKING_THREADS);
    }
    if let Some(threads) = service_threads {
        // The service's own work is background work too (crate::priority): each runtime thread
        // lowers itself as it starts; hook processes are started by a thread that does not.
        builder.on_thread_start(move || threads.lower_this_thread());
        builder.on_thread_stop(crate::priority::ServiceThreads::forget_this_thread);
    }
    let runtime = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hermes-hooks: cannot start the async runtime: {e}");
            return 1;
        }
    };
    if let Some(threads) = service_threads {
        threads.install(runtime.handle().clone());
    }
    let code = runtime.block_on(async move {
        let code = match cli.command {
            Command::Serve(args) => serve::serve(args).await,
            #[cfg(feature = "fleet")]
            Command::Worker(mut args) => {
                args.fleet.worker = true;
                serve::serve(args).await
            }
            #[cfg(feature = "fleet")]
            Command::Dead { command } => fleet::dead(command).await,
            Command::List { roots, json, live } => match live {
                Some(address) => list::list_live(&address, json).await,
                None => list::list(roots, json).await,
            },
            Command::Check {
                roots,
                config_hooks,
            } => check::check(roots, config_hooks).await,
            Command::Test(args) => test_cmd::test(args).await,
            Command::Emit(args) => emit::emit(args).await,
            Command::New {
                name,
                kind,
                url,
                src,
                roots,
            } => new::new_hook(&roots, &name, kind, url.as_deref(), src),
            Command::Enable { name, roots } => enable::set_enabled(&roots, &name, true),
            Command::Disable { name, roots } => enable::set_enabled(&roots, &name, false),
            Command::Dashboard { command } => dashboard::dashboard(command),
            Command::Plugin { command } => plugin::plugin(command),
            Command::Doctor { no_run } => doctor::doctor(no_run).await,
            Command::Install(args) => install::install(args).await,
            Command::Update(args) => update::update(args).await,
            Command::Remove { name, purge, roots } => remove::remove(&roots, &name, purge).await,
            Command::Completions { shell } => completions::completions(shell),
            Command::Man { out } => completions::man(out.as_deref()),
        };
        // The workers are stopped: let the Python fork servers reap them and exit before we do.
        crate::handler::python::zygote::shutdown_all(Duration::from_secs(5)).await;
        code
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
