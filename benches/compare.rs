//! Gateway-side emit latency, hermes-hooks against the original in-gateway host, in one run.
//!
//! `cargo bench --bench compare` (builds the release binary first).
//! 1. HTTP: `hermes-hooks serve` on 127.0.0.1:0 with 10 Python hooks that each sleep 50 ms;
//!    300 `POST /v1/events` over one keep-alive connection, each timed until its 202.
//! 2. Drop-in client: `serve` on a Unix socket with 10 hooks on agent:start, one sleeping
//!    200 ms; `benches/client_emit.py` times 10,000 `await registry.emit(...)` through
//!    `clients/python`.
//! 3. The same with the slow hook inside the gateway (`runs: gateway`: the client imports it
//!    and runs its sync handler on the hook's own thread) next to nine service hooks.
//! 4. The baseline (`benches/baseline_host.py`, the original host re-created) on the same
//!    shapes. Prints medians, p99s and ratios side by side.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Instant;

mod common;

fn write_hooks(root: &std::path::Path, n: usize, code: &str) {
    for i in 0..n {
        let dir = root.join(format!("hook{i:02}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("HOOK.yaml"), "events: [agent:start]\n").expect("write");
        std::fs::write(dir.join("handler.py"), code).expect("write");
    }
}

/// Sends `count` events over one keep-alive connection; returns per-request latencies in µs.
fn http_emits(addr: &str, count: usize) -> Vec<f64> {
    let mut sock = TcpStream::connect(addr).expect("connect");
    sock.set_nodelay(true).expect("nodelay");
    let mut reader = BufReader::new(sock.try_clone().expect("clone"));
    let body = br#"{"event": "agent:start", "context": {"platform": "telegram", "user_id": "42", "message": "hello"}}"#;
    let req = format!(
        "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        sock.write_all(req.as_bytes()).expect("write");
        sock.write_all(body).expect("write");
        let status = common::read_response(&mut reader);
        out.push(t0.elapsed().as_secs_f64() * 1e6);
        assert!(status.contains(" 202 "), "{status}");
    }
    out
}

fn main() {
    let bin = env!("CARGO_BIN_EXE_hermes-hooks");
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("hooks");
    write_hooks(
        &root,
        10,
        "import time\ndef handle(e, c):\n    time.sleep(0.05)\n",
    );
    let service = common::Service::start(&root, tmp.path());
    let addr = service.addr.clone();

    let _ = http_emits(&addr, 20); // warm-up
    let mut lat = http_emits(&addr, 300);
    drop(service);

    // 2. The drop-in client against a service on a Unix socket.
    let tmp2 = tempfile::tempdir().expect("tempdir");
    let root2 = tmp2.path().join("hooks");
    write_hooks(&root2, 9, "def handle(e, c):\n    return None\n");
    let slow = root2.join("hook99-slow");
    std::fs::create_dir_all(&slow).expect("mkdir");
    std::fs::write(slow.join("HOOK.yaml"), "events: [agent:start]\n").expect("write");
    std::fs::write(
        slow.join("handler.py"),
        "import time\ndef handle(e, c):\n    time.sleep(0.2)\n",
    )
    .expect("write");
    let client = client_bench(bin, &root2, tmp2.path());

    // 3. The slow hook inside the gateway, next to nine service hooks.
    let tmp3 = tempfile::tempdir().expect("tempdir");
    let root3 = tmp3.path().join("hooks");
    write_hooks(&root3, 9, "def handle(e, c):\n    return None\n");
    let slow = root3.join("hook99-in-gateway");
    std::fs::create_dir_all(&slow).expect("mkdir");
    std::fs::write(
        slow.join("HOOK.yaml"),
        "events: [agent:start]\nruns: gateway\n",
    )
    .expect("write");
    std::fs::write(
        slow.join("handler.py"),
        "import time\ndef handle(e, c):\n    time.sleep(0.2)\n",
    )
    .expect("write");
    let in_gateway = client_bench(bin, &root3, tmp3.path());

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/baseline_host.py");
    let base = Command::new("python3")
        .arg(script)
        .arg("--json")
        .output()
        .expect("run baseline");
    let base: serde_json::Value = serde_json::from_slice(&base.stdout).expect("baseline JSON");
    let b50 = base["ten_sleep_50ms"]["p50_ms"]
        .as_f64()
        .unwrap_or(f64::NAN)
        * 1000.0;
    let b99 = base["ten_sleep_50ms"]["p99_ms"]
        .as_f64()
        .unwrap_or(f64::NAN)
        * 1000.0;
    let (p50, p99) = (common::pct(&mut lat, 0.5), common::pct(&mut lat, 0.99));
    println!("emit with 10 hooks that each sleep 50 ms (gateway-side time per emit)");
    println!("{:<44} {:>12} {:>12}", "", "p50 µs", "p99 µs");
    println!(
        "{:<44} {:>12.1} {:>12.1}",
        "original host (awaits inline), 20 emits", b50, b99
    );
    println!(
        "{:<44} {:>12.1} {:>12.1}",
        "hermes-hooks POST /v1/events, 300 emits", p50, p99
    );
    println!(
        "{:<44} {:>11.0}x {:>11.0}x",
        "ratio (original / hermes-hooks)",
        b50 / p50,
        b99 / p99
    );
    println!();
    let c50 = client["p50_us"].as_f64().unwrap_or(f64::NAN);
    let c99 = client["p99_us"].as_f64().unwrap_or(f64::NAN);
    let t50 = base["trivial_10"]["p50_us"].as_f64().unwrap_or(f64::NAN);
    let t99 = base["trivial_10"]["p99_us"].as_f64().unwrap_or(f64::NAN);
    let s50 = base["one_slow_200ms"]["p50_ms"]
        .as_f64()
        .unwrap_or(f64::NAN)
        * 1000.0;
    let s99 = base["one_slow_200ms"]["p99_ms"]
        .as_f64()
        .unwrap_or(f64::NAN)
        * 1000.0;
    println!("await registry.emit(...) with 10 hooks on agent:start (gateway-side time per emit)");
    println!("{:<52} {:>12} {:>12}", "", "p50 µs", "p99 µs");
    println!(
        "{:<52} {:>12.2} {:>12.2}",
        "original host, 10 trivial hooks, 10,000 emits", t50, t99
    );
    println!(
        "{:<52} {:>12.1} {:>12.1}",
        "original host, one of 10 hooks sleeps 200 ms, 20 emits", s50, s99
    );
    println!(
        "{:<52} {:>12.2} {:>12.2}",
        "clients/python -> hermes-hooks, one sleeps 200 ms, 10,000", c50, c99
    );
    println!(
        "{:<52} {:>11.2}x {:>11.2}x",
        "ratio vs original with trivial hooks",
        t50 / c50,
        t99 / c99
    );
    println!(
        "{:<52} {:>11.0}x {:>11.0}x",
        "ratio vs original with the 200 ms hook",
        s50 / c50,
        s99 / c99
    );
    println!();
    let g50 = in_gateway["p50_us"].as_f64().unwrap_or(f64::NAN);
    let g99 = in_gateway["p99_us"].as_f64().unwrap_or(f64::NAN);
    println!(
        "await registry.emit(...), one in-gateway sync hook sleeping 200 ms + 9 service hooks"
    );
    println!("{:<52} {:>12} {:>12}", "", "p50 µs", "p99 µs");
    println!(
        "{:<52} {:>12.1} {:>12.1}",
        "original host, one of 10 hooks sleeps 200 ms, 20 emits", s50, s99
    );
    println!(
        "{:<52} {:>12.2} {:>12.2}",
        "clients/python, 200 ms hook in the gateway, 10,000", g50, g99
    );
    println!(
        "{:<52} {:>11.0}x {:>11.0}x",
        "ratio vs original with the 200 ms hook",
        s50 / g50,
        s99 / g99
    );
    println!();
    println!("baseline raw: {base}");
    println!("client raw: {client}");
    println!("in-gateway raw: {in_gateway}");
}

/// Runs `serve` on a Unix socket over `root` and `benches/client_emit.py` against it.
fn client_bench(bin: &str, root: &std::path::Path, home: &std::path::Path) -> serde_json::Value {
    let sock = home.join("hooks.sock");
    let mut child = Command::new(bin)
        .args(["serve", "--drain-timeout", "0", "--hooks-dir"])
        .arg(root)
        .arg("--socket")
        .arg(&sock)
        .env("HERMES_HOME", home)
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    // The client lists the hooks once (and imports the in-gateway ones): wait until loaded.
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while !unix_ready(&sock) {
        assert!(
            Instant::now() < deadline,
            "service not ready at {}",
            sock.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let client_script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/client_emit.py");
    let client = Command::new("python3")
        .arg(client_script)
        .arg(&sock)
        .env("HERMES_HOME", home)
        .output()
        .expect("run client bench");
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    serde_json::from_slice(&client.stdout).unwrap_or_else(|_| {
        panic!(
            "client bench output: {}",
            String::from_utf8_lossy(&client.stderr)
        )
    })
}

/// `GET /readyz` over the Unix socket answered 200.
fn unix_ready(sock: &std::path::Path) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(sock) else {
        return false;
    };
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}
