//! The busy-CPU phase (issue 33): a nice-0 busy loop shares the service's session (autogroup:
//! its scheduling group) and is pinned to the service's CPU, from before the service starts to
//! the end, while a client keeps emitting fire-and-forget events to a background hook. Decisions
//! must not fail open: every collect, from the first one sent while the hooks are still loading,
//! answers either 503 `not_ready` or with every decision hook's verdict (none `timed_out`, none
//! missing, never an empty "no objection"). Meanwhile (issue 47) the collects also wait behind an
//! executable decision hook's running event, a Python decision worker that crashed and restarts
//! for the collect, and a reload of a decision hook whose handler.py was edited.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::try_http;
use crate::util::{Hooks, Serve};

/// A decision hook: `cpu_ms` of CPU, then its verdict and its pid.
fn decision_hook(hooks: &Hooks, name: &str, cpu_ms: u32, verdict: &str) {
    let code = format!(
        "import os, time\n\ndef handle(event, context):\n    if event == 'agent:crash':\n        os._exit(3)\n    t = time.process_time()\n    while time.process_time() - t < {cpu}:\n        pass\n    return {{'decision': {verdict:?}, 'pid': os.getpid()}}\n",
        cpu = f64::from(cpu_ms) / 1000.0,
    );
    hooks.add(
        name,
        &[
            (
                "HOOK.yaml",
                "events: [\"command:*\", \"agent:crash\"]\ntimeout: 3\n",
            ),
            ("handler.py", &code),
        ],
    );
}

/// An executable decision hook: denies `command:*`; an `agent:slow` event runs about 0.3 s of
/// CPU first (a running event a collect waits behind).
fn exec_decision_hook(hooks: &Hooks) {
    let script = "#!/bin/sh\nread -r line\ncase \"$line\" in\n  *agent:slow*) i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done; echo null ;;\n  *) echo '{\"decision\": \"deny\"}' ;;\nesac\n";
    let dir = hooks.exec("exec-guard", r#"["command:*", "agent:slow"]"#, script);
    std::fs::write(
        dir.join("HOOK.yaml"),
        "name: exec-guard\nevents: [\"command:*\", \"agent:slow\"]\ntimeout: 5\n",
    )
    .unwrap();
}

/// What the loop does before its collect number `i`: an executable event that runs while the
/// collect waits, a crash of a Python decision worker (restarted for the collect), or an edit
/// and reload of a decision hook (the new version answers).
fn disturb(addr: &str, hooks: &Hooks, i: usize) {
    let emit = |event: &str| {
        let body = serde_json::to_vec(&json!({ "event": event })).unwrap();
        let _ = try_http(addr, "POST", "/v1/events", &body);
    };
    match i % 4 {
        1 => emit("agent:slow"),
        2 => emit("agent:crash"),
        3 => {
            let handler = hooks.root().join("allow-audit").join("handler.py");
            let code = std::fs::read_to_string(&handler).unwrap();
            std::fs::write(&handler, format!("{code}\n# edit {i}\n")).unwrap();
            let (addr, body) = (addr.to_string(), b"{}".to_vec());
            std::thread::spawn(move || try_http(&addr, "POST", "/v1/reload", &body));
        }
        _ => {}
    }
}

#[test]
#[ignore = "busy-CPU soak: run with --ignored (HERMES_SOAK_BUSY_SECS, default 20)"]
fn busy_cpu_soak_every_collect_gets_every_verdict() {
    let secs = super::env_secs("HERMES_SOAK_BUSY_SECS", 20);
    eprintln!("busy-CPU soak: {secs} s");
    let hooks = Hooks::new();
    decision_hook(&hooks, "deny-policy", 50, "deny");
    decision_hook(&hooks, "allow-audit", 10, "allow");
    exec_decision_hook(&hooks);
    hooks.add(
        "background",
        &[
            ("HOOK.yaml", "events: [\"message:*\"]\n"),
            (
                "handler.py",
                "def handle(event, context):\n    sum(range(2000))\n",
            ),
        ],
    );
    let cpu = "1";
    // Children of this process, as the service: one session, one autogroup.
    let busy = crate::util::BusyLoop::on_cpu(cpu);
    let mut cmd = std::process::Command::new("taskset");
    cmd.args(["-c", cpu, crate::util::bin(), "serve", "--hooks-dir"])
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0", "--drain-timeout", "10"]);
    let mut serve = Serve::spawn_listening(cmd, &hooks);
    let addr = serve.addr.clone();
    let body =
        serde_json::to_vec(&json!({"event": "command:run", "context": {"cmd": "rm"}})).unwrap();

    // While the hooks load: 503 not_ready or the full answer, nothing in between.
    let mut not_ready = 0u64;
    let loading_deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, v) =
            try_http(&addr, "POST", "/v1/collect", &body).expect("the service answers");
        if status == 503 {
            assert_eq!(v["error"]["code"], "not_ready", "{v}");
            not_ready += 1;
            assert!(
                Instant::now() < loading_deadline,
                "still loading after 120 s"
            );
            std::thread::sleep(Duration::from_millis(50)); // polling readiness, bounded above
            continue;
        }
        check(status, &v, 0);
        break;
    }

    // Fire-and-forget load beside the collects.
    let stop = Arc::new(AtomicBool::new(false));
    let emitted = Arc::new(AtomicU64::new(0));
    let emitter = {
        let (addr, stop, emitted) = (addr.clone(), stop.clone(), emitted.clone());
        std::thread::spawn(move || {
            let events: Vec<Value> = (0..50)
                .map(|n| json!({"event": "message:received", "context": {"n": n}}))
                .collect();
            let batch = serde_json::to_vec(&json!({ "events": events })).unwrap();
            while !stop.load(Ordering::Relaxed) {
                if let Some((202, _)) = try_http(&addr, "POST", "/v1/events/batch", &batch) {
                    emitted.fetch_add(50, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(200)); // a steady, modest rate
            }
        })
    };
    let until = Instant::now() + Duration::from_secs(secs);
    let mut times = Vec::new();
    let mut pids = std::collections::BTreeSet::new();
    while Instant::now() < until {
        disturb(&addr, &hooks, times.len());
        let started = Instant::now();
        let (status, v) =
            try_http(&addr, "POST", "/v1/collect", &body).expect("the service answers");
        times.push(started.elapsed());
        check(status, &v, times.len());
        for r in v["results"].as_array().unwrap() {
            pids.insert((r["hook"].to_string(), r["result"]["pid"].as_u64()));
        }
    }
    stop.store(true, Ordering::Relaxed);
    emitter.join().unwrap();
    times.sort();
    let figures = json!({
        "collects": times.len(),
        "not_ready_while_loading": not_ready,
        "collect_ms_p50": times[times.len() / 2].as_secs_f64() * 1000.0,
        "collect_ms_max": times[times.len() - 1].as_secs_f64() * 1000.0,
        "events_emitted": emitted.load(Ordering::Relaxed),
    });
    eprintln!("busy-CPU soak: {figures}");
    super::report("busy", &figures);
    // Which worker answered (a restart while loading, when the fork server was not ready in
    // time on the busy CPU, shows as a second pid: logged, not a broken promise).
    eprintln!("busy-CPU soak: answered by {pids:?}");
    assert!(times.len() >= 3, "{figures}");
    // The background hook's backlog drains once the CPU is free again.
    drop(busy);
    assert_eq!(serve.terminate(), Some(0));
}

/// A collect's answer: every verdict in match order (discovery order), no error.
fn check(status: u16, v: &Value, i: usize) {
    assert_eq!(status, 200, "collect {i}: {v}");
    assert_eq!(
        v["errors"],
        json!([]),
        "collect {i}: none timed out or failed: {v}"
    );
    let verdicts: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["result"]["decision"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        verdicts,
        ["allow", "deny", "deny"],
        "collect {i}: every verdict: {v}"
    );
}
