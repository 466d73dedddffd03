//! Decisions never fail open (issue 33): a collect waits for the matching hooks' own timeouts
//! through a fleet edge too, names the matching hooks that cannot answer, and the Python client
//! neither loses a collect to a service that is shutting down nor hides a hook that cannot
//! answer. (The busy CPU case is in `priority.rs`, beside the other scheduling tests.)

use std::process::Command;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, approve};

#[cfg(feature = "fleet")]
use crate::fleet::{fleet_of, records};

/// A fleet edge loads no hooks: its collect without `timeout_ms` used to give up after the
/// 5 s fallback. It now waits for the matching hook's own `timeout:` (120 s here) as the
/// workers report it, and returns a deny that takes 6 s.
#[cfg(feature = "fleet")]
#[testenv::needs(nats)]
#[test]
fn a_fleet_collect_waits_for_the_hooks_own_timeout_not_five_seconds() {
    let Some((_nats, hooks, [_w], edge)) = fleet_of("slow-deny", r#"["command:*"]"#, "", ["w1"])
    else {
        return;
    };
    let started = std::time::Instant::now();
    let (status, v) = edge.post(
        "/v1/collect",
        &json!({"event": "command:run", "context": {"pause": 6, "answer": {"decision": "deny"}}}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v,
        json!({"results": [{"hook": "slow-deny", "result": {"decision": "deny"}}], "errors": []}),
        "after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(6));
    assert_eq!(records(&hooks, "slow-deny").len(), 1);
}

/// Under `--trust explicit` a deny hook not yet approved, and an approved one whose handler fails
/// to import, used to leave a collect with `{"results": [], "errors": []}`: the same answer as
/// "nobody objects". Both are now named (`refused`, `not_loaded`, with the reason); a hook on
/// other events is not. The Python client logs them and, when asked, fails closed.
#[test]
fn a_matching_hook_that_is_not_loaded_is_named_in_the_collect_answer() {
    let hooks = Hooks::new();
    let deny = "def handle(event, context):\n    return {'decision': 'deny'}\n";
    hooks.python("guard", r#"["command:*"]"#, deny);
    hooks.python(
        "broken-guard",
        r#"["command:run"]"#,
        "raise ImportError('policy table missing')\n",
    );
    hooks.python("elsewhere", r#"["agent:*"]"#, deny);
    approve(&hooks, "broken-guard");
    let serve = Serve::start(&hooks, &["--trust", "explicit"]);
    let (status, v) = serve.post("/v1/collect", &json!({"event": "command:run"}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["results"], json!([]), "{v}");
    let errors = v["errors"].as_array().expect("errors");
    let state = |name: &str| {
        errors.iter().find(|e| e["hook"] == name).map(|e| {
            (
                e["state"].clone(),
                e["error"].as_str().unwrap_or("").to_string(),
            )
        })
    };
    let (refused, why) = state("guard").unwrap_or_else(|| panic!("guard not named: {v}"));
    assert_eq!(refused, "refused", "{v}");
    assert!(
        why.contains("approv"),
        "the reason says it is not approved: {v}"
    );
    let (absent, why) = state("broken-guard").unwrap_or_else(|| panic!("broken-guard: {v}"));
    assert_eq!(absent, "not_loaded", "{v}");
    assert!(why.contains("policy table missing"), "{v}");
    assert_eq!(errors.len(), 2, "the agent:* hook does not match: {v}");

    // The gateway's client: a log line naming the hook, and fail-closed on request.
    let script = r#"
import asyncio, json, logging, sys
sys.path.insert(0, sys.argv[2])
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from hermes_hooks import HookRegistry

async def main():
    reg = HookRegistry(address=sys.argv[1], autostart=False)
    reg.discover_and_load()
    open_ = await reg.emit_collect("command:run", {})
    closed = await reg.emit_collect("command:run", {}, fail_closed={"decision": "deny"})
    strict = HookRegistry(address=sys.argv[1], autostart=False,
                          collect_fail_closed={"decision": "deny"})
    nothing = await strict.emit_collect("session:start", {})
    print(json.dumps({"open": open_, "closed": closed, "nothing": nothing}))
    reg.close()
    strict.close()

asyncio.run(main())
"#;
    let out = Command::new("python3")
        .args(["-c", script, &format!("http://{}", serve.addr)])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python"))
        .env("HERMES_HOME", hooks.home()) // never the real ~/.hermes
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client script failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON line");
    assert_eq!(v["open"], json!([]), "{v}");
    assert_eq!(
        v["closed"],
        json!([{"decision": "deny"}, {"decision": "deny"}]),
        "one deny per hook that cannot answer: {v}"
    );
    assert_eq!(
        v["nothing"],
        json!([]),
        "no hook matches: nothing to close on: {v}"
    );
    for hook in ["guard", "broken-guard"] {
        assert!(
            stderr.contains(&format!("Decision hook {hook} cannot answer 'command:run'")),
            "a log line names {hook}: {stderr}"
        );
    }
}

/// Issue 47, row 2: a Python hook with `timeout: 1` that takes 20 ms per `agent:start` and denies
/// `message:pre_route`. After a batch of 200 `agent:start`, a collect without `timeout_ms` used to
/// get a budget of 2 s: the events the worker had already taken into its window (up to 256)
/// were counted neither there nor in `/v1/hooks`' queue depth, so the deny (computed after
/// ~4 s) was dropped as `timed_out`. The budget now counts them, and the deny comes back.
#[test]
fn a_collect_counts_the_events_in_a_python_window_ahead_of_it() {
    let hooks = Hooks::new();
    let code = "import time\n\ndef handle(event, context):\n    if event == 'agent:start':\n        time.sleep(0.02)\n        return None\n    return {'decision': 'deny'}\n";
    let dir = hooks.python(
        "slow-guard",
        r#"["agent:start", "message:pre_route"]"#,
        code,
    );
    std::fs::write(
        dir.join("HOOK.yaml"),
        "name: slow-guard\nevents: [\"agent:start\", \"message:pre_route\"]\ntimeout: 1\n",
    )
    .unwrap();
    let serve = Serve::start(&hooks, &[]);
    // The worker is up before the batch (its first start is not what is measured).
    let (status, v) = serve.post("/v1/collect", &json!({"event": "message:pre_route"}));
    assert_eq!(status, 200, "{v}");
    let batch: Vec<Value> = (0..200).map(|_| json!({"event": "agent:start"})).collect();
    let (status, v) = serve.post("/v1/events/batch", &json!({ "events": batch }));
    assert!(status < 300, "{status} {v}");
    // What is ahead shows in /v1/hooks: queued or taken into the window, not 0.
    let (_, info) = serve.get("/v1/hooks/slow-guard");
    let ahead = info["queue"]["depth"].as_u64().unwrap_or(0)
        + info["queue"]["in_flight"].as_u64().unwrap_or(0);
    assert!(ahead >= 100, "the 200 events ahead are shown: {info}");
    let started = std::time::Instant::now();
    let (status, v) = serve.post("/v1/collect", &json!({"event": "message:pre_route"}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["results"],
        json!([{"hook": "slow-guard", "result": {"decision": "deny"}}]),
        "after {:?}: {v}",
        started.elapsed()
    );
}
