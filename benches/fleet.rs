//! Fleet mode figures for BENCHMARKS.md (`cargo bench --bench fleet`; needs `nats-server` (found
//! as `HERMES_NATS_SERVER`, on PATH or in /usr/sbin), `cc` and `python3`): events/s edge ->
//! JetStream -> 1 worker for a no-op C library hook and a trivial Python hook, in order
//! (`concurrency: 1`), alone and beside 9 idle hooks on other events, with the edge's bundles
//! (a request's events share stream messages) and with one event per message (`--fleet-bundle
//! 1`); the same workload in local
//! mode; the broker's own publish-and-consume rate (a JetStream client publishing and a pull
//! consumer acknowledging at once, no hermes-hooks) in the same run; rounds alternate. Then
//! (unless FLEET_BENCH_THROUGHPUT_ONLY is set) end-to-end latency p50/p99 and the failover time
//! of an event whose worker is SIGKILLed mid-handler. FLEET_BENCH_CPU prints the CPU time per
//! event of nats-server, the edge and the worker of each fleet run (and of nats-server alone);
//! FLEET_BENCH_POSTING how long each run's posting took (the accepts, until the last 202);
//! FLEET_BENCH_RETRIES sets the measured hook's `retries:`; FLEET_BENCH_ONE_BROKER runs every
//! fleet run on one broker (its stream kept from run to run) instead of a fresh one each.

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

/// The edge's default bundle size (`--fleet-bundle`): events per stream message at most.
const BUNDLE: usize = 128;

const NOOP_PY: &str = "def handle(event, context):\n    return None\n";

/// A service or worker, stopped (SIGTERM, then reaped) on drop.
type Proc = common::Service;

fn spawn(args: &[&str], home: &Path) -> Proc {
    common::Service::spawn(args, home)
}

fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
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

fn wait_until(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    poll_until(what, timeout, Duration::from_millis(2), f);
}

/// Asks `f` every `every` until it says yes; panics after `timeout`.
fn poll_until(what: &str, timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(every);
    }
}

/// CPU seconds (user + system, its reaped children included) process `pid` has used so far.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name: state is field 3; utime..cstime are 14..17.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// [`cpu_secs`] of `pid` and every live descendant (a worker's Python processes are children
/// of its fork server, which a thread other than the main one started: every thread's
/// children are read).
fn tree_cpu_secs(pid: u32) -> f64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    let children: Vec<u32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    cpu_secs(pid) + children.into_iter().map(tree_cpu_secs).sum::<f64>()
}

/// CPU microseconds per event of each named process (and its descendants) over `f`.
fn cpu_per_event<T>(procs: &[(&str, u32)], events: usize, f: impl FnOnce() -> T) -> (T, String) {
    let before: Vec<f64> = procs.iter().map(|(_, p)| tree_cpu_secs(*p)).collect();
    let out = f();
    let per: Vec<String> = procs
        .iter()
        .zip(before)
        .map(|((name, p), b)| {
            let used = tree_cpu_secs(*p) - b;
            format!("{name} {:.1}", used / events as f64 * 1e6)
        })
        .collect();
    (out, per.join(", "))
}

/// The nats-server binary: `HERMES_NATS_SERVER`, else on PATH, else /usr/sbin.
fn nats_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HERMES_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
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
        let child = Command::new(nats_bin().expect("nats-server"))
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

/// With FLEET_BENCH_ONE_BROKER, every fleet run of the process uses this one broker: its
/// stream and consumers carry over from run to run, as with a driver's long-lived broker
/// (issue 56 row 9: rounds on one broker, the one difference from this bench left to try).
static SHARED: std::sync::Mutex<Option<Nats>> = std::sync::Mutex::new(None);

/// A fleet run's broker: its own, or (FLEET_BENCH_ONE_BROKER) the shared one's URL and pid.
fn run_broker() -> (Option<Nats>, String, u32) {
    if std::env::var_os("FLEET_BENCH_ONE_BROKER").is_none() {
        let n = Nats::start();
        let (url, pid) = (n.url(), n.child.id());
        return (Some(n), url, pid);
    }
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    let n = shared.get_or_insert_with(Nats::start);
    (None, n.url(), n.child.id())
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

/// A hook root with one hook `h` on `bench:*` of `kind`, and `idle` hooks of the same kind on
/// other events.
fn hook_root_with(
    dir: &Path,
    kind: Kind,
    concurrency: u32,
    extra_py: Option<&str>,
    idle: usize,
) -> PathBuf {
    let root = dir.join(format!("hooks-{concurrency}-{}-{idle}", extra_py.is_some()));
    for i in 0..idle {
        let hook = root.join(format!("idle{i}"));
        std::fs::create_dir_all(&hook).expect("mkdir");
        std::fs::write(
            hook.join("HOOK.yaml"),
            format!("events: [\"other{i}:*\"]\nqueue: {{capacity: 1000000}}\n"),
        )
        .expect("write HOOK.yaml");
        write_handler(dir, &hook, kind, None);
    }
    let hook = root.join("h");
    std::fs::create_dir_all(&hook).expect("mkdir");
    // FLEET_BENCH_RETRIES=N: the measured hook's `retries:` (0: every event is on its last
    // allowed delivery, so an ordered hook's holder marks what it may start, issue 48).
    let retries = std::env::var("FLEET_BENCH_RETRIES")
        .map(|r| format!("retries: {r}\n"))
        .unwrap_or_default();
    std::fs::write(
        hook.join("HOOK.yaml"),
        format!(
            "events: [\"bench:*\"]\nqueue: {{capacity: 1000000}}\nconcurrency: {concurrency}\n{retries}"
        ),
    )
    .expect("write HOOK.yaml");
    write_handler(dir, &hook, kind, extra_py);
    root
}

/// A hook root with one hook `h` on `bench:*` of `kind`.
fn hook_root(dir: &Path, kind: Kind, concurrency: u32, extra_py: Option<&str>) -> PathBuf {
    hook_root_with(dir, kind, concurrency, extra_py, 0)
}

fn write_handler(dir: &Path, hook: &Path, kind: Kind, extra_py: Option<&str>) {
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
/// were handled. The request bodies are written before the clock starts (as the broker-alone
/// baseline's message is): the figure is the service's, not the bench client's JSON writing.
///
/// FLEET_BENCH_CLIENT_JSON=1 writes each body inside the timed loop instead, as rounds before
/// issue 21's third measured (the client's JSON writing then bounds local mode).
fn run_load(edge: &str, total: usize, done: impl Fn() -> u64) -> f64 {
    let in_loop = std::env::var_os("FLEET_BENCH_CLIENT_JSON").is_some();
    let body = |first: usize| batch((total - first).min(1000), first);
    let mut bodies: Vec<(usize, Option<Vec<u8>>)> = (0..total)
        .step_by(1000)
        .map(|first| (first, (!in_loop).then(|| body(first))))
        .collect();
    let start = Instant::now();
    for (first, written) in &mut bodies {
        let b = written.take().unwrap_or_else(|| body(*first));
        let (status, v) = http(edge, "POST", "/v1/events/batch", &b);
        assert_eq!(status, 202, "{v}");
    }
    if std::env::var_os("FLEET_BENCH_POSTING").is_some() {
        // How long the accepts took (each 202 waits for the broker to store the events):
        // issue 48's slow rounds were the edge's publishing taking 3x longer.
        println!(
            "  posting {total} events took {:.2} s",
            start.elapsed().as_secs_f64()
        );
    }
    // Asked every 5 ms: at most 0.5 % of a 1 s run (every 2 ms was 500 HTTP requests a second
    // for the measured service to answer on its own threads).
    poll_until(
        "every event handled",
        Duration::from_secs(600),
        Duration::from_millis(5),
        || done() >= total as u64,
    );
    total as f64 / start.elapsed().as_secs_f64()
}

fn throughput(
    dir: &Path,
    kind: Kind,
    workers: usize,
    concurrency: u32,
    idle: usize,
    total: usize,
    bundle: usize,
) -> f64 {
    let (_nats, url, nats_pid) = run_broker();
    let root = hook_root_with(dir, kind, concurrency, None, idle);
    let root_s = root.to_str().expect("utf-8 path").to_string();
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
    let bundle = bundle.to_string();
    let edge = spawn(
        &[
            "serve",
            "--fleet",
            &url,
            "--gateway-id",
            "bench",
            "--fleet-bundle",
            &bundle,
        ],
        dir,
    );
    wait_until("the fleet view", Duration::from_secs(30), || {
        let (_, v) = http(&edge.addr, "GET", "/v1/hooks", b"");
        let hooks = v["hooks"].as_array().cloned().unwrap_or_default();
        hooks.len() == idle + 1
            && hooks
                .iter()
                .all(|h| h["workers"].as_array().map(|a| a.len()) == Some(workers))
    });
    let addrs: Vec<String> = ws.iter().map(|w| w.addr.clone()).collect();
    let mut procs = vec![("nats-server", nats_pid), ("edge", edge.child.id())];
    procs.extend(ws.iter().map(|w| ("worker", w.child.id())));
    let (rate, cpu) = cpu_per_event(&procs, total, || {
        run_load(&edge.addr, total, || {
            addrs.iter().map(|a| ok_count(a)).sum()
        })
    });
    if std::env::var_os("FLEET_BENCH_CPU").is_some() {
        println!("  CPU us per event: {cpu}");
    }
    rate
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

/// Two workers; a slow event; SIGKILL to the worker running it `after` it started (right away:
/// the worst case, the broker's ack wait began with the delivery; later, progress signals every
/// third of it restarted it); time until the other finished it.
fn failover(dir: &Path, ack_wait: &str, after: Duration) -> f64 {
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
    std::thread::sleep(after); // the scenario: the event has run this long when its worker dies
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

/// The broker's own rate on this machine: one JetStream client publishing `n` messages of an
/// event's size (pipelined, up to 512 acknowledgements outstanding, each with a de-duplication
/// id, as the edge does) while a pull consumer receives and acknowledges them, at once; events/s
/// until the last is received.
fn broker_rate(url: &str, n: usize) -> f64 {
    use async_nats::jetstream::{self, consumer::pull, stream};
    use futures_util::StreamExt;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = async_nats::connect(url).await.expect("connect");
        let js = jetstream::new(client);
        let s = js
            .get_or_create_stream(stream::Config {
                name: "BASE".into(),
                subjects: vec!["base.>".into()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .expect("stream");
        let consumer = s
            .create_consumer(pull::Config {
                durable_name: Some("base".into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                max_ack_pending: 1024,
                ..Default::default()
            })
            .await
            .expect("consumer");
        let body = serde_json::to_vec(&json!({"v": 1, "id": "18ed285881dfc86a7587-1f3a", "gateway": "bench", "event": "bench:e", "context": {"platform": "telegram", "user_id": "42", "chat_id": "c", "session_id": "s", "i": 12345}, "time": "2026-12-01T15:00:00.000000Z"})).expect("json");
        let body = bytes::Bytes::from(body);
        let start = Instant::now();
        let publisher = {
            let js = js.clone();
            tokio::spawn(async move {
                let mut acks = std::collections::VecDeque::new();
                for i in 0..n {
                    let m = jetstream::message::PublishMessage::build()
                        .payload(body.clone())
                        .message_id(format!("bench:{i}"));
                    acks.push_back(js.send_publish("base.e.bench", m).await.expect("publish"));
                    if acks.len() >= 512
                        && let Some(a) = acks.pop_front()
                    {
                        a.await.expect("ack");
                    }
                }
                for a in acks {
                    a.await.expect("ack");
                }
            })
        };
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(1024)
            .messages()
            .await
            .expect("pull");
        let mut got = 0;
        while got < n {
            let m = messages.next().await.expect("a message").expect("no error");
            m.ack().await.expect("ack");
            got += 1;
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        publisher.await.expect("publisher");
        rate
    })
}

fn main() {
    if nats_bin().is_none() {
        eprintln!("fleet bench skipped: nats-server is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    if std::env::var_os("FLEET_BENCH_THROUGHPUT_ONLY").is_none() {
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
    let rounds: usize = std::env::var("FLEET_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // Per workload: local, fleet, fleet beside 9 idle hooks; and the broker alone. Rounds
    // alternate the variants so that a load change on the shared machine hits them all.
    // FLEET_BENCH_EVENTS (default 100,000: about a second per run, so the start and the last
    // acknowledgements weigh little) and FLEET_BENCH_KINDS (`c`, `python` or both, comma
    // separated) make other runs, e.g. longer and narrower ones for profiling.
    let events: usize = std::env::var("FLEET_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let kinds = std::env::var("FLEET_BENCH_KINDS").unwrap_or_else(|_| "c,python".into());
    let workloads: Vec<(Kind, &str, usize)> = [
        (Kind::Dylib, "no-op C library", "c"),
        (Kind::Python, "trivial Python", "python"),
    ]
    .into_iter()
    .filter(|(_, _, key)| kinds.split(',').any(|k| k.trim() == *key))
    .map(|(kind, name, _)| (kind, name, events))
    .collect();
    let mut figures: Vec<[Vec<f64>; 4]> = workloads.iter().map(|_| Default::default()).collect();
    let mut broker = Vec::new();
    // FLEET_BENCH_WARMUP rounds (default 1) run first and are not counted: on this shared VM
    // the first round after a pause ran every variant (local mode and the broker alone too) at
    // half to two thirds of the later rounds' rates (binaries and the store paged in, CPUs
    // clocking up).
    let warmup: usize = std::env::var("FLEET_BENCH_WARMUP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..warmup + rounds {
        if round == warmup {
            figures.iter_mut().flatten().for_each(Vec::clear);
            broker.clear();
        }
        if round < warmup {
            println!("(warm-up round, not counted)");
        }
        for (w, &(kind, name, total)) in workloads.iter().enumerate() {
            let sub = d.join(format!("r{round}-{}", name.len()));
            std::fs::create_dir_all(&sub).expect("mkdir");
            let l = local(&sub, kind, total);
            let f = throughput(&sub, kind, 1, 1, 0, total, BUNDLE);
            let i = throughput(&sub, kind, 1, 1, 9, total, BUNDLE);
            let one = throughput(&sub, kind, 1, 1, 0, total, 1);
            println!(
                "round {round}: {name}: local {l:.0}/s, fleet {f:.0}/s, fleet + 9 idle hooks {i:.0}/s, fleet with one event per message {one:.0}/s"
            );
            figures[w][0].push(l);
            figures[w][1].push(f);
            figures[w][2].push(i);
            figures[w][3].push(one);
        }
        let nats = Nats::start();
        let (b, cpu) = cpu_per_event(&[("nats-server", nats.child.id())], events, || {
            broker_rate(&nats.url(), events)
        });
        if std::env::var_os("FLEET_BENCH_CPU").is_some() {
            println!("  CPU us per event: {cpu}");
        }
        println!("round {round}: broker alone (publish + consume, JetStream file store): {b:.0}/s");
        broker.push(b);
    }
    let med = |v: &[f64]| {
        let mut v = v.to_vec();
        common::pct(&mut v, 0.5)
    };
    let b = med(&broker);
    println!(
        "\n| events/s, medians of {rounds} rounds | local `serve` | fleet, 1 worker, in order | fleet / local | fleet / broker | beside 9 idle hooks | idle / alone | one event per message | its / local | its / broker |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (w, &(_, name, total)) in workloads.iter().enumerate() {
        let [l, f, i, one] = [0, 1, 2, 3].map(|k| med(&figures[w][k]));
        println!(
            "| {name}, {total} events | {l:.0} | **{f:.0}** | {:.2} | {:.2} | {i:.0} | {:.2} | {one:.0} | {:.2} | {:.2} |",
            f / l,
            f / b,
            i / f,
            one / l,
            one / b
        );
    }
    println!(
        "| broker alone: publish + consume at once, {events} messages | | {b:.0} | | 1.00 | | | | | |"
    );
    // The same ratios taken within each round (each variant beside the others run in the same
    // minute), then the median over rounds: less exposed to the machine's slow swings.
    let paired = |a: &[f64], b: &[f64]| {
        let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        med(&r)
    };
    println!("\nmedians of the per-round ratios:");
    for (w, &(_, name, _)) in workloads.iter().enumerate() {
        println!(
            "  {name}: fleet / local {:.2}, fleet / broker {:.2}, idle / alone {:.2}; one event per message: / local {:.2}, / broker {:.2}",
            paired(&figures[w][1], &figures[w][0]),
            paired(&figures[w][1], &broker),
            paired(&figures[w][2], &figures[w][1]),
            paired(&figures[w][3], &figures[w][0]),
            paired(&figures[w][3], &broker)
        );
    }
    // The shared broker (FLEET_BENCH_ONE_BROKER) is stopped with the throughput runs.
    drop(SHARED.lock().unwrap_or_else(|p| p.into_inner()).take());
    if std::env::var_os("FLEET_BENCH_THROUGHPUT_ONLY").is_some() {
        return;
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
    for ack_wait in [2u64, 5] {
        for (when, after) in [
            ("as it starts", Duration::ZERO),
            (
                "after 1.1 x ack wait",
                Duration::from_millis(ack_wait * 1100),
            ),
        ] {
            let fsub = d.join(format!("fo-{ack_wait}-{}", after.as_millis()));
            std::fs::create_dir_all(&fsub).expect("mkdir");
            let s = failover(&fsub, &ack_wait.to_string(), after);
            println!(
                "failover of the in-flight event after SIGKILL {when}, --ack-wait {ack_wait}: {s:.2} s ({:.2} x)",
                s / ack_wait as f64
            );
        }
    }
}
