//! Hot-reload figures: pick-up latency and rescan cost.
//!
//! `cargo bench --bench reload`.
//! 1. Pick-up latency of the release `serve` (watcher on, 100 ms debounce): from the last write
//!    of a change to the first event answered by the new version (polled with
//!    `POST /v1/collect` every millisecond), p50/p99 over 50 changes, for a new hook directory
//!    and for an edited handler.py.
//! 2. Cost of a rescan with 1,000 hook directories, in process: `discover` alone, and a full
//!    `Host::reload` when nothing changed (median of 10). The hooks are executables so that
//!    loading 1,000 of them starts no processes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

fn collect(addr: &str, event: &str) -> serde_json::Value {
    let body = format!("{{\"event\": \"{event}\", \"timeout_ms\": 2000}}");
    let mut s = TcpStream::connect(addr).expect("connect");
    let req = format!(
        "POST /v1/collect HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
    serde_json::from_slice(&raw[split + 4..]).unwrap_or(serde_json::Value::Null)
}

fn wait_for(addr: &str, event: &str, want: &serde_json::Value) -> Duration {
    let t0 = Instant::now();
    loop {
        let v = collect(addr, event);
        if v["results"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| &x["result"] == want))
        {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no pick-up of {event}: {v}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn write_atomic(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, content).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

mod common;
use common::pct;

fn pickup() -> (Vec<f64>, Vec<f64>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("hooks");
    let edit = root.join("edited");
    std::fs::create_dir_all(&edit).expect("mkdir");
    std::fs::write(edit.join("HOOK.yaml"), "events: [command:edited]\n").expect("write");
    std::fs::write(
        edit.join("handler.py"),
        "def handle(e, c):\n    return -1\n",
    )
    .expect("write");
    let service = common::Service::start(&root, tmp.path());
    let addr = service.addr.clone();
    wait_for(&addr, "command:edited", &serde_json::json!(-1));

    let mut new_dir = Vec::new();
    for i in 0..50 {
        let d = root.join(format!("new{i:02}"));
        let staging = tmp.path().join(format!("staging{i:02}"));
        std::fs::create_dir_all(&staging).expect("mkdir");
        std::fs::write(
            staging.join("HOOK.yaml"),
            format!("events: [command:new{i}]\n"),
        )
        .expect("write");
        std::fs::write(
            staging.join("handler.py"),
            format!("def handle(e, c):\n    return {i}\n"),
        )
        .expect("write");
        // The directory appears complete (as `mv` of a prepared directory does).
        let t0 = Instant::now();
        std::fs::rename(&staging, &d).expect("rename");
        let _ = wait_for(&addr, &format!("command:new{i}"), &serde_json::json!(i));
        new_dir.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let mut edited = Vec::new();
    for i in 0..50 {
        let t0 = Instant::now();
        write_atomic(
            &edit.join("handler.py"),
            &format!("def handle(e, c):\n    return {i}\n"),
        );
        let _ = wait_for(&addr, "command:edited", &serde_json::json!(i));
        edited.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    drop(service);
    (new_dir, edited)
}

fn rescan_cost() -> (f64, f64) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("hooks");
    for i in 0..1000 {
        let d = root.join(format!("hook{i:04}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("HOOK.yaml"),
            format!("name: hook{i:04}\nevents: [\"command:*\", agent:start]\n"),
        )
        .expect("write");
        std::fs::write(d.join("handler.sh"), "#!/bin/sh\ncat >/dev/null\n").expect("write");
    }
    let mut discover = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        let d = hermes_hooks::bench_support::discover(std::slice::from_ref(&root));
        assert_eq!(d.hooks.len(), 1000);
        discover.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config = hermes_hooks::HostConfig {
        roots: vec![root],
        hermes_home: tmp.path().to_path_buf(),
        python: "python3".into(),
        runtime_dir: tmp.path().join("cache"),
        trust: Default::default(),
        gateway_hooks_only: false,
        worker_priority: Default::default(),
        sandbox_default: Default::default(),
        config_hooks: true,
    };
    let (host, report) = rt.block_on(hermes_hooks::Host::start(config));
    assert_eq!(report.loaded.len(), 1000, "{:?}", report.skipped.first());
    let mut reload = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        let r = rt.block_on(host.reload());
        assert!(r.started.is_empty());
        reload.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    rt.block_on(host.shutdown(Duration::from_secs(1)));
    (pct(&mut discover, 0.5), pct(&mut reload, 0.5))
}

fn main() {
    let (mut new_dir, mut edited) = pickup();
    let (discover, reload) = rescan_cost();
    println!("pick-up latency, write -> first event answered by the new version (50 each, ms)");
    println!("{:<28} {:>8} {:>8}", "", "p50", "p99");
    println!(
        "{:<28} {:>8.1} {:>8.1}",
        "new hook directory",
        pct(&mut new_dir, 0.5),
        pct(&mut new_dir, 0.99)
    );
    println!(
        "{:<28} {:>8.1} {:>8.1}",
        "edited handler.py",
        pct(&mut edited, 0.5),
        pct(&mut edited, 0.99)
    );
    println!();
    println!(
        "rescan with 1,000 hook directories (median of 10, ms): discover {discover:.1}, reload with nothing changed {reload:.1}"
    );
}
