//! The service as deployed: the Unix socket default, stale and live sockets, tokens, refusing
//! to expose itself, 503 while draining, and the `emit` command talking to it.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, bin, http, poll};

const T: Duration = Duration::from_secs(30);

/// `serve` on the default socket ($HERMES_HOME/hooks.sock); returns the child once ready.
/// `serve` on `hooks` (its socket in their `HERMES_HOME`), not waited for.
fn spawn_serve(hooks: &Hooks) -> std::process::Child {
    Command::new(bin())
        .args(["serve", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn serve_on_socket(hooks: &Hooks) -> std::process::Child {
    let child = spawn_serve(hooks);
    let sock = hooks.home().join("hooks.sock");
    poll(T, "the socket to answer", || {
        let o = emit_cli(hooks, &["agent:none"]);
        (sock.exists() && o.status.success()).then_some(())
    });
    child
}

fn emit_cli(hooks: &Hooks, args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .arg("emit")
        .args(args)
        .env("HERMES_HOME", hooks.home())
        .output()
        .unwrap()
}

fn stop(mut child: std::process::Child) {
    crate::util::signal(child.id(), libc::SIGTERM);
    let _ = child.wait();
}

#[test]
fn unix_socket_by_default_with_mode_0600_and_emit_talks_to_it() {
    let hooks = Hooks::new();
    hooks.python(
        "pol",
        "[message:pre_route]",
        "def handle(e, c):\n    return {'seen': c['message']}\n",
    );
    hooks.recorder("rec", "[agent:start]", "None");
    let child = serve_on_socket(&hooks);
    let sock = hooks.home().join("hooks.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let o = emit_cli(&hooks, &["agent:start", "--context", r#"{"user_id": "9"}"#]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap(),
        json!({"queued": 1})
    );
    poll(T, "delivery", || {
        (hooks.recorded("rec").len() == 1).then_some(())
    });

    let o = emit_cli(
        &hooks,
        &[
            "message:pre_route",
            "--collect",
            "--context",
            r#"{"message": "m"}"#,
        ],
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["results"],
        json!([{"hook": "pol", "result": {"seen": "m"}}])
    );

    let o = emit_cli(&hooks, &["bad name"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("HTTP 400"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // A second service on the same socket is refused, naming the running one.
    let o = Command::new(bin())
        .args(["serve", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("already running") && err.contains(&format!("pid {}", child.id())),
        "{err}"
    );
    stop(child);
    assert!(!sock.exists(), "socket removed on exit");
    let o = emit_cli(&hooks, &["agent:start"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is `hermes-hooks serve` running?"));
}

#[test]
fn stale_socket_file_is_replaced() {
    let hooks = Hooks::new();
    let sock = hooks.home().join("hooks.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists(), "a stale socket file is left behind");
    let child = serve_on_socket(&hooks);
    stop(child);
}

#[test]
fn non_loopback_tcp_needs_a_token_and_the_token_is_checked() {
    let hooks = Hooks::new();
    hooks.recorder("rec", "[agent:start]", "None");
    let o = Command::new(bin())
        .args(["serve", "--listen", "0.0.0.0:0", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("without --token-file"));

    let token_file = hooks.tmp.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--hooks-dir"])
        .arg(hooks.root())
        .arg("--token-file")
        .arg(&token_file);
    // Health probes need no token, so the harness's readiness poll works as is.
    let serve = Serve::spawn(cmd, &hooks);
    let addr = serve.addr.clone();
    let body = br#"{"event": "agent:start"}"#;
    let ct = ("Content-Type", "application/json");
    let (s, _, b) = http(&addr, "POST", "/v1/events", &[ct], body);
    assert_eq!(s, 401);
    assert_eq!(
        serde_json::from_slice::<Value>(&b).unwrap()["error"]["code"],
        "unauthorized"
    );
    let (s, _, _) = http(
        &addr,
        "POST",
        "/v1/events",
        &[ct, ("Authorization", "Bearer wrong")],
        body,
    );
    assert_eq!(s, 401);
    let (s, _, _) = http(
        &addr,
        "POST",
        "/v1/events",
        &[ct, ("Authorization", "Bearer s3cret-token")],
        body,
    );
    assert_eq!(s, 202);
    let o = Command::new(bin())
        .args(["emit", "agent:start", "--listen", &addr, "--token-file"])
        .arg(&token_file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    poll(T, "both deliveries", || {
        (hooks.recorded("rec").len() == 2).then_some(())
    });
    let (s, _, _) = http(&addr, "GET", "/v1/hooks", &[], b"");
    assert_eq!(s, 401, "everything but the health probes needs the token");
}

#[test]
fn events_get_503_while_the_service_drains() {
    let hooks = Hooks::new();
    hooks.python(
        "slow",
        "[agent:step]",
        "import time\ndef handle(e, c):\n    time.sleep(0.3)\n",
    );
    let serve = Serve::start(&hooks, &["--drain-timeout", "30"]);
    for _ in 0..10 {
        assert_eq!(
            serve.post("/v1/events", &json!({"event": "agent:step"})).0,
            202
        );
    }
    crate::util::signal(serve.child.id(), libc::SIGTERM);
    let (s, v) = poll(T, "a 503", || {
        let r = serve.post("/v1/events", &json!({"event": "agent:step"}));
        (r.0 == 503).then_some(r)
    });
    assert_eq!(s, 503);
    assert_eq!(v["error"]["code"], "shutting_down");
    assert_eq!(serve.get("/readyz").0, 503);
    // Status stays readable while draining.
    assert_eq!(serve.get("/v1/hooks").0, 200);
}

#[test]
fn events_before_the_first_load_get_503_not_ready_and_a_reload_never_blocks_emit() {
    let hooks = Hooks::new();
    // Importing this handler takes a while: the first load, and every reload of it, is slow.
    let slow_import = "import time\ntime.sleep(2)\ndef handle(e, c):\n    return 'loaded'\n";
    let dir = hooks.python("slow-import", "[command:x]", slow_import);
    hooks.recorder("rec", "[agent:start]", "None");
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .env("HERMES_HOOKS_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(a) = line.split("listening on http://").nth(1) {
                let _ = tx.send(a.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    });
    let addr = rx.recv_timeout(T).expect("listening line");
    let ct = [("Content-Type", "application/json")];
    let (s, _, b) = http(
        &addr,
        "POST",
        "/v1/events",
        &ct,
        br#"{"event": "agent:start"}"#,
    );
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("not_ready")),
        "{v}"
    );
    assert_eq!(http(&addr, "GET", "/readyz", &[], b"").0, 503);
    poll(T, "ready", || {
        (http(&addr, "GET", "/readyz", &[], b"").0 == 200).then_some(())
    });

    // Edit the slow hook: its new version takes 2 s to start; emit must not wait for that.
    std::fs::write(
        dir.join("handler.py"),
        slow_import.replace("'loaded'", "'reloaded'"),
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let mut worst = Duration::ZERO;
    while t0.elapsed() < Duration::from_secs(3) {
        let t = std::time::Instant::now();
        let (s, _, _) = http(
            &addr,
            "POST",
            "/v1/events",
            &ct,
            br#"{"event": "agent:start"}"#,
        );
        assert_eq!(s, 202);
        worst = worst.max(t.elapsed());
    }
    assert!(
        worst < Duration::from_millis(500),
        "an emit waited {worst:?} during the reload"
    );
    poll(T, "the new version", || {
        let (_, _, b) = http(
            &addr,
            "POST",
            "/v1/collect",
            &ct,
            br#"{"event": "command:x"}"#,
        );
        let v: Value = serde_json::from_slice(&b).ok()?;
        (v["results"][0]["result"] == "reloaded").then_some(())
    });
    stop(child);
}

/// Issue 47 (suspected, confirmed): `emit --collect` during the first load exited 1 at once on
/// 503 `not_ready`, where the Python client waits for the load. It now asks again until the
/// hooks are loaded and prints the decision.
#[test]
fn emit_collect_during_the_first_load_waits_for_it() {
    let hooks = Hooks::new();
    let slow_import =
        "import time\ntime.sleep(2)\ndef handle(e, c):\n    return {'decision': 'deny'}\n";
    hooks.python("slow-guard", "[command:x]", slow_import);
    let sock = hooks.home().join("hooks.sock");
    let mut serve = spawn_serve(&hooks);
    poll(T, "the socket", || sock.exists().then_some(()));
    let out = Command::new(bin())
        .args(["emit", "command:x", "--collect", "--socket"])
        .arg(&sock)
        .env("HERMES_HOME", hooks.home())
        .output()
        .unwrap();
    crate::util::signal(serve.id(), libc::SIGTERM);
    let _ = serve.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}: {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"deny\""), "{stdout}");
}
