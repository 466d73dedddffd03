//! Issue 58, "Python shell scripts at worker speed, unchanged": a config.yaml command that
//! runs a Python script is run by a fork server of its interpreter
//! (`src/config_hooks/script_runner.py`, `script_server.py`), as a fresh interpreter would run
//! it.
//!
//! - `the_runner_matches_subprocess`: the runner against `subprocess.run` on one script after
//!   another (argv, `__name__`, `__file__`, `sys.path`, exit codes, exceptions, signals, stdin
//!   to its end, large output, timeouts, text decoding, what falls back), in
//!   `tests/config_hooks/test_script_runner.py`.
//! - `a_python_gate_decides_as_under_hermes_own_runner`: the same scripts run by hermes-agent
//!   0.19.0's own shell-hook runner (its functions, from its venv: `hermes_side.py`) and hosted
//!   here from config.yaml, on the same inputs: the same decisions, exit codes and stderr; and
//!   every run here came from the fork server.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::agent_hooks::script;
use crate::util::{Hooks, Serve, bin};

fn suite_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config_hooks")
}

#[test]
fn the_runner_matches_subprocess() {
    let out = Command::new("python3")
        .args(["-m", "unittest", "-v", "test_script_runner"])
        .current_dir(suite_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the runner's tests failed:\n{stderr}");
    let ran = crate::util::unittest_ran(&stderr);
    assert!(ran >= 10, "only {ran} runner tests ran:\n{stderr}");
    assert!(!stderr.contains("skipped"), "tests were skipped:\n{stderr}");
}

/// A `pre_tool_call` gate in the style of the published ones: JSON in, a Claude-Code-style
/// block out; each run notes its parent process (which the comparison leaves out).
const GATE: &str = r#"#!/usr/bin/env python3
"""Refuses rm -rf; the other commands say what to do with this gate itself."""
import json
import os
import sys

call = json.load(sys.stdin)
with open(os.environ["HH_SIDE_LOG"], "a") as log, \
        open("/proc/%d/cmdline" % os.getppid(), "rb") as parent:
    log.write(parent.read().replace(b"\0", b" ").decode("utf-8", "replace") + "\n")
command = (call.get("tool_input") or {}).get("command", "")
if "rm -rf" in command:
    print(json.dumps({"decision": "block", "reason": "no rm -rf: " + command}))
elif command == "malformed":
    print("{not json")
elif command == "exit":
    print(json.dumps({"action": "block", "message": "blocked, then exit 3"}))
    sys.exit(3)
elif command == "stderr":
    print("a warning from the gate", file=sys.stderr)
    print("{}")
elif command == "crash":
    raise RuntimeError("the gate crashed")
elif command == "refuse":
    sys.exit("refused by message")
"#;

/// A `pre_llm_call` script that tells, as its context, where and how it runs.
const CONTEXT: &str = r#"import json, os, sys
with open(os.environ["HH_SIDE_LOG"], "a") as log, \
        open("/proc/%d/cmdline" % os.getppid(), "rb") as parent:
    log.write(parent.read().replace(b"\0", b" ").decode("utf-8", "replace") + "\n")
seen = {"cwd": os.getcwd(), "argv": sys.argv, "var": os.environ.get("HH_SIDE_VAR"),
        "name": __name__, "file": __file__, "path0": sys.path[0],
        "executable": sys.executable, "stdin_keys": sorted(json.load(sys.stdin))}
print(json.dumps({"context": json.dumps(seen, sort_keys=True)}))
"#;

/// The cases: (event, command, kwargs as Hermes's `invoke_hook` passes them).
fn cases(gate: &str, context: &str) -> Vec<Value> {
    let mut out: Vec<Value> = [
        "rm -rf /tmp/nothing",
        "ls -la",
        "malformed",
        "exit",
        "stderr",
    ]
    .iter()
    .chain(&["crash", "refuse"])
    .map(|command| {
        json!({
            "event": "pre_tool_call", "command": gate, "matcher": "terminal", "timeout": 20,
            "kwargs": {"tool_name": "terminal", "args": {"command": command},
                       "task_id": "t1", "session_id": "s1", "tool_call_id": "c1"},
        })
    })
    .collect();
    out.push(json!({
        "event": "pre_llm_call", "command": format!("python3 {context} one 'two words'"),
        "timeout": 20,
        "kwargs": {"session_id": "s1", "user_message": "hello", "model": "m",
                   "platform": "cli", "is_first_turn": true},
    }));
    out
}

/// The runs' parent processes, as the scripts noted them.
fn parents(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

#[testenv::needs(gateway_venv)]
#[test]
fn a_python_gate_decides_as_under_hermes_own_runner() {
    let hooks = Hooks::new();
    let gate = script(&hooks, "gate.py", GATE);
    let context = script(&hooks, "context.py", CONTEXT);
    let cases = cases(&gate, &context);
    let here = std::env::current_dir().expect("the test's directory");

    // Under 0.19.0's runner, from the venv's Python, in this test's directory.
    let cases_file = hooks.out().join("cases.json");
    std::fs::write(&cases_file, serde_json::to_string(&cases).unwrap()).unwrap();
    let hermes_log = hooks.out().join("hermes.log");
    let venv = crate::real_gateway::gateway_venv();
    let out = Command::new(venv.join("bin/python"))
        .arg(suite_dir().join("hermes_side.py"))
        .arg(&cases_file)
        .current_dir(&here)
        .env("HERMES_HOME", hooks.home())
        .env("HH_SIDE_VAR", "side-by-side")
        .env("HH_SIDE_LOG", &hermes_log)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run the venv's python");
    assert!(
        out.status.success(),
        "hermes_side.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let upstream: Vec<Value> = serde_json::from_slice(&out.stdout).expect("its JSON");
    assert_eq!(upstream.len(), cases.len());

    // Hosted here from config.yaml: the same entries.
    std::fs::write(
        hooks.home().join("config.yaml"),
        format!(
            "hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - {{command: {gate}, \
             matcher: terminal, timeout: 20}}\n  pre_llm_call:\n    - command: \"{}\"\n      \
             timeout: 20\n",
            cases[cases.len() - 1]["command"]
                .as_str()
                .unwrap_or_default()
        ),
    )
    .unwrap();
    let here_log = hooks.out().join("here.log");
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0"])
        .env("HH_SIDE_VAR", "side-by-side")
        .env("HH_SIDE_LOG", &here_log);
    let serve = Serve::spawn(cmd, &hooks);
    for (case, theirs) in cases.iter().zip(&upstream) {
        let event = case["event"].as_str().unwrap_or_default();
        let (status, body) = serve.post(
            "/v1/collect",
            &json!({"event": event, "context": theirs["payload"]}),
        );
        assert_eq!(status, 200, "{body}");
        let ours = body["results"]
            .as_array()
            .and_then(|r| r.first())
            .map(|r| r["result"].clone())
            .unwrap_or(Value::Null);
        assert_eq!(
            ours, theirs["decision"],
            "{case}: here {body}, under 0.19.0's runner {theirs}"
        );
        let code = theirs["returncode"].as_i64().unwrap_or(0);
        if code != 0 {
            // The hosted entry logs what 0.19.0 logs: the code and the start of stderr.
            let said = format!("exited {code}: ");
            let last = theirs["stderr"]
                .as_str()
                .unwrap_or_default()
                .trim_end()
                .lines()
                .last()
                .unwrap_or_default()
                .to_string();
            crate::util::poll(std::time::Duration::from_secs(10), "the log line", || {
                let log = serve.log();
                (log.contains(&said) && log.contains(&last)).then_some(())
            });
        }
    }
    let expect = |i: usize, decision: Value| assert_eq!(upstream[i]["decision"], decision);
    expect(
        0,
        json!({"action": "block", "message": "no rm -rf: rm -rf /tmp/nothing"}),
    );
    expect(1, Value::Null);
    expect(2, Value::Null);
    expect(
        3,
        json!({"action": "block", "message": "blocked, then exit 3"}),
    );
    assert_eq!(upstream[3]["returncode"], 3);
    assert_eq!(upstream[4]["stderr"], "a warning from the gate\n");
    assert_eq!(upstream[5]["returncode"], 1);
    assert!(
        upstream[5]["stderr"]
            .as_str()
            .is_some_and(|s| s.ends_with("RuntimeError: the gate crashed\n")),
        "{}",
        upstream[5]
    );
    assert_eq!(upstream[6]["stderr"], "refused by message\n");
    let seen: Value = serde_json::from_str(
        upstream[7]["decision"]["context"]
            .as_str()
            .unwrap_or_default(),
    )
    .expect("the context script's JSON");
    assert_eq!(seen["argv"], json!([context, "one", "two words"]));
    assert_eq!(seen["var"], "side-by-side");
    assert_eq!(seen["name"], "__main__");
    assert_eq!(
        seen["cwd"],
        json!(std::fs::canonicalize(&here).unwrap().display().to_string())
    );

    // Every run here was a fork of the script server; none under Hermes.
    let theirs = parents(&hermes_log);
    let ours = parents(&here_log);
    assert_eq!(theirs.len(), 2 * cases.len(), "{theirs:?}");
    assert!(
        theirs.iter().all(|p| !p.contains("script_server.py")),
        "{theirs:?}"
    );
    assert_eq!(ours.len(), cases.len(), "{ours:?}");
    assert!(
        ours.iter().all(|p| p.contains("script_server.py")),
        "a run here did not come from the fork server: {ours:?}"
    );
}
