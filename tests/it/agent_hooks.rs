//! Issue 49: the agent's events and the shell hooks of config.yaml, hosted by the service.
//!
//! A `HOOK.yaml` hook subscribes to Hermes's agent events by their Hermes names; the entries of
//! the `hooks:` block of `$HERMES_HOME/config.yaml` with consent run as hooks of the service,
//! with 0.19.0's stdin JSON, stdout reading, matcher and timeout. (The Hermes plugin that
//! forwards the events is tested in clients/python/tests/test_agent_plugin.py, and against the
//! real hermes-agent in tests/real_gateway.)

use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, bin, poll, set_mode};

/// What a tool call looks like as the plugin sends it (0.19.0's shell-hook stdin).
fn tool_call(tool: &str, command: &str, cwd: &str) -> Value {
    json!({
        "hook_event_name": "pre_tool_call",
        "tool_name": tool,
        "tool_input": {"command": command},
        "session_id": "s1",
        "cwd": cwd,
        "extra": {"task_id": "", "tool_call_id": "c1"},
    })
}

fn collect(serve: &Serve, event: &str, ctx: &Value) -> Value {
    let (status, body) = serve.post("/v1/collect", &json!({"event": event, "context": ctx}));
    assert_eq!(status, 200, "{body}");
    body
}

/// A script in the test's directory (mode 0755) that a config.yaml entry runs.
pub(crate) fn script(hooks: &Hooks, name: &str, body: &str) -> String {
    let path = hooks.tmp.path().join(name);
    std::fs::write(&path, body).unwrap();
    set_mode(&path, 0o755);
    path.display().to_string()
}

/// Issue 49, "Shell hooks from config.yaml": an entry with consent runs as a hook of the
/// service; its matcher (a full match of the tool name) and 0.19.0's two block shapes and
/// `{"context": ...}` are honoured; an observer's command runs once per event, with the
/// context on stdin, in the working directory of the process that sent the event (the
/// agent's, as Hermes runs it; issue 57 row 1: never the `cwd` the context says, which the
/// service overwrites with the sender's); an entry without consent is not hosted. On the
/// old code (d69d285) config.yaml was not read at all: no hook, no result.
#[test]
fn config_yaml_shell_hooks_run_as_hooks() {
    let hooks = Hooks::new();
    let out = hooks.out();
    let gate = script(
        &hooks,
        "gate.sh",
        "#!/bin/sh\ninput=$(cat)\ncase \"$input\" in *'rm -rf'*) \
         echo '{\"decision\": \"block\", \"reason\": \"no rm -rf here\"}';; esac\n",
    );
    let ctx = script(
        &hooks,
        "ctx.sh",
        "#!/bin/sh\ncat >/dev/null\necho '{\"context\": \"from config\"}'\nexit 3\n",
    );
    let seen = out.join("post.jsonl");
    let post = script(
        &hooks,
        "post.sh",
        &format!(
            "#!/bin/sh\n{{ cat; echo; }} >> {}\npwd >> {}.cwd\n",
            seen.display(),
            seen.display()
        ),
    );
    let never = script(&hooks, "never.sh", "#!/bin/sh\necho ran >> /dev/null\n");
    std::fs::write(
        hooks.home().join("config.yaml"),
        format!(
            "hooks:\n  pre_tool_call:\n    - {{command: {gate}, matcher: 'term.*'}}\n\
             \x20 pre_llm_call:\n    - {{command: {ctx}, timeout: 5}}\n\
             \x20 post_tool_call:\n    - {{command: {post}}}\n\
             \x20 on_session_end:\n    - {{command: {never}}}\n"
        ),
    )
    .unwrap();
    let approvals: Vec<Value> = [
        ("pre_tool_call", &gate),
        ("pre_llm_call", &ctx),
        ("post_tool_call", &post),
    ]
    .iter()
    .map(|(e, c)| json!({"event": e, "command": c}))
    .collect();
    std::fs::write(
        hooks.home().join("shell-hooks-allowlist.json"),
        json!({"approvals": approvals}).to_string(),
    )
    .unwrap();
    let serve = Serve::start(&hooks, &[]);
    let (_, listed) = serve.get("/v1/hooks");
    let names: Vec<&str> = listed["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["name"].as_str())
        .collect();
    assert_eq!(
        names.len(),
        3,
        "the entry without consent is not hosted: {names:?}"
    );
    assert!(names.iter().all(|n| n.starts_with("shell-")), "{names:?}");

    let cwd = hooks.tmp.path().display().to_string();
    let blocked = collect(
        &serve,
        "pre_tool_call",
        &tool_call("terminal", "rm -rf /", &cwd),
    );
    assert_eq!(
        blocked["results"][0]["result"],
        json!({"action": "block", "message": "no rm -rf here"}),
        "{blocked}"
    );
    // The matcher must match the whole name: `terminal2` matches `term.*`, `my_terminal` not.
    let other = collect(
        &serve,
        "pre_tool_call",
        &tool_call("my_terminal", "rm -rf /", &cwd),
    );
    assert_eq!(other["results"], json!([]), "{other}");
    // A non-zero exit is logged, its stdout still counts.
    let context = collect(
        &serve,
        "pre_llm_call",
        &json!({"hook_event_name": "pre_llm_call", "extra": {}}),
    );
    assert_eq!(
        context["results"][0]["result"],
        json!({"context": "from config"}),
        "{context}"
    );

    let mut call = tool_call("terminal", "ls", &cwd);
    call["hook_event_name"] = json!("post_tool_call");
    let (status, _) = serve.post(
        "/v1/events",
        &json!({"event": "post_tool_call", "context": call}),
    );
    assert_eq!(status, 202);
    let lines = poll(Duration::from_secs(20), "the post_tool_call script", || {
        let text = std::fs::read_to_string(&seen).ok()?;
        text.ends_with('\n').then_some(text)
    });
    std::thread::sleep(Duration::from_millis(300)); // a second run would have written by now
    let text = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(text, lines);
    let got: Value = serde_json::from_str(text.trim()).unwrap();
    // The sender is this test process: its directory, whatever the context said.
    let here = std::env::current_dir().unwrap();
    let mut expected = call.clone();
    expected["cwd"] = json!(here.display().to_string());
    assert_eq!(
        got, expected,
        "the context reaches the command on stdin as sent, with the sender's own cwd"
    );
    let ran_in = poll(
        Duration::from_secs(20),
        "the script's working directory",
        || {
            std::fs::read_to_string(format!("{}.cwd", seen.display()))
                .ok()
                .filter(|t| t.ends_with('\n'))
        },
    );
    assert_eq!(
        ran_in.trim(),
        std::fs::canonicalize(&here).unwrap().display().to_string(),
        "the command ran where the sender stands, not in the context's {cwd}"
    );
}

/// `hooks_auto_accept: true` (and `HERMES_ACCEPT_HOOKS`) accept every entry, as upstream;
/// `check` lists the hosted entries with the other hooks, and a misspelt event is named.
#[test]
fn auto_accept_and_check() {
    let hooks = Hooks::new();
    let gate = script(&hooks, "gate.sh", "#!/bin/sh\ncat >/dev/null\n");
    std::fs::write(
        hooks.home().join("config.yaml"),
        format!("hooks:\n  pre_tool_call:\n    - command: {gate}\n  pre_tool_cal:\n    - command: {gate}\n"),
    )
    .unwrap();
    let check = |env: Option<(&str, &str)>, auto: bool| {
        if auto {
            std::fs::write(
                hooks.home().join("config.yaml"),
                format!(
                    "hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - command: {gate}\n"
                ),
            )
            .unwrap();
        }
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["check", "--config-hooks", "--hooks-dir"])
            .arg(hooks.root())
            .env("HERMES_HOME", hooks.home())
            .env_remove("HERMES_ACCEPT_HOOKS");
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let hosted = "(shell, pre_tool_call)\n        hooks.pre_tool_call[0] of config.yaml";
    let none = check(None, false);
    assert!(!none.contains(hosted), "{none}");
    let by_env = check(Some(("HERMES_ACCEPT_HOOKS", "1")), false);
    assert!(by_env.contains(hosted), "{by_env}");
    assert!(
        by_env.contains("did you mean \"pre_tool_call\""),
        "{by_env}"
    );
    let by_config = check(None, true);
    assert!(by_config.contains(hosted), "{by_config}");
}

/// Issue 49, "The agent's events for hooks hosted here": a HOOK.yaml hook on `pre_tool_call`
/// (and `pre_*`) answers a collect; `check` knows the agent's names (no "matches no known
/// event" warning for them, a did-you-mean for a near miss).
#[test]
fn hook_yaml_hooks_take_agent_events() {
    let hooks = Hooks::new();
    hooks.python(
        "gate",
        "[\"pre_tool_call\"]",
        "def handle(event, ctx):\n    if 'rm' in ctx['tool_input']['command']:\n        return {'action': 'block', 'message': 'no'}\n",
    );
    hooks.python(
        "all-pre",
        "[\"pre_*\"]",
        "def handle(event, ctx):\n    return {'context': event}\n",
    );
    hooks.python(
        "typo",
        "[\"pre_tool_cal\"]",
        "def handle(event, ctx):\n    return None\n",
    );
    let out = std::process::Command::new(bin())
        .args(["check", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("did you mean \"pre_tool_call\""), "{said}");
    assert!(!said.contains("\"pre_*\" matches no known"), "{said}");
    let serve = Serve::start(&hooks, &[]);
    let got = collect(&serve, "pre_tool_call", &tool_call("terminal", "rm x", "/"));
    assert_eq!(
        got["results"],
        json!([
            {"hook": "gate", "result": {"action": "block", "message": "no"}},
            {"hook": "all-pre", "result": {"context": "pre_tool_call"}}
        ]),
        "{got}"
    );
}

pub(crate) fn run(hooks: &Hooks, args: &[&str]) -> (i32, String) {
    let nobody = hooks.tmp.path().join("nobody.sock");
    run_at(hooks, args, &nobody.display().to_string())
}

/// `run`, with the service at `address` (`HERMES_HOOKS_ADDRESS`).
pub(crate) fn run_at(hooks: &Hooks, args: &[&str], address: &str) -> (i32, String) {
    run_with(
        hooks,
        args,
        address,
        std::env::var_os("PATH").unwrap_or_default(),
    )
}

/// `run_at`, with `path` as `PATH`.
pub(crate) fn run_with(
    hooks: &Hooks,
    args: &[&str],
    address: &str,
    path: std::ffi::OsString,
) -> (i32, String) {
    let out = std::process::Command::new(bin())
        .args(args)
        .env("HERMES_HOME", hooks.home())
        .env("PATH", path)
        .env("HERMES_HOOKS_ADDRESS", address)
        .env_remove("HERMES_ACCEPT_HOOKS")
        .env_remove("HERMES_HOOKS_TOKEN")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// `test pre_tool_call --hook seen --payload-file F --json` (F holding `payload`) with `more`
/// arguments, on the test's hook root: the exit code and the output.
pub(crate) fn test_seen(hooks: &Hooks, payload: &str, more: &[&str]) -> (i32, String) {
    let file = hooks.tmp.path().join("payload.json");
    std::fs::write(&file, payload).unwrap();
    let root = hooks.root().display().to_string();
    let file = file.display().to_string();
    let mut args = vec![
        "test",
        "pre_tool_call",
        "--hooks-dir",
        &root,
        "--hook",
        "seen",
        "--payload-file",
        &file,
        "--json",
    ];
    args.extend_from_slice(more);
    run(hooks, &args)
}

/// Issue 49, "Operators": `plugin install` enables the Hermes plugin in config.yaml (and keeps
/// the rest of the file); `doctor` checks what `hermes hooks doctor` checks (the script, consent,
/// a run on a sample call only with consent) plus the plugin; `test EVENT --for-tool NAME
/// --payload-file F` makes the context of an agent call as the plugin makes it.
#[test]
fn operators_plugin_doctor_and_test() {
    let hooks = Hooks::new();
    let ran = hooks.out().join("ran");
    let good = script(
        &hooks,
        "good.sh",
        &format!(
            "#!/bin/sh\ncat >> {}\necho '{{\"context\": \"x\"}}'\n",
            ran.display()
        ),
    );
    let missing = hooks.tmp.path().join("missing.sh").display().to_string();
    let config = hooks.home().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "# mine\nhooks:\n  pre_llm_call:\n    - command: {good}\n  post_tool_call:\n    - command: {missing}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        hooks.home().join("shell-hooks-allowlist.json"),
        json!({"approvals": [{"event": "pre_llm_call", "command": good, "approved_at": "2026-01-01T00:00:00Z"}]})
            .to_string(),
    )
    .unwrap();
    let (code, said) = run(&hooks, &["doctor"]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("not in plugins.enabled"), "{said}");
    assert!(said.contains("approved 2026-01-01T00:00:00Z"), "{said}");
    assert!(
        said.contains("answered JSON on a sample call (exit 0)"),
        "{said}"
    );
    assert!(
        said.contains("missing.sh is missing or cannot run"),
        "{said}"
    );
    assert!(said.contains("no consent"), "{said}");
    // Only the approved script ran, once, with the context on stdin.
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&ran).unwrap()).unwrap();
    assert_eq!(seen["hook_event_name"], "pre_llm_call");

    let (code, said) = run(&hooks, &["plugin", "install"]);
    assert_eq!(code, 0, "{said}");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.starts_with("# mine\nhooks:"), "{text}");
    assert!(
        text.contains("plugins:\n  enabled:\n  - hermes-hooks"),
        "{text}"
    );
    let (_, said) = run(&hooks, &["doctor"]);
    assert!(
        said.contains("ok      the Hermes plugin is in plugins.enabled"),
        "{said}"
    );

    hooks.python(
        "seen",
        "[\"pre_tool_call\"]",
        "def handle(event, ctx):\n    return {'tool': ctx['tool_name'], 'input': ctx['tool_input'], 'extra': ctx['extra']}\n",
    );
    let (code, said) = test_seen(
        &hooks,
        r#"{"args": {"path": "/etc/passwd"}, "task_id": "t9"}"#,
        &["--for-tool", "read_file"],
    );
    assert_eq!(code, 0, "{said}");
    let line: Value = serde_json::from_str(said.lines().next().unwrap()).unwrap();
    assert_eq!(
        line["result"],
        json!({"tool": "read_file", "input": {"path": "/etc/passwd"},
               "extra": {"tool_call_id": "test-call", "task_id": "t9"}}),
        "{said}"
    );
    let root = hooks.root().display().to_string();
    let (code, said) = run(
        &hooks,
        &[
            "test",
            "agent:start",
            "--hooks-dir",
            &root,
            "--for-tool",
            "x",
        ],
    );
    assert_eq!(code, 2, "{said}");
}

/// Issue 49: a config.yaml entry may carry this project's `sandbox:`; the command it runs is
/// held to it (here: it may run programs and read its directory, not write beside it), and
/// `check` shows it. Listed as ignored on a kernel without Landlock ABI 4 (crates/testenv).
#[testenv::needs(landlock4)]
#[test]
fn a_config_yaml_entry_runs_in_its_sandbox() {
    let hooks = Hooks::new();
    let dir = hooks.tmp.path().display().to_string();
    let outside = hooks.tmp.path().join("outside");
    let probe = script(
        &hooks,
        "probe.sh",
        &format!(
            "#!/bin/sh\ncat >/dev/null\nif echo x > {} 2>/dev/null; then w=wrote; else w=denied; fi\n\
             echo \"{{\\\"context\\\": \\\"$w\\\"}}\"\n",
            outside.display()
        ),
    );
    std::fs::write(
        hooks.home().join("config.yaml"),
        format!(
            "hooks_auto_accept: true\nhooks:\n  pre_llm_call:\n    - command: {probe}\n      \
             sandbox: {{exec: true, read: [\"{dir}\"]}}\n"
        ),
    )
    .unwrap();
    let root = hooks.root().display().to_string();
    let (code, said) = run(&hooks, &["check", "--config-hooks", "--hooks-dir", &root]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("exec:    yes"), "{said}");
    let (code, said) = run(
        &hooks,
        &[
            "test",
            "pre_llm_call",
            "--hooks-dir",
            &root,
            "--payload-file",
            "/dev/null",
        ],
    );
    assert_eq!(
        code, 2,
        "an empty payload file is not a JSON object: {said}"
    );
    let payload = hooks.tmp.path().join("p.json");
    std::fs::write(&payload, "{}").unwrap();
    let (code, said) = run(
        &hooks,
        &[
            "test",
            "pre_llm_call",
            "--hooks-dir",
            &root,
            "--payload-file",
            &payload.display().to_string(),
            "--json",
        ],
    );
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(r#""result":{"context":"denied"}"#), "{said}");
    assert!(!outside.exists());
}

/// Issue 49, consent carries over under `--trust explicit`, and the service follows config.yaml
/// by itself: an entry in `shell-hooks-allowlist.json` is approved when its hook is first
/// written and runs without `enable`; one accepted only by `hooks_auto_accept` follows the
/// trust mode (refused until approved); an entry added to config.yaml while the service runs
/// is hosted without a reload (the watcher sees config.yaml and the allowlist); a hook the
/// operator then disables (its approval revoked) is not approved again by the next scan.
#[test]
fn consent_carries_over_under_explicit_trust_and_config_edits_are_seen() {
    let hooks = Hooks::new();
    let gate = script(&hooks, "gate.sh", "#!/bin/sh\ncat >/dev/null\n");
    let other = script(&hooks, "other.sh", "#!/bin/sh\ncat >/dev/null\n");
    let late = script(&hooks, "late.sh", "#!/bin/sh\ncat >/dev/null\n");
    let config = hooks.home().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - {{command: {gate}}}\n\
             \x20 post_tool_call:\n    - {{command: {other}}}\n"
        ),
    )
    .unwrap();
    let allow = |pairs: &[(&str, &str)]| {
        let approvals: Vec<Value> = pairs
            .iter()
            .map(|(e, c)| json!({"event": e, "command": c}))
            .collect();
        std::fs::write(
            hooks.home().join("shell-hooks-allowlist.json"),
            json!({"approvals": approvals}).to_string(),
        )
        .unwrap();
    };
    allow(&[("pre_tool_call", &gate)]);
    let serve = Serve::start(&hooks, &["--trust", "explicit"]);
    let state = |event: &str| -> (bool, bool) {
        let (_, v) = serve.get("/v1/hooks");
        let has = |key: &str| {
            v[key]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| on_event(h, event))
        };
        (has("hooks"), has("skipped"))
    };
    assert_eq!(
        state("pre_tool_call"),
        (true, false),
        "allowlisted: approved"
    );
    assert_eq!(
        state("post_tool_call"),
        (false, true),
        "auto-accepted only: follows the trust mode"
    );
    // Edited while it runs: a new allowlisted entry is hosted without a reload.
    std::fs::write(
        &config,
        format!(
            "hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - {{command: {gate}}}\n\
             \x20 post_tool_call:\n    - {{command: {other}}}\n\
             \x20 on_session_end:\n    - {{command: {late}}}\n"
        ),
    )
    .unwrap();
    allow(&[("pre_tool_call", &gate), ("on_session_end", &late)]);
    poll(Duration::from_secs(30), "the new entry hosted", || {
        (state("on_session_end") == (true, false)).then_some(())
    });
    // Disabled by the operator: its approval is revoked and stays so.
    let name = {
        let (_, v) = serve.get("/v1/hooks");
        v["hooks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| on_event(h, "pre_tool_call"))
            .and_then(|h| h["name"].as_str())
            .unwrap()
            .to_string()
    };
    let (status, v) = serve.post(&format!("/v1/hooks/{name}/disable"), &json!({}));
    assert_eq!(status, 200, "{v}");
    let (status, _) = serve.post("/v1/reload", &json!({}));
    assert_eq!(status, 200);
    assert_eq!(
        state("pre_tool_call"),
        (false, true),
        "revoked stays revoked"
    );
}

/// Issue 49: the agent's events reach the service only, so a hook that runs inside the gateway
/// and asks for one is told so by `check` (a warning naming the event and `runs: service`).
#[test]
fn a_gateway_placed_hook_asking_for_agent_events_is_warned() {
    let hooks = Hooks::new();
    hooks.add(
        "ingw",
        &[
            (
                "HOOK.yaml",
                "name: ingw\nevents: [\"pre_tool_call\", \"agent:start\"]\nruns: gateway\n",
            ),
            (
                "handler.py",
                "def handle(event, context):\n    return None\n",
            ),
        ],
    );
    let (_, said) = run(
        &hooks,
        &["check", "--hooks-dir", &hooks.root().display().to_string()],
    );
    assert!(
        said.contains("takes the agent's `pre_tool_call`, but the hook runs inside the gateway")
            && said.contains("runs: service"),
        "{said}"
    );
}

/// Issue 49, bad input: a config.yaml that is not YAML, an entry without a command and an event
/// Hermes does not have are each named by `check` (file, key, why), and the hooks of the hook
/// roots still load.
#[test]
fn a_broken_hooks_block_is_named_and_loses_nothing() {
    let hooks = Hooks::new();
    hooks.python(
        "fine",
        "[\"agent:start\"]",
        "def handle(event, context):\n    return None\n",
    );
    let config = hooks.home().join("config.yaml");
    let root = hooks.root().display().to_string();
    std::fs::write(&config, "hooks:\n  pre_tool_call: [\n").unwrap();
    let (_, said) = run(&hooks, &["check", "--config-hooks", "--hooks-dir", &root]);
    assert!(
        said.contains("config.yaml is not YAML") && said.contains("unclosed bracket"),
        "{said}"
    );
    assert!(said.contains("1 hook(s) ok"), "{said}");
    std::fs::write(
        &config,
        "hooks:\n  pre_tool_call:\n    - {matcher: x}\n  not_an_event:\n    - {command: a.sh}\n",
    )
    .unwrap();
    let (_, said) = run(&hooks, &["check", "--config-hooks", "--hooks-dir", &root]);
    assert!(
        said.contains("hooks.pre_tool_call[0] has no command; skipped")
            && said.contains("hooks.not_an_event: not an event of Hermes's agent, skipped"),
        "{said}"
    );
    assert!(said.contains("1 hook(s) ok"), "{said}");
}

/// Issue 60 row 7: `check` knows the commands hermes-agent 0.19.0's gateway emits
/// (`command:status`, `command:stop`, `command:model`: no "matches no known gateway event"),
/// says that `command:reset` never fires (0.19.0 emits `/reset` as `command:new`), and checks
/// only the root it is given: config.yaml's shell hooks (`$HERMES_HOME/config-hooks`) are left
/// out, and said to be, unless `--config-hooks` asks for them. On 44db861 the three commands
/// were "custom events" and `check --hooks-dir DIR` counted the config hook as one of DIR's.
#[test]
fn check_knows_the_gateways_commands_and_checks_the_root_given() {
    let hooks = Hooks::new();
    let code = "def handle(event, ctx):\n    return None\n";
    hooks.python(
        "cmds",
        "[\"command:status\", \"command:stop\", \"command:model\"]",
        code,
    );
    hooks.python("old-reset", "[\"command:reset\"]", code);
    hooks.python("mine", "[\"command:deploy\"]", code);
    let gate = script(&hooks, "gate.sh", "#!/bin/sh\ncat >/dev/null\n");
    std::fs::write(
        hooks.home().join("config.yaml"),
        format!("hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - command: {gate}\n"),
    )
    .unwrap();
    let root = hooks.root().display().to_string();
    let (code, said) = run(&hooks, &["check", "--hooks-dir", &root]);
    assert_eq!(code, 0, "{said}");
    for known in ["command:status", "command:stop", "command:model"] {
        assert!(!said.contains(&format!("{known:?} ")), "{said}");
    }
    assert!(
        said.contains("\"command:reset\" never fires: /reset is another name of /new"),
        "{said}"
    );
    assert!(
        said.contains("\"command:deploy\" is not a built-in command of hermes-agent 0.19.0 (fine for a plugin's command)"),
        "{said}"
    );
    assert!(!said.contains("(shell, pre_tool_call)"), "{said}");
    assert!(
        said.contains("its 1 shell hook(s) are not checked here (a --hooks-dir was given)"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "3 hook(s) ok, 0 problem(s), 2 warning(s) in {root}\n"
        )),
        "{said}"
    );

    let (code, said) = run(&hooks, &["check", "--config-hooks", "--hooks-dir", &root]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("(shell, pre_tool_call)"), "{said}");
    assert!(said.contains("4 hook(s) ok"), "{said}");
}

/// `doctor` against the service at `addr`, its consent from the test's files only.
fn doctor_at(hooks: &Hooks, addr: &str, extra: &[&str]) -> (i32, String) {
    let args: Vec<&str> = ["doctor"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    run_at(hooks, &args, &format!("http://{addr}"))
}

/// config.yaml with one entry, `command` on `event`, and its consent in the allowlist.
fn allowlisted_entry(hooks: &Hooks, event: &str, command: &str) {
    std::fs::write(
        hooks.home().join("config.yaml"),
        format!("hooks:\n  {event}:\n    - command: {command}\n"),
    )
    .unwrap();
    std::fs::write(
        hooks.home().join("shell-hooks-allowlist.json"),
        json!({"approvals": [{"event": event, "command": command}]}).to_string(),
    )
    .unwrap();
}

/// Whether `h` (of `/v1/hooks`' hooks or skipped) is a hook made from config.yaml that runs on
/// `event` (one per command, named `shell-DIGEST`, issue 58 row 1).
pub(crate) fn on_event(h: &Value, event: &str) -> bool {
    h["name"].as_str().is_some_and(|n| n.starts_with("shell-"))
        && h["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e == event))
}

/// The name of the hook made from config.yaml's (one) entry on `event`, as `/v1/hooks` lists
/// it among the hooks or the skipped.
fn config_hook_name(serve: &Serve, event: &str) -> String {
    let (_, v) = serve.get("/v1/hooks");
    ["hooks", "skipped"]
        .iter()
        .flat_map(|k| v[*k].as_array().cloned().unwrap_or_default())
        .find(|h| on_event(h, event))
        .and_then(|h| h["name"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no hook for {event}: {v}"))
}

/// Issue 60 row 3: under `--trust explicit` a config.yaml hook the service lists as
/// `not_approved` gets "not approved: run `hermes-hooks enable NAME --trust explicit`" from
/// `doctor` (on 44db861: "the service does not list it: reload it", and reloading changed
/// nothing); an allowlisted entry first written while the service ran with `--trust all` is
/// refused after the switch, and `doctor` says why; once enabled it is hosted.
#[test]
fn doctor_under_explicit_trust_says_how_to_approve_a_config_hook() {
    let hooks = Hooks::new();
    let gate = script(&hooks, "gate.sh", "#!/bin/sh\ncat >/dev/null\n");
    let config = hooks.home().join("config.yaml");
    std::fs::write(
        &config,
        format!("hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - command: {gate}\n"),
    )
    .unwrap();
    let serve = Serve::start(&hooks, &["--trust", "explicit"]);
    let name = config_hook_name(&serve, "pre_tool_call");
    let (code, said) = doctor_at(&hooks, &serve.addr, &["--no-run"]);
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains(&format!(
            "problem not approved (the service runs with --trust explicit): run `hermes-hooks \
             enable {name} --trust explicit`"
        )),
        "{said}"
    );
    assert!(!said.contains("reload it"), "{said}");
    assert!(!said.contains("written before"), "{said}");
    drop(serve);

    // Allowlisted, first written under --trust all, then the service switched to explicit.
    allowlisted_entry(&hooks, "post_tool_call", &gate);
    let serve = Serve::start(&hooks, &[]);
    let name = config_hook_name(&serve, "post_tool_call");
    drop(serve);
    let serve = Serve::start(&hooks, &["--trust", "explicit"]);
    let (code, said) = doctor_at(&hooks, &serve.addr, &["--no-run"]);
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains(&format!(
            "run `hermes-hooks enable {name} --trust explicit`"
        )) && said.contains("this one was written before, under --trust all"),
        "{said}"
    );
    let (code, out) = run(&hooks, &["enable", &name, "--trust", "explicit"]);
    assert_eq!(code, 0, "{out}");
    poll(Duration::from_secs(30), "the enabled hook hosted", || {
        serve.post("/v1/reload", &json!({}));
        let (_, said) = doctor_at(&hooks, &serve.addr, &["--no-run"]);
        said.contains(&format!("ok      hosted as {name}"))
            .then_some(())
    });
}

/// Issue 60 row 8: `doctor` says before it runs a shell hook on a sample call (a hook that
/// posts somewhere posts), and `--no-run` runs none (on 44db861 it ran each one unannounced,
/// with no way not to).
#[test]
fn doctor_says_before_it_runs_a_hook_and_no_run_runs_none() {
    let hooks = Hooks::new();
    let ran = hooks.out().join("ran");
    let hook = script(
        &hooks,
        "post.sh",
        &format!("#!/bin/sh\ncat >> {}\n", ran.display()),
    );
    allowlisted_entry(&hooks, "pre_llm_call", &hook);
    // No service: the run does not need one.
    let nobody = "127.0.0.1:9";
    let (_, said) = doctor_at(&hooks, nobody, &[]);
    let announced = said
        .find("running it once on a sample call of pre_llm_call")
        .unwrap_or_else(|| panic!("not announced: {said}"));
    let result = said
        .find("ran on a sample call (exit 0)")
        .unwrap_or_else(|| panic!("not run: {said}"));
    assert!(announced < result, "said after it ran: {said}");
    assert!(ran.exists(), "{said}");
    std::fs::remove_file(&ran).unwrap();

    let (_, said) = doctor_at(&hooks, nobody, &["--no-run"]);
    assert!(
        said.contains("skip    not run on a sample call (--no-run)"),
        "{said}"
    );
    assert!(!said.contains("running it once"), "{said}");
    assert!(!ran.exists(), "--no-run ran the hook: {said}");
}
