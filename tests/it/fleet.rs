//! Fleet mode against a real nats-server (JetStream, file store in a temp dir, free port):
//! workers sharing hooks, failover after SIGKILL, order, dead letters and replay, collect, the
//! edge killed after 202, the broker down at start and restarted under load.
//!
//! Skipped (with a message) only when `nats-server` is not installed and `CI` is not set; in CI a
//! missing nats-server fails.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, bin, poll, read_jsonl, signal};

/// A nats-server with JetStream on a free port and a temp store; killed on drop.
pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    store: tempfile::TempDir,
    /// Extra command-line arguments (credentials, a config file).
    args: Vec<String>,
}

fn nats_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HERMES_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

impl NatsServer {
    /// Starts one, or returns `None` (test skipped) when nats-server is missing outside CI.
    pub fn start() -> Option<Self> {
        Self::start_with(&[], "")
    }

    /// Starts one with extra arguments and, when `conf` is not empty, a config file holding it.
    pub fn start_with(args: &[&str], conf: &str) -> Option<Self> {
        if nats_binary().is_none() {
            if std::env::var_os("CI").is_some() {
                panic!(
                    "nats-server is not installed (CI is set: the fleet tests must run; apt-get install nats-server)"
                );
            }
            eprintln!("SKIPPED: nats-server is not installed (apt-get install nats-server)");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut s = Self {
            child: None,
            port,
            store: tempfile::tempdir().expect("tempdir"),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        if !conf.is_empty() {
            let file = s.store.path().join("nats.conf");
            std::fs::write(&file, conf).expect("write nats.conf");
            s.args
                .extend(["-c".to_string(), file.display().to_string()]);
        }
        s.restart();
        Some(s)
    }

    /// SIGKILL, and empty the store: the broker comes back knowing nothing.
    pub fn kill_and_wipe(&mut self) {
        self.kill();
        for e in std::fs::read_dir(self.store.path())
            .expect("store")
            .flatten()
        {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(e.path()).expect("wipe the store");
            }
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// (Re)starts the server on the same port and store; waits until it answers.
    pub fn restart(&mut self) {
        let bin = nats_binary().expect("nats-server");
        let child = Command::new(bin)
            .args(["-js", "-sd"])
            .arg(self.store.path().join("js"))
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        let addr = format!("127.0.0.1:{}", self.port);
        poll(
            Duration::from_secs(20),
            "nats-server to accept connections",
            || {
                use std::io::Read;
                let mut s = std::net::TcpStream::connect(&addr).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).ok()?;
                (&buf == b"INFO").then_some(())
            },
        );
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Options that make failover and retries fast enough for tests.
pub(crate) const FAST: &[&str] = &[
    "--ack-wait",
    "2",
    "--retry-backoff-ms",
    "50",
    "--status-interval-ms",
    "100",
];

pub(crate) fn worker(hooks: &Hooks, nats: &NatsServer, id: &str) -> Serve {
    let mut cmd = Command::new(bin());
    cmd.arg("worker")
        .args(["--fleet", &nats.url()])
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0", "--worker-id", id])
        .args(FAST)
        .env("TEST_WORKER", id);
    Serve::spawn(cmd, hooks)
}

pub(crate) fn edge(hooks: &Hooks, url: &str, extra: &[&str]) -> Serve {
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .args(["--fleet", url, "--gateway-id", "gw-test"])
        .args(["--listen", "127.0.0.1:0"])
        .args(extra);
    Serve::spawn(cmd, hooks)
}

/// A Python hook that records every delivery (`n`, event id, delivery count, worker) and, on
/// request, is slow on a first delivery or fails.
pub(crate) fn recording_hook(hooks: &Hooks, name: &str, events: &str, extra_yaml: &str) {
    let out = hooks.out().join(format!("{name}.jsonl"));
    let started = hooks.out().join(format!("{name}.started"));
    let fixed = hooks.out().join(format!("{name}.fixed"));
    let code = format!(
        r#"import json, os, time

def handle(event, context):
    fleet = context.get("_fleet", {{}})
    rec = {{"n": context.get("n"), "id": fleet.get("event_id"), "d": fleet.get("delivered"),
            "w": os.environ.get("TEST_WORKER"), "event": event, "seq": fleet.get("stream_seq"),
            "pid": os.getpid(), "t": time.time()}}
    if context.get("slow") and fleet.get("delivered") == 1:
        with open({started:?}, "a") as f:
            f.write(json.dumps(rec) + "\n")
        time.sleep(60)
    if context.get("poison") and not os.path.exists({fixed:?}):
        with open({out:?} + ".failed", "a") as f:
            f.write(json.dumps(rec) + "\n")
        raise ValueError("poison event n=%s" % context.get("n"))
    if context.get("pause"):
        with open({paused:?}, "a") as f:
            f.write(json.dumps(rec) + "\n")
        time.sleep(float(context["pause"]))
    with open({out:?}, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return context.get("answer")
"#,
        started = started.display().to_string(),
        fixed = fixed.display().to_string(),
        out = out.display().to_string(),
        paused = hooks
            .out()
            .join(format!("{name}.paused"))
            .display()
            .to_string(),
    );
    hooks.add(
        name,
        &[
            (
                "HOOK.yaml",
                &format!("name: {name}\nevents: {events}\ntimeout: 120\n{extra_yaml}"),
            ),
            ("handler.py", &code),
        ],
    );
}

pub(crate) fn records(hooks: &Hooks, name: &str) -> Vec<Value> {
    read_jsonl(&hooks.out().join(format!("{name}.jsonl")))
}

/// Waits until the edge's fleet view shows `hook` served by every worker in `workers`.
pub(crate) fn wait_for_fleet(edge: &Serve, hook: &str, workers: &[&str]) {
    poll(
        Duration::from_secs(30),
        &format!("the edge's fleet view to show {hook} on {workers:?}"),
        || {
            let (_, v) = edge.get("/v1/hooks");
            let h = v["hooks"]
                .as_array()?
                .iter()
                .find(|h| h["name"] == hook)?
                .clone();
            let have: Vec<&str> = h["workers"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            workers.iter().all(|w| have.contains(w)).then_some(())
        },
    );
}

pub(crate) fn post_batch(edge: &Serve, range: std::ops::Range<u64>, extra: Value) -> (u16, Value) {
    let events: Vec<Value> = range
        .map(|n| {
            let mut ctx = json!({"n": n});
            if let (Value::Object(c), Value::Object(e)) = (&mut ctx, &extra) {
                c.extend(e.clone());
            }
            json!({"event": "agent:step", "context": ctx})
        })
        .collect();
    edge.post("/v1/events/batch", &json!({"events": events}))
}

pub(crate) fn handled_ns(recs: &[Value]) -> Vec<u64> {
    recs.iter().filter_map(|r| r["n"].as_u64()).collect()
}

#[test]
fn two_workers_share_a_hook_and_a_killed_workers_event_goes_to_the_other() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "shared", r#"["agent:*"]"#, "concurrency: 4\n");
    let mut a = worker(&hooks, &nats, "wa");
    let mut b = worker(&hooks, &nats, "wb");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "shared", &["wa", "wb"]);

    let (status, body) = post_batch(&edge, 0..40, json!({"pause": 0.02}));
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        body["queued"][0], 1,
        "the fleet view knows one matching hook: {body}"
    );
    let recs = poll(Duration::from_secs(30), "40 events handled", || {
        let r = records(&hooks, "shared");
        (handled_ns(&r).into_iter().collect::<HashSet<_>>().len() >= 40).then_some(r)
    });
    let unique: HashSet<u64> = handled_ns(&recs).into_iter().collect();
    assert_eq!(
        unique,
        (0..40).collect::<HashSet<_>>(),
        "every event handled"
    );
    assert_duplicates_are_redeliveries(&recs);
    let by: HashSet<&str> = recs.iter().filter_map(|r| r["w"].as_str()).collect();
    assert_eq!(by.len(), 2, "both workers took part of the work: {by:?}");

    // A slow event; kill whichever worker has it, in the middle of the handler.
    let (status, _) = edge.post(
        "/v1/events",
        &json!({"event": "agent:start", "context": {"n": 1000, "slow": true}}),
    );
    assert_eq!(status, 202);
    let started = poll(Duration::from_secs(30), "the slow handler to start", || {
        read_jsonl(&hooks.out().join("shared.started"))
            .into_iter()
            .next()
    });
    let victim = started["w"].as_str().unwrap().to_string();
    let killed_at = Instant::now();
    let (dead, alive) = if victim == "wa" {
        (&mut a, "wb")
    } else {
        (&mut b, "wa")
    };
    signal(dead.child.id(), libc::SIGKILL);
    let _ = dead.child.wait();
    let rec = poll(
        Duration::from_secs(30),
        "the other worker to handle the killed worker's event",
        || {
            records(&hooks, "shared")
                .into_iter()
                .find(|r| r["n"] == 1000)
        },
    );
    assert_eq!(rec["w"], alive, "handled by the surviving worker: {rec}");
    assert_eq!(rec["d"], 2, "a redelivery: {rec}");
    assert_eq!(rec["id"], started["id"], "the same event id");
    eprintln!("failover after SIGKILL: {:?}", killed_at.elapsed());
    let ns = handled_ns(&records(&hooks, "shared"));
    assert_eq!(
        ns.iter().filter(|&&n| n == 1000).count(),
        1,
        "nothing handled twice"
    );
}

#[test]
fn order_per_hook_holds_with_two_workers() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "ordered", r#"["agent:step"]"#, "");
    let _a = worker(&hooks, &nats, "wa");
    let _b = worker(&hooks, &nats, "wb");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "ordered", &["wa", "wb"]);
    for chunk in 0..3 {
        let (status, body) = post_batch(&edge, chunk * 20..chunk * 20 + 20, json!({}));
        assert_eq!(status, 202, "{body}");
    }
    let recs = poll(Duration::from_secs(30), "60 events handled", || {
        let r = records(&hooks, "ordered");
        (r.len() >= 60).then_some(r)
    });
    assert_eq!(
        handled_ns(&recs),
        (0..60).collect::<Vec<_>>(),
        "one in flight across the fleet: handled in publish order"
    );
}

pub(crate) fn dead_cmd(nats: &NatsServer, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin())
        .arg("dead")
        .args(args)
        .args(["--fleet", &nats.url()])
        .output()
        .expect("run dead");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn a_poison_event_is_dead_lettered_after_its_retries_and_replay_requeues_it() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "fragile", r#"["agent:*"]"#, "retries: 2\n");
    recording_hook(&hooks, "bystander", r#"["agent:*"]"#, "");
    std::fs::write(hooks.out().join("bystander.fixed"), "").unwrap();
    let _w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "fragile", &["wa"]);
    wait_for_fleet(&edge, "bystander", &["wa"]);
    let (status, _) = edge.post(
        "/v1/events",
        &json!({"event": "agent:start", "context": {"n": 7, "poison": true}}),
    );
    assert_eq!(status, 202);

    let letter = poll(Duration::from_secs(30), "the dead letter", || {
        let (code, out) = dead_cmd(&nats, &["list", "--json", "--hook", "fragile"]);
        assert_eq!(code, 0, "{out}");
        out.lines()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
    });
    assert_eq!(letter["hook"], "fragile", "{letter}");
    assert_eq!(
        letter["deliveries"], 3,
        "retries: 2 = three deliveries: {letter}"
    );
    assert!(
        letter["error"]
            .as_str()
            .unwrap()
            .contains("poison event n=7"),
        "{letter}"
    );
    assert_eq!(letter["envelope"]["context"]["n"], 7);
    let failed = read_jsonl(&hooks.out().join("fragile.jsonl.failed"));
    assert_eq!(
        failed
            .iter()
            .map(|r| r["d"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![1, 2, 3],
        "three attempts, each a new delivery"
    );
    let (_, text) = dead_cmd(&nats, &["list", "--hook", "fragile"]);
    assert!(
        text.contains("fragile") && text.contains("deliveries=3"),
        "{text}"
    );

    // Fixed: replay re-queues it for that hook only.
    std::fs::write(hooks.out().join("fragile.fixed"), "").unwrap();
    let (code, out) = dead_cmd(&nats, &["replay", "--all"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("re-queued 1 event"), "{out}");
    let rec = poll(
        Duration::from_secs(30),
        "the replayed event handled",
        || records(&hooks, "fragile").into_iter().find(|r| r["n"] == 7),
    );
    assert_eq!(
        rec["id"], letter["envelope"]["id"],
        "the same event id: {rec}"
    );
    let (_, out) = dead_cmd(&nats, &["list"]);
    assert!(
        out.contains("no dead letters"),
        "replayed letters leave the list: {out}"
    );
    // The other hook saw the event once, not again on replay: wait for the fleet view to show
    // the replay skipped by it.
    poll(
        Duration::from_secs(10),
        "bystander to skip the replay",
        || {
            let (_, v) = edge.get("/v1/hooks");
            let h = v["hooks"]
                .as_array()?
                .iter()
                .find(|h| h["name"] == "bystander")?
                .clone();
            (h["fleet"]["skipped"].as_u64()? >= 1).then_some(())
        },
    );
    assert_eq!(handled_ns(&records(&hooks, "bystander")), vec![7]);
    let (_, v) = edge.get("/v1/hooks");
    let fragile = v["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "fragile")
        .unwrap()
        .clone();
    assert_eq!(
        edge.get("/v1/hooks/fragile").1,
        fragile,
        "one fleet hook by name, as in the list"
    );
    assert_eq!(fragile["fleet"]["dead"], 1, "{fragile}");
    assert_eq!(fragile["fleet"]["retried"], 2, "{fragile}");
}

#[test]
fn collect_goes_through_the_fleet_in_match_order() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    hooks.python(
        "wild",
        r#"["message:*"]"#,
        "def handle(event, context):\n    return {'from': 'wild'}\n",
    );
    hooks.python("exact", r#"["message:pre_route"]"#, "def handle(event, context):\n    return {'from': 'exact', 'gw': context['_fleet']['gateway_id']}\n");
    hooks.python(
        "broken",
        r#"["message:pre_route"]"#,
        "def handle(event, context):\n    raise RuntimeError('no decision')\n",
    );
    hooks.python(
        "silent",
        r#"["message:pre_route"]"#,
        "def handle(event, context):\n    return None\n",
    );
    let _w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    for h in ["wild", "exact", "broken", "silent"] {
        wait_for_fleet(&edge, h, &["wa"]);
    }
    let (status, v) = edge.post(
        "/v1/collect",
        &json!({"event": "message:pre_route", "context": {"message": "hi"}, "timeout_ms": 10000}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["results"],
        json!([{"hook": "exact", "result": {"from": "exact", "gw": "gw-test"}}, {"hook": "wild", "result": {"from": "wild"}}]),
        "exact before wildcard, None left out: {v}"
    );
    assert_eq!(v["errors"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["errors"][0]["hook"], "broken");
    assert!(
        v["errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("no decision"),
        "{v}"
    );
    // Nothing for a name no hook matches.
    let (_, v) = edge.post("/v1/collect", &json!({"event": "agent:start"}));
    assert_eq!(v, json!({"results": [], "errors": []}));

    // The gateway's Python client, unchanged, against the edge: it lists the fleet's hooks,
    // emits, and collects in match order.
    let script = r#"
import asyncio, json, sys
sys.path.insert(0, sys.argv[2])
from hermes_hooks import HookRegistry

async def main():
    reg = HookRegistry(address=sys.argv[1])
    reg.discover_and_load()
    names = sorted(h["name"] for h in reg.loaded_hooks)
    await reg.emit("message:received", {"text": "x"})
    results = await reg.emit_collect("message:pre_route", {"message": "hi"}, timeout=10)
    flushed = reg.flush(10)
    print(json.dumps({"names": names, "results": results, "flushed": flushed}))
    reg.close()

asyncio.run(main())
"#;
    let out = Command::new("python3")
        .args(["-c", script, &format!("http://{}", edge.addr)])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python"))
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "client script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON line");
    assert_eq!(
        v["names"],
        json!(["broken", "exact", "silent", "wild"]),
        "{v}"
    );
    assert_eq!(
        v["results"],
        json!([{"from": "exact", "gw": "gw-test"}, {"from": "wild"}]),
        "{v}"
    );
    assert_eq!(v["flushed"], true, "{v}");
}

#[test]
fn the_edge_killed_after_202_loses_nothing() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "keeper", r#"["agent:*"]"#, "concurrency: 8\n");
    let _w = worker(&hooks, &nats, "wa");
    let mut edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "keeper", &["wa"]);
    for chunk in 0..4 {
        let (status, body) = post_batch(&edge, chunk * 100..chunk * 100 + 100, json!({}));
        assert_eq!(status, 202, "{body}");
    }
    signal(edge.child.id(), libc::SIGKILL);
    let _ = edge.child.wait();
    let recs = poll(
        Duration::from_secs(60),
        "400 events handled after the edge died",
        || {
            let r = records(&hooks, "keeper");
            (handled_ns(&r).into_iter().collect::<HashSet<_>>().len() >= 400).then_some(r)
        },
    );
    let unique: HashSet<u64> = handled_ns(&recs).into_iter().collect();
    assert_eq!(unique, (0..400).collect::<HashSet<_>>());
}

fn fleet_state(edge: &Serve) -> Value {
    edge.get("/v1/hooks").1["fleet"].clone()
}

#[test]
fn broker_down_at_start_the_edge_buffers_refuses_when_full_and_delivers_later() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "late", r#"["agent:*"]"#, "concurrency: 8\n");
    // The hook joins the fleet (its durable consumer exists), then the broker goes away.
    let w = worker(&hooks, &nats, "wa");
    poll(Duration::from_secs(30), "the worker's consumer", || {
        w.log().contains("fleet worker connected").then_some(())
    });
    {
        let probe = edge(&hooks, &nats.url(), &[]);
        wait_for_fleet(&probe, "late", &["wa"]);
    }
    nats.kill();

    let edge = edge(&hooks, &nats.url(), &["--fleet-buffer", "50"]);
    let (status, v) = edge.get("/readyz");
    assert_eq!(status, 200, "an edge without its broker still accepts: {v}");
    assert_eq!(v["status"], "degraded", "{v}");
    let t = Instant::now();
    let (status, body) = post_batch(&edge, 0..40, json!({}));
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["state"], "buffered", "{body}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "accepting into the buffer does not wait for the broker: {:?}",
        t.elapsed()
    );
    // 40 more do not fit in 50: the batch is refused whole (503, Retry-After); nothing
    // accepted is dropped.
    let body = serde_json::to_vec(&json!({"events": (40..80).map(|n| json!({"event": "agent:step", "context": {"n": n}})).collect::<Vec<_>>()})).unwrap();
    let (status, headers, resp) = crate::util::http(
        &edge.addr,
        "POST",
        "/v1/events/batch",
        &[("Content-Type", "application/json")],
        &body,
    );
    let resp = String::from_utf8_lossy(&resp);
    assert_eq!(status, 503, "{resp}");
    assert!(resp.contains("buffer_full"), "{resp}");
    assert!(
        headers.iter().any(|(k, v)| k == "retry-after" && v == "1"),
        "{headers:?}"
    );
    let (status, body) = post_batch(&edge, 40..50, json!({}));
    assert_eq!(status, 202, "{body}");
    let f = fleet_state(&edge);
    assert_eq!(f["state"], "degraded", "{f}");
    assert_eq!(f["buffer_full"], 40, "the refused events, counted: {f}");
    assert_eq!(f["buffered"], 50, "{f}");
    let (_, _, metrics) = crate::util::http(&edge.addr, "GET", "/metrics", &[], b"");
    let metrics = String::from_utf8_lossy(&metrics);
    for line in [
        "hermes_hooks_fleet_degraded 1",
        "hermes_hooks_fleet_buffer_full_total 40",
        "hermes_hooks_fleet_buffered 50",
    ] {
        assert!(
            metrics.contains(line),
            "/metrics lacks {line:?}:\n{metrics}"
        );
    }

    nats.restart();
    let recs = poll(
        Duration::from_secs(60),
        "the buffered events delivered",
        || {
            let r = records(&hooks, "late");
            (handled_ns(&r).into_iter().collect::<HashSet<_>>().len() >= 50).then_some(r)
        },
    );
    let unique: HashSet<u64> = handled_ns(&recs).into_iter().collect();
    assert_eq!(
        unique,
        (0..50).collect::<HashSet<_>>(),
        "every accepted event delivered"
    );
    poll(Duration::from_secs(20), "readyz to leave degraded", || {
        (edge.get("/readyz").1["status"] == "ready").then_some(())
    });
    assert_eq!(fleet_state(&edge)["buffered"], 0);
}

#[test]
fn broker_killed_and_restarted_under_load_every_202_is_delivered() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "steady", r#"["agent:*"]"#, "concurrency: 8\n");
    let _w = worker(&hooks, &nats, "wa");
    let edge = Arc::new(edge(&hooks, &nats.url(), &[]));
    wait_for_fleet(&edge, "steady", &["wa"]);

    // A client sending batches of 10 without pause; it records what got 202.
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (edge, stop) = (edge.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut accepted = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let (status, _) = post_batch(&edge, n..n + 10, json!({}));
                if status == 202 {
                    accepted.extend(n..n + 10);
                }
                n += 10;
            }
            accepted
        })
    };
    poll(
        Duration::from_secs(30),
        "some events handled before the crash",
        || (records(&hooks, "steady").len() >= 50).then_some(()),
    );
    nats.kill();
    poll(
        Duration::from_secs(20),
        "the edge to report degraded",
        || (edge.get("/readyz").1["status"] == "degraded").then_some(()),
    );
    let buffered_before = poll(
        Duration::from_secs(20),
        "events buffered while the broker is down",
        || {
            let b = fleet_state(&edge)["buffered"].as_u64()?;
            (b >= 20).then_some(b)
        },
    );
    nats.restart();
    poll(Duration::from_secs(30), "the edge to recover", || {
        (edge.get("/readyz").1["status"] == "ready").then_some(())
    });
    let handled_now = records(&hooks, "steady").len();
    poll(
        Duration::from_secs(30),
        "more events after the restart",
        || (records(&hooks, "steady").len() >= handled_now + 50).then_some(()),
    );
    stop.store(true, Ordering::Relaxed);
    let accepted = sender.join().unwrap();
    assert!(buffered_before >= 20);

    let recs = poll(
        Duration::from_secs(60),
        "every accepted event handled",
        || {
            let r = records(&hooks, "steady");
            let got: HashSet<u64> = handled_ns(&r).into_iter().collect();
            accepted.iter().all(|n| got.contains(n)).then_some(r)
        },
    );
    let duplicates = assert_duplicates_are_redeliveries(&recs);
    let f = fleet_state(&edge);
    assert_eq!(f["buffer_full"], 0, "nothing refused: {f}");
    eprintln!(
        "accepted {} events, handled {} times ({duplicates} duplicates, all redeliveries); edge: {f}",
        accepted.len(),
        recs.len()
    );
}

/// At-least-once, but a second handling only where the broker redelivered (the handler sees
/// `delivered` > 1): returns the number of extra handlings.
pub(crate) fn assert_duplicates_are_redeliveries(recs: &[Value]) -> usize {
    let mut per: BTreeMap<u64, Vec<(i64, u64)>> = BTreeMap::new();
    for r in recs {
        per.entry(r["n"].as_u64().unwrap())
            .or_default()
            .push((r["d"].as_i64().unwrap(), r["seq"].as_u64().unwrap()));
    }
    let mut duplicates = 0;
    for (n, deliveries) in &per {
        let extra = deliveries.len() - 1;
        let redelivered = deliveries.iter().filter(|(d, _)| *d > 1).count();
        assert!(
            extra <= redelivered,
            "event {n} handled {} times but only {redelivered} were redeliveries: {deliveries:?}",
            deliveries.len()
        );
        duplicates += extra;
    }
    duplicates
}

#[test]
fn a_worker_picks_up_a_hook_added_while_it_runs_and_drops_a_removed_one() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "first", r#"["agent:*"]"#, "");
    let _w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "first", &["wa"]);

    // An executable hook appears: hot reload starts it and its consumer.
    let seen = hooks.out().join("exec.jsonl");
    hooks.exec(
        "second",
        r#"["agent:*"]"#,
        &format!(
            "#!/bin/sh\ncat >> {}\necho >> {}\n",
            seen.display(),
            seen.display()
        ),
    );
    wait_for_fleet(&edge, "second", &["wa"]);
    let (status, _) = post_batch(&edge, 0..3, json!({}));
    assert_eq!(status, 202);
    let got = poll(Duration::from_secs(30), "the new exec hook to run", || {
        let r = read_jsonl(&seen);
        (r.len() >= 3).then_some(r)
    });
    assert_eq!(got[0]["event"], "agent:step");
    assert_eq!(
        got[0]["context"]["_fleet"]["gateway_id"], "gw-test",
        "{}",
        got[0]
    );

    // Removed: it leaves the fleet view.
    std::fs::remove_dir_all(hooks.root().join("second")).unwrap();
    poll(
        Duration::from_secs(30),
        "the removed hook to leave the fleet view",
        || {
            let (_, v) = edge.get("/v1/hooks");
            let names: Vec<String> = v["hooks"]
                .as_array()?
                .iter()
                .filter_map(|h| h["name"].as_str().map(str::to_string))
                .collect();
            (names == ["first"]).then_some(())
        },
    );
}

#[test]
fn a_worker_stopped_with_sigterm_finishes_its_event_and_leaves_the_rest_to_the_others() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "graceful", r#"["agent:*"]"#, "");
    let mut a = worker(&hooks, &nats, "wa");
    let mut b = worker(&hooks, &nats, "wb");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "graceful", &["wa", "wb"]);
    let (status, _) = edge.post(
        "/v1/events",
        &json!({"event": "agent:start", "context": {"n": 1, "pause": 1.0}}),
    );
    assert_eq!(status, 202);
    let running = poll(Duration::from_secs(30), "the handler to start", || {
        read_jsonl(&hooks.out().join("graceful.paused"))
            .into_iter()
            .next()
    });
    let victim = running["w"].as_str().unwrap().to_string();
    let (stopping, other) = if victim == "wa" {
        (&mut a, "wb")
    } else {
        (&mut b, "wa")
    };
    assert_eq!(stopping.terminate(), Some(0), "a clean exit on SIGTERM");
    let recs = records(&hooks, "graceful");
    assert_eq!(
        recs.len(),
        1,
        "the event in flight was finished before the exit: {recs:?}"
    );
    assert_eq!(recs[0]["w"], victim.as_str());
    assert_eq!(recs[0]["d"], 1, "not redelivered: it was acknowledged");
    poll(
        Duration::from_secs(10),
        "the stopped worker to leave the fleet view",
        || {
            let (_, v) = edge.get("/v1/hooks");
            (v["fleet"]["workers"].as_array()?.len() == 1).then_some(())
        },
    );
    let (status, _) = post_batch(&edge, 10..15, json!({}));
    assert_eq!(status, 202);
    let recs = poll(
        Duration::from_secs(30),
        "later events handled by the other worker",
        || {
            let r = records(&hooks, "graceful");
            (r.len() >= 6).then_some(r)
        },
    );
    assert!(
        recs[1..].iter().all(|r| r["w"] == other),
        "only {other} is left: {recs:?}"
    );
}

/// Issue 14: hooks with `runs: gateway` stay in the gateway in fleet mode: the edge lists them
/// (so the gateway's client imports them) and runs no other hook itself.
#[test]
fn the_edge_lists_in_gateway_hooks_and_runs_no_service_hook() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    hooks.add(
        "patcher",
        &[
            (
                "HOOK.yaml",
                "events: [\"gateway:startup\"]\nruns: gateway\n",
            ),
            (
                "handler.py",
                "def handle(event, context):\n    return None\n",
            ),
        ],
    );
    recording_hook(&hooks, "keeper", r#"["agent:*"]"#, "");
    let edge = edge(
        &hooks,
        &nats.url(),
        &["--hooks-dir", &hooks.root().to_string_lossy()],
    );
    let (status, body) = edge.get("/v1/hooks");
    assert_eq!(status, 200, "{body}");
    let local: Vec<&Value> = body["hooks"]
        .as_array()
        .expect("hooks list")
        .iter()
        .filter(|h| h.get("workers").is_none())
        .collect();
    assert_eq!(
        local.len(),
        1,
        "only the in-gateway hook is the edge's own: {body}"
    );
    assert_eq!(local[0]["name"], "patcher", "{body}");
    assert_eq!(local[0]["runs"], "gateway", "{body}");
    assert!(
        local[0]["sha256"].as_str().is_some_and(|s| s.len() == 64),
        "the client needs the handler's SHA-256: {body}"
    );
}

fn alive(pid: u64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Issue 21: an event just under the HTTP body limit but over the broker's `max_payload` is
/// refused before anything is accepted (413), and the events after it flow.
#[test]
fn an_event_over_the_brokers_limit_gets_413_and_holds_up_nothing() {
    let Some(nats) = NatsServer::start_with(&[], "max_payload: 8192\n") else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "small", r#"["agent:*"]"#, "");
    let _w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "small", &["wa"]);
    let big = "x".repeat(20_000);
    let (status, body) = edge.post(
        "/v1/events",
        &json!({"event": "agent:start", "context": {"n": 0, "blob": big}}),
    );
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "too_large_for_broker", "{body}");
    let (status, body) = post_batch(&edge, 1..4, json!({"blob": big}));
    assert_eq!(status, 413, "a batch with one is refused whole: {body}");
    let (status, body) = post_batch(&edge, 1..11, json!({}));
    assert_eq!(status, 202, "{body}");
    let recs = poll(Duration::from_secs(30), "the small events handled", || {
        let r = records(&hooks, "small");
        (r.len() >= 10).then_some(r)
    });
    assert_eq!(handled_ns(&recs), (1..11).collect::<Vec<_>>());
    let f = fleet_state(&edge);
    assert_eq!(f["buffered"], 0, "nothing stuck in the buffer: {f}");
    assert!(f["degraded_reason"].is_null(), "{f}");
}

/// Issue 21: a worker SIGKILLed during an event's only allowed delivery (`retries: 0`): the
/// event goes to the dead letters (delivered once more, not run), and the handler's process
/// dies with its worker instead of finishing the event as an orphan.
#[test]
fn a_worker_killed_during_the_last_delivery_dead_letters_the_event_and_its_handler_dies() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "once", r#"["agent:*"]"#, "retries: 0\n");
    let mut a = worker(&hooks, &nats, "wa");
    let mut b = worker(&hooks, &nats, "wb");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "once", &["wa", "wb"]);
    let (status, _) = edge.post(
        "/v1/events",
        &json!({"event": "agent:start", "context": {"n": 5, "slow": true}}),
    );
    assert_eq!(status, 202);
    let started = poll(Duration::from_secs(30), "the slow handler to start", || {
        read_jsonl(&hooks.out().join("once.started"))
            .into_iter()
            .next()
    });
    let pid = started["pid"].as_u64().unwrap();
    let victim = if started["w"] == "wa" { &mut a } else { &mut b };
    signal(victim.child.id(), libc::SIGKILL);
    let _ = victim.child.wait();
    poll(
        Duration::from_secs(10),
        "the handler process to die with its worker",
        || (!alive(pid)).then_some(()),
    );
    let letter = poll(Duration::from_secs(30), "the dead letter", || {
        let (code, out) = dead_cmd(&nats, &["list", "--json", "--hook", "once"]);
        assert_eq!(code, 0, "{out}");
        out.lines()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
    });
    assert_eq!(letter["envelope"]["context"]["n"], 5, "{letter}");
    assert_eq!(letter["deliveries"], 1, "{letter}");
    assert!(
        letter["error"].as_str().unwrap().contains("stopped before"),
        "{letter}"
    );
    assert!(
        records(&hooks, "once").is_empty(),
        "not run again, and the orphan never finished it"
    );
}

/// Issue 21: the broker comes back with an empty store and reuses stream sequences; the worker's
/// "already done" memory must not take the new events for old ones.
#[test]
fn a_broker_back_with_an_empty_store_loses_nothing() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "amnesia", r#"["agent:*"]"#, "");
    let _w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "amnesia", &["wa"]);
    let (status, body) = post_batch(&edge, 0..16, json!({}));
    assert_eq!(status, 202, "{body}");
    poll(Duration::from_secs(30), "16 events handled", || {
        (records(&hooks, "amnesia").len() >= 16).then_some(())
    });
    nats.kill_and_wipe();
    nats.restart();
    let (status, body) = post_batch(&edge, 16..32, json!({}));
    assert_eq!(status, 202, "{body}");
    let recs = poll(
        Duration::from_secs(60),
        "the 16 events after the restart",
        || {
            let r = records(&hooks, "amnesia");
            (handled_ns(&r).into_iter().collect::<HashSet<_>>().len() >= 32).then_some(r)
        },
    );
    let unique: HashSet<u64> = handled_ns(&recs).into_iter().collect();
    assert_eq!(unique, (0..32).collect::<HashSet<_>>());
}

/// Issue 21: a Python hook whose events wait in the worker's local queue longer than the ack
/// wait and the hook's timeout: none is redelivered or dead-lettered while it waits.
#[test]
fn events_waiting_in_the_local_queue_are_not_redelivered() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(
        &hooks,
        "queued",
        r#"["agent:*"]"#,
        "concurrency: 8\nretries: 1\n",
    );
    // Timeout 2 s per call; 8 calls of 1 s one after the other in one Python process (a
    // synchronous handler: the pipelined calls wait their turn): the last waits 7 s.
    let yaml = hooks.root().join("queued/HOOK.yaml");
    let text = std::fs::read_to_string(&yaml)
        .unwrap()
        .replace("timeout: 120", "timeout: 2");
    std::fs::write(&yaml, text).unwrap();
    let _w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "queued", &["wa"]);
    let (status, body) = post_batch(&edge, 0..8, json!({"pause": 1.0}));
    assert_eq!(status, 202, "{body}");
    let recs = poll(Duration::from_secs(60), "8 events handled", || {
        let r = records(&hooks, "queued");
        (handled_ns(&r).into_iter().collect::<HashSet<_>>().len() >= 8).then_some(r)
    });
    // A little longer: a false redelivery would show as a second record.
    std::thread::sleep(Duration::from_secs(3));
    let recs2 = records(&hooks, "queued");
    assert_eq!(
        recs2.len(),
        recs.len().max(8),
        "handled once each: {recs2:?}"
    );
    assert!(recs2.iter().all(|r| r["d"] == 1), "{recs2:?}");
    let (_, out) = dead_cmd(&nats, &["list"]);
    assert!(out.contains("no dead letters"), "{out}");
}

/// Issue 21: `nats://user:password@host` logs in with those credentials, and the password shows
/// nowhere: not in the log, `/v1/hooks` or the token-exempt `/readyz`.
#[test]
fn credentials_in_the_url_are_used_and_never_shown() {
    let Some(nats) = NatsServer::start_with(&["--user", "hooks", "--pass", "s3cr3t-pw"], "") else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "authed", r#"["agent:*"]"#, "");
    let url = format!("nats://hooks:s3cr3t-pw@127.0.0.1:{}", nats.port);
    let mut cmd = Command::new(bin());
    cmd.arg("worker")
        .args(["--fleet", &url])
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0", "--worker-id", "wa"])
        .args(FAST);
    let w = Serve::spawn(cmd, &hooks);
    let edge = edge(&hooks, &url, &[]);
    wait_for_fleet(&edge, "authed", &["wa"]);
    let (status, _) = post_batch(&edge, 0..3, json!({}));
    assert_eq!(status, 202);
    poll(Duration::from_secs(30), "3 events handled", || {
        (records(&hooks, "authed").len() >= 3).then_some(())
    });
    for (what, text) in [
        ("/v1/hooks", edge.get("/v1/hooks").1.to_string()),
        ("/readyz", edge.get("/readyz").1.to_string()),
        ("worker /v1/hooks", w.get("/v1/hooks").1.to_string()),
        ("edge log", edge.log()),
        ("worker log", w.log()),
    ] {
        assert!(
            !text.contains("s3cr3t-pw"),
            "{what} shows the password: {text}"
        );
    }
    assert!(
        edge.get("/v1/hooks")
            .1
            .to_string()
            .contains(&format!("nats://127.0.0.1:{}", nats.port)),
        "the broker is still named"
    );
}

/// Issue 21: SIGTERM with the broker down ends within `--drain-timeout` (edge and worker).
#[test]
fn shutdown_with_the_broker_down_is_bounded_by_the_drain_timeout() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "any", r#"["agent:*"]"#, "");
    let mut w = {
        let mut cmd = Command::new(bin());
        cmd.arg("worker")
            .args(["--fleet", &nats.url()])
            .arg("--hooks-dir")
            .arg(hooks.root())
            .args(["--listen", "127.0.0.1:0", "--worker-id", "wa"])
            .args(["--drain-timeout", "2"])
            .args(FAST);
        Serve::spawn(cmd, &hooks)
    };
    let mut edge = edge(&hooks, &nats.url(), &["--drain-timeout", "2"]);
    wait_for_fleet(&edge, "any", &["wa"]);
    nats.kill();
    let (status, _) = post_batch(&edge, 0..5, json!({}));
    assert_eq!(status, 202);
    for (what, s) in [("edge", &mut edge), ("worker", &mut w)] {
        let t = Instant::now();
        let code = s.terminate();
        assert!(code.is_some(), "{what} did not exit");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what} took {:?} to stop with the broker down",
            t.elapsed()
        );
    }
}

/// Issue 21: a hook added while events flow sees every event published after it was installed
/// (its consumer starts at the hook's install time, not when the worker got round to it).
#[test]
fn a_hook_added_while_events_flow_misses_nothing_after_its_install() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "early", r#"["agent:*"]"#, "concurrency: 8\n");
    let _w = worker(&hooks, &nats, "wa");
    let edge = Arc::new(edge(&hooks, &nats.url(), &[]));
    wait_for_fleet(&edge, "early", &["wa"]);
    let installed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (edge, stop, installed) = (edge.clone(), stop.clone(), installed.clone());
        std::thread::spawn(move || {
            let mut after = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let was_installed = installed.load(Ordering::SeqCst);
                let (status, _) = post_batch(&edge, n..n + 5, json!({}));
                assert_eq!(status, 202);
                if was_installed {
                    after.extend(n..n + 5);
                }
                n += 5;
            }
            after
        })
    };
    poll(Duration::from_secs(30), "events flowing", || {
        (records(&hooks, "early").len() >= 20).then_some(())
    });
    recording_hook(&hooks, "late", r#"["agent:*"]"#, "concurrency: 8\n");
    installed.store(true, Ordering::SeqCst);
    wait_for_fleet(&edge, "late", &["wa"]);
    poll(Duration::from_secs(30), "the new hook running", || {
        (records(&hooks, "late").len() >= 20).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    let after = sender.join().unwrap();
    let recs = poll(
        Duration::from_secs(60),
        "every event after the install handled by the new hook",
        || {
            let got: HashSet<u64> = handled_ns(&records(&hooks, "late")).into_iter().collect();
            after.iter().all(|n| got.contains(n)).then_some(got)
        },
    );
    assert!(after.len() >= 20 && recs.len() >= after.len());
}

/// Issue 21: the 202 says whether the broker has the event (`stored`), and a client's event id
/// is the broker's de-duplication id: resent after a lost answer, it is stored and run once.
#[test]
fn the_202_says_stored_and_a_client_event_id_is_stored_once() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "idem", r#"["agent:*"]"#, "");
    let _w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "idem", &["wa"]);
    for _ in 0..2 {
        let (status, body) = edge.post(
            "/v1/events",
            &json!({"event": "agent:start", "id": "order-42", "context": {"n": 42}}),
        );
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["state"], "stored", "{body}");
    }
    let (status, body) = edge.post(
        "/v1/events/batch",
        &json!({"events": [{"event": "agent:start", "id": "order-42", "context": {"n": 42}}, {"event": "agent:start", "context": {"n": 43}}]}),
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["state"], "stored", "{body}");
    let (status, body) = edge.post(
        "/v1/events",
        &json!({"event": "agent:start", "id": "has space"}),
    );
    assert_eq!(status, 400, "{body}");
    let recs = poll(Duration::from_secs(30), "the events handled", || {
        let r = records(&hooks, "idem");
        (r.iter().any(|r| r["n"] == 43)).then_some(r)
    });
    // One in flight, in stream order: a second copy of 42 would have run before 43.
    assert_eq!(
        handled_ns(&recs),
        vec![42, 43],
        "order-42 stored once: {recs:?}"
    );
    assert_eq!(recs[0]["id"], "order-42", "the client's id is the event id");
}

/// Issue 21: a hook whose only worker died still shows in collect answers (an error naming it)
/// and in the fleet view, instead of vanishing a few seconds later.
#[test]
fn collect_names_a_hook_whose_worker_is_gone() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    hooks.python(
        "decider",
        r#"["message:pre_route"]"#,
        "def handle(event, context):\n    return {\"ok\": True}\n",
    );
    let mut w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "decider", &["wa"]);
    signal(w.child.id(), libc::SIGKILL);
    let _ = w.child.wait();
    // The worker is forgotten after three silent intervals; the hook stays, with no worker.
    poll(
        Duration::from_secs(30),
        "the worker to leave the view",
        || (fleet_state(&edge)["workers"].as_array()?.is_empty()).then_some(()),
    );
    let (_, v) = edge.get("/v1/hooks");
    let h = v["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "decider")
        .cloned();
    assert_eq!(
        h.as_ref().map(|h| h["status"].clone()),
        Some(json!("no_worker")),
        "{v}"
    );
    let (status, v) = edge.post(
        "/v1/collect",
        &json!({"event": "message:pre_route", "timeout_ms": 3000}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["errors"][0]["hook"], "decider", "{v}");
    assert!(
        v["errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("no worker"),
        "{v}"
    );
}

/// Issue 21: an ordered hook has one active puller (a lease) and many events in flight; when
/// the puller is SIGKILLed mid-stream the other worker takes over and the order holds (every
/// event's first handling in publish order).
#[test]
fn order_holds_when_the_active_puller_is_killed() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "strict", r#"["agent:step"]"#, "");
    let mut a = worker(&hooks, &nats, "wa");
    let mut b = worker(&hooks, &nats, "wb");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "strict", &["wa", "wb"]);
    let (status, body) = post_batch(&edge, 0..150, json!({"pause": 0.01}));
    assert_eq!(status, 202, "{body}");
    let first = poll(Duration::from_secs(30), "some events handled", || {
        let r = records(&hooks, "strict");
        (r.len() >= 20).then_some(r)
    });
    let holder = first[0]["w"].as_str().unwrap().to_string();
    let victim = if holder == "wa" { &mut a } else { &mut b };
    signal(victim.child.id(), libc::SIGKILL);
    let _ = victim.child.wait();
    let recs = poll(Duration::from_secs(60), "150 events handled", || {
        let r = records(&hooks, "strict");
        (handled_ns(&r).into_iter().collect::<HashSet<_>>().len() >= 150).then_some(r)
    });
    let mut seen = HashSet::new();
    let firsts: Vec<u64> = handled_ns(&recs)
        .into_iter()
        .filter(|n| seen.insert(*n))
        .collect();
    assert_eq!(
        firsts,
        (0..150).collect::<Vec<_>>(),
        "first handlings in publish order across the hand-over"
    );
    assert!(
        recs.iter().any(|r| r["w"] != holder.as_str()),
        "the other worker took over"
    );
    assert_duplicates_are_redeliveries(&recs);
}

/// Issue 21: the fleet alert rules in contrib/ use only metrics an edge or a worker exposes, and
/// the worker's /metrics carries its fleet counters per hook.
#[test]
fn the_fleet_alert_rules_use_metrics_the_edge_and_workers_expose() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "counted", r#"["agent:*"]"#, "");
    let w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "counted", &["wa"]);
    let (status, _) = post_batch(&edge, 0..3, json!({}));
    assert_eq!(status, 202);
    let metrics = |s: &Serve| {
        let (_, _, b) = crate::util::http(&s.addr, "GET", "/metrics", &[], b"");
        String::from_utf8_lossy(&b).to_string()
    };
    let exposition = poll(Duration::from_secs(30), "both /metrics complete", || {
        let (e, w) = (metrics(&edge), metrics(&w));
        (e.contains("hermes_hooks_fleet_dead_letters")
            && w.contains("hermes_hooks_fleet_worker_acked_total{hook=\"counted\"} 3"))
        .then_some(e + &w)
    });
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/prometheus/fleet-alerts.yml"
    ))
    .unwrap();
    let mut missing = Vec::new();
    for (i, _) in rules.match_indices("hermes_hooks_") {
        let name: String = rules[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !exposition.contains(&name) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "fleet-alerts.yml uses metrics nothing exposes: {missing:?}\n{exposition}"
    );
}

/// Issue 21: a removed hook's consumer is deleted after the grace (`--consumer-grace`), and
/// `dead replay` of its letters then refuses (keeping them) instead of deleting letters nobody
/// would run.
#[test]
fn a_removed_hooks_consumer_goes_after_the_grace_and_its_letters_stay() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "doomed", r#"["agent:*"]"#, "retries: 0\n");
    recording_hook(&hooks, "keeper", r#"["agent:*"]"#, "");
    let w = {
        let mut cmd = Command::new(bin());
        cmd.arg("worker")
            .args(["--fleet", &nats.url()])
            .arg("--hooks-dir")
            .arg(hooks.root())
            .args(["--listen", "127.0.0.1:0", "--worker-id", "wa"])
            .args(["--consumer-grace", "0"])
            .args(FAST);
        Serve::spawn(cmd, &hooks)
    };
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "doomed", &["wa"]);
    let (status, _) = edge.post(
        "/v1/events",
        &json!({"event": "agent:start", "context": {"n": 1, "poison": true}}),
    );
    assert_eq!(status, 202);
    poll(Duration::from_secs(30), "the dead letter", || {
        let (_, out) = dead_cmd(&nats, &["list", "--json", "--hook", "doomed"]);
        out.lines()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
    });
    std::fs::remove_dir_all(hooks.root().join("doomed")).unwrap();
    poll(Duration::from_secs(30), "the consumer deleted", || {
        w.log()
            .contains("consumer hook_doomed deleted")
            .then_some(())
    });
    let (code, out) = dead_cmd(&nats, &["replay", "--all"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("renamed or removed"), "{out}");
    let (_, out) = dead_cmd(&nats, &["list", "--hook", "doomed"]);
    assert!(out.contains("doomed"), "the letter stays: {out}");
}
