//! What the dashboard's Hooks tab stands on (issue 39): the service's review / enable / disable /
//! notices endpoints, and `hermes-hooks dashboard install|uninstall`. The tab itself is checked
//! in a real browser by `.ci/dashboard.sh`.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::util::{Hooks, Serve, bin, poll};

fn loaded(serve: &Serve) -> Vec<String> {
    let (status, body) = serve.get("/v1/hooks");
    assert_eq!(status, 200, "{body}");
    body["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_approval_through_the_api_covers_only_what_was_reviewed() {
    let hooks = Hooks::new();
    let code = "def handle(event, context):\n    return None\n";
    let dir = hooks.python("pending", r#"["agent:start"]"#, code);
    let serve = Serve::start(&hooks, &["--trust", "explicit", "--no-watch"]);
    let (_, list) = serve.get("/v1/hooks");
    assert_eq!(list["trust"], "explicit");
    assert_eq!(list["roots"], json!([hooks.root()]));
    assert_eq!(list["skipped"][0]["code"], "not_approved", "{list}");

    // The review names every file that can run, with its hash; it changes nothing.
    let (status, review) = serve.get("/v1/hooks/pending/review");
    assert_eq!(status, 200, "{review}");
    let sha = hex::encode(Sha256::digest(code.as_bytes()));
    assert_eq!(review["files"], json!({"handler.py": sha}), "{review}");
    assert_eq!(review["sha256"], sha);
    assert_eq!(review["approved"], Value::Null);
    assert!(loaded(&serve).is_empty());

    // The handler changes after the review: approving what was reviewed is refused.
    std::fs::write(dir.join("handler.py"), "def handle(e, c):\n    return 1\n").unwrap();
    let (status, body) = serve.post(
        "/v1/hooks/pending/enable",
        &json!({"reviewed": review["digest"]}),
    );
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("changed since they were reviewed"),
        "{body}"
    );
    assert!(
        loaded(&serve).is_empty(),
        "approved code that was not reviewed"
    );
    assert!(!hooks.home().join("hooks-trust.json").exists());

    // Reviewed again, approved: the hook runs after the reload the call makes.
    let (_, review) = serve.get("/v1/hooks/pending/review");
    let (status, body) = serve.post(
        "/v1/hooks/pending/enable",
        &json!({"reviewed": review["digest"]}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("approved pending"),
        "{body}"
    );
    poll(Duration::from_secs(60), "the approved hook to load", || {
        (loaded(&serve) == ["pending"]).then_some(())
    });

    // The live tail saw it load; `after` leaves out what was already read.
    let (status, tail) = serve.get("/v1/notices");
    assert_eq!(status, 200, "{tail}");
    let notices = tail["notices"].as_array().unwrap();
    let load = notices
        .iter()
        .find(|n| n["type"] == "hook_loaded" && n["hook"] == "pending")
        .unwrap_or_else(|| panic!("no hook_loaded notice in {tail}"));
    let last = tail["last"].as_u64().unwrap();
    assert!(load["seq"].as_u64().unwrap() <= last);
    let (_, later) = serve.get(&format!("/v1/notices?after={last}"));
    assert_eq!(later["notices"], json!([]), "{later}");

    // Disabled (the approval revoked): unloaded by the reload.
    let (status, body) = serve.post("/v1/hooks/pending/disable", &json!({}));
    assert_eq!(status, 200, "{body}");
    poll(
        Duration::from_secs(60),
        "the disabled hook to unload",
        || loaded(&serve).is_empty().then_some(()),
    );
    let (status, body) = serve.get("/v1/hooks/nope/review");
    assert_eq!(status, 404, "{body}");
}

fn dashboard(home: &std::path::Path, verb: &str) -> std::process::Output {
    Command::new(bin())
        .args(["dashboard", verb])
        .env("HERMES_HOME", home)
        .output()
        .expect("run hermes-hooks dashboard")
}

#[test]
fn dashboard_install_writes_the_plugin_and_enables_it_keeping_the_config() {
    let hooks = Hooks::new();
    let home = hooks.home();
    let config = home.join("config.yaml");
    let before = "# mine\nmodel:\n  default: m  # a comment\nplugins:\n  enabled:\n    - other\n  disabled: []\nlast: 1\n";
    std::fs::write(&config, before).unwrap();

    let out = dashboard(&home, "install");
    assert!(out.status.success(), "{out:?}");
    let plugin = home.join("plugins/hermes-hooks-dashboard/dashboard");
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("clients/python/hermes_hooks/dashboard_plugin");
    for file in [
        "manifest.json",
        "dist/index.js",
        "dist/style.css",
        "plugin_api.py",
    ] {
        assert!(
            std::fs::read(plugin.join(file)).unwrap() == std::fs::read(shipped.join(file)).unwrap(),
            "{file}: what `dashboard install` wrote is not the file in the wheel"
        );
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(plugin.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["name"], "hermes-hooks-dashboard");
    assert_eq!(manifest["tab"]["path"], "/hooks");
    let after = std::fs::read_to_string(&config).unwrap();
    assert_eq!(
        after,
        before.replace(
            "    - other\n",
            "    - other\n    - hermes-hooks-dashboard\n"
        )
    );
    // Twice is once.
    assert!(dashboard(&home, "install").status.success());
    assert_eq!(std::fs::read_to_string(&config).unwrap(), after);

    let out = dashboard(&home, "uninstall");
    assert!(out.status.success(), "{out:?}");
    assert!(!home.join("plugins/hermes-hooks-dashboard").exists());
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before);

    // A plugin the operator disabled stays disabled: install says so and changes nothing.
    let disabled = "plugins:\n  disabled: [hermes-hooks-dashboard]\n";
    std::fs::write(&config, disabled).unwrap();
    let out = dashboard(&home, "install");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("plugins.disabled"));
    assert_eq!(std::fs::read_to_string(&config).unwrap(), disabled);
    assert!(!home.join("plugins/hermes-hooks-dashboard").exists());
}
