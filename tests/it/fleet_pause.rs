//! Issue 48 row 1: an ordered hook's lease holder frozen with SIGSTOP while it has events in
//! flight (its local queue, its Python worker's pipe, a bundle part-way), long enough for the
//! other worker to take the lease over and run, then continued. On d69d285 the old holder, on
//! waking, started hundreds of events the new holder had already run (two holders of one
//! ordered hook at once, every repeat with `delivered` = 1). Now a holder starts nothing and
//! acknowledges nothing past its lease's bound on the monotonic clock ([`StartGate`]), and a
//! Python worker stopped with it refuses, on waking, the calls in its pipe past that bound.
//! On nats-server 2.9 and 2.10+; the whole process tree frozen, and the worker alone (its
//! Python worker keeps running the calls it has, up to the bound).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::fleet::{
    NatsServer, assert_duplicates_are_redeliveries, edge_serving, first_ns, nats_servers,
    post_batch, recording_hook, records, wait_for_all, wait_records, worker,
};
use crate::util::{Hooks, child_pids, epoch_secs, poll, signal};

/// `pid` and every process below it.
pub(crate) fn tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        out.extend(child_pids(out[i]));
        i += 1;
    }
    out
}

#[testenv::needs(nats)]
#[test]
fn a_lease_holder_woken_from_sigstop_starts_nothing_the_new_holder_runs() {
    for bin in nats_servers() {
        for whole_tree in [true, false] {
            pause_on(bin.clone(), whole_tree, false);
        }
    }
}

/// Issue 56 row 8: the same with an ordered **executable** hook and the worker alone stopped.
/// Its start gate was looked at only when a job left the hook's queue, never again before the
/// process was forked: the woken holder started events the new holder had run or was running.
/// Now every handler kind looks at the gate at the last moment (the executable's on its
/// starter thread, just before the fork).
#[testenv::needs(nats)]
#[test]
fn a_woken_holder_of_an_executable_hook_forks_nothing_the_new_holder_runs() {
    for bin in nats_servers() {
        pause_on(bin, false, true);
    }
}

fn pause_on(bin: PathBuf, whole_tree: bool, exec: bool) {
    let what = format!(
        "{} ({}{})",
        bin.display(),
        if exec { "executable, " } else { "" },
        if whole_tree {
            "process tree"
        } else {
            "worker alone"
        }
    );
    let nats = NatsServer::start_bin(bin, &[], "");
    let hooks = Hooks::new();
    if exec {
        let dir = hooks.add(
            "frozen",
            &[
                (
                    "HOOK.yaml",
                    "name: frozen\nevents: [\"agent:step\"]\ntimeout: 60\n",
                ),
                ("handler", &crate::nemesis::exec_handler(&hooks, "frozen")),
            ],
        );
        crate::util::set_mode(&dir.join("handler"), 0o755);
    } else {
        recording_hook(&hooks, "frozen", r#"["agent:step"]"#, "");
    }
    // `--ack-wait 2`: the lease lives 2 s.
    let a = worker(&hooks, &nats, "wa");
    let b = worker(&hooks, &nats, "wb");
    let edge = edge_serving(&hooks, &nats.url(), &[], &["frozen"], &["wa", "wb"]);
    // A process per event: fewer for the executable.
    let n = if exec { 300u64 } else { 1500 };
    let (before, after) = if exec { (30, 60) } else { (100, 150) };
    for chunk in 0..3 {
        let (status, v) = post_batch(
            &edge,
            chunk * n / 3..(chunk + 1) * n / 3,
            json!({"pause": 0.004}),
        );
        assert_eq!(status, 202, "{v}");
    }
    let first = wait_records(&hooks, "frozen", before, 60);
    let holder = first[0]["w"].as_str().unwrap_or_default().to_string();
    let victim = if holder == "wa" { &a } else { &b };
    let pids = if whole_tree {
        tree(victim.child.id())
    } else {
        vec![victim.child.id()]
    };
    for p in &pids {
        signal(*p, libc::SIGSTOP);
    }
    let stopped = epoch_secs();
    // Frozen until the other worker took the lease over and ran a good part of what is left.
    let taken = poll(Duration::from_secs(30), "the standby to take over", || {
        let other: Vec<Value> = records(&hooks, "frozen")
            .into_iter()
            .filter(|r| r["w"] != holder.as_str())
            .collect();
        (other.len() >= after).then_some(other)
    });
    for p in &pids {
        signal(*p, libc::SIGCONT);
    }
    let woke = epoch_secs();
    let recs = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // A process per event for the executable: about 5 a second on a busy 2-core machine
        // (the suite's other fleet tests beside it), so the rest can take a minute.
        wait_for_all(&hooks, "frozen", n, Duration::from_secs(150))
    })) {
        Ok(r) => r,
        Err(e) => {
            for (w, s) in [("wa", &a), ("wb", &b)] {
                for l in s.log().lines().filter(|l| l.contains("fleet")) {
                    eprintln!("{w}: {l}");
                }
            }
            std::panic::resume_unwind(e)
        }
    };
    let took_over = taken
        .iter()
        .filter_map(|r| r["t"].as_f64())
        .fold(f64::MAX, f64::min);
    // When each handling was let start: the Python runner's look at the start gate
    // (`_fleet.admitted_ns`), else (an executable) the handler's first clock reading. Not the
    // Python handler's own clock: a process tree stopped between the runner's look and the
    // handler's first line (tens of microseconds) has the handler read the clock as it wakes,
    // for a call let start under the lease.
    let admitted = recs.iter().all(|r| r["adm"].is_u64());
    let start = |r: &Value| {
        if admitted {
            r["adm"].as_u64().map(|ns| ns as f64 / 1e9)
        } else {
            r["t"].as_f64()
        }
    };
    let taken_at = taken.iter().filter_map(&start).fold(f64::MAX, f64::min);
    let late: Vec<&Value> = recs
        .iter()
        .filter(|r| r["w"] == holder.as_str() && start(r).unwrap_or(0.0) >= taken_at)
        .collect();
    eprintln!(
        "{what}: frozen {:.1} s, the other worker took over {:.1} s after the stop; {} handlings, {} by the old holder after that (by {})",
        woke - stopped,
        took_over - stopped,
        recs.len(),
        late.len(),
        if admitted {
            "the runner's admissions"
        } else {
            "the handlers' clocks"
        }
    );
    assert!(
        late.is_empty(),
        "{what}: the old holder started {} events after the new holder took over (two holders at once), first {}",
        late.len(),
        late[0]
    );
    let firsts = first_ns(&recs);
    let mut sorted = firsts.clone();
    sorted.sort_unstable();
    assert_eq!(firsts, sorted, "{what}: first handlings in stream order");
    let repeats = assert_duplicates_are_redeliveries(&recs);
    eprintln!("{what}: {repeats} repeats, each a redelivery (delivered > 1)");
    let log = victim.log();
    assert!(
        log.contains("lease is lost or past its bound"),
        "{what}: the old holder says it stood down: {log}"
    );
}

/// Issue 56, found by the nemesis (seed 3128294535162591552 on 2.15: an unordered hook's event
/// neither run nor dead-lettered): a delivery a worker gives up unstarted (it was frozen past
/// the ack wait, or lost the broker, and leaves what its pulls had buffered to the broker) is
/// no attempt, yet the broker counts it. An unordered hook's consumer stopped delivering an
/// event after its allowed deliveries plus one, so an event whose deliveries were all given up
/// like that stayed in the stream for good: never run, never dead-lettered. Now the consumer
/// delivers without a limit and the worker decides: a delivery past the allowed ones is
/// dead-lettered with its reason, before it runs. An unordered hook (`concurrency: 2`,
/// `retries: 0`), its worker's process tree frozen past the ack wait three times while its
/// pulls hold events it has not started: every event runs or is dead-lettered.
#[testenv::needs(nats)]
#[test]
fn an_unordered_hooks_deliveries_given_up_unstarted_never_strand_an_event() {
    for bin in nats_servers() {
        stranded_on(bin);
    }
}

fn stranded_on(bin: PathBuf) {
    let what = bin.display().to_string();
    let nats = NatsServer::start_bin(bin, &[], "");
    let hooks = Hooks::new();
    recording_hook(
        &hooks,
        "un",
        r#"["agent:step"]"#,
        "concurrency: 2\nretries: 0\n",
    );
    let w = worker(&hooks, &nats, "wa");
    let edge = edge_serving(
        &hooks,
        &nats.url(),
        &["--fleet-bundle", "1"],
        &["un"],
        &["wa"],
    );
    let n = 30u64;
    let (status, v) = post_batch(&edge, 0..n, json!({"pause": 0.4}));
    assert_eq!(status, 202, "{v}");
    wait_records(&hooks, "un", 2, 60);
    for _ in 0..3 {
        // Frozen for longer than the ack wait (2 s): what the pulls hold comes back to the
        // broker, which counts a delivery for each.
        let pids = tree(w.child.id());
        for p in &pids {
            signal(*p, libc::SIGSTOP);
        }
        std::thread::sleep(Duration::from_millis(2600));
        for p in tree(w.child.id()).iter().chain(&pids) {
            signal(*p, libc::SIGCONT);
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    let (ran, dead) = poll(Duration::from_secs(60), "every event run or dead", || {
        let ran: std::collections::HashSet<u64> = records(&hooks, "un")
            .iter()
            .filter_map(|r| r["n"].as_u64())
            .collect();
        let (_, out) = crate::fleet::dead_cmd(&nats, &["list", "--json", "--hook", "un"]);
        let dead: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        let dead_ns: std::collections::HashSet<u64> = dead
            .iter()
            .filter_map(|d| d["envelope"]["context"]["n"].as_u64())
            .collect();
        ((0..n).all(|i| ran.contains(&i) || dead_ns.contains(&i))).then_some((ran, dead))
    });
    eprintln!(
        "{what}: {} of {n} ran, {} dead-lettered",
        ran.len(),
        dead.len()
    );
    for d in &dead {
        let why = d["error"].as_str().unwrap_or_default();
        assert!(!why.is_empty(), "{what}: a dead letter says why: {d}");
    }
}
