//! Issue 12: `concurrency: N` for executable hooks (N calls at once; 1 keeps the order).

use std::time::Duration;

use hermes_hooks::Host;
use serde_json::json;

use crate::util::{Hooks, config, poll_async, set_mode};

const T: Duration = Duration::from_secs(20);

/// An executable hook that logs `n start_ns end_ns` per event, spending `secs` in between.
fn timed_exec(hooks: &Hooks, concurrency: Option<u32>, secs: &str) -> std::path::PathBuf {
    let out = hooks.out().join("spans.txt");
    let yaml = match concurrency {
        Some(n) => format!("events: ['command:*']\nconcurrency: {n}\n"),
        None => "events: ['command:*']\n".to_string(),
    };
    let script = format!(
        "#!/bin/sh\nn=$(sed 's/.*\"n\": *\\([0-9]*\\).*/\\1/')\nstart=$(date +%s%N)\nsleep {secs}\nend=$(date +%s%N)\necho \"$n $start $end\" >> {out:?}\n",
        out = out.display().to_string()
    );
    let dir = hooks.add("spans", &[("HOOK.yaml", &yaml), ("handler", &script)]);
    set_mode(&dir.join("handler"), 0o755);
    out
}

async fn spans(host: &Host, out: &std::path::Path, n: u64) -> Vec<(u64, u128, u128)> {
    for i in 0..n {
        assert_eq!(host.emit("command:x", json!({"n": i})).unwrap(), 1);
    }
    poll_async(T, "every event to finish", || {
        let info = host.hook("spans").unwrap();
        (info.counters.ok + info.counters.failed == n).then_some(())
    })
    .await;
    assert_eq!(host.hook("spans").unwrap().counters.failed, 0);
    crate::util::read_spans(out)
}

/// Most spans running at one instant.
fn max_overlap(spans: &[(u64, u128, u128)]) -> usize {
    spans
        .iter()
        .map(|&(_, s, _)| spans.iter().filter(|&&(_, a, b)| a <= s && s < b).count())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn concurrency_n_runs_n_calls_at_once() {
    let hooks = Hooks::new();
    let out = timed_exec(&hooks, Some(4), "0.4");
    let (host, report) = Host::start(config(&hooks)).await;
    assert_eq!(report.loaded, vec!["spans".to_string()], "{report:?}");
    let spans = spans(&host, &out, 8).await;
    assert_eq!(spans.len(), 8);
    assert_eq!(max_overlap(&spans), 4, "4 at once, never more: {spans:?}");
    assert_eq!(host.hook("spans").unwrap().concurrency, 4);
    host.shutdown(T).await;
}

#[tokio::test]
async fn concurrency_one_keeps_the_order() {
    let hooks = Hooks::new();
    let out = timed_exec(&hooks, None, "0.01");
    let (host, _) = Host::start(config(&hooks)).await;
    let spans = spans(&host, &out, 12).await;
    let order: Vec<u64> = spans.iter().map(|s| s.0).collect();
    assert_eq!(order, (0..12).collect::<Vec<u64>>(), "in emit order");
    assert_eq!(max_overlap(&spans), 1, "one at a time: {spans:?}");
    host.shutdown(T).await;
}

#[tokio::test]
async fn concurrency_out_of_range_is_refused_and_on_python_it_is_a_fleet_only_note() {
    let hooks = Hooks::new();
    hooks.add(
        "py",
        &[
            ("HOOK.yaml", "events: [command:x]\nconcurrency: 4\n"),
            ("handler.py", "def handle(e, c):\n    return 1\n"),
        ],
    );
    hooks.add(
        "too-many",
        &[
            ("HOOK.yaml", "events: [command:x]\nconcurrency: 65\n"),
            ("handler.sh", "#!/bin/sh\n"),
        ],
    );
    let (host, report) = Host::start(config(&hooks)).await;
    let reason = |name: &str| {
        report
            .skipped
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.reason.clone())
            .unwrap_or_else(|| panic!("{name} was refused: {report:?}"))
    };
    // A Python hook takes its events one at a time locally; `concurrency:` is what it may have
    // in flight across a fleet (issue 14), so it loads, with a note that says so.
    let py = host.snapshot();
    let py = py.get("py").expect("the python hook loads");
    assert!(
        py.spec
            .manifest
            .notes
            .iter()
            .any(|n| n.contains("applies in fleet mode only")),
        "{:?}",
        py.spec.manifest.notes
    );
    assert!(
        reason("too-many").contains("65 is out of range 1..=64"),
        "{}",
        reason("too-many")
    );
    host.shutdown(T).await;
}
