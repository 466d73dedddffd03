//! Sandboxed hooks against unconfined ones, in one run (issue 41).
//!
//! `cargo bench --bench sandbox` (release service). Alternating rounds of each pair so that a
//! loaded machine weighs on both alike:
//! 1. Start-up: `serve` on 50 trivial Python hooks until its "hooks loaded" line, every hook
//!    `sandbox: none`, then every hook `sandbox: strict` (each worker confines itself before
//!    the import).
//! 2. Events/s through one trivial Python hook, `none` against `strict`.
//! 3. Events/s through one no-op executable hook (`#!/bin/sh`), `none` against `strict`: the
//!    cost on the exec path of the confinement between fork and exec (environment rebuilt,
//!    `no_new_privs`, `landlock_restrict_self` on a ruleset built once per handler).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;

use common::request;

const ROUNDS: usize = 3;

fn write_hook(root: &Path, name: &str, yaml: &str, file: &str, code: &str) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("HOOK.yaml"), yaml).expect("write");
    std::fs::write(dir.join(file), code).expect("write");
    if file == "handler" {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
}

fn done(addr: &str, name: &str) -> u64 {
    let h: Value = serde_json::from_slice(&request(addr, "GET", &format!("/v1/hooks/{name}"), b""))
        .unwrap_or(Value::Null);
    let c = &h["counters"];
    c["ok"].as_u64().unwrap_or(0) + c["failed"].as_u64().unwrap_or(0)
}

/// Sends `n` events and waits until the hook has handled `until` in all; returns events/s.
fn rate(addr: &str, name: &str, n: usize, until: u64) -> f64 {
    let t0 = Instant::now();
    let mut left = n;
    while left > 0 {
        let k = left.min(1000);
        let events: Vec<Value> = (0..k)
            .map(|_| json!({"event": "bench:x", "context": {"user_id": "42", "message": "hello"}}))
            .collect();
        let body = serde_json::to_vec(&json!({"events": events})).expect("json");
        let _ = request(addr, "POST", "/v1/events/batch", &body);
        left -= k;
    }
    while done(addr, name) < until {
        assert!(t0.elapsed() < Duration::from_secs(600), "{name} too slow");
        std::thread::sleep(Duration::from_millis(10));
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn startup() {
    println!("## Start-up of 50 trivial Python hooks (serve start to \"hooks loaded\")");
    let mut ms = [Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (i, sandbox) in ["none", "strict"].iter().enumerate() {
            let tmp = tempfile::tempdir().expect("tempdir");
            let root = tmp.path().join("hooks");
            for h in 0..50 {
                write_hook(
                    &root,
                    &format!("h{h:03}"),
                    &format!("events: [agent:start]\nsandbox: {sandbox}\n"),
                    "handler.py",
                    "def handle(event, context):\n    return None\n",
                );
            }
            let t0 = Instant::now();
            let service = common::Service::start(&root, tmp.path());
            ms[i].push(t0.elapsed().as_secs_f64() * 1000.0);
            drop(service);
        }
    }
    println!("| sandbox | rounds (ms) | mean |");
    println!("|---|---|---|");
    for (i, sandbox) in ["none", "strict"].iter().enumerate() {
        let each: Vec<String> = ms[i].iter().map(|m| format!("{m:.0}")).collect();
        println!(
            "| {sandbox} | {} | {:.0} ms |",
            each.join(", "),
            mean(&ms[i])
        );
    }
    println!("strict / none: {:.3}", mean(&ms[1]) / mean(&ms[0]));
}

fn throughput(title: &str, file: &str, code: &str, n: usize) {
    println!("\n## Events/s through one {title}");
    let mut rates = [Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (i, sandbox) in ["none", "strict"].iter().enumerate() {
            let tmp = tempfile::tempdir().expect("tempdir");
            let root = tmp.path().join("hooks");
            write_hook(
                &root,
                "one",
                &format!("events: ['bench:*']\nqueue: {{capacity: 1000000}}\nsandbox: {sandbox}\n"),
                file,
                code,
            );
            let service = common::Service::start(&root, tmp.path());
            let warm = (n / 20).max(50);
            rate(&service.addr, "one", warm, warm as u64);
            rates[i].push(rate(&service.addr, "one", n, (warm + n) as u64));
        }
    }
    println!("| sandbox | rounds (events/s) | mean |");
    println!("|---|---|---|");
    for (i, sandbox) in ["none", "strict"].iter().enumerate() {
        let each: Vec<String> = rates[i].iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "| {sandbox} | {} | {:.0} |",
            each.join(", "),
            mean(&rates[i])
        );
    }
    println!("strict / none: {:.3}", mean(&rates[1]) / mean(&rates[0]));
}

fn main() {
    startup();
    throughput(
        "trivial Python hook",
        "handler.py",
        "def handle(event, context):\n    return None\n",
        50_000,
    );
    throughput(
        "no-op executable hook",
        "handler",
        "#!/bin/sh\nexit 0\n",
        1500,
    );
}
