//! The service's lifecycle: signals that arrive while the first load is still running, and the
//! service started from the library (no CLI) on port 0 and stopped by its shutdown future.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::util::{Hooks, Serve, bin, http, poll, signal};

const T: Duration = Duration::from_secs(30);

/// A Python hook whose import announces itself (out/importing) and then blocks until the test
/// creates out/release (at most 8 s, under the 10 s start timeout): the first load is held open
/// for as long as the test needs.
fn slow_import_hook(hooks: &Hooks) -> (std::path::PathBuf, std::path::PathBuf) {
    let importing = hooks.out().join("importing");
    let release = hooks.out().join("release");
    let code = format!(
        "import os, time\nopen({importing:?}, 'w').close()\ndeadline = time.time() + 8\n\
         while not os.path.exists({release:?}) and time.time() < deadline:\n    time.sleep(0.01)\n\n\
         def handle(event, context):\n    return {{'ok': True}}\n",
        importing = importing.display().to_string(),
        release = release.display().to_string(),
    );
    hooks.python("slow", "[agent:start]", &code);
    (importing, release)
}

fn serve_cmd(hooks: &Hooks, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0", "--no-watch"])
        .args(extra);
    cmd
}

/// Waits for the child to exit; its exit code.
fn wait_exit(serve: &mut Serve) -> Option<i32> {
    poll(T, "the service to exit", || {
        serve.child.try_wait().ok().flatten().map(|s| s.code())
    })
}

#[test]
fn sighup_during_the_first_load_reloads_after_it_instead_of_killing_the_process() {
    let hooks = Hooks::new();
    let (importing, release) = slow_import_hook(&hooks);
    let mut serve = Serve::spawn_listening(serve_cmd(&hooks, &[]), &hooks);
    poll(T, "the first load to be importing the hook", || {
        importing.exists().then_some(())
    });
    signal(serve.child.id(), libc::SIGHUP);
    poll(
        T,
        "the SIGHUP to be logged as arriving during the first load",
        || {
            serve
                .log()
                .contains("SIGHUP during the first load")
                .then_some(())
        },
    );
    assert!(
        serve.child.try_wait().unwrap().is_none(),
        "expected the service to survive SIGHUP during the first load; log:\n{}",
        serve.log()
    );
    let (status, body) = serve.get("/readyz");
    assert_eq!(
        status, 503,
        "expected not ready while the import is held: {body}"
    );
    std::fs::write(&release, "").unwrap();
    poll(T, "readyz after the first load", || {
        (serve.get("/readyz").0 == 200).then_some(())
    });
    poll(T, "the reload the SIGHUP asked for", || {
        serve.log().contains("reloaded").then_some(())
    });
    let (status, body) = serve.post(
        "/v1/collect",
        &json!({"event": "agent:start", "context": {}, "timeout_ms": 10000}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["result"], json!({"ok": true}), "{body}");
    assert_eq!(serve.terminate(), Some(0), "log:\n{}", serve.log());
}

#[test]
fn sigterm_during_the_first_load_still_drains_and_reports_host_stop() {
    let hooks = Hooks::new();
    let (importing, release) = slow_import_hook(&hooks);
    let mut serve = Serve::spawn_listening(serve_cmd(&hooks, &["--output", "json"]), &hooks);
    poll(T, "the first load to be importing the hook", || {
        importing.exists().then_some(())
    });
    signal(serve.child.id(), libc::SIGTERM);
    poll(T, "the SIGTERM to be handled", || {
        serve.log().contains("SIGTERM: stopping").then_some(())
    });
    std::fs::write(&release, "").unwrap();
    let code = wait_exit(&mut serve);
    assert_eq!(code, Some(0), "log:\n{}", serve.log());
    poll(T, "stdout to be read to its end", || {
        let lines = serve.stdout_json();
        lines.last().filter(|l| l["type"] == "host_stop").cloned()
    });
    let lines = serve.stdout_json();
    let kinds: Vec<&str> = lines.iter().filter_map(|l| l["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"host_start"), "{kinds:?}");
    assert!(
        kinds.contains(&"hook_loaded"),
        "expected the first load to finish before the drain: {kinds:?}"
    );
    let stop = lines.last().unwrap();
    assert_eq!(stop["type"], "host_stop", "{lines:?}");
    assert_eq!(stop["exit_code"], 0, "{stop}");
    assert_eq!(stop["undelivered"], 0, "{stop}");
    assert!(stop["drain_ms"].is_u64(), "expected drain_ms in {stop}");
    assert!(
        serve.log().contains("shutting down: draining"),
        "{}",
        serve.log()
    );
}

#[test]
fn the_library_runs_the_service_on_port_0_and_stops_it_by_its_shutdown_future() {
    use hermes_hooks::service::{self, Listener, ServiceConfig};
    let hooks = Hooks::new();
    hooks.recorder("rec", "[agent:start]", "{'seen': True}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let host = hermes_hooks::Host::new(crate::util::config(&hooks));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = ServiceConfig {
        watch: false,
        ..ServiceConfig::default()
    };
    let running = rt.spawn(service::run(Listener::Tcp(listener), host, config, async {
        let _ = stopped.await;
    }));
    poll(T, "readyz", || {
        let (status, _, _) = http(&addr, "GET", "/readyz", &[], b"");
        (status == 200).then_some(())
    });
    let body = serde_json::to_vec(&json!({"event": "agent:start", "context": {"n": 1}})).unwrap();
    let (status, _, answer) = http(
        &addr,
        "POST",
        "/v1/events",
        &[("Content-Type", "application/json")],
        &body,
    );
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&answer));
    poll(T, "the hook to record the event", || {
        (hooks.recorded("rec").len() == 1).then_some(())
    });
    stop.send(()).unwrap();
    let started = Instant::now();
    let report = rt
        .block_on(running)
        .expect("the service task")
        .expect("the service ran");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "expected the stop to take well under the drain and server grace"
    );
    assert_eq!(report.undelivered(), 0);
    let first = report.first_load.expect("the first load finished");
    assert_eq!(first.loaded, vec!["rec".to_string()], "{:?}", first.skipped);
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "expected the listener closed after the service stopped"
    );
}
