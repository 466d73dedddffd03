//! The real gateway (issue 36): hermes-agent 0.19.0 from PyPI, in the venv
//! `.ci/hermes-agent-venv.sh` makes (cached under `target/`), a conversation on its `webhook`
//! platform through the original host and through the shim with the service autostarted (the
//! venv's `bin` on `PATH` and not), every hook event compared. The checks themselves are in
//! `tests/real_gateway/test_real_gateway.py` (standard library only); this runs them with the
//! service binary under test.
//!
//! Outside CI, when neither `HERMES_AGENT_VENV` nor `target/hermes-agent-venv` exists at build
//! time (`#[testenv::needs(gateway_venv)]`, crates/testenv) the test is listed as ignored with the way to
//! make the venv; run with `--ignored` (or under `CI`) it makes it, and fails when it cannot
//! (issue 50: it used to say so on stderr and count as passed).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::bin;

/// The gateway's venv: `$HERMES_AGENT_VENV`, else made (once, then reused) in
/// `target/hermes-agent-venv`; panics, saying why, when it cannot be made.
pub(crate) fn gateway_venv() -> PathBuf {
    if let Some(v) = std::env::var_os("HERMES_AGENT_VENV") {
        return PathBuf::from(v);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("hermes-agent-venv");
    let out = Command::new(root.join(".ci/hermes-agent-venv.sh"))
        .arg(&venv)
        .output()
        .expect("run .ci/hermes-agent-venv.sh");
    assert!(
        out.status.success(),
        "cannot make the gateway's venv in {} (no network?):\n{}",
        venv.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    venv
}

#[testenv::needs(gateway_venv)]
#[test]
fn the_real_gateway_emits_the_same_events_through_the_service_as_in_process() {
    run_module("test_real_gateway", 4);
}

/// Runs `tests/real_gateway/MODULE.py` with unittest on the gateway's venv and the binary under
/// test; every one of its `tests` tests must run and pass.
fn run_module(module: &str, tests: usize) {
    let venv = gateway_venv();
    let out = Command::new("python3")
        .args(["-m", "unittest", "-v", module])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real_gateway"))
        .env("HERMES_AGENT_VENV", &venv)
        .env("HERMES_HOOKS_BIN", bin())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{module} failed:\n{stderr}");
    assert!(stderr.contains(&format!("Ran {tests} test")), "{stderr}");
    assert!(!stderr.contains("skipped"), "tests were skipped:\n{stderr}");
}

/// Issue 49, "The real thing in CI": in `hermes chat -q` and in `hermes gateway run`, through the
/// client's Hermes plugin, a `pre_tool_call` hook blocks a `terminal` command and the model sees
/// the block message, a `pre_llm_call` context reaches the model's request, a `post_tool_call`
/// observer sleeping 5 s does not lengthen the turn, and a config.yaml shell hook runs once per
/// event (`tests/real_gateway/test_agent_hooks.py`). On the old code (d69d285) there was no
/// plugin: nothing blocked, no context. Issue 58: in `chat -q`, `transform_tool_result` and
/// `transform_llm_output` hooks change what the model sees and what is printed, as 0.19.0
/// reads their answers.
#[testenv::needs(gateway_venv)]
#[test]
fn the_agent_events_reach_hooks_in_chat_and_in_the_gateway() {
    run_module("test_agent_hooks", 6);
}

/// Issue 58 row 1: a config.yaml script of our own on eight of the agent's events, in
/// `hermes chat -q` under Hermes's own runner and under the plugin and the service, gets the
/// same sequence of events, and a script with a cooldown file plays once in each
/// (`tests/real_gateway/test_one_order.py`). On c592df0 each (event, command) was a hook of
/// its own: the events came out of order.
#[testenv::needs(gateway_venv)]
#[test]
fn one_config_script_gets_its_events_in_hermess_order() {
    run_module("test_one_order", 1);
}
