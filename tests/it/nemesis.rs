//! The fleet's nemesis (issue 56): a seeded schedule of faults against a small fleet while
//! events flow, every run's history recorded and checked against the fleet's invariants,
//! in the spirit of Jepsen. Example tests replay one case; this one looks for the next.
//!
//! **The fleet**: a broker, three workers (`w1`..`w3`, each with its own hook directory), one
//! edge, and three hooks on each worker: `npy` (Python, ordered; its patterns are edited in
//! place and back: `[nem:a, nem:b]` or `[nem:a, nem:c]`), `nex` (an executable, ordered,
//! `[nem:a, nem:b]`) and `npar` (an executable with `concurrency: 4`, `[nem:a, nem:c]`). A
//! poster sends batches of `nem:a`/`nem:b`/`nem:c` events to the edge the whole time, each
//! numbered; an answer 202 makes them accepted.
//!
//! **The schedule** (from the seed): SIGKILL of a worker (restarted after a while, same id),
//! SIGSTOP of a worker's process tree for 0.3-1.8 ack waits, an edit of `npy`'s patterns on one
//! worker (and its revert by a later edit), a rolling update of a worker (SIGTERM: its version
//! retires, drains and stops; restarted with the other patterns for `npy`), a broker restart, a
//! SIGKILL of the edge (restarted), a SIGSTOP of the edge for 0.3-1.8 ack waits.
//! Which faults are drawn is `HERMES_NEMESIS_FAULTS` (a comma-separated list of
//! [`FAULTS`]; default `all`).
//!
//! **The history**: each handler writes one line as it starts (hook, `n`, worker, delivery
//! count, stream sequence, and for `npy` the patterns of the version it runs in); the dead
//! letters come from `dead list`. **The invariants** (README, "Fleet guarantees"):
//!
//! - `no-loss`: every accepted event that some version of a hook matched, at a time no edit
//!   was near, ran on that hook or is dead-lettered with a reason.
//! - `matched-version`: no event runs on a version whose patterns do not match it.
//! - `stream-order`: an ordered hook starts each event for the first time in stream order
//!   (which also catches two holders at once: the second one's starts fall behind); an event
//!   dead-lettered before its first start was handled then, and a later start is a repeat.
//! - `repeat-counted`: of an event's starts, at most one says `delivered` 1: every repeat says
//!   more (the order of the lines is not the order of the starts: a handler frozen with its
//!   worker writes its line when it wakes, after the repeat another worker ran meanwhile).
//! - `dead-reason`: every dead letter has a reason.
//!
//! It prints its seed and server; `HERMES_NEMESIS_SEED=S HERMES_NEMESIS_SERVER=PATH` replays
//! one run (the schedule is the seed's; the timing is the machine's). `HERMES_NEMESIS_RUNS=N`
//! runs N fresh seeds on each server (the CI default is 1); a failing seed found in
//! development goes into [`REGRESSIONS`]. Each run prints its dead letters and the workers'
//! fleet warnings by kind; a failed run writes every process's log under
//! `target/tmp/nemesis/SEED/` (`HERMES_NEMESIS_KEEP_LOGS=1`: a passing run's too).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fleet::{
    NatsServer, dead_cmd, edge, fast_and, nats_servers, wait_for_fleet, worker_with,
};
use crate::fleet_pause::tree;
use crate::util::{Hooks, Serve, epoch_secs, read_jsonl, signal};

/// Every fault the schedule can draw (`HERMES_NEMESIS_FAULTS=all`, the default).
const FAULTS: &[&str] = &["kill", "stop", "edit", "roll", "broker", "edge", "edgestop"];
/// Seeds that once broke an invariant, with the server they broke it on ("old" for 2.9 or
/// "new" for 2.10+) and the faults drawn (in their order: the schedule depends on it):
/// replayed by [`nemesis_regression_seeds`].
const REGRESSIONS: &[(u64, &str, &str)] = &[
    // An unordered hook's delivery read from the pull's buffer after a broker restart started
    // on one worker while the restarted broker sent it to another, both saying `delivered` 1.
    (8685917986951815011, "new", "kill,broker,edge"),
    // `npy` ran two `nem:b` events on the version a reload loaded from an edit to
    // `[nem:a, nem:c]`: the old version's worker put them back in the hook's queue, which the
    // new version took over (matched-version; a version now pops only what it matches).
    (6697335439513186090, "old", "kill,stop,edit,broker,edge"),
    // `npy`'s old version lived on one worker only, SIGKILLed and restarted with the same id:
    // its first status, before its hooks loaded, counted as a change of its versions, and the
    // `nem:b` events accepted until it listed the hook again were skipped by the others.
    (15933431368365335045, "old", "kill,stop,edit,broker,edge"),
    // Every fault on 2.15: after a broker restart emptied the lease bucket (then in memory),
    // another worker took `nex`'s lease while the old holder still ran (stream-order); then,
    // with the buckets on file, `npar` event 310 stayed in the stream for good: the broker's
    // delivery limit counted deliveries frozen or cut-off workers gave up unstarted.
    (
        3128294535162591552,
        "new",
        "kill,stop,edit,roll,broker,edge",
    ),
    // Every fault on 2.15: an event accepted after a rolling update's drain gave up, while the
    // stopping worker still had the old version, was skipped once that worker came back with
    // the new one (no-loss); and an ordered hook's event no live version matched was handed to
    // a handler call, then to the retry subject once its version came back, and first ran after
    // the events behind it (stream-order). Timing-dependent: its replays passed before the fix
    // too (fleet_roll's edited-holder test and the versions unit test hold the two cases).
    (
        17722090543346195135,
        "new",
        "kill,stop,edit,roll,broker,edge,edgestop",
    ),
];
/// The workers' ack wait, seconds (a lease lives about as long).
const ACK_WAIT: f64 = 2.0;
/// How long before or after an edit an event's fate is not decided by the schedule's view of
/// the versions (the reload, the status that tells the others), seconds.
const EDIT_GRACE: f64 = 4.0;
const V1: &str = r#"["nem:a", "nem:b"]"#;
const V2: &str = r#"["nem:a", "nem:c"]"#;
const NAMES: [&str; 3] = ["nem:a", "nem:b", "nem:c"];
const HOOKS: [&str; 3] = ["npy", "nex", "npar"];

/// splitmix64: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Uniform in [a, b).
    fn between(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone)]
enum Fault {
    Kill { worker: usize, down: f64 },
    Stop { worker: usize, frozen: f64 },
    Edit { worker: usize },
    Roll { worker: usize, down: f64 },
    Broker { down: f64 },
    Edge { down: f64 },
    EdgeStop { frozen: f64 },
}

impl Fault {
    /// Its name in [`FAULTS`].
    fn kind(&self) -> &'static str {
        match self {
            Fault::Kill { .. } => "kill",
            Fault::Stop { .. } => "stop",
            Fault::Edit { .. } => "edit",
            Fault::Roll { .. } => "roll",
            Fault::Broker { .. } => "broker",
            Fault::Edge { .. } => "edge",
            Fault::EdgeStop { .. } => "edgestop",
        }
    }
}

/// The seed's schedule: faults with the pause before each.
fn schedule(seed: u64, faults: &[String], steps: usize) -> Vec<(f64, Fault)> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for _ in 0..steps {
        let pause = rng.between(0.3, 2.5);
        let kind = faults[rng.below(faults.len() as u64) as usize].as_str();
        let worker = rng.below(3) as usize;
        let fault = match kind {
            "kill" => Fault::Kill {
                worker,
                down: rng.between(0.2, 3.0),
            },
            "stop" => Fault::Stop {
                worker,
                frozen: rng.between(0.3, 1.8) * ACK_WAIT,
            },
            "edit" => Fault::Edit { worker },
            "roll" => Fault::Roll {
                worker,
                down: rng.between(0.2, 2.0),
            },
            "broker" => Fault::Broker {
                down: rng.between(0.2, 2.0),
            },
            "edgestop" => Fault::EdgeStop {
                frozen: rng.between(0.3, 1.8) * ACK_WAIT,
            },
            "edge" => Fault::Edge {
                down: rng.between(0.1, 1.5),
            },
            other => panic!("HERMES_NEMESIS_FAULTS: no fault {other:?} (the faults: {FAULTS:?})"),
        };
        out.push((pause, fault));
    }
    out
}

/// A handler's start line: `npy` in Python, with the patterns of its version (`patterns`, a
/// JSON list) in its code (each edit writes the handler with the HOOK.yaml: a version's worker
/// runs its own version's code, or none, its files having changed since it loaded); the
/// executables in Python too (one process per event).
fn python_handler(hooks: &Hooks, hook: &str, patterns: &str) -> String {
    let out = hooks.out().join(format!("{hook}.jsonl"));
    format!(
        r#"import json, os, time

PATTERNS = {patterns}

def handle(event, context):
    fleet = context.get("_fleet", {{}})
    rec = {{"hook": {hook:?}, "n": context.get("n"), "event": event, "w": os.environ.get("TEST_WORKER"),
            "d": fleet.get("delivered"), "seq": fleet.get("stream_seq"), "pats": PATTERNS, "t": time.time()}}
    with open({out:?}, "a") as f:
        f.write(json.dumps(rec) + "\n")
    time.sleep(float(context.get("pause", 0)))
"#,
        out = out.display().to_string()
    )
}

/// An executable (Python, one process per event) that writes the same start line.
pub(crate) fn exec_handler(hooks: &Hooks, hook: &str) -> String {
    let out = hooks.out().join(format!("{hook}.jsonl"));
    format!(
        r#"#!/usr/bin/env python3
import json, os, sys, time
msg = json.loads(sys.stdin.readline())
context = msg.get("context", {{}})
fleet = context.get("_fleet", {{}})
rec = {{"hook": {hook:?}, "n": context.get("n"), "event": msg.get("event"), "w": os.environ.get("TEST_WORKER"),
        "d": fleet.get("delivered"), "seq": fleet.get("stream_seq"), "t": time.time()}}
with open({out:?}, "a") as f:
    f.write(json.dumps(rec) + "\n")
time.sleep(float(context.get("pause", 0)))
"#,
        out = out.display().to_string()
    )
}

/// The three hooks in `hooks`' root.
fn add_hooks(hooks: &Hooks) {
    hooks.add(
        "npy",
        &[
            (
                "HOOK.yaml",
                &format!("name: npy\nevents: {V1}\ntimeout: 30\nretries: 2\n"),
            ),
            ("handler.py", &python_handler(hooks, "npy", V1)),
        ],
    );
    for (hook, events, extra) in [("nex", V1, ""), ("npar", V2, "concurrency: 4\n")] {
        let dir = hooks.add(
            hook,
            &[
                (
                    "HOOK.yaml",
                    &format!("name: {hook}\nevents: {events}\ntimeout: 30\nretries: 2\n{extra}"),
                ),
                ("handler", &exec_handler(hooks, hook)),
            ],
        );
        crate::util::set_mode(&dir.join("handler"), 0o755);
    }
}

/// `npy`'s patterns in `hooks`.
fn npy_version(hooks: &Hooks) -> &'static str {
    let text = std::fs::read_to_string(hooks.root().join("npy/HOOK.yaml")).unwrap_or_default();
    if text.contains(V2) { V2 } else { V1 }
}

/// Edits `npy` in `hooks` to the patterns `to`: its HOOK.yaml and its handler (which records
/// them) are made beside the root and swapped in whole (`renameat2` with `RENAME_EXCHANGE`), so
/// a reload's scan sees the old version or the new one, never half of each.
fn set_npy(hooks: &Hooks, to: &str) {
    let dir = hooks.root().join("npy");
    let text = std::fs::read_to_string(dir.join("HOOK.yaml")).expect("npy's HOOK.yaml");
    let from = if to == V1 { V2 } else { V1 };
    let stage = hooks.out().join("npy-next");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).expect("stage npy's next version");
    std::fs::write(stage.join("HOOK.yaml"), text.replace(from, to)).expect("npy's HOOK.yaml");
    std::fs::write(stage.join("handler.py"), python_handler(hooks, "npy", to))
        .expect("npy's handler");
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("a path");
    let (a, b) = (c(&stage), c(&dir));
    // SAFETY: two NUL-terminated paths; the call only renames.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(
        rc,
        0,
        "swap npy's version: {}",
        std::io::Error::last_os_error()
    );
    let _ = std::fs::remove_dir_all(&stage);
}

/// What the poster sent: each batch with the time the edge's answer came and whether it was
/// 202.
struct Posted {
    /// (n, event name, answer time, accepted)
    events: Vec<(u64, &'static str, f64, bool)>,
}

/// One POST that tolerates an edge that is gone: whether the edge answered 202 with the
/// events stored at the broker (`"state": "stored"`; a `buffered` answer dies with its edge,
/// as README's fleet section says, so it is not owed).
fn try_post(addr: &str, body: &Value) -> Option<bool> {
    let body = serde_json::to_vec(body).ok()?;
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    let head = format!(
        "POST /v1/events/batch HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(&body).ok()?;
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    if raw.is_empty() {
        return None;
    }
    let (status, _, body) = crate::util::parse_response(&raw);
    let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Some(status == 202 && answer["state"] == "stored")
}

/// Posts batches of 1-4 events every 80-280 ms until `stop`, to whatever address `edge` holds.
fn poster(seed: u64, edge: Arc<Mutex<String>>, stop: Arc<AtomicBool>) -> Posted {
    let mut rng = Rng(seed ^ 0x5EED);
    let mut posted = Posted { events: Vec::new() };
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let len = 1 + rng.below(4);
        let batch: Vec<(u64, &'static str)> = (0..len)
            .map(|i| (n + i, NAMES[rng.below(3) as usize]))
            .collect();
        n += len;
        let events: Vec<Value> = batch
            .iter()
            .map(|(n, name)| json!({"event": name, "context": {"n": n, "pause": 0.02}}))
            .collect();
        let addr = edge.lock().map(|a| a.clone()).unwrap_or_default();
        let status = try_post(&addr, &json!({"events": events}));
        let at = epoch_secs();
        for (n, name) in batch {
            posted.events.push((n, name, at, status == Some(true)));
        }
        std::thread::sleep(Duration::from_millis(80 + rng.below(200)));
    }
    posted
}

/// The fleet under test.
struct Fleet {
    nats: NatsServer,
    dirs: Vec<Hooks>,
    workers: Vec<Option<Serve>>,
    edge: Option<Serve>,
    edge_home: Hooks,
    edge_addr: Arc<Mutex<String>>,
    /// Each edit: (time, worker, the version it wrote).
    edits: Vec<(f64, usize, &'static str)>,
    /// When the broker was killed and when it was back.
    broker_kills: Vec<(f64, f64)>,
    /// Every process's log, each incarnation's (`w1.0`, `w1.1`, `edge.0`, ...), written out
    /// when a run fails.
    logs: Vec<(String, Arc<Mutex<Vec<String>>>)>,
}

/// The workers' options: the fleet tests' fast ones, and a short retirement drain.
fn worker_opts() -> Vec<&'static str> {
    fast_and(&["--retire-drain", "10"])
}

impl Fleet {
    fn start(bin: PathBuf) -> Self {
        let nats = NatsServer::start_bin(bin, &[], "");
        let dirs: Vec<Hooks> = (0..3).map(|_| Hooks::new()).collect();
        for d in &dirs {
            add_hooks(d);
        }
        let workers: Vec<Option<Serve>> = (0..3)
            .map(|i| {
                Some(worker_with(
                    &dirs[i],
                    &nats,
                    &format!("w{}", i + 1),
                    &worker_opts(),
                ))
            })
            .collect();
        let edge_home = Hooks::new();
        let e = edge(&edge_home, &nats.url(), &[]);
        for hook in HOOKS {
            wait_for_fleet(&e, hook, &["w1", "w2", "w3"]);
        }
        let edge_addr = Arc::new(Mutex::new(e.addr.clone()));
        let mut logs: Vec<(String, Arc<Mutex<Vec<String>>>)> = workers
            .iter()
            .enumerate()
            .filter_map(|(i, w): (usize, &Option<Serve>)| {
                Some((format!("w{}.0", i + 1), w.as_ref()?.stderr.clone()))
            })
            .collect();
        logs.push(("edge.0".into(), e.stderr.clone()));
        Self {
            nats,
            dirs,
            workers,
            edge: Some(e),
            edge_home,
            edge_addr,
            edits: Vec::new(),
            broker_kills: Vec::new(),
            logs,
        }
    }

    fn restart_worker(&mut self, i: usize) {
        let w = worker_with(
            &self.dirs[i],
            &self.nats,
            &format!("w{}", i + 1),
            &worker_opts(),
        );
        self.keep_log(&format!("w{}", i + 1), &w);
        self.workers[i] = Some(w);
    }

    /// Keeps a new incarnation's log under `name.N`.
    fn keep_log(&mut self, name: &str, p: &Serve) {
        let n = self
            .logs
            .iter()
            .filter(|(l, _)| l.split('.').next() == Some(name))
            .count();
        self.logs.push((format!("{name}.{n}"), p.stderr.clone()));
    }

    /// Writes every process's log to `target/nemesis/SEED/` (a failed run's evidence) and
    /// says where.
    fn write_logs(&self, seed: u64) -> String {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("nemesis")
            .join(seed.to_string());
        let _ = std::fs::create_dir_all(&dir);
        for (name, lines) in &self.logs {
            let text = lines.lock().map(|l| l.join("\n")).unwrap_or_default();
            let _ = std::fs::write(dir.join(format!("{name}.log")), text);
        }
        dir.display().to_string()
    }

    /// The workers' WARN and ERROR lines about the fleet, by their first words (the numbers
    /// and names after them differ), most first.
    fn warnings(&self) -> Vec<(String, usize)> {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for (_, lines) in self.logs.iter().filter(|(n, _)| n.starts_with('w')) {
            let Ok(lines) = lines.lock() else { continue };
            for l in lines.iter() {
                let Some(at) = l.find(" WARN ").or_else(|| l.find(" ERROR ")) else {
                    continue;
                };
                let text: String = l[at..].chars().take(100).collect();
                if !text.contains("fleet") || text.contains("dead-letter subject") {
                    continue;
                }
                *by.entry(text).or_default() += 1;
            }
        }
        let mut out: Vec<(String, usize)> = by.into_iter().collect();
        out.sort_by_key(|b| std::cmp::Reverse(b.1));
        out.truncate(12);
        out
    }

    fn apply(&mut self, fault: &Fault, log: &mut Vec<String>) {
        let t0 = epoch_secs();
        match *fault {
            Fault::Kill { worker, down } => {
                if let Some(mut w) = self.workers[worker].take() {
                    let kids = tree(w.child.id());
                    w.sigkill();
                    // The handlers go with their worker, as with a machine's crash.
                    for k in kids {
                        signal(k, libc::SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_secs_f64(down));
                self.restart_worker(worker);
            }
            Fault::Stop { worker, frozen } => {
                if let Some(w) = &self.workers[worker] {
                    let pids = tree(w.child.id());
                    for p in &pids {
                        signal(*p, libc::SIGSTOP);
                    }
                    std::thread::sleep(Duration::from_secs_f64(frozen));
                    for p in tree(w.child.id()).iter().chain(&pids) {
                        signal(*p, libc::SIGCONT);
                    }
                }
            }
            Fault::Edit { worker } => {
                let to = if npy_version(&self.dirs[worker]) == V1 {
                    V2
                } else {
                    V1
                };
                set_npy(&self.dirs[worker], to);
                self.edits.push((t0, worker, to));
            }
            Fault::Roll { worker, down } => {
                if let Some(mut w) = self.workers[worker].take() {
                    // A rolling update's stop: the version retires (its drain, up to
                    // --retire-drain), the queue drains, the worker exits.
                    w.begin_stop();
                    let _ = w.wait_exit(Duration::from_secs(60));
                }
                let to = if npy_version(&self.dirs[worker]) == V1 {
                    V2
                } else {
                    V1
                };
                set_npy(&self.dirs[worker], to);
                // The old version ran until the stop ended: the change counts from then.
                self.edits.push((epoch_secs(), worker, to));
                std::thread::sleep(Duration::from_secs_f64(down));
                self.restart_worker(worker);
            }
            Fault::Broker { down } => {
                let killed = epoch_secs();
                self.nats.kill();
                std::thread::sleep(Duration::from_secs_f64(down));
                self.nats.restart();
                self.broker_kills.push((killed, epoch_secs()));
            }
            Fault::EdgeStop { frozen } => {
                // Posts wait on the frozen edge (their answers come when it wakes, or are
                // given up: then not accepted); what it had published is the broker's already.
                if let Some(e) = &self.edge {
                    let pid = e.child.id();
                    signal(pid, libc::SIGSTOP);
                    std::thread::sleep(Duration::from_secs_f64(frozen));
                    signal(pid, libc::SIGCONT);
                }
            }
            Fault::Edge { down } => {
                if let Some(mut e) = self.edge.take() {
                    e.sigkill();
                }
                std::thread::sleep(Duration::from_secs_f64(down));
                let e = edge(&self.edge_home, &self.nats.url(), &[]);
                self.keep_log("edge", &e);
                if let Ok(mut a) = self.edge_addr.lock() {
                    a.clone_from(&e.addr);
                }
                self.edge = Some(e);
            }
        }
        log.push(format!("{t0:.2} {fault:?}"));
    }

    /// Every start the handlers recorded, from every worker's directory.
    fn starts(&self) -> Vec<Value> {
        let mut all: Vec<Value> = self
            .dirs
            .iter()
            .flat_map(|d| {
                HOOKS
                    .iter()
                    .flat_map(|h| read_jsonl(&d.out().join(format!("{h}.jsonl"))))
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(|a, b| {
            a["t"]
                .as_f64()
                .partial_cmp(&b["t"].as_f64())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        all
    }

    /// The dead letters of `hook`, by the `n` of their event.
    fn dead(&self, hook: &str) -> HashMap<u64, Value> {
        let (_, out) = dead_cmd(&self.nats, &["list", "--json", "--hook", hook]);
        out.lines()
            .filter(|l| l.trim_start().starts_with('{'))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| Some((v["envelope"]["context"]["n"].as_u64()?, v)))
            .collect()
    }
}

/// Whether the versions of `npy` on the workers (from the edits, all V1 at first) match
/// `name` at time `t`: `Some(true)` some version does, `Some(false)` none does, `None` an edit
/// was near.
fn npy_matches_at(edits: &[(f64, usize, &'static str)], name: &str, t: f64) -> Option<bool> {
    if edits.iter().any(|(at, _, _)| (at - t).abs() < EDIT_GRACE) {
        return None;
    }
    let mut v = [V1; 3];
    for (at, w, to) in edits {
        if *at < t {
            v[*w] = to;
        }
    }
    Some(v.iter().any(|p| p.contains(&format!("\"{name}\""))))
}

/// Which hooks must run or dead-letter an event named `name` accepted at `t`.
fn owed(edits: &[(f64, usize, &'static str)], name: &str, t: f64) -> Vec<&'static str> {
    let mut out = Vec::new();
    if npy_matches_at(edits, name, t) == Some(true) {
        out.push("npy");
    }
    if V1.contains(&format!("\"{name}\"")) {
        out.push("nex");
    }
    if V2.contains(&format!("\"{name}\"")) {
        out.push("npar");
    }
    out
}

/// Checks the history against the invariants; returns what broke them.
fn check(
    posted: &Posted,
    starts: &[Value],
    dead: &HashMap<&str, HashMap<u64, Value>>,
    edits: &[(f64, usize, &'static str)],
    broker_kills: &[(f64, f64)],
) -> Vec<String> {
    let mut broken = Vec::new();
    let ran: HashSet<(String, u64)> = starts
        .iter()
        .filter_map(|s| Some((s["hook"].as_str()?.to_string(), s["n"].as_u64()?)))
        .collect();
    // no-loss
    let mut lost: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (n, name, t, accepted) in &posted.events {
        if !accepted {
            continue;
        }
        for hook in owed(edits, name, *t) {
            if !ran.contains(&(hook.to_string(), *n)) && !dead[hook].contains_key(n) {
                lost.entry(hook).or_default().push(*n);
            }
        }
    }
    for (hook, ns) in lost {
        let at: HashMap<u64, f64> = posted.events.iter().map(|e| (e.0, e.2)).collect();
        broken.push(format!(
            "no-loss: {} accepted event(s) of {hook} neither ran nor were dead-lettered: {:?} (accepted at {:.2} to {:.2})",
            ns.len(),
            &ns[..ns.len().min(20)],
            at.get(&ns[0]).copied().unwrap_or(0.0),
            at.get(&ns[ns.len() - 1]).copied().unwrap_or(0.0),
        ));
    }
    // matched-version
    for s in starts.iter().filter(|s| s["hook"] == "npy") {
        let (Some(pats), Some(event)) = (s["pats"].as_array(), s["event"].as_str()) else {
            continue;
        };
        if !pats.iter().any(|p| p == event) {
            broken.push(format!(
                "matched-version: {event} ran on a version of npy with {pats:?}: {s}"
            ));
        }
    }
    // stream-order and repeat-counted
    for hook in HOOKS {
        let mut seen: HashMap<u64, (i64, &Value)> = HashMap::new();
        let mut last: Option<(u64, u64)> = None;
        for s in starts.iter().filter(|s| s["hook"] == hook) {
            let (Some(n), Some(d)) = (s["n"].as_u64(), s["d"].as_i64()) else {
                continue;
            };
            match seen.get(&n) {
                // A broker killed in between rolls its consumer state back: what ran just
                // before may run again saying `delivered` 1 (README, the faults' table).
                Some((before, first))
                    if d < 2
                        && *before < 2
                        && !broker_kills.iter().any(|(killed, back)| {
                            first["t"].as_f64() < Some(*back) && Some(*killed) < s["t"].as_f64()
                        }) =>
                {
                    broken.push(format!(
                    "repeat-counted: {hook} started event {n} again saying delivered {d}: {s} (before: {first})"
                    ))
                }
                Some(_) => {}
                // An event dead-lettered was handled then (its place in the order is the dead
                // letter's, which no start line shows): a later run is a repeat, as after a
                // redelivery of what ran (an acknowledgement lost with a frozen worker).
                None if hook != "npar" && !dead[hook].contains_key(&n) => {
                    let key = (s["seq"].as_u64().unwrap_or(0), n);
                    if last.is_some_and(|l| key < l) {
                        broken.push(format!(
                            "stream-order: {hook} started event {n} (seq {}) for the first time after {:?}: {s}",
                            key.0, last
                        ));
                    }
                    last = Some(key);
                }
                None => {}
            }
            if seen.get(&n).is_none_or(|(before, _)| d < *before) {
                seen.insert(n, (d, s));
            }
        }
    }
    // dead-reason
    for (hook, letters) in dead {
        for (n, v) in letters {
            if v["error"].as_str().is_none_or(str::is_empty) {
                broken.push(format!(
                    "dead-reason: {hook}'s dead letter of {n} has no reason: {v}"
                ));
            }
        }
    }
    broken
}

/// One run: the fleet on the server `bin`, the seed's schedule, the history checked.
fn run(bin: &Path, seed: u64, faults: &[String], steps: usize) -> Result<(), String> {
    eprintln!(
        "nemesis: seed {seed} on {} (replay: HERMES_NEMESIS_SEED={seed} HERMES_NEMESIS_SERVER={})",
        bin.display(),
        bin.display()
    );
    let plan = schedule(seed, faults, steps);
    let mut fleet = Fleet::start(bin.to_path_buf());
    let stop = Arc::new(AtomicBool::new(false));
    let posting = {
        let (addr, stop) = (fleet.edge_addr.clone(), stop.clone());
        std::thread::spawn(move || poster(seed, addr, stop))
    };
    let mut log = Vec::new();
    for (pause, fault) in &plan {
        std::thread::sleep(Duration::from_secs_f64(*pause));
        fleet.apply(fault, &mut log);
    }
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let posted = posting.join().expect("the poster");
    // Every worker back on V1, so whatever any version owes has a worker to run it.
    for i in 0..3 {
        if npy_version(&fleet.dirs[i]) != V1 {
            set_npy(&fleet.dirs[i], V1);
            fleet.edits.push((epoch_secs(), i, V1));
        }
    }
    let accepted = posted.events.iter().filter(|e| e.3).count();
    let started = Instant::now();
    // Quiet: every owed event ran or is dead, or the limit passes (then the check says which).
    let settled = poll_quiet(&fleet, &posted, Duration::from_secs(45));
    let starts = fleet.starts();
    let dead: HashMap<&str, HashMap<u64, Value>> =
        HOOKS.iter().map(|h| (*h, fleet.dead(h))).collect();
    let broken = check(&posted, &starts, &dead, &fleet.edits, &fleet.broker_kills);
    // Which faults the seed drew, by kind (`broker 2, kill 3, ...`).
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, f) in &plan {
        *kinds.entry(f.kind()).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    eprintln!(
        "nemesis: seed {seed}: {} fault(s) ({}), {accepted} event(s) accepted, {} start(s), {} dead letter(s), settled {settled} in {:.1} s",
        plan.len(),
        kinds.join(", "),
        starts.len(),
        dead.values().map(HashMap::len).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    for (reason, count) in dead_reasons(&dead) {
        eprintln!("nemesis:   {count} dead letter(s): {reason}");
    }
    // What the workers warned of, by its first words (a passing run's evidence too).
    for (warning, count) in fleet.warnings() {
        eprintln!("nemesis:   {count} warning(s): {warning}");
    }
    let keep = std::env::var_os("HERMES_NEMESIS_KEEP_LOGS").is_some();
    if broken.is_empty() {
        if keep {
            eprintln!("nemesis: logs in {}", fleet.write_logs(seed));
        }
        return Ok(());
    }
    let logs = fleet.write_logs(seed);
    let history: Vec<String> = starts.iter().map(Value::to_string).collect();
    let _ = std::fs::write(Path::new(&logs).join("starts.jsonl"), history.join("\n"));
    let posts: Vec<String> = posted
        .events
        .iter()
        .map(|(n, name, t, ok)| format!("{n} {name} {t:.3} {ok}"))
        .collect();
    let _ = std::fs::write(Path::new(&logs).join("posted.txt"), posts.join("\n"));
    let edits: Vec<String> = fleet
        .edits
        .iter()
        .map(|(t, w, v)| format!("{t:.3} w{} {v}", w + 1))
        .collect();
    let _ = std::fs::write(Path::new(&logs).join("edits.txt"), edits.join("\n"));
    Err(format!(
        "seed {seed} on {}: {} broken invariant(s) (logs in {}):\n  {}\nschedule:\n  {}",
        bin.display(),
        broken.len(),
        logs,
        broken
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  "),
        log.join("\n  ")
    ))
}

/// The dead letters by hook and reason (its first words: the numbers and names after them
/// differ), most first: what a run's dead letters were for, printed even when it passes.
fn dead_reasons(dead: &HashMap<&str, HashMap<u64, Value>>) -> Vec<(String, usize)> {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for (hook, letters) in dead {
        for v in letters.values() {
            let why: String = v["error"].as_str().unwrap_or("").chars().take(90).collect();
            *by.entry(format!("{hook}: {why}")).or_default() += 1;
        }
    }
    let mut out: Vec<(String, usize)> = by.into_iter().collect();
    out.sort_by_key(|b| std::cmp::Reverse(b.1));
    out
}

/// Waits until every owed event ran or is dead-lettered (true), or nothing more ran or was
/// dead-lettered for `limit` (false: the check says what is missing).
fn poll_quiet(fleet: &Fleet, posted: &Posted, limit: Duration) -> bool {
    let mut deadline = Instant::now() + limit;
    let mut seen = 0;
    loop {
        let starts = fleet.starts();
        let dead: HashMap<&str, HashMap<u64, Value>> =
            HOOKS.iter().map(|h| (*h, fleet.dead(h))).collect();
        let ran: HashSet<(String, u64)> = starts
            .iter()
            .filter_map(|s| Some((s["hook"].as_str()?.to_string(), s["n"].as_u64()?)))
            .collect();
        let missing = posted.events.iter().filter(|e| e.3).any(|(n, name, t, _)| {
            owed(&fleet.edits, name, *t)
                .into_iter()
                .any(|h| !ran.contains(&(h.to_string(), *n)) && !dead[h].contains_key(n))
        });
        if !missing {
            return true;
        }
        let handled = ran.len() + dead.values().map(HashMap::len).sum::<usize>();
        if handled > seen {
            seen = handled;
            deadline = Instant::now() + limit;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn faults() -> Vec<String> {
    match std::env::var("HERMES_NEMESIS_FAULTS") {
        Ok(s) if !s.trim().is_empty() && s.trim() != "all" => {
            s.split(',').map(|f| f.trim().to_string()).collect()
        }
        _ => FAULTS.iter().map(|f| f.to_string()).collect(),
    }
}

fn steps() -> usize {
    std::env::var("HERMES_NEMESIS_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
}

/// Fresh seeds on each server (`HERMES_NEMESIS_RUNS`, default 1), or the one of
/// `HERMES_NEMESIS_SEED` on `HERMES_NEMESIS_SERVER` (default: each server).
#[testenv::needs(nats)]
#[test]
#[ignore = "minutes a run: CI runs it with fresh seeds (.ci/run: one per server, every fault), outside the README's test command; by hand: `cargo test --test it nemesis_fresh -- --ignored --nocapture`"]
fn nemesis_fresh_seeds() {
    let servers: Vec<PathBuf> = match std::env::var_os("HERMES_NEMESIS_SERVER") {
        Some(p) => vec![PathBuf::from(p)],
        None => nats_servers(),
    };
    let seeds: Vec<u64> = match std::env::var("HERMES_NEMESIS_SEED") {
        Ok(s) => vec![s.trim().parse().expect("HERMES_NEMESIS_SEED is a number")],
        Err(_) => {
            let runs: u64 = std::env::var("HERMES_NEMESIS_RUNS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
            (0..runs)
                .map(|i| Rng(base.wrapping_add(i)).next())
                .collect()
        }
    };
    let (faults, steps) = (faults(), steps());
    let mut failed = Vec::new();
    let began = Instant::now();
    for bin in &servers {
        for seed in &seeds {
            if let Err(e) = run(bin, *seed, &faults, steps) {
                eprintln!("nemesis: FAILED {e}");
                failed.push(e);
            }
        }
    }
    eprintln!(
        "nemesis: {} run(s) in {:.0} s, {} failed",
        servers.len() * seeds.len(),
        began.elapsed().as_secs_f64(),
        failed.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// The seeds of [`REGRESSIONS`], each on its server.
#[testenv::needs(nats)]
#[test]
fn nemesis_regression_seeds() {
    let servers = nats_servers();
    let mut failed = Vec::new();
    for (seed, which, drawn) in REGRESSIONS {
        let bin = if *which == "new" {
            servers.last()
        } else {
            servers.first()
        };
        let Some(bin) = bin else { continue };
        let drawn: Vec<String> = drawn.split(',').map(str::to_string).collect();
        if let Err(e) = run(bin, *seed, &drawn, steps()) {
            failed.push(e);
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
