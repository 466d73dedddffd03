//! Fleet mode figures for BENCHMARKS.md (`cargo bench --bench fleet`; needs `nats-server`, `cc`
//! and `python3`): events/s edge -> JetStream -> 1 and 2 workers for a no-op C library hook and a
//! trivial Python hook (concurrency 1 = order kept, and 64), the same workload in local mode,
//! end-to-end latency p50/p99 (accepted at the edge -> handler running), and the failover time of
//! an event whose worker is SIGKILLed mid-handler.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const NOOP_C: &str = r#"
#include <stdint.h>
#include <stddef.h>
typedef struct { uint8_t *ptr; size_t len; } HermesHookBuf;
uint32_t hermes_hook_abi_version(void) { return 1; }
int32_t hermes_hook_handle(const uint8_t *e, size_t el, const uint8_t *c, size_t cl, HermesHookBuf *out) {
    (void)e; (void)el; (void)c; (void)cl; out->ptr = 0; out->len = 0; return 0;
}
void hermes_hook_free(HermesHookBuf b) { (void)b; }
"#;

const NOOP_PY: &str = "def handle(event, context):\n    return None\n";

/// A service or worker, stopped (SIGTERM, then reaped) on drop.
type Proc = common::Service;

fn spawn(args: &[&str], home: &Path) -> Proc {
    common::Service::spawn(args, home)
}

fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    s.write_all(body).expect("write");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct Nats {
    child: Child,
    port: u16,
    _store: tempfile::TempDir,
}

impl Nats {
    fn start() -> Self {
        let store = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let child = Command::new("nats-server")
            .args(["-js", "-sd"])
            .arg(store.path())
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        wait_until("nats-server", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Self {
            child,
            port,
            _store: store,
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Dylib,
    Python,
}

/// A hook root with one hook `h` on `bench:*` of `kind`.
fn hook_root(dir: &Path, kind: Kind, concurrency: u32, extra_py: Option<&str>) -> PathBuf {
    let root = dir.join(format!("hooks-{concurrency}-{}", extra_py.is_some()));
    let hook = root.join("h");
    std::fs::create_dir_all(&hook).expect("mkdir");
    std::fs::write(
        hook.join("HOOK.yaml"),
        format!(
            "events: [\"bench:*\"]\nqueue: {{capacity: 1000000}}\nconcurrency: {concurrency}\n"
        ),
    )
    .expect("write HOOK.yaml");
    match kind {
        Kind::Dylib => {
            let c = dir.join("noop.c");
            std::fs::write(&c, NOOP_C).expect("write noop.c");
            let ok = Command::new("cc")
                .args(["-O2", "-shared", "-fPIC", "-o"])
                .arg(hook.join("handler.so"))
                .arg(&c)
                .status()
                .expect("cc")
                .success();
            assert!(ok, "cc failed");
        }
        Kind::Python => std::fs::write(hook.join("handler.py"), extra_py.unwrap_or(NOOP_PY))
            .expect("write handler.py"),
    }
    root
}

fn ok_count(addr: &str) -> u64 {
    let (_, v) = http(addr, "GET", "/v1/hooks/h", b"");
    v["counters"]["ok"].as_u64().unwrap_or(0)
}

fn batch(n: usize, first: usize) -> Vec<u8> {
    let events: Vec<Value> = (first..first + n)
        .map(|i| json!({"event": "bench:e", "context": {"platform": "telegram", "user_id": "42", "chat_id": "c", "session_id": "s", "i": i}}))
        .collect();
    serde_json::to_vec(&json!({"events": events})).expect("json")
}

/// Sends `total` events in batches of 1,000 to `edge`, returns events/s until `done` says all
/// were handled.
fn run_load(edge: &str, total: usize, done: impl Fn() -> u64) -> f64 {
    let start = Instant::now();
    let mut sent = 0;
    while sent < total {
        let n = (total - sent).min(1000);
        let (status, v) = http(edge, "POST", "/v1/events/batch", &batch(n, sent));
        assert_eq!(status, 202, "{v}");
        sent += n;
    }
    wait_until("every event handled", Duration::from_secs(600), || {
        done() >= total as u64
    });
    total as f64 / start.elapsed().as_secs_f64()
}

fn throughput(dir: &Path, kind: Kind, workers: usize, concurrency: u32, total: usize) -> f64 {
    let nats = Nats::start();
    let root = hook_root(dir, kind, concurrency, None);
    let root_s = root.to_str().expect("utf-8 path").to_string();
    let url = nats.url();
    let ws: Vec<Proc> = (0..workers)
        .map(|i| {
            let id = format!("w{i}");
            spawn(
                &[
                    "worker",
                    "--fleet",
                    &url,
                    "--hooks-dir",
                    &root_s,
                    "--worker-id",
                    &id,
                    "--status-interval-ms",
                    "100",
                ],
                dir,
            )
        })
        .collect();
    let edge = spawn(&["serve", "--fleet", &url, "--gateway-id", "bench"], dir);
    wait_until("the fleet view", Duration::from_secs(30), || {
        let (_, v) = http(&edge.addr, "GET", "/v1/hooks", b"");
        v["hooks"][0]["workers"].as_array().map(|a| a.len()) == Some(workers)
    });
    let addrs: Vec<String> = ws.iter().map(|w| w.addr.clone()).collect();
    run_load(&edge.addr, total, || {
        addrs.iter().map(|a| ok_count(a)).sum()
    })
}

fn local(dir: &Path, kind: Kind, total: usize) -> f64 {
    let root = hook_root(dir, kind, 1, None);
    let svc = spawn(
        &["serve", "--hooks-dir", root.to_str().expect("utf-8")],
        dir,
    );
    run_load(&svc.addr, total, || ok_count(&svc.addr))
}

const LATENCY_PY: &str = "import time, json, os\n\ndef handle(event, context):\n    with open(os.environ['BENCH_OUT'], 'a') as f:\n        f.write('%f\\n' % (time.time() - context['t']))\n";

/// Sends `n` single events one after the other; the hook writes (now - sent time).
fn latency(dir: &Path, fleet: Option<&str>, n: usize) -> (f64, f64) {
    let out = dir.join(format!("lat-{}.txt", fleet.is_some()));
    let _ = std::fs::remove_file(&out);
    // SAFETY: set before the children are spawned; the bench is single-threaded here.
    unsafe { std::env::set_var("BENCH_OUT", &out) };
    let root = hook_root(dir, Kind::Python, 1, Some(LATENCY_PY));
    let root_s = root.to_str().expect("utf-8").to_string();
    let (_w, target) = match fleet {
        Some(url) => {
            let w = spawn(
                &[
                    "worker",
                    "--fleet",
                    url,
                    "--hooks-dir",
                    &root_s,
                    "--status-interval-ms",
                    "100",
                ],
                dir,
            );
            let edge = spawn(&["serve", "--fleet", url, "--gateway-id", "bench"], dir);
            wait_until("the fleet view", Duration::from_secs(30), || {
                let (_, v) = http(&edge.addr, "GET", "/v1/hooks", b"");
                v["hooks"][0]["workers"].as_array().is_some()
            });
            (Some(w), edge)
        }
        None => (None, spawn(&["serve", "--hooks-dir", &root_s], dir)),
    };
    let lines = || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<f64>().ok())
            .collect::<Vec<f64>>()
    };
    for i in 0..n {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let body =
            serde_json::to_vec(&json!({"event": "bench:lat", "context": {"t": t}})).expect("json");
        let (status, _) = http(&target.addr, "POST", "/v1/events", &body);
        assert_eq!(status, 202);
        // One at a time: the next is sent after this one was handled (no queueing in the figure).
        wait_until("the event handled", Duration::from_secs(30), || {
            lines().len() > i
        });
    }
    let mut v: Vec<f64> = lines().into_iter().map(|s| s * 1000.0).collect();
    (common::pct(&mut v, 0.5), common::pct(&mut v, 0.99))
}

const SLOW_PY: &str = "import time, os\n\ndef handle(event, context):\n    if context['_fleet']['delivered'] == 1:\n        open(os.environ['BENCH_OUT'] + '.started.' + os.environ['BENCH_WORKER'], 'w').close()\n        time.sleep(600)\n    open(os.environ['BENCH_OUT'] + '.done', 'w').close()\n";

/// Two workers; a slow event; SIGKILL to the worker running it; time until the other finished it.
fn failover(dir: &Path, ack_wait: &str) -> f64 {
    let nats = Nats::start();
    let url = nats.url();
    let out = dir.join("failover");
    // SAFETY: as above.
    unsafe { std::env::set_var("BENCH_OUT", &out) };
    let root = hook_root(dir, Kind::Python, 1, Some(SLOW_PY));
    let root_s = root.to_str().expect("utf-8").to_string();
    let mut ws = Vec::new();
    for i in 0..2 {
        // SAFETY: as above.
        unsafe { std::env::set_var("BENCH_WORKER", i.to_string()) };
        ws.push(spawn(
            &[
                "worker",
                "--fleet",
                &url,
                "--hooks-dir",
                &root_s,
                "--ack-wait",
                ack_wait,
                "--worker-id",
                &format!("w{i}"),
                "--status-interval-ms",
                "100",
            ],
            dir,
        ));
    }
    let edge = spawn(&["serve", "--fleet", &url, "--gateway-id", "bench"], dir);
    wait_until("the fleet view", Duration::from_secs(30), || {
        let (_, v) = http(&edge.addr, "GET", "/v1/hooks", b"");
        v["hooks"][0]["workers"].as_array().map(|a| a.len()) == Some(2)
    });
    let (status, _) = http(
        &edge.addr,
        "POST",
        "/v1/events",
        br#"{"event": "bench:slow"}"#,
    );
    assert_eq!(status, 202);
    let started = |i: usize| PathBuf::from(format!("{}.started.{i}", out.display()));
    wait_until("the slow handler", Duration::from_secs(30), || {
        started(0).exists() || started(1).exists()
    });
    let victim = if started(0).exists() { 0 } else { 1 };
    let t = Instant::now();
    // SAFETY: as above.
    unsafe { libc::kill(ws[victim].child.id() as i32, libc::SIGKILL) };
    let done = PathBuf::from(format!("{}.done", out.display()));
    wait_until("the other worker", Duration::from_secs(120), || {
        done.exists()
    });
    t.elapsed().as_secs_f64()
}

/// Ingest alone: `total` events posted in batches of 1,000, timed until the last answer (202
/// from the edge = stored by the stream; from local mode = queued).
fn ingest(dir: &Path, fleet: Option<&str>, total: usize) -> f64 {
    let root = hook_root(dir, Kind::Dylib, 1, None);
    let svc = match fleet {
        Some(url) => spawn(&["serve", "--fleet", url, "--gateway-id", "bench"], dir),
        None => spawn(
            &["serve", "--hooks-dir", root.to_str().expect("utf-8")],
            dir,
        ),
    };
    let bodies: Vec<Vec<u8>> = (0..total / 1000).map(|i| batch(1000, i * 1000)).collect();
    let start = Instant::now();
    for b in &bodies {
        let (status, v) = http(&svc.addr, "POST", "/v1/events/batch", b);
        assert_eq!(status, 202, "{v}");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    if Command::new("nats-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("fleet bench skipped: nats-server is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    {
        let sub = d.join("ingest");
        std::fs::create_dir_all(&sub).expect("mkdir");
        let total = 100_000;
        let local = ingest(&sub, None, total);
        let nats = Nats::start();
        let edge = ingest(&sub, Some(&nats.url()), total);
        println!(
            "batch ingest, {total} events in requests of 1,000: local mode {local:.0}/s, edge (202 = stored by the stream) {edge:.0}/s"
        );
    }
    if std::env::var_os("FLEET_BENCH_INGEST_ONLY").is_some() {
        return;
    }
    println!("| workload | local mode | fleet, 1 worker | fleet, 2 workers |");
    println!("|---|---|---|---|");
    for (kind, name, total) in [
        (Kind::Dylib, "no-op C library", 20_000),
        (Kind::Python, "trivial Python", 10_000),
    ] {
        for conc in [1u32, 64] {
            let sub = d.join(format!("{}-{conc}", name.len()));
            std::fs::create_dir_all(&sub).expect("mkdir");
            let l = if conc == 1 {
                local(&sub, kind, total)
            } else {
                f64::NAN
            };
            let one = throughput(&sub, kind, 1, conc, total);
            let two = throughput(&sub, kind, 2, conc, total);
            println!(
                "| {name}, concurrency {conc}, {total} events | {} | {:.0}/s | {:.0}/s |",
                if l.is_nan() {
                    "(as above)".to_string()
                } else {
                    format!("{l:.0}/s")
                },
                one,
                two
            );
        }
    }
    let n = 500;
    let lsub = d.join("lat");
    std::fs::create_dir_all(&lsub).expect("mkdir");
    let (lp50, lp99) = latency(&lsub, None, n);
    let nats = Nats::start();
    let (fp50, fp99) = latency(&lsub, Some(&nats.url()), n);
    drop(nats);
    println!(
        "\nend-to-end latency, Python hook, {n} sequential events (ms): local p50 {lp50:.2} p99 {lp99:.2}; fleet p50 {fp50:.2} p99 {fp99:.2}"
    );
    for ack_wait in ["2", "5"] {
        let fsub = d.join(format!("fo-{ack_wait}"));
        std::fs::create_dir_all(&fsub).expect("mkdir");
        let s = failover(&fsub, ack_wait);
        println!("failover of the in-flight event after SIGKILL, --ack-wait {ack_wait}: {s:.2} s");
    }
}
