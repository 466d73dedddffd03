//! Issue 58: the operator's commands around the agent's events (`test --payload-file`,
//! `dashboard`/`plugin` and `plugins.enabled`, `list` of a config.yaml entry, `doctor` asking
//! Hermes's Python).

use serde_json::{Value, json};

use crate::agent_hooks::{run, run_with, script, test_seen};
use crate::util::{Hooks, Serve};

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

/// `plugins.enabled` of the test's config.yaml.
fn enabled(hooks: &Hooks) -> Vec<String> {
    let text = std::fs::read_to_string(hooks.home().join("config.yaml")).unwrap_or_default();
    let config: Value = serde_saphyr::from_str(&text).unwrap_or(Value::Null);
    config["plugins"]["enabled"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A Hooks tab as `dashboard install` wrote it before issue 58: under the agent plugin's name,
/// enabled by the one shared entry.
fn shared_tab(hooks: &Hooks) -> std::path::PathBuf {
    let dir = hooks.home().join("plugins/hermes-hooks");
    std::fs::create_dir_all(dir.join("dashboard")).unwrap();
    std::fs::write(
        dir.join("dashboard/manifest.json"),
        r#"{"name": "hermes-hooks"}"#,
    )
    .unwrap();
    std::fs::write(
        hooks.home().join("config.yaml"),
        "plugins:\n  enabled:\n  - hermes-hooks\n",
    )
    .unwrap();
    dir
}

/// Row 10: the Hooks tab and the agent plugin have an entry each in `plugins.enabled`, so
/// `dashboard uninstall` leaves the agent plugin (every `pre_tool_call` gate) on and says so,
/// and `plugin uninstall` leaves the tab on; a tab installed before under the shared name is
/// moved to its own entry by `dashboard install` and by `plugin uninstall` (which then removes
/// only the agent plugin's), and removed by `dashboard uninstall` without touching that entry.
/// On the old code `dashboard uninstall` removed `hermes-hooks`: the gates were off.
#[test]
fn the_tab_and_the_agent_plugin_are_enabled_and_removed_apart() {
    let hooks = Hooks::new();
    for args in [["plugin", "install"], ["dashboard", "install"]] {
        let (code, said) = run(&hooks, &args);
        assert_eq!(code, 0, "{said}");
    }
    assert_eq!(enabled(&hooks), ["hermes-hooks", "hermes-hooks-dashboard"]);
    let (code, said) = run(&hooks, &["dashboard", "uninstall"]);
    assert_eq!(code, 0, "{said}");
    assert_eq!(enabled(&hooks), ["hermes-hooks"], "{said}");
    assert!(
        said.contains("hermes-hooks stays in plugins.enabled"),
        "{said}"
    );
    let (code, said) = run(&hooks, &["dashboard", "install"]);
    assert_eq!(code, 0, "{said}");
    let (code, said) = run(&hooks, &["plugin", "uninstall"]);
    assert_eq!(code, 0, "{said}");
    assert_eq!(enabled(&hooks), ["hermes-hooks-dashboard"], "{said}");
    assert!(
        hooks
            .home()
            .join("plugins/hermes-hooks-dashboard/dashboard/manifest.json")
            .is_file()
    );

    // Installed before, under the shared name: what each command leaves enabled, and says.
    let cases: [(&[&str], &[&str], &str); 3] = [
        (
            &["plugin", "uninstall"],
            &["hermes-hooks-dashboard"],
            "shared hermes-hooks",
        ),
        (
            &["dashboard", "install"],
            &["hermes-hooks", "hermes-hooks-dashboard"],
            "hermes-hooks stays in plugins.enabled",
        ),
        (
            &["dashboard", "uninstall"],
            &["hermes-hooks"],
            "hermes-hooks stays in plugins.enabled",
        ),
    ];
    for (args, left, says) in cases {
        let hooks = Hooks::new();
        let old = shared_tab(&hooks);
        let (code, said) = run(&hooks, args);
        assert_eq!(code, 0, "{args:?}: {said}");
        assert_eq!(enabled(&hooks), left, "{args:?}: {said}");
        assert!(!old.exists() && said.contains(says), "{args:?}: {said}");
        let tab = hooks
            .home()
            .join("plugins/hermes-hooks-dashboard/dashboard/manifest.json");
        if left.contains(&"hermes-hooks-dashboard") {
            let manifest: Value = serde_json::from_slice(&std::fs::read(&tab).unwrap()).unwrap();
            assert_eq!(manifest["name"], "hermes-hooks-dashboard");
        }
    }
}

/// Row 8: `list`, `check`, `list --json` and `/v1/hooks` show an entry of config.yaml's `hooks:` block as
/// what it is: kind `shell`, its event, matcher and command as written, and no advice about
/// the hook directory the service made from it (its `HOOK.yaml`, `sched:`, `python:`). On the
/// old code it was kind `python`, the command only in the description, and the worker's line
/// said to leave `sched:` out of the made HOOK.yaml.
#[test]
fn list_shows_a_config_entry_as_written() {
    let hooks = Hooks::new();
    let gate = script(&hooks, "gate.sh", "#!/bin/sh\ncat >/dev/null\n");
    std::fs::write(
        hooks.home().join("config.yaml"),
        format!(
            "hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - command: {gate} --strict\n      \
             matcher: 'terminal|write_file'\n"
        ),
    )
    .unwrap();
    let written = json!({"event": "pre_tool_call", "matcher": "terminal|write_file",
                         "command": format!("{gate} --strict"), "timeout": 60, "index": 0});
    let (code, said) = run(&hooks, &["list"]);
    assert_eq!(code, 0, "{said}");
    let row = said
        .lines()
        .find(|l| l.starts_with("shell-"))
        .unwrap_or_default();
    assert!(row.split_whitespace().nth(1) == Some("shell"), "{said}");
    assert!(
        said.contains(&format!(
            "hooks.pre_tool_call[0] of config.yaml (matcher \"terminal|write_file\"): runs {gate} --strict"
        )),
        "{said}"
    );
    for advice in ["HOOK.yaml", "sched:", "python:"] {
        assert!(!said.contains(advice), "{advice} in {said}");
    }
    let (code, said) = run(&hooks, &["check"]);
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("(shell, pre_tool_call)\n        hooks.pre_tool_call[0] of config.yaml"),
        "{said}"
    );
    let (code, said) = run(&hooks, &["list", "--json"]);
    assert_eq!(code, 0, "{said}");
    let listed: Value = serde_json::from_str(&said).unwrap();
    let hook = &listed["hooks"][0];
    assert_eq!(
        (&hook["kind"], &hook["config_entry"]),
        (&json!("shell"), &written),
        "{said}"
    );
    assert_eq!(hook["config_entries"], json!([written]), "{said}");
    assert!(
        hook.get("worker").is_none() && hook.get("python").is_none(),
        "{said}"
    );

    let serve = Serve::start(&hooks, &[]);
    let (status, body) = serve.get("/v1/hooks");
    assert_eq!(status, 200, "{body}");
    let hook = &body["hooks"][0];
    assert_eq!(
        (&hook["kind"], &hook["config_entry"]),
        (&json!("shell"), &written),
        "{body}"
    );
}

/// Row 1: the entries of one command are one hook, and `list`, `check` and `list --json` show
/// each of them (on c592df0: a hook per entry).
#[test]
fn list_shows_each_entry_of_a_command() {
    let hooks = Hooks::new();
    let pet = script(&hooks, "pet.sh", "#!/bin/sh\ncat >/dev/null\n");
    std::fs::write(
        hooks.home().join("config.yaml"),
        format!(
            "hooks_auto_accept: true\nhooks:\n  on_session_start:\n    - command: {pet}\n  \
             pre_tool_call:\n    - {{command: {pet}, matcher: terminal}}\n"
        ),
    )
    .unwrap();
    let lines = [
        format!("hooks.on_session_start[0] of config.yaml: runs {pet}"),
        format!("hooks.pre_tool_call[0] of config.yaml (matcher \"terminal\"): runs {pet}"),
    ];
    for args in [&["list"][..], &["check"]] {
        let (code, said) = run(&hooks, args);
        assert_eq!(code, 0, "{said}");
        assert_eq!(said.matches("shell-").count(), 1, "one hook: {said}");
        for line in &lines {
            assert!(said.contains(line.as_str()), "{line} in {said}");
        }
    }
    let (_, said) = run(&hooks, &["list", "--json"]);
    let listed: Value = serde_json::from_str(&said).unwrap();
    let hook = &listed["hooks"][0];
    assert_eq!(
        hook["events"],
        json!(["on_session_start", "pre_tool_call"]),
        "{said}"
    );
    assert_eq!(
        hook["config_entries"].as_array().map(Vec::len),
        Some(2),
        "{said}"
    );
}

/// `doctor --no-run` with `bin_dir` first on `PATH` (where a `hermes` is): exit code and output.
fn doctor_with_hermes_in(hooks: &Hooks, bin_dir: &std::path::Path) -> (i32, String) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin_dir.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let nobody = hooks.tmp.path().join("nobody.sock").display().to_string();
    let path = std::env::join_paths(dirs).unwrap();
    run_with(hooks, &["doctor", "--no-run"], &nobody, path)
}

/// A fake Hermes install under `dir`: `bin/hermes`, a script whose `#!` names `bin/python`, a
/// launcher of this machine's Python without its site-packages and with `path` as its
/// `PYTHONPATH` (what that Python can import). The `bin` directory.
fn fake_hermes(dir: &std::path::Path, path: &[&std::path::Path]) -> std::path::PathBuf {
    let found = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let real = String::from_utf8_lossy(&found.stdout).trim().to_string();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let pythonpath: Vec<String> = path.iter().map(|p| p.display().to_string()).collect();
    let python = bin.join("python");
    std::fs::write(
        &python,
        format!(
            "#!/bin/sh\nPYTHONPATH='{}' exec '{real}' -S \"$@\"\n",
            pythonpath.join(":")
        ),
    )
    .unwrap();
    crate::util::set_mode(&python, 0o755);
    let hermes = bin.join("hermes");
    std::fs::write(
        &hermes,
        format!(
            "#!{}\nraise SystemExit('a stand-in for hermes')\n",
            python.display()
        ),
    )
    .unwrap();
    crate::util::set_mode(&hermes, 0o755);
    bin
}

/// Row 9: `doctor` asks the Python that runs `hermes` (found on `PATH`, by its `#!` line)
/// whether it imports the plugin and has its entry point, and gives the fix when not: without
/// the client it is a problem naming that Python and `-m pip install`; on its path but not
/// installed (no entry point), a problem too; installed, ok. On the old code doctor said
/// "0 problem(s)" in all three.
#[test]
fn doctor_asks_the_python_that_runs_hermes() {
    let hooks = Hooks::new();
    std::fs::write(
        hooks.home().join("config.yaml"),
        "plugins:\n  enabled: [hermes-hooks]\n",
    )
    .unwrap();
    // The client's package alone: clients/python itself may hold the egg-info of an editable
    // install (.ci/hermes-agent-venv.sh makes one), whose entry point would count.
    let client = hooks.tmp.path().join("client");
    std::fs::create_dir_all(&client).unwrap();
    std::os::unix::fs::symlink(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python/hermes_hooks"),
        client.join("hermes_hooks"),
    )
    .unwrap();
    // Installed: the package and its distribution's entry point (a dist-info of our own).
    let site = hooks.tmp.path().join("site");
    let info = site.join("hermes_hooks-0.0.0.dist-info");
    std::fs::create_dir_all(&info).unwrap();
    std::fs::write(
        info.join("METADATA"),
        "Metadata-Version: 2.1\nName: hermes-hooks\nVersion: 0.0.0\n",
    )
    .unwrap();
    std::fs::write(
        info.join("entry_points.txt"),
        "[hermes_agent.plugins]\nhermes-hooks = hermes_hooks.agent_plugin\n",
    )
    .unwrap();
    let cases: [(&str, Vec<&std::path::Path>, i32, &str); 3] = [
        ("none", vec![], 1, "cannot import hermes_hooks.agent_plugin"),
        ("path", vec![&client], 1, "has no entry point hermes-hooks"),
        (
            "installed",
            vec![&client, &site],
            0,
            "names hermes_hooks.agent_plugin",
        ),
    ];
    for (name, path, code, says) in cases {
        let bin = fake_hermes(&hooks.tmp.path().join(name), &path);
        let (got, said) = doctor_with_hermes_in(&hooks, &bin);
        assert_eq!(got, code, "{name}: {said}");
        assert!(said.contains(says), "{name}: {said}");
        let python = bin.join("python").display().to_string();
        assert!(
            said.contains(&format!("Hermes's Python ({python}")),
            "{name}: {said}"
        );
        if code == 1 {
            assert!(
                said.contains(&format!("`{python} -m pip install")),
                "{name}: {said}"
            );
        }
    }
}

/// Row 9 against the real hermes-agent (its venv as CI makes it, with the client installed):
/// its Python imports the plugin, has the entry point, and Hermes's own reader of
/// `plugins.enabled` is asked: a `plugins.disabled` entry, which wins in Hermes, is a problem.
#[testenv::needs(gateway_venv)]
#[test]
fn doctor_asks_the_real_hermes() {
    let venv = std::env::var_os("HERMES_AGENT_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .parent()
                .expect("the target directory")
                .join("hermes-agent-venv")
        });
    let hooks = Hooks::new();
    let config = hooks.home().join("config.yaml");
    std::fs::write(&config, "plugins:\n  enabled: [hermes-hooks]\n").unwrap();
    let (code, said) = doctor_with_hermes_in(&hooks, &venv.join("bin"));
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("imports hermes_hooks.agent_plugin"), "{said}");
    assert!(
        said.contains("Hermes's own reader lists hermes-hooks in plugins.enabled"),
        "{said}"
    );
    std::fs::write(
        &config,
        "plugins:\n  enabled: [hermes-hooks]\n  disabled: [hermes-hooks]\n",
    )
    .unwrap();
    let (code, said) = doctor_with_hermes_in(&hooks, &venv.join("bin"));
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains("`hermes plugins enable hermes-hooks`"),
        "{said}"
    );
}
