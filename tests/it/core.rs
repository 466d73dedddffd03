//! Discovery and dispatch through the library API, ported behaviour by behaviour from the
//! original host's test suite, plus the guarantees the original could not give.

use std::time::{Duration, Instant};

use hermes_hooks::{Host, SkipCode};
use serde_json::{Value, json};

use crate::util::{Hooks, config, poll_async, set_mode};

const T: Duration = Duration::from_secs(20);

async fn start(hooks: &Hooks) -> (Host, hermes_hooks::LoadReport) {
    Host::start(config(hooks)).await
}

fn skip_code(report: &hermes_hooks::LoadReport, name: &str) -> SkipCode {
    report
        .skipped
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} not in skipped: {:#?}", report.skipped))
        .code
}

fn skip_reason(report: &hermes_hooks::LoadReport, name: &str) -> String {
    report
        .skipped
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.reason.clone())
        .unwrap_or_default()
}

async fn collect(host: &Host, event: &str, ctx: Value) -> Vec<hermes_hooks::HookOutcome> {
    host.emit_collect(event, ctx, Duration::from_secs(15))
        .await
        .unwrap()
}

fn results(outcomes: &[hermes_hooks::HookOutcome]) -> Vec<Value> {
    outcomes
        .iter()
        .filter_map(|o| o.result.clone().ok().flatten())
        .collect()
}

// --- discovery (original: TestHookDiscovery) ---

#[tokio::test]
async fn loads_a_valid_hook() {
    let hooks = Hooks::new();
    hooks.recorder("logger", "[\"agent:start\"]", "None");
    let (host, report) = start(&hooks).await;
    assert_eq!(report.loaded, vec!["logger"]);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let info = host.hook("logger").unwrap();
    assert_eq!(info.events, vec!["agent:start"]);
    assert_eq!(info.kind, "python");
    host.shutdown(T).await;
}

#[tokio::test]
async fn skips_missing_manifest() {
    let hooks = Hooks::new();
    hooks.add("nomanifest", &[("handler.py", "def handle(e, c): pass\n")]);
    let (host, report) = start(&hooks).await;
    assert!(report.loaded.is_empty());
    // As upstream (issue 19): not a hook directory, so not a problem either.
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    host.shutdown(T).await;
}

#[tokio::test]
async fn skips_missing_handler() {
    let hooks = Hooks::new();
    hooks.add("nohandler", &[("HOOK.yaml", "events: [agent:start]\n")]);
    let (host, report) = start(&hooks).await;
    assert_eq!(skip_code(&report, "nohandler"), SkipCode::NoHandler);
    assert!(skip_reason(&report, "nohandler").contains("handler.py"));
    host.shutdown(T).await;
}

#[tokio::test]
async fn skips_no_events() {
    let hooks = Hooks::new();
    hooks.add(
        "empty",
        &[
            ("HOOK.yaml", "name: empty\nevents: []\n"),
            ("handler.py", "def handle(e, c): pass\n"),
        ],
    );
    hooks.add(
        "missing",
        &[
            ("HOOK.yaml", "name: missing\n"),
            ("handler.py", "def handle(e, c): pass\n"),
        ],
    );
    let (host, report) = start(&hooks).await;
    assert_eq!(skip_code(&report, "empty"), SkipCode::NoEvents);
    assert_eq!(skip_code(&report, "missing"), SkipCode::NoEvents);
    host.shutdown(T).await;
}

#[tokio::test]
async fn skips_no_handle_function() {
    let hooks = Hooks::new();
    hooks.python(
        "nohandle",
        "[agent:start]",
        "def something_else(e, c): pass\n",
    );
    let (host, report) = start(&hooks).await;
    assert_eq!(skip_code(&report, "nohandle"), SkipCode::LoadFailed);
    assert!(
        skip_reason(&report, "nohandle").contains("no 'handle' function"),
        "{}",
        skip_reason(&report, "nohandle")
    );
    assert!(report.skipped[0].file.ends_with("handler.py"));
    host.shutdown(T).await;
}

#[tokio::test]
async fn skips_disabled_hook_without_calling_it_a_problem() {
    let hooks = Hooks::new();
    hooks.add(
        "off",
        &[
            ("HOOK.yaml", "events: [agent:start]\nenabled: false\n"),
            ("handler.py", "def handle(e, c): pass\n"),
        ],
    );
    let (host, report) = start(&hooks).await;
    assert_eq!(skip_code(&report, "off"), SkipCode::Disabled);
    assert!(!report.has_problems());
    host.shutdown(T).await;
}

#[tokio::test]
async fn missing_hooks_dir_loads_nothing() {
    let hooks = Hooks::new();
    let mut cfg = config(&hooks);
    cfg.roots = vec![hooks.tmp.path().join("does-not-exist")];
    let (host, report) = Host::start(cfg).await;
    assert!(report.loaded.is_empty() && report.skipped.is_empty());
    assert_eq!(host.emit("agent:start", json!({})).unwrap(), 0);
    host.shutdown(T).await;
}

#[tokio::test]
async fn loads_several_hooks_in_directory_order() {
    let hooks = Hooks::new();
    hooks.recorder("c-hook", "[agent:start]", "None");
    hooks.recorder("a-hook", "[agent:start]", "None");
    hooks.recorder("b-hook", "[agent:end]", "None");
    std::fs::write(hooks.root().join("not-a-dir.txt"), "ignored").unwrap();
    let (host, report) = start(&hooks).await;
    assert_eq!(report.loaded, vec!["a-hook", "b-hook", "c-hook"]);
    assert!(report.skipped.is_empty());
    host.shutdown(T).await;
}

#[tokio::test]
async fn every_load_report_reason_names_file_and_reason() {
    let hooks = Hooks::new();
    let ok_py = "def handle(e, c):\n    return None\n";
    hooks.add(
        "yaml-error",
        &[
            ("HOOK.yaml", "name: yaml-error\nevents: [agent:start\n"),
            ("handler.py", ok_py),
        ],
    );
    hooks.add(
        "not-mapping",
        &[("HOOK.yaml", "- agent:start\n"), ("handler.py", ok_py)],
    );
    hooks.add(
        "bad-pattern",
        &[
            ("HOOK.yaml", "events: [\"agent:[\"]\n"),
            ("handler.py", ok_py),
        ],
    );
    hooks.python(
        "import-error",
        "[agent:start]",
        "import no_such_module_here\ndef handle(e, c): pass\n",
    );
    hooks.python(
        "syntax-error",
        "[agent:start]",
        "def handle(e, c)\n    pass\n",
    );
    hooks.add(
        "outside",
        &[(
            "HOOK.yaml",
            "events: [agent:start]\nhandler: ../elsewhere.py\n",
        )],
    );
    std::fs::write(hooks.root().join("../elsewhere.py"), ok_py).unwrap();
    let escape = hooks.add(
        "symlink",
        &[("HOOK.yaml", "events: [agent:start]\nhandler: link.py\n")],
    );
    std::os::unix::fs::symlink(
        hooks.tmp.path().join("elsewhere.py"),
        escape.join("link.py"),
    )
    .unwrap();
    hooks.add(
        "needs-bin",
        &[
            (
                "HOOK.yaml",
                "events: [agent:start]\nrequires: {bins: [no-such-binary-xyz]}\n",
            ),
            ("handler.py", ok_py),
        ],
    );
    hooks.add(
        "needs-env",
        &[
            (
                "HOOK.yaml",
                "events: [agent:start]\nrequires: {env: [HERMES_TEST_UNSET_VAR_XYZ]}\n",
            ),
            ("handler.py", ok_py),
        ],
    );
    hooks.add(
        "needs-os",
        &[
            (
                "HOOK.yaml",
                "events: [agent:start]\nrequires: {os: [windows]}\n",
            ),
            ("handler.py", ok_py),
        ],
    );
    hooks.add(
        "not-exec",
        &[
            ("HOOK.yaml", "events: [agent:start]\nhandler: run\n"),
            ("run", "#!/bin/sh\n"),
        ],
    );
    hooks.add(
        "bad-timeout",
        &[
            ("HOOK.yaml", "events: [agent:start]\ntimeout: 999\n"),
            ("handler.py", ok_py),
        ],
    );
    hooks.recorder("good", "[agent:start]", "None");

    let (host, report) = start(&hooks).await;
    assert_eq!(
        report.loaded,
        vec!["good"],
        "one broken hook never stops the others"
    );
    let expect = [
        ("yaml-error", SkipCode::YamlError, "line 2"),
        ("not-mapping", SkipCode::NotMapping, "not a mapping"),
        ("bad-pattern", SkipCode::BadPattern, "agent:["),
        (
            "import-error",
            SkipCode::LoadFailed,
            "No module named 'no_such_module_here'",
        ),
        ("syntax-error", SkipCode::LoadFailed, "SyntaxError"),
        ("outside", SkipCode::HandlerOutside, ".."),
        (
            "symlink",
            SkipCode::HandlerOutside,
            "outside the hook directory",
        ),
        ("needs-bin", SkipCode::Requirements, "no-such-binary-xyz"),
        (
            "needs-env",
            SkipCode::Requirements,
            "HERMES_TEST_UNSET_VAR_XYZ",
        ),
        ("needs-os", SkipCode::Requirements, "windows"),
        ("not-exec", SkipCode::BadHandler, "chmod +x"),
        ("bad-timeout", SkipCode::BadField, "timeout"),
    ];
    for (name, code, needle) in expect {
        let s = report
            .skipped
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} not reported"));
        assert_eq!(s.code, code, "{name}: {}", s.reason);
        assert!(
            s.reason.contains(needle),
            "{name}: {:?} lacks {needle:?}",
            s.reason
        );
        assert!(
            s.file.starts_with(hooks.root().join(name)),
            "{name}: file {}",
            s.file.display()
        );
    }
    assert_eq!(report.skipped.len(), expect.len());
    host.shutdown(T).await;
}

#[tokio::test]
async fn earlier_root_wins_and_shadowed_hook_is_reported() {
    let first = Hooks::new();
    let second = Hooks::new();
    first.recorder("dup", "[agent:start]", "'first'");
    second.recorder("dup", "[agent:start]", "'second'");
    second.recorder("only-second", "[agent:start]", "'extra'");
    let mut cfg = config(&first);
    cfg.roots = vec![first.root(), second.root()];
    let (host, report) = Host::start(cfg).await;
    assert_eq!(report.loaded, vec!["dup", "only-second"]);
    let s = report
        .skipped
        .iter()
        .find(|s| s.code == SkipCode::Shadowed)
        .expect("shadowed reported");
    assert_eq!(s.dir, second.root().join("dup"));
    let out = collect(&host, "agent:start", json!({})).await;
    assert_eq!(results(&out), vec![json!("first"), json!("extra")]);
    host.shutdown(T).await;
}

// --- emit (original: TestEmit) ---

#[tokio::test]
async fn sync_handler_called() {
    let hooks = Hooks::new();
    hooks.recorder("rec", "[agent:start]", "None");
    let (host, _) = start(&hooks).await;
    assert_eq!(
        host.emit("agent:start", json!({"user_id": "u1"})).unwrap(),
        1
    );
    let seen = poll_async(T, "the handler to record", || {
        let r = hooks.recorded("rec");
        (!r.is_empty()).then_some(r)
    })
    .await;
    assert_eq!(
        seen[0],
        json!({"event": "agent:start", "context": {"user_id": "u1"}})
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn async_handler_awaited() {
    let hooks = Hooks::new();
    let out = hooks.out().join("async.txt");
    hooks.python(
        "asy",
        "[agent:start]",
        &format!(
            "import asyncio\n\nasync def handle(event, context):\n    await asyncio.sleep(0.05)\n    open({:?}, 'a').write(event + '\\n')\n",
            out.display().to_string()
        ),
    );
    let (host, _) = start(&hooks).await;
    host.emit("agent:start", json!({})).unwrap();
    poll_async(T, "the async handler to finish", || {
        std::fs::read_to_string(&out)
            .ok()
            .filter(|s| s == "agent:start\n")
    })
    .await;
    host.shutdown(T).await;
}

#[tokio::test]
async fn wildcard_receives_command_reset() {
    let hooks = Hooks::new();
    hooks.recorder("cmd", "[\"command:*\"]", "None");
    let (host, _) = start(&hooks).await;
    assert_eq!(
        host.emit("command:reset", json!({"command": "reset"}))
            .unwrap(),
        1
    );
    assert_eq!(host.emit("commands:reset", json!({})).unwrap(), 0);
    poll_async(T, "command:reset", || {
        (hooks.recorded("cmd").len() == 1).then_some(())
    })
    .await;
    assert_eq!(hooks.recorded("cmd")[0]["event"], "command:reset");
    host.shutdown(T).await;
}

#[tokio::test]
async fn bare_namespace_does_not_match_and_globs_do() {
    let hooks = Hooks::new();
    hooks.recorder("bare", "[agent]", "'bare'");
    hooks.recorder("brace", "[\"{agent,session}:*\"]", "'brace'");
    hooks.recorder("all", "[\"*\"]", "'all'");
    let (host, _) = start(&hooks).await;
    let out = collect(&host, "agent:start", json!({})).await;
    assert_eq!(results(&out), vec![json!("all"), json!("brace")]);
    let out = collect(&host, "agent", json!({})).await;
    assert_eq!(results(&out), vec![json!("bare"), json!("all")]);
    host.shutdown(T).await;
}

#[tokio::test]
async fn emit_with_no_handlers_is_fine() {
    let hooks = Hooks::new();
    let (host, _) = start(&hooks).await;
    assert_eq!(host.emit("agent:start", json!({})).unwrap(), 0);
    host.shutdown(T).await;
}

#[tokio::test]
async fn raising_handler_does_not_propagate() {
    let hooks = Hooks::new();
    hooks.python(
        "boom",
        "[agent:start]",
        "def handle(e, c):\n    raise ValueError('boom')\n",
    );
    hooks.recorder("after", "[agent:start]", "None");
    let (host, _) = start(&hooks).await;
    assert_eq!(host.emit("agent:start", json!({})).unwrap(), 2);
    poll_async(T, "the other hook", || {
        (hooks.recorded("after").len() == 1).then_some(())
    })
    .await;
    poll_async(T, "the error counted", || {
        host.hook("boom")
            .filter(|h| h.counters.failed == 1)
            .map(|h| h.last_error)
    })
    .await
    .map(|e| assert!(e.message.contains("ValueError: boom"), "{}", e.message))
    .expect("last error recorded");
    host.shutdown(T).await;
}

#[tokio::test]
async fn emit_without_context_passes_empty_object() {
    let hooks = Hooks::new();
    hooks.recorder("rec", "[agent:start]", "None");
    let (host, _) = start(&hooks).await;
    host.emit("agent:start", Value::Null).unwrap();
    poll_async(T, "record", || {
        (hooks.recorded("rec").len() == 1).then_some(())
    })
    .await;
    assert_eq!(hooks.recorded("rec")[0]["context"], json!({}));
    host.shutdown(T).await;
}

#[tokio::test]
async fn invalid_event_names_and_contexts_are_rejected() {
    let hooks = Hooks::new();
    let (host, _) = start(&hooks).await;
    for bad in ["", "agent start", "agent:\tstart", &"a".repeat(257)] {
        let err = host.emit(bad, json!({})).unwrap_err();
        assert!(
            matches!(err, hermes_hooks::EmitError::InvalidEvent(_)),
            "{bad:?}: {err}"
        );
    }
    let err = host.emit("agent:start", json!([1])).unwrap_err();
    assert!(
        err.to_string().contains("context must be a JSON object"),
        "{err}"
    );
    host.shutdown(T).await;
}

// --- emit_collect (original: TestEmitCollect) ---

#[tokio::test]
async fn collect_returns_sync_and_async_values_and_drops_none() {
    let hooks = Hooks::new();
    hooks.python(
        "a-sync",
        "[command:x]",
        "def handle(e, c):\n    return {'allow': True}\n",
    );
    hooks.python(
        "b-async",
        "[command:x]",
        "async def handle(e, c):\n    return 'async-value'\n",
    );
    hooks.python(
        "c-none",
        "[command:x]",
        "def handle(e, c):\n    return None\n",
    );
    let (host, _) = start(&hooks).await;
    let out = collect(&host, "command:x", json!({})).await;
    assert_eq!(
        results(&out),
        vec![json!({"allow": true}), json!("async-value")]
    );
    assert!(out.iter().all(|o| o.result.is_ok()));
    host.shutdown(T).await;
}

#[tokio::test]
async fn collect_survives_a_raising_handler() {
    let hooks = Hooks::new();
    hooks.python(
        "a-raise",
        "[command:x]",
        "def handle(e, c):\n    raise RuntimeError('nope')\n",
    );
    hooks.python(
        "b-ok",
        "[command:x]",
        "def handle(e, c):\n    return 'ok'\n",
    );
    let (host, _) = start(&hooks).await;
    let out = collect(&host, "command:x", json!({})).await;
    assert_eq!(results(&out), vec![json!("ok")]);
    let err = out
        .iter()
        .find(|o| o.hook == "a-raise")
        .unwrap()
        .result
        .clone()
        .unwrap_err();
    assert_eq!(err, "RuntimeError: nope");
    host.shutdown(T).await;
}

#[tokio::test]
async fn collect_orders_exact_before_wildcard() {
    let hooks = Hooks::new();
    // Directory order puts the wildcard hook first; match order must still put exact first.
    hooks.python(
        "a-wild",
        "[\"command:*\"]",
        "def handle(e, c):\n    return 'wildcard'\n",
    );
    hooks.python(
        "b-exact",
        "[command:reset]",
        "def handle(e, c):\n    return 'exact'\n",
    );
    hooks.python(
        "c-both",
        "[\"command:*\", command:reset]",
        "def handle(e, c):\n    return 'both'\n",
    );
    let (host, _) = start(&hooks).await;
    let out = collect(&host, "command:reset", json!({})).await;
    assert_eq!(
        results(&out),
        vec![json!("exact"), json!("both"), json!("wildcard")]
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn collect_with_no_handlers_returns_empty() {
    let hooks = Hooks::new();
    let (host, _) = start(&hooks).await;
    assert!(collect(&host, "command:x", json!({})).await.is_empty());
    host.shutdown(T).await;
}

#[tokio::test]
async fn collect_defaults_the_context() {
    let hooks = Hooks::new();
    hooks.python(
        "echo",
        "[command:x]",
        "def handle(e, c):\n    return {'ctx': c}\n",
    );
    let (host, _) = start(&hooks).await;
    let out = collect(&host, "command:x", Value::Null).await;
    assert_eq!(results(&out), vec![json!({"ctx": {}})]);
    host.shutdown(T).await;
}

#[tokio::test]
async fn collect_deadline_reports_the_late_hook_and_keeps_the_others() {
    let hooks = Hooks::new();
    hooks.python(
        "a-slow",
        "[command:x]",
        "import time\ndef handle(e, c):\n    time.sleep(2)\n    return 'late'\n",
    );
    hooks.python(
        "b-fast",
        "[command:x]",
        "def handle(e, c):\n    return 'fast'\n",
    );
    let (host, _) = start(&hooks).await;
    let t0 = Instant::now();
    let out = host
        .emit_collect("command:x", json!({}), Duration::from_millis(300))
        .await
        .unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "deadline honoured: {:?}",
        t0.elapsed()
    );
    assert_eq!(results(&out), vec![json!("fast")]);
    let late = out.iter().find(|o| o.hook == "a-slow").unwrap();
    assert!(late.result.clone().unwrap_err().contains("deadline"));
    host.shutdown(T).await;
}

// --- what the original host could not do ---

#[tokio::test]
async fn slow_handler_does_not_delay_emit_or_other_hooks() {
    let hooks = Hooks::new();
    hooks.python(
        "slow",
        "[agent:start]",
        "import time\ndef handle(e, c):\n    time.sleep(3)\n",
    );
    hooks.recorder("fast", "[agent:start]", "None");
    let (host, _) = start(&hooks).await;
    let t0 = Instant::now();
    for i in 0..5 {
        assert_eq!(host.emit("agent:start", json!({"i": i})).unwrap(), 2);
    }
    let emit_time = t0.elapsed();
    assert!(
        emit_time < Duration::from_millis(500),
        "5 emits took {emit_time:?}"
    );
    poll_async(T, "the fast hook to see all 5", || {
        (hooks.recorded("fast").len() == 5).then_some(())
    })
    .await;
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the fast hook waited for the slow one: {:?}",
        t0.elapsed()
    );
    host.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn per_hook_order_is_emit_order() {
    let hooks = Hooks::new();
    hooks.recorder("rec", "[agent:step]", "None");
    let (host, _) = start(&hooks).await;
    for i in 0..200 {
        host.emit("agent:step", json!({"iteration": i})).unwrap();
    }
    let seen = poll_async(T, "200 events", || {
        let r = hooks.recorded("rec");
        (r.len() == 200).then_some(r)
    })
    .await;
    let order: Vec<i64> = seen
        .iter()
        .map(|v| v["context"]["iteration"].as_i64().unwrap())
        .collect();
    assert_eq!(order, (0..200).collect::<Vec<_>>());
    host.shutdown(T).await;
}

#[tokio::test]
async fn full_queue_applies_policy_and_counts_drops() {
    let hooks = Hooks::new();
    hooks.add(
        "tiny",
        &[
            (
                "HOOK.yaml",
                "events: [agent:step]\nqueue: {capacity: 2, overflow: drop_newest}\n",
            ),
            (
                "handler.py",
                "import time\ndef handle(e, c):\n    time.sleep(0.5)\n",
            ),
        ],
    );
    hooks.add(
        "oldest",
        &[
            ("HOOK.yaml", "events: [agent:step]\nqueue: {capacity: 2}\n"),
            (
                "handler.py",
                "import time\ndef handle(e, c):\n    time.sleep(0.5)\n",
            ),
        ],
    );
    let (host, _) = start(&hooks).await;
    let mut queued = 0;
    for i in 0..10 {
        queued += host.emit("agent:step", json!({"i": i})).unwrap();
    }
    let tiny = host.hook("tiny").unwrap();
    let oldest = host.hook("oldest").unwrap();
    // drop_newest refuses; drop_oldest accepts and evicts. At most 1 in flight + 2 queued.
    assert!(tiny.counters.dropped >= 7, "{:?}", tiny.counters);
    assert_eq!(tiny.counters.dropped + tiny.counters.queued, 10);
    assert!(oldest.counters.dropped >= 7, "{:?}", oldest.counters);
    assert_eq!(oldest.counters.queued, 10);
    assert_eq!(queued as u64, 10 + tiny.counters.queued);
    host.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn shutdown_drains_queues_then_reports_what_is_left() {
    let hooks = Hooks::new();
    hooks.add(
        "drain",
        &[
            ("HOOK.yaml", "events: [agent:step]\n"),
            ("handler.py", &format!(
                "import time\ndef handle(e, c):\n    time.sleep(0.2)\n    open({:?}, 'a').write('x')\n",
                hooks.out().join("drain.txt").display().to_string()
            )),
        ],
    );
    let (host, _) = start(&hooks).await;
    for _ in 0..3 {
        host.emit("agent:step", json!({})).unwrap();
    }
    let report = host.shutdown(Duration::from_secs(10)).await;
    assert!(report.undelivered.is_empty(), "{report:?}");
    assert_eq!(
        std::fs::read_to_string(hooks.out().join("drain.txt")).unwrap(),
        "xxx"
    );
    assert!(matches!(
        host.emit("agent:step", json!({})),
        Err(hermes_hooks::EmitError::ShuttingDown)
    ));

    // With a short deadline the rest is reported undelivered.
    let hooks = Hooks::new();
    hooks.python(
        "stuck",
        "[agent:step]",
        "import time\ndef handle(e, c):\n    time.sleep(5)\n",
    );
    let (host, _) = start(&hooks).await;
    for _ in 0..4 {
        host.emit("agent:step", json!({})).unwrap();
    }
    let t0 = Instant::now();
    let report = host.shutdown(Duration::from_millis(300)).await;
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    // Three still queued and the one the killed worker was running.
    assert_eq!(report.undelivered, vec![("stuck".to_string(), 4)]);
    let t = report.total;
    assert_eq!((t.accepted, t.undelivered), (4, 4), "{report:?}");
}

#[tokio::test]
async fn permissions_of_files_are_respected_by_exec_kind() {
    let hooks = Hooks::new();
    let dir = hooks.add(
        "script",
        &[
            ("HOOK.yaml", "events: [agent:start]\n"),
            ("handler.sh", "echo '\"from-sh\"'\n"),
        ],
    );
    set_mode(&dir.join("handler.sh"), 0o644);
    let (host, report) = start(&hooks).await;
    assert_eq!(
        report.loaded,
        vec!["script"],
        "a .sh without the run bit runs with sh"
    );
    let out = collect(&host, "agent:start", json!({})).await;
    assert_eq!(results(&out), vec![json!("from-sh")]);
    host.shutdown(T).await;
}
