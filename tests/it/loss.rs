//! The loss budget (issue 25): what a fault costs. A SIGKILLed Python worker loses at most the
//! call in flight, also when its files were edited meanwhile: the queued events wait for the new
//! version and run there, instead of failing because the old version may not restart.

use std::path::Path;
use std::time::Duration;

use hermes_hooks::Host;
use serde_json::json;

use crate::util::{Hooks, config, poll_async, read_jsonl, signal};

const T: Duration = Duration::from_secs(60);

/// A Python hook that records `{n, tag}` per event into out/<name>.jsonl, writes its pid at
/// import, and holds an event asking `hold` (in version v1 only) until it is killed.
fn held_python(hooks: &Hooks, name: &str, tag: &str) -> String {
    let out = hooks.out();
    format!(
        r#"import json, os, time
TAG = {tag:?}
with open({pid:?}, "w") as f:
    f.write(str(os.getpid()))

def handle(event, context):
    if context.get("hold") and TAG == "v1":
        open({held:?}, "w").close()
        time.sleep(120)
    with open({rec:?}, "a") as f:
        f.write(json.dumps({{"n": context.get("n"), "tag": TAG}}) + "\n")
    return TAG
"#,
        pid = out.join(format!("{name}.pid")).display().to_string(),
        held = out.join(format!("{name}.held")).display().to_string(),
        rec = out.join(format!("{name}.jsonl")).display().to_string(),
    )
}

fn write_atomic(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_an_edit_waits_hands_its_queue_to_the_new_version() {
    let hooks = Hooks::new();
    let name = "edited";
    let dir = hooks.add(
        name,
        &[
            (
                "HOOK.yaml",
                &format!("name: {name}\nevents: [\"job:*\"]\ntimeout: 120\n"),
            ),
            ("handler.py", &held_python(&hooks, name, "v1")),
        ],
    );
    // No file watcher in an in-process host: the hand-over must not wait for one.
    let (host, report) = Host::start(config(&hooks)).await;
    assert_eq!(report.started, vec![name.to_string()], "{report:?}");

    host.emit("job:run", json!({"n": 0, "hold": true})).unwrap();
    let held = hooks.out().join(format!("{name}.held"));
    poll_async(T, "the first event to be held by v1", || {
        held.exists().then_some(())
    })
    .await;
    let pid: u32 = std::fs::read_to_string(hooks.out().join(format!("{name}.pid")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let queued = 40u64;
    for n in 1..=queued {
        host.emit("job:run", json!({"n": n})).unwrap();
    }
    // A valid new version lands on disk; then the old version's worker dies.
    write_atomic(&dir.join("handler.py"), &held_python(&hooks, name, "v2"));
    signal(pid, libc::SIGKILL);

    let tally = poll_async(T, "every event settled", || {
        let t = *host.accounts().get(name)?;
        (t.accepted == queued + 1 && t.ok + t.failed == t.accepted).then_some(t)
    })
    .await;
    let last_error = host.hook(name).and_then(|h| h.last_error);
    let recs = read_jsonl(&hooks.out().join(format!("{name}.jsonl")));
    host.shutdown(T).await;
    assert_eq!(
        tally.failed, 1,
        "the kill costs the event in flight only, not the queued ones: {tally:?}, last error \
         {last_error:?}"
    );
    assert_eq!(tally.ok, queued, "{tally:?}");
    let ran: Vec<(u64, String)> = recs
        .iter()
        .map(|r| {
            (
                r["n"].as_u64().unwrap_or(0),
                r["tag"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let want: Vec<(u64, String)> = (1..=queued).map(|n| (n, "v2".to_string())).collect();
    assert_eq!(
        ran, want,
        "the queued events ran once each, in order, on the new version"
    );
}

/// An executable that records `{n, tag}` per event and holds the event asking `hold` until the
/// gate file exists.
fn held_exec(hooks: &Hooks, name: &str, tag: &str) -> String {
    let out = hooks.out();
    format!(
        r#"#!/bin/sh
ctx=$(cat)
case "$ctx" in
  *'"hold":true'*) : > {held}; while [ ! -e {gate} ]; do sleep 0.01; done ;;
esac
n=$(printf '%s' "$ctx" | sed -n 's/.*"n":\([0-9]*\).*/\1/p')
printf '{{"n": %s, "tag": "{tag}"}}\n' "$n" >> {rec}
echo '"{tag}"'
"#,
        held = out.join(format!("{name}.held")).display(),
        gate = out.join(format!("{name}.gate")).display(),
        rec = out.join(format!("{name}.jsonl")).display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executable_edited_while_events_wait_runs_them_on_the_new_version() {
    let hooks = Hooks::new();
    let name = "edited_exec";
    let dir = hooks.exec(name, "[\"job:*\"]", &held_exec(&hooks, name, "v1"));
    let (host, report) = Host::start(config(&hooks)).await;
    assert_eq!(report.started, vec![name.to_string()], "{report:?}");

    host.emit("job:run", json!({"n": 0, "hold": true})).unwrap();
    let held = hooks.out().join(format!("{name}.held"));
    poll_async(T, "the first event to be held by v1", || {
        held.exists().then_some(())
    })
    .await;
    let queued = 20u64;
    for n in 1..=queued {
        host.emit("job:run", json!({"n": n})).unwrap();
    }
    // A valid new version lands on disk while v1 still runs the first event.
    let handler = dir.join("handler");
    write_atomic(&handler, &held_exec(&hooks, name, "v2"));
    crate::util::set_mode(&handler, 0o755);
    std::fs::write(hooks.out().join(format!("{name}.gate")), "").unwrap();

    let tally = poll_async(T, "every event settled", || {
        let t = *host.accounts().get(name)?;
        (t.accepted == queued + 1 && t.ok + t.failed == t.accepted).then_some(t)
    })
    .await;
    let last_error = host.hook(name).and_then(|h| h.last_error);
    let recs = read_jsonl(&hooks.out().join(format!("{name}.jsonl")));
    host.shutdown(T).await;
    assert_eq!(
        tally.failed, 0,
        "an edit loses nothing: {tally:?}, last error {last_error:?}"
    );
    let ran: Vec<(u64, String)> = recs
        .iter()
        .map(|r| {
            (
                r["n"].as_u64().unwrap_or(0),
                r["tag"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut want = vec![(0, "v1".to_string())];
    want.extend((1..=queued).map(|n| (n, "v2".to_string())));
    assert_eq!(
        ran, want,
        "the held event finished on v1, the queued ones ran once each, in order, on v2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_broken_edit_the_waiting_events_fail_together_after_the_bound() {
    let hooks = Hooks::new();
    let name = "broken_edit";
    let dir = hooks.add(
        name,
        &[
            (
                "HOOK.yaml",
                &format!("name: {name}\nevents: [\"job:*\"]\ntimeout: 120\n"),
            ),
            ("handler.py", &held_python(&hooks, name, "v1")),
        ],
    );
    let (host, _) = Host::start(config(&hooks)).await;
    host.emit("job:run", json!({"n": 0, "hold": true})).unwrap();
    let held = hooks.out().join(format!("{name}.held"));
    poll_async(T, "the first event to be held by v1", || {
        held.exists().then_some(())
    })
    .await;
    let pid: u32 = std::fs::read_to_string(hooks.out().join(format!("{name}.pid")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for n in 1..=10 {
        host.emit("job:run", json!({"n": n})).unwrap();
    }
    write_atomic(&dir.join("handler.py"), "def handle(event, context:\n");
    signal(pid, libc::SIGKILL);
    let killed = std::time::Instant::now();

    let tally = poll_async(T, "every event settled", || {
        let t = *host.accounts().get(name)?;
        (t.ok + t.failed == 11).then_some(t)
    })
    .await;
    let waited = killed.elapsed();
    let info = host.hook(name).unwrap();
    host.shutdown(T).await;
    assert_eq!(tally.failed, 11, "nothing loadable followed: {tally:?}");
    assert!(
        // The hand-over's bound (HANDOVER_WAIT) is 10 s.
        waited >= Duration::from_secs(10),
        "the waiting events failed only after the bound: {waited:?}"
    );
    let last = info.last_error.map(|e| e.message).unwrap_or_default();
    assert!(
        last.contains("changed since this version") && last.contains("no new version loaded"),
        "{last}"
    );
}
