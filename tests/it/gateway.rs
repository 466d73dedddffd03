//! Real hooks work unchanged (issue 10): the gateway's interpreter, hook logging, in-gateway
//! placement, and the gateway-side suite (`tests/gateway/test_in_gateway.py`: the fixtures under
//! `tests/gateway/hooks` driven through `clients/python` by a gateway-like script).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, bin, poll, set_mode};

const T: Duration = Duration::from_secs(30);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway")
}

/// Copies the fixture hook `name` into the hook root.
fn copy_fixture(hooks: &Hooks, name: &str) -> PathBuf {
    let src = fixtures().join("hooks").join(name);
    let dst = hooks.root().join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
        set_mode(&dst.join(entry.file_name()), 0o644);
    }
    dst
}

/// A fake `$HERMES_HOME/hermes-agent/venv/bin/python`: python3 with the fixture's `site/` (where
/// `venv_only_pkg` lives) on its path.
fn fake_venv(hooks: &Hooks) -> PathBuf {
    let python = hooks.home().join("hermes-agent/venv/bin/python");
    std::fs::create_dir_all(python.parent().unwrap()).unwrap();
    let site = fixtures().join("fake_venv/site");
    std::fs::write(
        &python,
        format!(
            "#!/bin/sh\nPYTHONPATH={}${{PYTHONPATH:+:$PYTHONPATH}} exec python3 \"$@\"\n",
            site.display()
        ),
    )
    .unwrap();
    set_mode(&python, 0o755);
    python
}

fn run(hooks: &Hooks, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .arg("--hooks-dir")
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .env_remove("HERMES_HOOKS_PYTHON")
        .env_remove("HERMES_HOOKS_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run hermes-hooks")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn gateway_side_suite_passes_against_the_real_service() {
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests/gateway", "-v"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HERMES_HOOKS_BIN", bin())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gateway-side tests failed:\n{stderr}");
    let ran = crate::util::unittest_ran(&stderr);
    assert!(ran >= 13, "only {ran} gateway-side tests ran:\n{stderr}");
    assert!(!stderr.contains("skipped"), "tests were skipped:\n{stderr}");
}

#[test]
fn the_gateway_venv_is_chosen_when_present_and_a_missing_module_says_how_to_pick() {
    let hooks = Hooks::new();
    copy_fixture(&hooks, "venv-only");

    // No venv: plain python3 lacks the package; the reason names the interpreter and the fix.
    let o = run(&hooks, &["check"], &[]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("ModuleNotFoundError"), "{out}");
    assert!(
        out.contains("interpreter python3 (default:") && out.contains("HERMES_HOOKS_PYTHON"),
        "expected the interpreter and how to pick another in:\n{out}"
    );

    // The installer's layout: $HERMES_HOME/hermes-agent/venv/bin/python is used.
    let venv = fake_venv(&hooks);
    let o = run(&hooks, &["check"], &[]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains(&format!(
            "interpreter {} (the gateway's venv",
            venv.display()
        )),
        "check should name the venv interpreter and why:\n{out}"
    );
    let serve = Serve::start(&hooks, &[]);
    let (status, body) = serve.post(
        "/v1/collect",
        &json!({"event": "command:where", "timeout_ms": 20000}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["result"],
        json!({"where": "the gateway venv"})
    );
    let (_, hook) = serve.get("/v1/hooks/venv-only");
    assert_eq!(hook["python"]["path"], json!(venv.display().to_string()));
    assert!(
        hook["python"]["why"]
            .as_str()
            .unwrap_or("")
            .contains("venv"),
        "{hook}"
    );
    drop(serve);

    // $HERMES_HOOKS_PYTHON comes before the venv, and is named in the reason.
    let o = run(&hooks, &["check"], &[("HERMES_HOOKS_PYTHON", "python3")]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("interpreter python3 ($HERMES_HOOKS_PYTHON)"),
        "{out}"
    );
}

#[test]
fn hook_logging_reaches_the_service_log_tagged_with_hook_level_and_logger() {
    let hooks = Hooks::new();
    copy_fixture(&hooks, "chatty");
    hooks.add(
        "own-logging",
        &[
            ("HOOK.yaml", "events: [command:own]\n"),
            (
                "handler.py",
                "import logging\nlogging.basicConfig(level=logging.DEBUG, format='OWN %(levelname)s %(message)s')\n\
                 def handle(e, c):\n    logging.getLogger('mine').debug('kept my format')\n",
            ),
        ],
    );
    let serve = Serve::start(&hooks, &[]);
    for event in ["command:chat", "command:own"] {
        let (status, body) =
            serve.post("/v1/collect", &json!({"event": event, "timeout_ms": 20000}));
        assert_eq!(status, 200, "{body}");
    }
    let log = poll(T, "the hooks' log lines", || {
        let log = serve.log();
        (log.contains("a library speaks") && log.contains("OWN DEBUG kept my format"))
            .then_some(log)
    });
    let line = |needle: &str| {
        log.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no log line with {needle:?} in:\n{log}"))
            .to_string()
    };
    let warning = line("warning line for command:chat");
    assert!(
        warning.contains("WARN")
            && warning.contains("chatty")
            && warning.contains("hermes_hook_chatty")
            && warning.contains("WARNING"),
        "a WARNING record is a warning line with hook, level and logger: {warning}"
    );
    let info = line("info line for command:chat");
    assert!(info.contains("INFO") && info.contains("chatty"), "{info}");
    assert!(line("chatty imported").contains("INFO"));
    assert!(line("a library speaks").contains("some.library"));
    assert!(
        !log.contains("debug line that stays hidden"),
        "DEBUG is below the runner's level:\n{log}"
    );
    drop(serve);

    // HERMES_HOOKS_LOG decides what shows: at `warn`, the INFO records are filtered out.
    let o = run(
        &hooks,
        &["test", "command:chat"],
        &[("HERMES_HOOKS_LOG", "warn")],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(err.contains("warning line for command:chat"), "{err}");
    assert!(!err.contains("info line for command:chat"), "{err}");
}

#[test]
fn in_gateway_hooks_are_listed_with_placement_and_get_no_worker() {
    let hooks = Hooks::new();
    let dir = copy_fixture(&hooks, "stamp-outgoing");
    copy_fixture(&hooks, "chatty");
    let serve = Serve::start(&hooks, &[]);
    let (_, list) = serve.get("/v1/hooks");
    let by_name = |n: &str| -> Value {
        list["hooks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n} not listed: {list}"))
    };
    let stamp = by_name("stamp-outgoing");
    assert_eq!(stamp["runs"], "gateway", "{stamp}");
    assert_eq!(stamp["why"], "imports gateway.platforms.base at line 5");
    assert_eq!(stamp["status"], "in_gateway");
    assert_eq!(stamp["events"], json!(["gateway:startup"]));
    let handler = dir.join("handler.py");
    assert_eq!(stamp["handler"], json!(handler.display().to_string()));
    use sha2::Digest;
    let digest = sha2::Sha256::digest(std::fs::read(&handler).unwrap());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(stamp["sha256"], json!(hex));
    let chatty = by_name("chatty");
    assert_eq!(chatty["runs"], "service");
    assert_eq!(
        chatty["why"],
        "its Python source imports none of the gateway's modules"
    );

    // No worker: emit queues nothing for it and no runner process serves its directory.
    let (_, queued) = serve.post("/v1/events", &json!({"event": "gateway:startup"}));
    assert_eq!(queued["queued"], 0, "{queued}");
    let dir_text = dir.display().to_string();
    let workers: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("runner-") && c.contains(&dir_text))
        .collect();
    assert!(
        workers.is_empty(),
        "no worker expected for an in-gateway hook: {workers:?}"
    );
}

#[test]
fn cli_shows_placement_and_test_does_not_pretend_to_run_in_gateway_hooks() {
    let hooks = Hooks::new();
    copy_fixture(&hooks, "stamp-outgoing");
    let o = run(&hooks, &["check"], &[]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("runs in the gateway: imports gateway.platforms.base at line 5"),
        "{out}"
    );
    // Published hooks' own keys are informational notes, not warnings.
    for key in ["version", "author", "platforms"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("note") && l.contains(&format!("`{key}`"))),
            "note about {key} expected:\n{out}"
        );
    }
    assert!(out.contains("0 warning(s)"), "{out}");

    let o = run(&hooks, &["list"], &[]);
    let (out, _) = text(&o);
    assert!(
        out.contains("runs in the gateway: imports gateway.platforms.base"),
        "{out}"
    );

    let o = run(&hooks, &["test", "gateway:startup"], &[]);
    let (out, err) = text(&o);
    assert!(
        out.contains("stamp-outgoing") && out.contains("does not run in-gateway hooks"),
        "test should say it does not run the in-gateway hook:\n{out}{err}"
    );
    assert_eq!(o.status.code(), Some(1), "nothing ran here: {out}{err}");
}
