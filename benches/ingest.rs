//! HTTP ingest throughput of the service on this machine (load generator: this file, plain
//! threads with keep-alive connections over loopback; no external tool needed).
//!
//! `cargo bench --bench ingest`. Starts the release `hermes-hooks serve` on 127.0.0.1:0 with one
//! Python hook matching the events whose handler blocks (so what is measured is the ingest path:
//! HTTP, JSON, match, queue; not a Python worker competing for the 2 cores) and a queue large
//! enough that nothing is dropped in the run, then:
//! 1. single-event `POST /v1/events`, CONNS connections with keep-alive, for SECS seconds;
//! 2. `POST /v1/events/batch` with 1,000 events per request, one connection, for SECS seconds.
//!
//! Prints requests/s and events/s (each the median of 3 runs).

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Instant;

const SECS: f64 = 3.0;
const CONNS: usize = 2;

/// Sends `body` to `path` repeatedly for SECS seconds over one connection; returns requests.
fn hammer(addr: &str, path: &str, body: &[u8]) -> u64 {
    let mut sock = TcpStream::connect(addr).expect("connect");
    sock.set_nodelay(true).expect("nodelay");
    let mut reader = BufReader::new(sock.try_clone().expect("clone"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut req = head.into_bytes();
    req.extend_from_slice(body);
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed().as_secs_f64() < SECS {
        sock.write_all(&req).expect("write");
        let status = common::read_response(&mut reader);
        assert!(status.contains(" 202 "), "{status}");
        n += 1;
    }
    n
}

mod common;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hook = tmp.path().join("hooks/sink");
    std::fs::create_dir_all(&hook).expect("mkdir");
    std::fs::write(
        hook.join("handler.py"),
        "import time\ndef handle(e, c):\n    time.sleep(3600)\n",
    )
    .expect("write");
    std::fs::write(
        hook.join("HOOK.yaml"),
        "events: [agent:step]\ntimeout: 300\nqueue: {capacity: 1000000}\n",
    )
    .expect("write");
    let service = common::Service::start(&tmp.path().join("hooks"), tmp.path());
    let addr = service.addr.clone();

    let single = br#"{"event": "agent:step", "context": {"platform": "telegram", "user_id": "42", "session_id": "s", "iteration": 3, "tool_names": ["web"]}}"#;
    let mut singles = Vec::new();
    for _ in 0..3 {
        let handles: Vec<_> = (0..CONNS)
            .map(|_| {
                let addr = addr.clone();
                std::thread::spawn(move || hammer(&addr, "/v1/events", single))
            })
            .collect();
        let total: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
        singles.push(total as f64 / SECS);
    }

    let item = r#"{"event": "agent:step", "context": {"platform": "telegram", "user_id": "42", "session_id": "s", "iteration": 3, "tool_names": ["web"]}}"#;
    let batch = format!("{{\"events\": [{}]}}", vec![item; 1000].join(","));
    let mut batches = Vec::new();
    for _ in 0..3 {
        let n = hammer(&addr, "/v1/events/batch", batch.as_bytes());
        batches.push(n as f64 * 1000.0 / SECS);
    }
    drop(service);

    println!(
        "HTTP ingest over loopback, 1 matching hook (blocked handler, queue 1M), median of 3 runs of {SECS} s"
    );
    println!(
        "single-event POST /v1/events, {CONNS} keep-alive connections: {:>10.0} requests/s (= events/s)",
        median(singles.clone())
    );
    println!(
        "POST /v1/events/batch, 1,000 events per request, 1 connection: {:>10.0} events/s",
        median(batches.clone())
    );
    println!("raw: singles {singles:?}, batches {batches:?}");
}
