//! Issue 58: the operator's commands around the agent's events (`test --payload-file`,
//! `dashboard`/`plugin` and `plugins.enabled`, `list` of a config.yaml entry, `doctor` asking
//! Hermes's Python).

use serde_json::{Value, json};

use crate::agent_hooks::test_seen;
use crate::util::Hooks;

/// Row 11: a payload file written with the context's key `tool_input` (what a hook reads)
/// tests that input, not the sample `echo hello` with the key moved under `extra`; a context
/// copied from a hook's stdin (`extra`, `cwd`, `hook_event_name`) tests as it ran; `args` and
/// `tool_input` together, or a `tool_input` that is not an object, are refused naming the key.
/// On the old code the hook saw `{"command": "echo hello"}` and `extra.tool_input`.
#[test]
fn a_payload_with_the_contexts_keys_is_the_call_it_describes() {
    let hooks = Hooks::new();
    hooks.python(
        "seen",
        "[\"pre_tool_call\"]",
        "def handle(event, ctx):\n    return {'input': ctx['tool_input'], 'extra': ctx['extra'], 'cwd': ctx['cwd']}\n",
    );
    let (code, said) = test_seen(&hooks, r#"{"tool_input": {"command": "rm -rf /"}}"#, &[]);
    assert_eq!(code, 0, "{said}");
    let line: Value = serde_json::from_str(said.lines().next().unwrap()).unwrap();
    assert_eq!(
        line["result"]["input"],
        json!({"command": "rm -rf /"}),
        "{said}"
    );
    assert_eq!(
        line["result"]["extra"],
        json!({"tool_call_id": "test-call"}),
        "{said}"
    );

    let stdin = json!({
        "hook_event_name": "pre_tool_call", "tool_name": "terminal",
        "tool_input": {"command": "ls"}, "session_id": "s1", "cwd": "/srv/work",
        "extra": {"task_id": "t1", "tool_call_id": "c1"},
    });
    let (code, said) = test_seen(&hooks, &stdin.to_string(), &[]);
    assert_eq!(code, 0, "{said}");
    let line: Value = serde_json::from_str(said.lines().next().unwrap()).unwrap();
    assert_eq!(
        line["result"],
        json!({"input": {"command": "ls"}, "extra": {"task_id": "t1", "tool_call_id": "c1"},
               "cwd": "/srv/work"}),
        "{said}"
    );

    let (code, said) = test_seen(
        &hooks,
        r#"{"args": {"command": "ls"}, "tool_input": {"command": "rm"}}"#,
        &[],
    );
    assert_eq!(code, 2, "{said}");
    assert!(said.contains(r#"both "args" and "tool_input""#), "{said}");
    let (code, said) = test_seen(&hooks, r#"{"tool_input": "rm -rf /"}"#, &[]);
    assert_eq!(code, 2, "{said}");
    assert!(
        said.contains(r#"a JSON object such as {"command": "ls"}"#),
        "{said}"
    );
    let (code, said) = test_seen(&hooks, r#"{"hook_event_name": "post_tool_call"}"#, &[]);
    assert_eq!(code, 2, "{said}");
    assert!(
        said.contains("the event tested is \"pre_tool_call\""),
        "{said}"
    );
}
