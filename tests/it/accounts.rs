//! Counters, logs and shutdown accounts across reloads: `restarts` never goes backwards, overflow
//! log lines keep coming after a reload, and shutdown waits for and counts the calls of removed
//! and superseded versions too.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, poll};

const T: Duration = Duration::from_secs(20);

/// A Python handler that writes its pid to `pidfile`, then blocks until `release` exists (or
/// crashes its worker for `test:crash`). `tag` makes versions differ.
fn blocker(pidfile: &Path, release: &Path, tag: &str) -> String {
    format!(
        "import os, time\n# {tag}\ndef handle(event, context):\n    if event == 'test:crash':\n        os._exit(3)\n    if event == 'test:quick':\n        return {tag:?}\n    with open({pid:?}, 'w') as f:\n        f.write(str(os.getpid()))\n    while not os.path.exists({rel:?}):\n        time.sleep(0.01)\n",
        pid = pidfile.display().to_string(),
        rel = release.display().to_string(),
    )
}

fn hook_info(serve: &Serve, name: &str) -> Value {
    serve.get(&format!("/v1/hooks/{name}")).1
}

#[test]
fn restarts_never_go_backwards_across_a_reload() {
    let hooks = Hooks::new();
    let (pid, rel) = (hooks.out().join("pid"), hooks.out().join("release"));
    let dir = hooks.python("crashy", "[\"test:*\"]", &blocker(&pid, &rel, "v1"));
    let serve = Serve::start(&hooks, &["--no-watch"]);
    let (s, body) = serve.post("/v1/collect", &json!({"event": "test:crash"}));
    assert_eq!(s, 200, "{body}");
    // The worker is restarted (and counted) when the next event needs it.
    poll(T, "the crash to be counted as a restart", || {
        serve.post("/v1/collect", &json!({"event": "test:quick"}));
        (hook_info(&serve, "crashy")["counters"]["restarts"].as_u64()? >= 1).then_some(())
    });
    let before = hook_info(&serve, "crashy")["counters"]["restarts"]
        .as_u64()
        .unwrap();
    std::fs::write(dir.join("handler.py"), blocker(&pid, &rel, "v2")).unwrap();
    let (s, report) = serve.post("/v1/reload", &json!({}));
    assert_eq!(s, 200, "{report}");
    poll(T, "the new version to answer", || {
        let (_, b) = serve.post("/v1/collect", &json!({"event": "test:quick"}));
        (b["results"][0]["result"] == "v2").then_some(())
    });
    let after = hook_info(&serve, "crashy")["counters"]["restarts"]
        .as_u64()
        .unwrap();
    assert!(
        after >= before,
        "restarts went backwards across the reload: {before} -> {after}"
    );
    serve.post("/v1/collect", &json!({"event": "test:crash"}));
    poll(T, "the new version's crash to add to the count", || {
        serve.post("/v1/collect", &json!({"event": "test:quick"}));
        (hook_info(&serve, "crashy")["counters"]["restarts"].as_u64()? > after).then_some(())
    });
}

#[test]
fn overflow_log_lines_keep_coming_after_a_reload() {
    let hooks = Hooks::new();
    let (pid, rel) = (hooks.out().join("pid"), hooks.out().join("release"));
    let yaml = "name: jam\nevents: [\"test:*\"]\ntimeout: 60\nqueue: {capacity: 1, overflow: drop_newest}\n";
    let dir = hooks.add(
        "jam",
        &[
            ("HOOK.yaml", yaml),
            ("handler.py", &blocker(&pid, &rel, "v1")),
        ],
    );
    let serve = Serve::start(&hooks, &["--no-watch"]);
    let drops = |serve: &Serve| serve.log().matches("event(s) dropped").count();
    let emit = |serve: &Serve| {
        let (s, _) = serve.post("/v1/events", &json!({"event": "test:block"}));
        assert_eq!(s, 202);
    };
    emit(&serve);
    poll(T, "the first call to block", || pid.exists().then_some(()));
    // The rate limit measures from the last line: make it late on this version's clock.
    let late = Instant::now() + Duration::from_millis(1500);
    poll(T, "1.5 s to pass", || {
        (Instant::now() >= late).then_some(())
    });
    emit(&serve);
    emit(&serve);
    poll(T, "the first overflow line", || {
        (drops(&serve) >= 1).then_some(())
    });
    let window = Instant::now() + Duration::from_millis(1100);
    poll(T, "the rate-limit window to pass", || {
        (Instant::now() >= window).then_some(())
    });
    // A new version (pending behind the blocked call) takes over the queue and its counters.
    std::fs::write(dir.join("handler.py"), blocker(&pid, &rel, "v2")).unwrap();
    let (s, report) = serve.post("/v1/reload", &json!({}));
    assert_eq!(s, 200, "{report}");
    emit(&serve);
    let t0 = Instant::now();
    poll(
        Duration::from_secs(5),
        "an overflow line after the reload",
        || (drops(&serve) >= 2).then_some(()),
    );
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "the overflow after the reload was logged only after {:?}",
        t0.elapsed()
    );
    std::fs::write(&rel, "").unwrap();
}

/// The service on `hooks` (no watcher, JSON notices, `--drain-timeout drain`) with three
/// `test:block` events posted (see [`blocker`]: the first blocks, two wait).
fn serve_three_blocks(hooks: &Hooks, drain: &str) -> Serve {
    let serve = Serve::start(
        hooks,
        &["--no-watch", "--output", "json", "--drain-timeout", drain],
    );
    for _ in 0..3 {
        let (s, _) = serve.post("/v1/events", &json!({"event": "test:block"}));
        assert_eq!(s, 202);
    }
    serve
}

#[test]
fn shutdown_waits_for_and_counts_a_removed_hooks_calls() {
    let hooks = Hooks::new();
    let (pid, rel) = (hooks.out().join("pid"), hooks.out().join("release"));
    let dir = hooks.python("goner", "[\"test:*\"]", &blocker(&pid, &rel, "v1"));
    hooks.recorder("stayer", "[\"test:*\"]", "None");
    let mut serve = serve_three_blocks(&hooks, "0.5");
    poll(T, "the first call to block", || pid.exists().then_some(()));
    let worker: i32 = poll(T, "the worker pid", || {
        std::fs::read_to_string(&pid).ok()?.trim().parse().ok()
    });
    std::fs::remove_dir_all(&dir).unwrap();
    serve.reload_lists("stopped", "goner");
    assert_eq!(serve.terminate(), Some(0));
    let stop: Value = serve.notice("host_stop");
    assert_eq!(
        stop["undelivered_by_hook"]["goner"], 3,
        "the removed hook's blocked call and its two queued events are undelivered: {stop}"
    );
    assert_eq!(
        stop["accounts"]["goner"],
        json!({"accepted": 3, "ok": 0, "failed": 0, "dropped": 0, "undelivered": 3}),
        "{stop}"
    );
    assert_eq!(
        stop["accounts"]["stayer"],
        json!({"accepted": 3, "ok": 3, "failed": 0, "dropped": 0, "undelivered": 0}),
        "{stop}"
    );
    let t = &stop["totals"];
    assert_eq!(
        t["accepted"].as_u64(),
        Some(
            t["ok"].as_u64().unwrap()
                + t["failed"].as_u64().unwrap()
                + t["dropped"].as_u64().unwrap()
                + t["undelivered"].as_u64().unwrap()
        ),
        "{stop}"
    );
    poll(T, "the removed hook's worker to be gone", || {
        crate::util::is_dead(worker).then_some(())
    });
}

#[test]
fn shutdown_waits_for_and_counts_a_superseded_versions_call() {
    let hooks = Hooks::new();
    let (pid, rel) = (hooks.out().join("pid"), hooks.out().join("release"));
    let dir = hooks.python("busy", "[\"test:*\"]", &blocker(&pid, &rel, "v1"));
    let mut serve = serve_three_blocks(&hooks, "0.5");
    let worker: i32 = poll(T, "the first call to block", || {
        std::fs::read_to_string(&pid).ok()?.trim().parse().ok()
    });
    // A new version takes over the queue; the old one is still in its call.
    std::fs::write(dir.join("handler.py"), blocker(&pid, &rel, "v2")).unwrap();
    let (s, report) = serve.post("/v1/reload", &json!({}));
    assert_eq!(s, 200, "{report}");
    assert_eq!(hook_info(&serve, "busy")["status"], "pending");
    assert_eq!(serve.terminate(), Some(0));
    let stop: Value = serve.notice("host_stop");
    assert_eq!(
        stop["accounts"]["busy"],
        json!({"accepted": 3, "ok": 0, "failed": 0, "dropped": 0, "undelivered": 3}),
        "the old version's running call and the two queued events: {stop}"
    );
    poll(T, "the old version's worker to be gone", || {
        crate::util::is_dead(worker).then_some(())
    });
}

#[test]
fn shutdown_lets_a_removed_hook_finish_its_queue_within_the_drain() {
    let hooks = Hooks::new();
    let (pid, rel) = (hooks.out().join("pid"), hooks.out().join("release"));
    let dir = hooks.python("leaving", "[\"test:*\"]", &blocker(&pid, &rel, "v1"));
    let mut serve = serve_three_blocks(&hooks, "15");
    poll(T, "the first call to block", || pid.exists().then_some(()));
    std::fs::remove_dir_all(&dir).unwrap();
    let (s, report) = serve.post("/v1/reload", &json!({}));
    assert_eq!(s, 200, "{report}");
    crate::util::signal(serve.child.id(), libc::SIGTERM);
    // The service is draining: the removed hook's calls may finish now.
    poll(T, "the drain to begin", || {
        serve.log().contains("shutting down").then_some(())
    });
    std::fs::write(&rel, "").unwrap();
    assert_eq!(serve.terminate(), Some(0));
    let stop: Value = serve.notice("host_stop");
    assert_eq!(
        stop["accounts"]["leaving"],
        json!({"accepted": 3, "ok": 3, "failed": 0, "dropped": 0, "undelivered": 0}),
        "shutdown waited for the removed hook's queue: {stop}"
    );
}
