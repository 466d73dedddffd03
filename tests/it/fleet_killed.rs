//! Issue 48, found after its rows: an ordered hook's holder that vanishes (SIGKILLed, or
//! starved past its lease) leaves its pending events to the next holder past their allowed
//! deliveries by the broker's count. Only the event it may have started on its last allowed
//! delivery is dead-lettered unrun ("killed?"); the others run. Before, every event it left
//! pending was dead-lettered: with `retries: 0` and a bundle of 40, all 40 (100 of 100 in a
//! probe), 36 of which had never started anywhere. On nats-server 2.9 and 2.10+.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fleet::{
    FAST, NatsServer, dead_cmd, edge, edge_serving, nats_servers, post_batch, recording_hook,
    records, wait_for_all, wait_for_fleet, wait_records, worker_with,
};
use crate::util::{Hooks, Serve, bin, poll, read_jsonl};

#[testenv::needs(nats)]
#[test]
fn a_killed_holder_leaves_dead_letters_only_where_it_may_have_started() {
    for bin in nats_servers() {
        killed_on(bin);
    }
}

fn killed_on(bin: PathBuf) {
    let what = bin.display().to_string();
    let nats = NatsServer::start_bin(bin, &[], "");
    let hooks = Hooks::new();
    recording_hook(&hooks, "kq", r#"["agent:step"]"#, "retries: 0\n");
    let mut workers = [
        Some(worker_with(&hooks, &nats, "wa", FAST)),
        Some(worker_with(&hooks, &nats, "wb", FAST)),
    ];
    let edge = edge_serving(&hooks, &nats.url(), &[], &["kq"], &["wa", "wb"]);
    // One request: one bundle of 40 events, each 0.1 s in its handler.
    let n = 40u64;
    let (status, v) = post_batch(&edge, 0..n, json!({"pause": 0.1}));
    assert_eq!(status, 202, "{v}");
    let first = wait_records(&hooks, "kq", 4, 60);
    let holder = first[0]["w"].as_str().unwrap_or_default().to_string();
    // Killed in the middle of event 4 (its handler wrote that it started).
    poll(Duration::from_secs(30), "event 4 started", || {
        read_jsonl(&hooks.out().join("kq.paused"))
            .iter()
            .any(|r| r["n"] == 4)
            .then_some(())
    });
    let victim = usize::from(holder != "wa");
    if let Some(mut w) = workers[victim].take() {
        w.sigkill();
    }
    // What the holder finished before it died (in stream order from 0).
    let ran_there: HashSet<u64> = records(&hooks, "kq")
        .iter()
        .filter(|r| r["w"] == holder.as_str())
        .filter_map(|r| r["n"].as_u64())
        .collect();
    let k = ran_there.len() as u64;
    assert_eq!(
        ran_there,
        (0..k).collect::<HashSet<_>>(),
        "{what}: in order"
    );
    let (ran, dead) = ran_elsewhere_or_dead(&nats, &hooks, "kq", &holder, &ran_there, n);
    let dead_ns: Vec<u64> = dead
        .iter()
        .filter_map(|d| d["envelope"]["context"]["n"].as_u64())
        .collect();
    eprintln!(
        "{what}: the holder finished {k} before its SIGKILL; dead-lettered {dead_ns:?}; {} run by the other",
        ran.len()
    );
    // The event it ran when it died, and only it.
    assert_eq!(k, 4, "{what}: killed during event 4");
    assert_eq!(dead_ns, [4], "{what}: one dead letter, the event it ran");
    let why = dead[0]["error"].as_str().unwrap_or_default();
    assert!(why.contains("killed?"), "{what}: {why}");
    let mut again: Vec<u64> = ran.iter().filter_map(|r| r["n"].as_u64()).collect();
    again.sort_unstable();
    let rest: Vec<u64> = (0..n).filter(|i| !dead_ns.contains(i)).collect();
    let mut after: Vec<u64> = again.iter().copied().filter(|i| *i > k).collect();
    after.dedup();
    assert_eq!(
        after,
        rest.iter().copied().filter(|i| *i > k).collect::<Vec<_>>(),
        "{what}: every event it had not started ran on the other worker, once"
    );
    for r in &ran {
        let m = r["n"].as_u64().unwrap_or(u64::MAX);
        if ran_there.contains(&m) {
            assert!(
                r["d"].as_i64().unwrap_or(0) >= 2,
                "{what}: an event the dead holder ran, run again, is shown as a repeat: {r}"
            );
        }
    }
}

/// Waits until each of events `0..n` of `hook` ran before (`ran_before`), ran on a worker other
/// than `holder`, or is dead-lettered; returns those other runs and the dead letters.
fn ran_elsewhere_or_dead(
    nats: &NatsServer,
    hooks: &Hooks,
    hook: &str,
    holder: &str,
    ran_before: &HashSet<u64>,
    n: u64,
) -> (Vec<Value>, Vec<Value>) {
    poll(Duration::from_secs(90), "every event run or dead", || {
        let ran: Vec<Value> = records(hooks, hook)
            .into_iter()
            .filter(|r| r["w"] != holder)
            .collect();
        let (_, out) = dead_cmd(nats, &["list", "--json", "--hook", hook]);
        let dead: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        let mut have: HashSet<u64> = ran_before.clone();
        have.extend(ran.iter().filter_map(|r| r["n"].as_u64()));
        have.extend(
            dead.iter()
                .filter_map(|d| d["envelope"]["context"]["n"].as_u64()),
        );
        (have.len() as u64 >= n).then_some((ran, dead))
    })
}

/// The marks' bucket refused: the worker's user may not make it nor write to it. The holder
/// says once that it cannot mark what it starts and runs every event of a `retries: 0` ordered
/// hook at its pace: the bucket is not asked again for each start (that cost each a 2 s wait).
#[testenv::needs(nats)]
#[test]
fn a_holder_whose_marks_are_refused_says_so_once_and_runs_every_event() {
    let Some(nats) = NatsServer::start_with(
        &[],
        r#"authorization {
  users = [
    {user: edge, password: edge-pw}
    {user: worker, password: worker-pw, permissions: {publish: {deny: ["$JS.API.STREAM.CREATE.KV_HERMES_ATTEMPTS", "$KV.HERMES_ATTEMPTS.>"]}}}
  ]
}
"#,
    ) else {
        return;
    };
    let url = |user: &str| format!("nats://{user}:{user}-pw@127.0.0.1:{}", nats.port);
    let hooks = Hooks::new();
    recording_hook(&hooks, "kr", r#"["agent:step"]"#, "retries: 0\n");
    let mut cmd = Command::new(bin());
    cmd.arg("worker")
        .args(["--fleet", &url("worker")])
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0", "--worker-id", "wa"])
        .args(FAST)
        .env("TEST_WORKER", "wa");
    let w = Serve::spawn(cmd, &hooks);
    let edge = edge(&hooks, &url("edge"), &["--fleet-bundle", "1"]);
    wait_for_fleet(&edge, "kr", &["wa"]);
    let began = Instant::now();
    let (status, v) = post_batch(&edge, 0..100, json!({}));
    assert_eq!(status, 202, "{v}");
    wait_for_all(&hooks, "kr", 100, Duration::from_secs(60));
    let took = began.elapsed();
    let said = "cannot say which event starts on its last allowed delivery";
    assert_eq!(w.log().matches(said).count(), 1, "said once: {}", w.log());
    assert!(
        took < Duration::from_secs(20),
        "100 events, one per message, took {took:?}"
    );
}

/// Issue 56: the lease and the marks of what a holder may have started live in file-stored
/// buckets, so a broker restart keeps both. The broker restarted while the holder runs an event
/// on its last allowed delivery (`retries: 0`): the holder keeps its lease (no other worker
/// takes it, the holder does not lose it); then the holder is SIGKILLed in that event, and the
/// next holder finds its mark: the event is dead-lettered "killed?", not run again as if never
/// started. With the buckets in the broker's memory (before), the restart emptied them: the
/// lease moved at once (two holders while the old one still ran its event) and the mark was
/// gone, so the killed event ran again on the other worker.
#[testenv::needs(nats)]
#[test]
fn a_broker_restart_keeps_the_lease_and_the_marks_of_what_a_holder_started() {
    for bin in nats_servers() {
        restart_keeps_on(bin);
    }
}

fn restart_keeps_on(bin: PathBuf) {
    let what = bin.display().to_string();
    let mut nats = NatsServer::start_bin(bin, &[], "");
    let hooks = Hooks::new();
    recording_hook(&hooks, "kb", r#"["agent:step"]"#, "retries: 0\n");
    let opts = [
        "--ack-wait",
        "8",
        "--retry-backoff-ms",
        "50",
        "--status-interval-ms",
        "100",
    ];
    let mut workers = [
        Some(worker_with(&hooks, &nats, "wa", &opts)),
        Some(worker_with(&hooks, &nats, "wb", &opts)),
    ];
    let edge = edge_serving(&hooks, &nats.url(), &[], &["kb"], &["wa", "wb"]);
    let n = 8u64;
    let (status, v) = post_batch(&edge, 0..n, json!({"pause": 5.0}));
    assert_eq!(status, 202, "{v}");
    let paused = hooks.out().join("kb.paused");
    let first = poll(Duration::from_secs(60), "event 0 started", || {
        read_jsonl(&paused).into_iter().find(|r| r["n"] == 0)
    });
    let holder = first["w"].as_str().unwrap_or_default().to_string();
    let victim = usize::from(holder != "wa");
    // Restarted cleanly (its consumer state on disk: the delivery counts hold) and quickly,
    // well within the lease's time to live (7.2 s): the holder's next renewal reaches it.
    nats.stop();
    nats.restart();
    let back = crate::util::epoch_secs();
    // The next event started after the restart (up to 5 s later: the holder renewed its lease
    // meanwhile, every 1.8 s), and the holder killed in it.
    let started = poll(
        Duration::from_secs(30),
        "an event started after the restart",
        || {
            read_jsonl(&paused)
                .into_iter()
                .find(|r| r["t"].as_f64().is_some_and(|t| t > back))
        },
    );
    let k = started["n"].as_u64().unwrap_or(u64::MAX);
    let log = workers[victim]
        .as_ref()
        .map(|w| w.log())
        .unwrap_or_default();
    if let Some(mut w) = workers[victim].take() {
        w.sigkill();
    }
    assert_eq!(
        started["w"],
        holder.as_str(),
        "{what}: the holder went on after the restart: {started}"
    );
    let done: HashSet<u64> = records(&hooks, "kb")
        .iter()
        .filter_map(|r| r["n"].as_u64())
        .collect();
    assert!(
        !done.contains(&k),
        "{what}: killed in event {k}, before its end"
    );
    assert!(
        !log.contains("lease lost") && !log.contains("not renewed in time"),
        "{what}: the holder kept its lease through the restart: {log}"
    );
    let other = workers[1 - victim]
        .as_ref()
        .map(|w| w.log())
        .unwrap_or_default();
    let (ran, dead) = ran_elsewhere_or_dead(&nats, &hooks, "kb", &holder, &(0..k).collect(), n);
    let dead_ns: Vec<u64> = dead
        .iter()
        .filter_map(|d| d["envelope"]["context"]["n"].as_u64())
        .collect();
    let ran_ns: Vec<u64> = ran.iter().filter_map(|r| r["n"].as_u64()).collect();
    eprintln!("{what}: killed in event {k}; dead-lettered {dead_ns:?}; the other ran {ran_ns:?}");
    assert!(
        !other.contains("lease taken"),
        "{what}: the standby took the lease while the holder lived: {other}"
    );
    assert_eq!(
        dead_ns,
        [k],
        "{what}: the event it was killed in, dead-lettered"
    );
    let why = dead[0]["error"].as_str().unwrap_or_default();
    assert!(why.contains("killed?"), "{what}: {why}");
    assert!(
        !ran_ns.contains(&k),
        "{what}: the event the holder may have started ran again: {ran_ns:?}"
    );
}

/// The buckets a broker restart must keep are on its file storage, and a holder's marks live a
/// day (`attempts::KEEP`), also in a marks bucket made before they had a time to live (issue 56,
/// the suspected case "the attempts bucket has no time to live"): the keys of holders that died
/// (a worker id is new per process by default) stop piling up.
#[testenv::needs(nats)]
#[test]
fn the_lease_and_marks_buckets_are_on_file_and_marks_live_a_day() {
    let day_ns = 24 * 3600 * 1_000_000_000u64;
    for bin in nats_servers() {
        let what = bin.display().to_string();
        let nats = NatsServer::start_bin(bin, &[], "");
        let api = |what: &str, body: &str| {
            crate::fleet::js_api(&nats.url(), what, body, Duration::from_secs(10))
                .unwrap_or_else(|| panic!("no answer from $JS.API.{what}"))
        };
        // The marks bucket as an older build made it: a key-value stream with no max_age.
        let old = json!({
            "name": "KV_HERMES_ATTEMPTS", "subjects": ["$KV.HERMES_ATTEMPTS.>"],
            "max_msgs_per_subject": 1, "storage": "file", "allow_rollup_hdrs": true,
            "deny_delete": true, "allow_direct": true, "discard": "new", "num_replicas": 1,
        });
        let made = api("STREAM.CREATE.KV_HERMES_ATTEMPTS", &old.to_string());
        assert!(made.get("error").is_none(), "{what}: {made}");
        assert_eq!(made["config"]["max_age"], 0, "{what}: {made}");
        // `retries: 0`: every event's first delivery is its last allowed, so the holder
        // marks it in the bucket before it starts.
        let hooks = Hooks::new();
        recording_hook(&hooks, "marked", r#"["agent:step"]"#, "retries: 0\n");
        let _w = worker_with(&hooks, &nats, "wm", &[]);
        let edge = edge_serving(&hooks, &nats.url(), &[], &["marked"], &["wm"]);
        let (status, v) = post_batch(&edge, 0..3, json!({}));
        assert_eq!(status, 202, "{what}: {v}");
        wait_records(&hooks, "marked", 3, 30);
        let info = poll(
            Duration::from_secs(20),
            "the marks bucket's time to live",
            || {
                let info = api("STREAM.INFO.KV_HERMES_ATTEMPTS", "");
                (info["config"]["max_age"] == day_ns).then_some(info)
            },
        );
        assert_eq!(info["config"]["storage"], "file", "{what}: {info}");
        assert!(
            info["state"]["messages"].as_u64().unwrap_or(0) >= 1,
            "{what}: the holder wrote no mark: {info}"
        );
        let leases = api("STREAM.INFO.KV_HERMES_LEASES", "");
        assert_eq!(leases["config"]["storage"], "file", "{what}: {leases}");
        eprintln!(
            "{what}: marks bucket max_age {} s, {} key(s); leases on {}",
            day_ns / 1_000_000_000,
            info["state"]["messages"],
            leases["config"]["storage"]
        );
    }
}
