//! `serve --output json`: the machine-readable event stream on stdout.

use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, poll};

const T: Duration = Duration::from_secs(30);

fn types(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l["type"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn json_stream_covers_the_lifecycle_and_nothing_else_goes_to_stdout() {
    let hooks = Hooks::new();
    hooks.recorder("good", "[agent:start]", "None");
    hooks.python(
        "raises",
        "[command:boom]",
        "print('to the log, not stdout')\ndef handle(e, c):\n    raise ValueError('boom')\n",
    );
    hooks.python(
        "crashes",
        "[command:crash]",
        "import os\ndef handle(e, c):\n    os._exit(1)\n",
    );
    hooks.add(
        "hangs",
        &[
            ("HOOK.yaml", "events: [command:hang]\ntimeout: 0.3\n"),
            (
                "handler.py",
                "import time\ndef handle(e, c):\n    time.sleep(30)\n",
            ),
        ],
    );
    hooks.add(
        "tiny",
        &[
            (
                "HOOK.yaml",
                "events: [agent:step]\nqueue: {capacity: 1, overflow: drop_newest}\n",
            ),
            (
                "handler.py",
                "import time\ndef handle(e, c):\n    time.sleep(0.2)\n",
            ),
        ],
    );
    hooks.add("broken", &[("HOOK.yaml", "events: [\n")]);
    let mut serve = Serve::start(&hooks, &["--output", "json"]);

    serve.post("/v1/events", &json!({"event": "command:boom"}));
    serve.post("/v1/collect", &json!({"event": "command:crash"}));
    serve.post("/v1/collect", &json!({"event": "command:crash"}));
    serve.post(
        "/v1/collect",
        &json!({"event": "command:hang", "timeout_ms": 5000}),
    );
    for _ in 0..5 {
        serve.post("/v1/events", &json!({"event": "agent:step"}));
    }
    // A broken edit of a loaded hook: reported as hook_reloaded with an error.
    std::fs::write(hooks.root().join("good/handler.py"), "def handle(e, c)\n").unwrap();
    poll(T, "hook_reloaded with an error", || {
        serve
            .stdout_json()
            .iter()
            .any(|l| l["type"] == "hook_reloaded" && l["error"].is_string())
            .then_some(())
    });
    std::fs::remove_dir_all(hooks.root().join("raises")).unwrap();
    poll(T, "hook_unloaded", || {
        serve
            .stdout_json()
            .iter()
            .any(|l| l["type"] == "hook_unloaded")
            .then_some(())
    });
    poll(T, "worker_restart", || {
        serve
            .stdout_json()
            .iter()
            .any(|l| l["type"] == "worker_restart")
            .then_some(())
    });

    assert_eq!(serve.terminate(), Some(0));
    let lines = serve.stdout_json();
    let t = types(&lines);
    assert_eq!(t.first().map(String::as_str), Some("host_start"), "{t:?}");
    assert_eq!(t.last().map(String::as_str), Some("host_stop"), "{t:?}");
    for want in [
        "hook_loaded",
        "hook_skipped",
        "hook_reloaded",
        "hook_unloaded",
        "handler_error",
        "handler_timeout",
        "worker_restart",
        "queue_overflow",
    ] {
        assert!(t.iter().any(|x| x == want), "{want} missing from {t:?}");
    }
    for l in &lines {
        assert_eq!(l["v"], 1, "{l}");
        assert!(
            l["time"]
                .as_str()
                .is_some_and(|s| s.ends_with('Z') && s.contains('T')),
            "{l}"
        );
    }
    let start = &lines[0];
    assert!(
        start["listen"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    assert_eq!(start["pid"], serve.child.id());
    let skipped = lines.iter().find(|l| l["type"] == "hook_skipped").unwrap();
    assert_eq!(skipped["code"], "yaml_error");
    let err = lines
        .iter()
        .find(|l| l["type"] == "handler_error" && l["hook"] == "raises")
        .unwrap();
    assert_eq!(err["error"], "ValueError: boom");
    assert_eq!(err["event"], "command:boom");
    let timeout = lines
        .iter()
        .find(|l| l["type"] == "handler_timeout")
        .unwrap();
    assert_eq!(timeout["hook"], "hangs");
    assert_eq!(lines.last().unwrap()["exit_code"], 0);
    // The handler's print went to the log, not the stream.
    assert!(serve.log().contains("to the log, not stdout"));
}
