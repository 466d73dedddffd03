//! Soaks: the real binary under load while a driver breaks things. Ignored by default; `.ci/run`
//! runs short versions of the three phases, one after the other:
//!
//! ```text
//! HERMES_SOAK_SECS=25 HERMES_SOAK_BUDGET_SECS=15 HERMES_SOAK_FLEET_SECS=15 \
//!     HERMES_SOAK_BUSY_SECS=15 cargo test --test soak -- --ignored --nocapture --test-threads 1
//! ```
//!
//! - the chaos phase (this file, `HERMES_SOAK_SECS`, default 60): exact accounting under overload
//!   and every kind of fault;
//! - the loss-budget phase ([`budget`], `HERMES_SOAK_BUDGET_SECS`, default 20): what a fault costs,
//!   without overload;
//! - the fleet phase ([`fleet`], `HERMES_SOAK_FLEET_SECS`, default 20): edge, workers and broker
//!   SIGKILLed and restarted under load, every 202 accounted for; with it (same variable) the
//!   "lease kills" and "changes" phases of issue 34 (an ordered hook's lease holder SIGKILLed
//!   again and again; hooks renamed and their patterns widened, swapped and narrowed on two
//!   workers in turn while events flow: on the nats-server on `PATH`, and on the 2.10+ build of
//!   `HERMES_NATS_SERVER_NEW` too when it names one; its workers' `--retire-drain` is
//!   `HERMES_SOAK_RETIRE_DRAIN`, default 3 s);
//! - the busy-CPU phase ([`busy`], `HERMES_SOAK_BUSY_SECS`, default 20): a busy loop in the
//!   service's session on its CPU, every collect answered with every verdict (issue 33).
//!
//! `HERMES_SOAK_SEED` replays the drivers' and clients' choices; `HERMES_SOAK_REPORT=<file>` also
//! writes each phase's figures as JSON (`<file>` for the chaos phase, `<file>.budget`,
//! `<file>.fleet`, `<file>.busy` for the others).
//!
//! The chaos phase:
//! Several clients emit (single, batch) and collect while a driver adds, edits (good and broken),
//! renames and removes hooks of three kinds (Python, executable, C library), SIGKILLs workers,
//! sends SIGHUP, asks for reloads and posts malformed requests; the events themselves make
//! handlers hang, crash, raise, flood their output, leave background children holding their
//! pipes and return huge results. At the end, per hook and in total (from `host_stop`):
//! accepted = ok + failed + dropped + undelivered, exactly, and the total accepted equals what
//! the clients were told was queued; no handler process is left; RSS stayed bounded; `/healthz`
//! answered every probe.

#[path = "it/util.rs"]
mod util;

#[path = "soak/budget.rs"]
mod budget;
#[path = "soak/busy.rs"]
mod busy;
#[cfg(feature = "fleet")]
#[path = "soak/fleet.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use util::{Hooks, Serve, signal};

/// Largest resident set the service may reach during the soak.
const RSS_LIMIT_KB: u64 = 512 * 1024;

/// Seconds a phase runs: `var`, or `default`.
fn env_secs(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// `HERMES_SOAK_SEED`, or one from the clock.
fn env_seed() -> u64 {
    std::env::var("HERMES_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// Writes a phase's figures where `HERMES_SOAK_REPORT` says (`phase` "chaos": the path itself).
fn report(phase: &str, figures: &Value) {
    if let Ok(path) = std::env::var("HERMES_SOAK_REPORT") {
        let path = if phase == "chaos" {
            path
        } else {
            format!("{path}.{phase}")
        };
        std::fs::write(path, serde_json::to_string_pretty(figures).unwrap()).unwrap();
    }
}

/// Waits (up to 10 s) until `left()` is empty: killed process groups are reaped by the system
/// once their parent is gone. Returns what is still there.
fn wait_gone(left: impl Fn() -> Vec<u32>) -> Vec<u32> {
    let gone_by = Instant::now() + Duration::from_secs(10);
    loop {
        let now = left();
        if now.is_empty() || Instant::now() > gone_by {
            return now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A small deterministic generator (xorshift64*), seeded per thread.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// What an event asks its handler to do, with its weight.
const BEHAVIOURS: [(&str, u64); 8] = [
    ("ok", 180),
    ("slow", 6),
    ("raise", 5),
    ("hang", 1),
    ("crash", 2),
    ("flood", 2),
    ("huge", 2),
    ("leak", 2),
];

fn behaviour(rng: &mut Rng) -> &'static str {
    let total: u64 = BEHAVIOURS.iter().map(|(_, w)| w).sum();
    let mut r = rng.below(total);
    for (b, w) in BEHAVIOURS {
        if r < w {
            return b;
        }
        r -= w;
    }
    "ok"
}

/// One HTTP/1.1 request that never panics: `None` when the connection or the answer failed.
fn try_http(addr: &str, method: &str, path: &str, body: &[u8]) -> Option<(u16, Value)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let status: u16 = String::from_utf8_lossy(&raw[..split])
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = &raw[split + 4..];
    let value = if head.contains("transfer-encoding: chunked") {
        let mut out = Vec::new();
        let mut rest = body;
        while let Some(p) = rest.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(String::from_utf8_lossy(&rest[..p]).trim(), 16).ok()?;
            if size == 0 {
                break;
            }
            out.extend_from_slice(rest.get(p + 2..p + 2 + size)?);
            rest = rest.get(p + 2 + size + 2..)?;
        }
        serde_json::from_slice(&out).unwrap_or(Value::Null)
    } else {
        serde_json::from_slice(body).unwrap_or(Value::Null)
    };
    Some((status, value))
}

/// Sends raw bytes and reads whatever comes back (malformed requests).
fn raw_send(addr: &str, bytes: &[u8], close_early: bool) {
    if let Ok(mut s) = TcpStream::connect(addr) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = s.write_all(bytes);
        if close_early {
            return;
        }
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
}

fn python_source(tag: &str) -> String {
    format!(
        r#"import os, sys, time
TAG = {tag:?}

def handle(event, context):
    do = context.get("do", "ok")
    if do == "hang":
        time.sleep(30)
    elif do == "slow":
        time.sleep(0.05)
    elif do == "crash":
        os._exit(7)
    elif do == "raise":
        raise RuntimeError("soak error")
    elif do == "flood":
        for i in range(3000):
            print("flood line", i)
        sys.stderr.write("z" * 100000 + "\n")
    elif do == "huge":
        return {{"tag": TAG, "big": "y" * 3000000}}
    return {{"tag": TAG}}
"#
    )
}

fn exec_source(tag: &str) -> String {
    format!(
        r#"#!/bin/sh
ctx=$(cat)
case "$ctx" in
  *'"do":"hang"'*) sleep 30 ;;
  *'"do":"slow"'*) sleep 0.05 ;;
  *'"do":"crash"'*) kill -9 $$ ;;
  *'"do":"raise"'*) echo "soak error" >&2; exit 3 ;;
  *'"do":"flood"'*) yes flood | head -n 5000 >&2 ;;
  *'"do":"huge"'*) head -c 3000000 /dev/zero | tr '\0' 'a'; exit 0 ;;
  *'"do":"leak"'*) sleep 30 & ;;
esac
echo '{{"tag": "{tag}"}}'
"#
    )
}

const C_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef struct { uint8_t *ptr; size_t len; } HermesHookBuf;
uint32_t hermes_hook_abi_version(void) { return 1; }
static int has(const uint8_t *c, size_t n, const char *s) { return memmem(c, n, s, strlen(s)) != NULL; }
int32_t hermes_hook_handle(const uint8_t *ev, size_t n, const uint8_t *c, size_t cn, HermesHookBuf *out) {
    (void)ev; (void)n;
    const char *ok = "{\"tag\": \"c\"}";
    if (has(c, cn, "\"do\":\"hang\"")) usleep(1500000);
    if (has(c, cn, "\"do\":\"slow\"")) usleep(50000);
    if (has(c, cn, "\"do\":\"raise\"") || has(c, cn, "\"do\":\"crash\"")) {
        out->ptr = malloc(10); memcpy(out->ptr, "soak error", 10); out->len = 10; return 1;
    }
    if (has(c, cn, "\"do\":\"huge\"")) {
        size_t len = 3000000;
        out->ptr = malloc(len); memset(out->ptr, ' ', len);
        memcpy(out->ptr, ok, strlen(ok)); out->len = len; return 0;
    }
    out->ptr = malloc(strlen(ok)); memcpy(out->ptr, ok, strlen(ok)); out->len = strlen(ok);
    return 0;
}
void hermes_hook_free(HermesHookBuf b) { free(b.ptr); }
"#;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Python,
    Exec,
    Library,
}

fn yaml(name: &str, timeout: &str) -> String {
    format!(
        "name: {name}\nevents: [\"soak:*\"]\ntimeout: {timeout}\nqueue: {{capacity: 200, overflow: drop_oldest}}\n"
    )
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

/// Writes hook `name` of `kind` into `dir`, version `tag`.
fn write_hook(dir: &Path, name: &str, kind: Kind, tag: &str, lib: &Path) {
    let _ = std::fs::create_dir_all(dir);
    match kind {
        Kind::Python => {
            let _ = std::fs::write(dir.join("handler.py"), python_source(tag));
            let _ = std::fs::write(dir.join("HOOK.yaml"), yaml(name, "1"));
        }
        Kind::Exec => {
            let _ = std::fs::write(dir.join("handler"), exec_source(tag));
            set_mode(&dir.join("handler"), 0o755);
            let _ = std::fs::write(dir.join("HOOK.yaml"), yaml(name, "1"));
        }
        Kind::Library => {
            let tmp = dir.join(".handler.so.tmp");
            if std::fs::copy(lib, &tmp).is_ok() {
                let _ = std::fs::rename(&tmp, dir.join("handler.so"));
            }
            let _ = std::fs::write(dir.join("HOOK.yaml"), yaml(name, "0.5"));
        }
    }
}

/// Direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        // Fields after the command name (which may hold spaces) in parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|f| f.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// Live (non-zombie) processes whose environment names `home` as HERMES_HOME: every handler
/// process and whatever it started.
fn handler_processes(home: &Path) -> Vec<u32> {
    let needle = format!("HERMES_HOME={}\0", home.display());
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let env = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
        if !env.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        if !status.is_empty() && !status.contains("State:\tZ") {
            out.push(p);
        }
    }
    out
}

fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Counts of what the clients were told.
#[derive(Default)]
struct ClientCounts {
    requests: AtomicU64,
    /// Hook deliveries the service said it queued (202 `queued`, collect entries).
    queued: AtomicU64,
    /// Requests refused (non-2xx) or failed at the socket.
    refused: AtomicU64,
    collect_results: AtomicU64,
    collect_errors: AtomicU64,
    /// Collect errors naming a matching hook that is not running (nothing queued to it).
    collect_not_running: AtomicU64,
    /// Events sent, by what they ask the handler to do.
    behaviours: Mutex<BTreeMap<&'static str, u64>>,
}

impl ClientCounts {
    fn sent(&self, b: &'static str) {
        *self.behaviours.lock().unwrap().entry(b).or_default() += 1;
    }
}

fn client(addr: String, seed: u64, stop: Arc<AtomicBool>, counts: Arc<ClientCounts>) {
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        counts.requests.fetch_add(1, Ordering::Relaxed);
        let op = rng.below(10);
        if op < 6 {
            let b = behaviour(&mut rng);
            counts.sent(b);
            let body = json!({"event": format!("soak:{b}"), "context": {"do": b}});
            match try_http(&addr, "POST", "/v1/events", body.to_string().as_bytes()) {
                Some((202, v)) => {
                    counts
                        .queued
                        .fetch_add(v["queued"].as_u64().unwrap_or(0), Ordering::Relaxed);
                }
                _ => {
                    counts.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else if op < 9 {
            let n = 1 + rng.below(20);
            let events: Vec<Value> = (0..n)
                .map(|_| {
                    let b = behaviour(&mut rng);
                    counts.sent(b);
                    json!({"event": format!("soak:{b}"), "context": {"do": b}})
                })
                .collect();
            let body = json!({"events": events});
            match try_http(
                &addr,
                "POST",
                "/v1/events/batch",
                body.to_string().as_bytes(),
            ) {
                Some((202, v)) => {
                    let sum: u64 = v["queued"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_u64).sum())
                        .unwrap_or(0);
                    counts.queued.fetch_add(sum, Ordering::Relaxed);
                }
                _ => {
                    counts.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else {
            // Collect only well-behaved events: every handler answers them with a value, so
            // each hook the event was queued to shows up as a result or an error.
            let b = *rng.pick(&["ok", "ok", "slow", "raise"]);
            counts.sent(b);
            let body =
                json!({"event": format!("soak:{b}"), "context": {"do": b}, "timeout_ms": 1000});
            match try_http(&addr, "POST", "/v1/collect", body.to_string().as_bytes()) {
                Some((200, v)) => {
                    let results = v["results"].as_array().map_or(0, Vec::len) as u64;
                    let errors = v["errors"].as_array().cloned().unwrap_or_default();
                    // Not queued: a hook removed between matching and queueing refused the
                    // event, and a matching hook that is not running (a broken version with no
                    // good one before it, say, after a rename) is named with its `state`.
                    let not_running =
                        errors.iter().filter(|e| e.get("state").is_some()).count() as u64;
                    let stopping = not_running
                        + errors
                            .iter()
                            .filter(|e| e["error"] == "the hook is stopping")
                            .count() as u64;
                    counts
                        .collect_not_running
                        .fetch_add(not_running, Ordering::Relaxed);
                    let errors = errors.len() as u64;
                    counts.collect_results.fetch_add(results, Ordering::Relaxed);
                    counts.collect_errors.fetch_add(errors, Ordering::Relaxed);
                    counts
                        .queued
                        .fetch_add(results + errors - stopping, Ordering::Relaxed);
                }
                _ => {
                    counts.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Pacing, so the service (and the other engineers' builds) keep some CPU.
        std::thread::sleep(Duration::from_millis(2 + rng.below(4)));
    }
}

/// One hook the driver manages.
struct Managed {
    name: String,
    dir: PathBuf,
    kind: Kind,
    version: u64,
}

impl Managed {
    /// Writes hook `h<next_id>` of `kind` (version v0) under `root` and counts `next_id` on.
    fn add(root: &Path, next_id: &mut u64, kind: Kind, lib: &Path) -> Self {
        let name = format!("h{next_id}");
        *next_id += 1;
        let dir = root.join(&name);
        write_hook(&dir, &name, kind, "v0", lib);
        Self {
            name,
            dir,
            kind,
            version: 0,
        }
    }
}

#[test]
#[ignore = "chaos soak: run with --ignored (HERMES_SOAK_SECS, default 60)"]
fn chaos_soak_keeps_every_promise() {
    let secs = env_secs("HERMES_SOAK_SECS", 60);
    let seed = env_seed();
    eprintln!("soak: {secs} s, seed {seed}");
    let hooks = Hooks::new();
    let root = hooks.root();

    // The C library, built once and copied into every library hook.
    let lib = hooks.out().join("soak.so");
    let src = hooks.out().join("soak.c");
    std::fs::write(&src, C_SOURCE).unwrap();
    let cc = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(cc.success(), "the C soak hook did not build");

    let mut managed: Vec<Managed> = Vec::new();
    let mut next_id = 0u64;
    for kind in [
        Kind::Python,
        Kind::Python,
        Kind::Exec,
        Kind::Exec,
        Kind::Library,
    ] {
        managed.push(Managed::add(&root, &mut next_id, kind, &lib));
    }

    let mut serve = Serve::start(&hooks, &["--output", "json", "--drain-timeout", "2"]);
    let pid = serve.child.id();
    let addr = serve.addr.clone();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(ClientCounts::default());

    // Health probe and RSS sampler.
    let health = Arc::new(Mutex::new((0u64, 0u64, Duration::ZERO))); // probes, failures, worst
    let rss_max = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, health, rss_max, addr) =
            (stop.clone(), health.clone(), rss_max.clone(), addr.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = matches!(try_http(&addr, "GET", "/healthz", b""), Some((200, _)));
                let took = t.elapsed();
                {
                    let mut h = health.lock().unwrap();
                    h.0 += 1;
                    if !ok {
                        h.1 += 1;
                    }
                    h.2 = h.2.max(took);
                }
                if let Some(kb) = rss_kb(pid) {
                    rss_max.fetch_max(kb, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let rss_start = rss_kb(pid).unwrap_or(0);

    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (addr, stop, counts) = (addr.clone(), stop.clone(), counts.clone());
            std::thread::spawn(move || client(addr, seed.wrapping_add(i + 1), stop, counts))
        })
        .collect();

    // The driver.
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let deadline = started + Duration::from_secs(secs);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(40 + rng.below(160)));
        let fault: &'static str = match rng.below(100) {
            0..=9 if managed.len() < 14 => {
                let kind = *rng.pick(&[Kind::Python, Kind::Exec, Kind::Library]);
                managed.push(Managed::add(&root, &mut next_id, kind, &lib));
                "add hook"
            }
            10..=24 if !managed.is_empty() => {
                let i = rng.below(managed.len() as u64) as usize;
                let m = &mut managed[i];
                m.version += 1;
                write_hook(&m.dir, &m.name, m.kind, &format!("v{}", m.version), &lib);
                "edit hook (good)"
            }
            25..=34 if !managed.is_empty() => {
                let i = rng.below(managed.len() as u64) as usize;
                let m = &managed[i];
                if m.kind == Kind::Python && rng.below(2) == 0 {
                    let _ =
                        std::fs::write(m.dir.join("handler.py"), "def handle(event, context:\n");
                } else {
                    let _ = std::fs::write(m.dir.join("HOOK.yaml"), "name: [unclosed\nevents: 7\n");
                }
                "edit hook (broken)"
            }
            35..=40 if !managed.is_empty() => {
                let i = rng.below(managed.len() as u64) as usize;
                let new_dir = root.join(format!("{}-r{}", managed[i].name, rng.below(1_000_000)));
                if std::fs::rename(&managed[i].dir, &new_dir).is_ok() {
                    managed[i].dir = new_dir;
                }
                "rename hook"
            }
            41..=46 if managed.len() > 2 => {
                let i = rng.below(managed.len() as u64) as usize;
                let m = managed.swap_remove(i);
                let _ = std::fs::remove_dir_all(&m.dir);
                "remove hook"
            }
            47..=61 => {
                let kids = children(pid);
                if kids.is_empty() {
                    continue;
                }
                signal(*rng.pick(&kids), libc::SIGKILL);
                "SIGKILL a worker"
            }
            62..=67 => {
                signal(pid, libc::SIGHUP);
                "SIGHUP"
            }
            68..=71 => {
                let _ = try_http(&addr, "POST", "/v1/reload", b"{}");
                "POST /v1/reload"
            }
            _ => {
                let kind = rng.below(9);
                match kind {
                    0 => raw_send(&addr, b"\x00\xff\x13garbage\r\n\r\n", false),
                    1 => {
                        let _ = try_http(&addr, "POST", "/v1/events", b"{not json");
                    }
                    2 => {
                        let _ = try_http(&addr, "POST", "/v1/events", br#"{"event": "Bad Name!"}"#);
                    }
                    3 => {
                        let big = vec![b'['; 3 * 1024 * 1024];
                        let _ = try_http(&addr, "POST", "/v1/events/batch", &big);
                    }
                    4 => raw_send(
                        &addr,
                        b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{\"ev",
                        true,
                    ),
                    5 => {
                        let _ = try_http(&addr, "DELETE", "/v1/hooks", b"");
                    }
                    6 => {
                        let _ = try_http(
                            &addr,
                            "POST",
                            "/v1/events/batch",
                            br#"{"events": [{"event": "soak:ok"}, {"event": 5}]}"#,
                        );
                    }
                    7 => {
                        let _ = try_http(
                            &addr,
                            "POST",
                            "/v1/collect",
                            br#"{"event": "soak:ok", "timeout_ms": -1}"#,
                        );
                    }
                    _ => {
                        let long = format!(
                            "GET /v1/hooks/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
                            "a".repeat(10_000),
                            "b".repeat(100_000)
                        );
                        raw_send(&addr, long.as_bytes(), false);
                    }
                }
                "malformed request"
            }
        };
        *faults.entry(fault).or_default() += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    watcher.join().unwrap();
    let ran = started.elapsed();

    assert_eq!(serve.terminate(), Some(0), "the service must exit cleanly");
    let stop_notice: Value = serve.notice("host_stop");
    let leftovers = wait_gone(|| handler_processes(&hooks.home()));

    // The accounts.
    let accounts = stop_notice["accounts"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut unbalanced = Vec::new();
    for (name, t) in &accounts {
        let get = |k: &str| t[k].as_u64().unwrap_or(0);
        if get("accepted") != get("ok") + get("failed") + get("dropped") + get("undelivered") {
            unbalanced.push(format!("{name}: {t}"));
        }
    }
    let totals = &stop_notice["totals"];
    let total = |k: &str| totals[k].as_u64().unwrap_or(0);
    let client_queued = counts.queued.load(Ordering::Relaxed);
    let (probes, probe_failures, worst_probe) = *health.lock().unwrap();
    let rss_max_kb = rss_max.load(Ordering::Relaxed);
    let figures = json!({
        "seed": seed,
        "duration_s": ran.as_secs_f64(),
        "requests": counts.requests.load(Ordering::Relaxed),
        "requests_refused": counts.refused.load(Ordering::Relaxed),
        "client_queued": client_queued,
        "collect_results": counts.collect_results.load(Ordering::Relaxed),
        "collect_errors": counts.collect_errors.load(Ordering::Relaxed),
        "collect_not_running": counts.collect_not_running.load(Ordering::Relaxed),
        "totals": totals,
        "hook_names": accounts.len(),
        "faults": faults,
        "events_by_behaviour": *counts.behaviours.lock().unwrap(),
        "healthz": {"probes": probes, "failures": probe_failures, "worst_ms": worst_probe.as_millis() as u64},
        "rss_kb": {"start": rss_start, "max": rss_max_kb},
        "handler_processes_left": leftovers.len(),
        "drain_ms": stop_notice["drain_ms"],
        "notices_lost": stop_notice["notices_lost"],
    });
    eprintln!("{}", serde_json::to_string_pretty(&figures).unwrap());
    report("chaos", &figures);

    assert!(
        leftovers.is_empty(),
        "handler processes left after shutdown: {leftovers:?}"
    );
    assert!(unbalanced.is_empty(), "unbalanced hooks: {unbalanced:?}");
    assert_eq!(
        total("accepted"),
        total("ok") + total("failed") + total("dropped") + total("undelivered"),
        "totals: {totals}"
    );
    assert_eq!(
        total("accepted"),
        client_queued,
        "the service accepted exactly what it told the clients it queued: {totals}"
    );
    assert!(
        total("accepted") > 0,
        "the soak delivered nothing: {totals}"
    );
    assert_eq!(
        probe_failures, 0,
        "/healthz failed {probe_failures} of {probes} probes"
    );
    assert!(
        rss_max_kb < RSS_LIMIT_KB,
        "RSS reached {rss_max_kb} kB (limit {RSS_LIMIT_KB} kB)"
    );
}
