//! `serve`: binds the listener the options name, then runs [`crate::service::run`] until
//! SIGINT/SIGTERM. With `--output json` the real stdout carries the notices only.

use std::time::Duration;

use crate::cli::args::{Output, ServeArgs};
use crate::cli::common::fail;
use crate::host::{Host, HostConfig};
use crate::server::{self, ApiConfig};
use crate::service::{self, Listener, ServiceConfig};

/// Binds the listener the options name and reads the token; refuses a non-loopback TCP
/// address without one.
async fn bind(args: &ServeArgs, config: &HostConfig) -> Result<(Listener, Option<String>), String> {
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
        return Ok((Listener::Tcp(listener), token));
    }
    let path = args
        .socket
        .clone()
        .unwrap_or_else(|| config.hermes_home.join("hooks.sock"));
    let listener = server::bind_unix(&path).map_err(|e| e.to_string())?;
    Ok((Listener::Unix(listener, path), token))
}

/// Runs `serve`; returns the exit code.
pub async fn serve(args: ServeArgs) -> i32 {
    #[allow(unused_mut)]
    let mut config = match args.roots.checked_config() {
        Ok(c) => c,
        Err(e) => return crate::cli::common::usage(e),
    };
    // The roots given were checked above (within a deadline); the default one may be missing.
    let given = |r: &std::path::PathBuf| {
        args.roots
            .hooks_dir
            .iter()
            .any(|d| std::path::absolute(d).is_ok_and(|d| d == *r))
    };
    for root in config.roots.iter().filter(|r| !given(r)) {
        match crate::cli::args::metadata_within(root, crate::cli::args::ROOT_STAT_DEADLINE) {
            Some(Ok(m)) if m.is_dir() => {}
            Some(_) => tracing::warn!(
                "hook root {} does not exist (yet): no hooks from it until it is created",
                root.display()
            ),
            None => tracing::warn!(
                "hook root {} did not answer within {}: its hooks load once it answers",
                root.display(),
                crate::time::fmt_duration(crate::cli::args::ROOT_STAT_DEADLINE)
            ),
        }
    }
    config.worker_priority = crate::priority::Priority {
        nice: args.worker_nice,
        sched: args
            .worker_sched
            .unwrap_or_else(crate::priority::default_sched),
    };
    if (args.worker_sched.is_none() || args.service_sched.is_none())
        && !crate::priority::can_raise()
    {
        tracing::warn!(
            "this service may not raise a decision's work out of SCHED_IDLE (no CAP_SYS_NICE): hook processes and the service's threads run in the normal class, so that a decision never times out on a busy CPU (--worker-sched idle / --service-sched idle to choose idle anyway)"
        );
    }
    config.sandbox_default = args.sandbox_default;
    #[cfg(feature = "fleet")]
    args.fleet.adjust(&mut config);
    let notices = match args.output {
        Output::Json => crate::notices::Notices::to_writer(private_stdout()),
        // Kept in memory only: `GET /v1/notices` (the dashboard's live tail).
        Output::Text => crate::notices::Notices::recording(),
    };
    let watch = !args.no_watch;
    if let Err(e) = crate::layout::create_private_dir(&config.hermes_home) {
        let e = format!(
            "cannot create HERMES_HOME {}: {e}",
            config.hermes_home.display()
        );
        service::report_failed_start(&notices, &config.roots, watch, &e);
        return fail(e);
    }
    let lease = match args.gateway_lease.as_deref().map(crate::cli::lease::open) {
        Some(Err(e)) => {
            service::report_failed_start(&notices, &config.roots, watch, &e);
            return fail(e);
        }
        Some(Ok(file)) => Some(file),
        None => None,
    };
    let (listener, token) = match bind(&args, &config).await {
        Ok(b) => b,
        Err(e) => {
            service::report_failed_start(&notices, &config.roots, watch, &e);
            return fail(e);
        }
    };
    #[allow(unused_mut)]
    let mut service_config = ServiceConfig {
        api: ApiConfig { token },
        drain: Duration::from_secs_f64(args.drain_timeout.clamp(0.0, 3600.0)),
        watch,
        signals: true,
        before_drain: None,
    };
    let host = Host::with_notices(config.clone(), notices.clone());
    #[cfg(feature = "fleet")]
    match args.fleet.attach(&host).await {
        Ok(running) => service_config.before_drain = Some(running.into_before_drain()),
        Err(e) => {
            service::report_failed_start(&notices, &config.roots, watch, &e);
            return fail(e);
        }
    }
    // SIGINT/SIGTERM stop the CLI's service, and with --gateway-lease the last gateway's going.
    let linger = Duration::from_secs_f64(args.linger);
    let draining = host.clone();
    let stop = async move {
        match lease {
            Some(file) => {
                // The lease stays locked until the service refuses new work: a gateway that
                // comes now waits for the lock, then sees `shutting_down` and starts another.
                let decided = crate::cli::lease::unused_for(file, linger).await;
                draining.begin_draining();
                drop(decided);
            }
            None => std::future::pending().await,
        }
    };
    match service::run(listener, host, service_config, stop).await {
        Ok(_) => 0,
        Err(e) => {
            let e = e.to_string();
            service::report_failed_start(&notices, &config.roots, watch, &e);
            fail(e)
        }
    }
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
