//! The command line: `check`, `list`, `test` against real hook directories.

use std::process::{Command, Output};

use serde_json::Value;

use crate::util::{Hooks, bin};

fn run(hooks: &Hooks, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .arg("--hooks-dir")
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .output()
        .expect("run hermes-hooks")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn check_passes_good_hooks_and_fails_on_any_problem() {
    let hooks = Hooks::new();
    hooks.recorder("good", "[agent:start]", "None");
    let o = run(&hooks, &["check"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("ok      good (python, agent:start)"),
        "{}",
        stdout(&o)
    );

    hooks.add(
        "broken",
        &[
            ("HOOK.yaml", "events: [agent:start\n"),
            ("handler.py", "def handle(e, c): pass\n"),
        ],
    );
    hooks.python("typo", "[sesion:start]", "def handle(e, c): pass\n");
    let o = run(&hooks, &["check"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("broken/HOOK.yaml: YAML error: line 1"),
        "{out}"
    );
    assert!(out.contains("did you mean \"session:start\"?"), "{out}");
    // Issue 50: a near miss of a gateway event is a problem for `check` (the hook never runs).
    assert!(
        out.contains("2 hook(s) ok, 2 problem(s), 0 warning(s)"),
        "{out}"
    );
}

/// Issue 38: a misspelt event name is said where an operator looks, not only by `check`.
#[test]
fn a_misspelt_event_name_is_warned_by_the_service_v1_hooks_and_test() {
    let hooks = Hooks::new();
    hooks.recorder(
        "typos",
        r#"["agent:started", "sesion:*", "agent.end"]"#,
        "None",
    );
    hooks.recorder("custom", r#"["myapp:deployed"]"#, "None");
    let serve = crate::util::Serve::start(&hooks, &[]);
    let (_, listing) = serve.get("/v1/hooks");
    let of = |name: &str| -> Vec<String> {
        let hook = listing["hooks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == name);
        serde_json::from_value(hook.unwrap()["warnings"].clone()).unwrap()
    };
    let typos = of("typos");
    for (p, meant) in [
        ("agent:started", "agent:start"),
        ("sesion:*", "session:*"),
        ("agent.end", "agent:end"),
    ] {
        let said = format!("pattern {p:?} matches no known gateway event; did you mean {meant:?}?");
        assert!(typos.contains(&said), "{typos:?}");
        crate::util::poll(
            std::time::Duration::from_secs(10),
            "the warning in the log",
            || {
                serve
                    .log()
                    .lines()
                    .any(|l| l.contains("WARN") && l.contains(&said))
                    .then_some(())
            },
        );
    }
    // A custom event is no typo: only `check` mentions it.
    assert_eq!(of("custom"), Vec::<String>::new());

    let o = run(&hooks, &["test", "agent:start", "--hook", "typos"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("hook \"typos\" is loaded, but its events (agent:started, sesion:*, agent.end) do not match \"agent:start\""),
        "{err}"
    );
    assert!(err.contains("did you mean \"agent:start\"?"), "{err}");
    let o = run(&hooks, &["test", "agent:start", "--hook", "nosuch"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("hook \"nosuch\" is not loaded (searched"),
        "{err}"
    );

    let o = run(&hooks, &["check"]);
    let out = stdout(&o);
    assert_eq!(out.matches("did you mean").count(), 3, "{out}");
    assert!(
        out.contains(
            "pattern \"myapp:deployed\" matches no known gateway event (fine for custom events)"
        ),
        "{out}"
    );
    // Issue 50: the three near misses fail `check`; the custom event is a warning.
    assert!(
        out.contains("2 hook(s) ok, 3 problem(s), 1 warning(s)"),
        "{out}"
    );
}

/// Issue 38: a hook that cannot load is one record naming the file, the line and Python's
/// message, in `check`, `test` and the service's log; its traceback only under `-v`.
#[test]
fn a_broken_handler_is_one_record_with_its_line_and_the_traceback_only_under_v() {
    let hooks = Hooks::new();
    hooks.python(
        "colon",
        "[agent:start]",
        "def handle(event_type, context)\n    pass\n",
    );
    hooks.python(
        "raises",
        "[agent:start]",
        "import json\nraise ValueError('no config')\n",
    );
    let o = run(&hooks, &["check"]);
    let (out, err) = (stdout(&o), String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("colon/handler.py: SyntaxError: expected ':' (handler.py, line 1)"),
        "{out}"
    );
    assert!(
        out.contains("raises/handler.py: ValueError: no config (handler.py, line 2)"),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("error")).count(),
        2,
        "{out}"
    );
    assert!(
        err.trim().is_empty(),
        "check said more than its two lines:\n{err}"
    );
    let o = run(&hooks, &["test", "agent:start"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("not loaded: ").count(), 2, "{err}");
    assert!(
        !err.contains("Traceback") && !err.contains("cannot load"),
        "{err}"
    );
    let o = run(&hooks, &["check", "-v"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("Traceback (most recent call last)").count(),
        2,
        "{err}"
    );

    let serve = crate::util::Serve::start(&hooks, &[]);
    crate::util::poll(
        std::time::Duration::from_secs(10),
        "both load failures logged",
        || (serve.log().matches("not loaded: ").count() == 2).then_some(()),
    );
    let log = serve.log();
    for hook in ["colon", "raises"] {
        let about: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("hook={hook}")))
            .collect();
        assert_eq!(about.len(), 1, "{hook}:\n{log}");
        assert!(
            about[0].contains("WARN") && about[0].contains("(handler.py, line"),
            "{log}"
        );
    }
    assert!(
        !log.contains("Traceback") && !log.contains("ERROR"),
        "{log}"
    );
}

#[test]
fn list_shows_loaded_and_skipped_as_text_and_json() {
    let hooks = Hooks::new();
    hooks.recorder("alpha", "[\"command:*\"]", "None");
    hooks.add("nope", &[("HOOK.yaml", "events: []\n")]);
    let o = run(&hooks, &["list"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0));
    assert!(out.contains("alpha") && out.contains("command:*"), "{out}");
    assert!(
        out.contains("not loaded:") && out.contains("no events"),
        "{out}"
    );
    let o = run(&hooks, &["list", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hooks"][0]["name"], "alpha");
    assert_eq!(v["skipped"][0]["code"], "no_events");
}

#[test]
fn test_runs_matching_handlers_and_prints_results_errors_durations() {
    let hooks = Hooks::new();
    hooks.python(
        "a-ok",
        "[command:reset]",
        "def handle(e, c):\n    print('a log line')\n    return {'user': c['user_id']}\n",
    );
    hooks.python(
        "b-err",
        "[\"command:*\"]",
        "def handle(e, c):\n    raise ValueError('bad')\n",
    );
    let o = run(
        &hooks,
        &["test", "command:reset", "--context", r#"{"user_id": "42"}"#],
    );
    let out = stdout(&o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "an error makes the exit code 1: {out}"
    );
    assert!(
        out.contains("a-ok") && out.contains("result: {\"user\":\"42\"}"),
        "{out}"
    );
    assert!(
        out.contains("b-err") && out.contains("ValueError: bad"),
        "{out}"
    );
    assert!(out.contains(" ms"), "{out}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("a log line"),
        "handler output is shown on stderr"
    );

    let o = run(
        &hooks,
        &[
            "test",
            "command:reset",
            "--hook",
            "a-ok",
            "--json",
            "--context",
            r#"{"user_id": "1"}"#,
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["hook"], "a-ok");
    assert_eq!(lines[0]["result"]["user"], "1");
    assert!(lines[0]["duration_ms"].as_f64().is_some());

    let o = run(&hooks, &["test", "agent:start"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no loaded hook matches"));
    let o = run(&hooks, &["test", "command:x", "--context", "not json"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a bad argument value is a usage error"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("--context is not valid JSON"));
    let o = run(&hooks, &["test", "bad event"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn usage_errors_exit_2() {
    let o = Command::new(bin()).arg("frobnicate").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = Command::new(bin()).arg("--version").output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("hermes-hooks "));
}

#[test]
fn bundled_examples_pass_check() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks-examples");
    let home = tempfile::tempdir().unwrap();
    let o = Command::new(bin())
        .args(["check", "--hooks-dir"])
        .arg(&examples)
        .env("HERMES_HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

/// A one-shot HTTP server on 127.0.0.1:0 answering every request with `answer` (JSON); returns
/// its URL. Serves until the test process exits.
fn tiny_server(answer: &'static str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 65536];
            let mut got = Vec::new();
            // Read the head and the body announced by Content-Length.
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..p]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if got.len() >= p + 4 + len {
                        break;
                    }
                }
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    url
}

#[test]
fn new_scaffolds_pass_check_and_test_for_every_kind() {
    let hooks = Hooks::new();
    let url = tiny_server(r#"{"from": "webhook"}"#);
    for (name, kind) in [
        ("py-hook", "python"),
        ("sh-hook", "exec"),
        ("wh-hook", "webhook"),
    ] {
        let mut args = vec!["new", name, "--kind", kind];
        if kind == "webhook" {
            args.extend(["--url", &url]);
        }
        let o = run(&hooks, &args);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(stdout(&o).contains("created"));
        let o = run(&hooks, &["test", "agent:start", "--hook", name]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{kind}: {}\n{}",
            stdout(&o),
            String::from_utf8_lossy(&o.stderr)
        );
        if kind == "webhook" {
            assert!(
                stdout(&o).contains(r#"result: {"from":"webhook"}"#),
                "{}",
                stdout(&o)
            );
        }
    }
    let o = run(&hooks, &["check"]);
    let out = stdout(&o);
    // The webhook's secret variable is unset: a warning, not a problem.
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("3 hook(s) ok, 0 problem(s)"), "{out}");
    // Never overwrites.
    let o = run(&hooks, &["new", "py-hook", "--kind", "exec"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    let o = run(&hooks, &["new", "bad/name"]);
    assert_eq!(o.status.code(), Some(1));
}

/// `list --live` shows each hook's status, health (issue 60 row 10: the dashboard's health, with
/// its reason under the row when it is trouble), counters and last error.
#[test]
fn list_live_shows_the_running_services_counters() {
    let hooks = Hooks::new();
    hooks.python(
        "counted",
        "[command:x]",
        "def handle(e, c):\n    if c.get('fail'):\n        raise ValueError('nope')\n",
    );
    let serve = crate::util::Serve::start(&hooks, &[]);
    serve.post(
        "/v1/collect",
        &serde_json::json!({"event": "command:x", "context": {"fail": true}}),
    );
    let live = || {
        let o = run(
            &hooks,
            &["list", "--live", &format!("http://{}", serve.addr)],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
        stdout(&o)
    };
    let out = live();
    let row = out
        .lines()
        .find(|l| l.starts_with("counted"))
        .unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // Its one call failed and none succeeded since: failing (issue 60 row 5), since then.
    assert_eq!(&cols[1..4], ["python", "ready", "failing"], "{row}");
    assert_eq!(cols[5..8], ["0", "1", "0"], "ok, failed, dropped: {row}");
    assert!(
        out.lines()
            .next()
            .unwrap_or("")
            .contains(" STATUS     HEALTH "),
        "{out}"
    );
    assert!(
        out.contains(
            "    health failing: 1 of 1 calls failed in the last 5 min; none has succeeded since \
             (since 20"
        ),
        "{out}"
    );
    let (_, listing) = serve.get("/v1/hooks");
    let time = listing["hooks"][0]["last_error"]["time"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        out.contains(&format!("last error ({time}): command:x: ValueError: nope")),
        "{out}"
    );
    // Issue 38: an error that later successes superseded says so, with its time.
    for _ in 0..2 {
        serve.post("/v1/collect", &serde_json::json!({"event": "command:x"}));
    }
    let out = live();
    assert!(
        out.contains(&format!(
            "earlier error ({time}; 2 call(s) succeeded since): command:x: ValueError: nope"
        )),
        "{out}"
    );
    assert!(!out.contains("last error"), "{out}");
    // Calls succeeded since: no longer failing, degraded while the failure is in the window.
    assert!(
        out.contains("    health degraded: 1 of 3 calls failed in the last 5 min (since 20"),
        "{out}"
    );
}

/// Issue 60 row 5: a hook that answers, but in more than half its timeout, is `slow` (its
/// health was `ok` however close to its timeout it ran: only failures counted).
#[test]
fn a_hook_answering_in_over_half_its_timeout_is_slow() {
    let hooks = Hooks::new();
    hooks.python(
        "sluggish",
        "[command:x]",
        "import time\n\ndef handle(e, c):\n    time.sleep(1.2)\n",
    );
    let manifest = hooks.root().join("sluggish/HOOK.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, format!("{text}timeout: 2\n")).unwrap();
    let serve = crate::util::Serve::start(&hooks, &[]);
    for _ in 0..2 {
        let (status, body) = serve.post(
            "/v1/collect",
            &serde_json::json!({"event": "command:x", "context": {}}),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["errors"], serde_json::json!([]), "{body}");
    }
    let (_, v) = serve.get("/v1/hooks");
    let health = &v["hooks"][0]["health"];
    assert_eq!(health["state"], "slow", "{v}");
    let reason = health["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("half its 2s timeout or more"), "{reason}");
    let o = run(
        &hooks,
        &["list", "--live", &format!("http://{}", serve.addr)],
    );
    let out = stdout(&o);
    assert!(out.contains("    health slow: p95 1"), "{out}");
    // Since when (issue 60 row 6): the first minute of the run of slow minutes.
    assert!(out.contains("timeout or more (since 20"), "{out}");
}

#[test]
fn emit_and_list_live_report_a_peer_that_hangs_up_or_is_not_http() {
    use std::io::{Read, Write};
    // A peer that reads the request and closes, then one that answers with something not HTTP:
    // both are clear errors naming the address, exit code 1, never a hang or a panic.
    for answer in [&b""[..], b"garbage\r\n\r\n"] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
        let addr = listener.local_addr().expect("local addr").to_string();
        let peer = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut c, _) = listener.accept().expect("accept");
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(answer);
            }
        });
        let hooks = Hooks::new();
        let emit = Command::new(bin())
            .args(["emit", "agent:start", "--listen", &addr])
            .env("HERMES_HOME", hooks.home())
            .output()
            .expect("run hermes-hooks emit");
        let live = run(&hooks, &["list", "--live", &format!("http://{addr}")]);
        peer.join().expect("peer thread");
        for o in [emit, live] {
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{err}");
            assert!(
                err.contains(&format!("talking to hermes-hooks at http://{addr}: ")),
                "expected an error naming the address, got: {err}"
            );
        }
    }
}

#[test]
fn new_rust_hook_builds_installs_and_runs() {
    let hooks = Hooks::new();
    // Shared target dir: the SDK and serde_json are built once across runs.
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/scaffold-hooks");
    let o = Command::new(bin())
        .args(["new", "rusty", "--kind", "rust", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .env("CARGO_TARGET_DIR", &target)
        .env("HERMES_HOOK_PROFILE", "debug")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(hooks.root().join("rusty/handler.so").is_file());
    assert!(
        hooks.home().join("hook-src/rusty/src/lib.rs").is_file(),
        "sources outside the hook root"
    );
    let o = run(&hooks, &["check"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let o = run(
        &hooks,
        &[
            "test",
            "agent:start",
            "--hook",
            "rusty",
            "--json",
            "--context",
            r#"{"a": 1}"#,
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        line["result"],
        serde_json::json!({"hook": "rusty", "event": "agent:start", "context_keys": 1})
    );
}

/// Runs the binary with `args` only (no --hooks-dir added), HERMES_HOME = the temp home.
fn run_bare(hooks: &Hooks, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("HERMES_HOME", hooks.home())
        .env_remove("HERMES_HOOKS_ADDRESS")
        .output()
        .expect("run hermes-hooks")
}

/// Issue 24: a mistyped `--hooks-dir` is an error naming the path, not "0 hook(s) ok".
#[test]
fn a_missing_hooks_dir_is_an_error_naming_it() {
    let hooks = Hooks::new();
    let typo = hooks.tmp.path().join("hooks-exmaples");
    let typo_s = typo.display().to_string();
    for args in [
        vec!["check"],
        vec!["list"],
        vec!["test", "agent:start"],
        vec!["serve", "--listen", "127.0.0.1:0"],
        vec!["enable", "x"],
    ] {
        let mut all = args.clone();
        all.extend(["--hooks-dir", typo_s.as_str()]);
        let o = run_bare(&hooks, &all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("--hooks-dir {typo_s}: no such directory")),
            "{args:?}: {err}"
        );
    }
    // A file is not a root either.
    let file = hooks.tmp.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let o = run_bare(&hooks, &["check", "--hooks-dir", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a directory"));
}

/// Issue 24: when nothing matches, `test` says where it looked and what is there.
#[test]
fn test_names_the_roots_it_searched() {
    let hooks = Hooks::new();
    hooks.python("only", "[\"session:start\"]", "def handle(e, c): pass\n");
    let o = run(&hooks, &["test", "agent:start"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("searched {}", hooks.root().display()))
            && err.contains("loaded there: only"),
        "{err}"
    );
}

/// Issue 24: HOOK.yaml mistakes are reported with the key, the line and what to write.
#[test]
fn hook_yaml_errors_name_the_key_the_line_and_the_fix() {
    let hooks = Hooks::new();
    let cases = [
        (
            "soon",
            "events: [\"agent:start\"]\ntimeout: soon\n",
            "`timeout`: line 2: \"soon\" is not a number of seconds; write e.g. `timeout: 30`",
        ),
        (
            "string",
            "events: agent:start\n",
            "`events`: line 1: \"agent:start\" is a single string, not a list: write `events: [\"agent:start\"]`",
        ),
        (
            "bracket",
            "events: [agent:start\ntimeout: 5\n",
            "line 1: `[` is not closed",
        ),
        (
            "twice",
            "events: [a:b]\nconcurrency: 1\nconcurrency: 2\n",
            "key `concurrency` is given twice (lines 2 and 3): keep one",
        ),
    ];
    for (name, yaml, _) in &cases {
        hooks.add(
            name,
            &[
                ("HOOK.yaml", yaml),
                ("handler.py", "def handle(e, c): pass\n"),
            ],
        );
    }
    let o = run(&hooks, &["check"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    for (name, _, want) in &cases {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("/{name}/HOOK.yaml")))
            .unwrap_or_else(|| panic!("no line for {name}: {out}"));
        assert!(line.contains(want), "{name}: {line}");
    }
    assert!(!out.contains("DuplicateKeyPolicy"), "{out}");
}

/// Issue 24: `test --json` durations are rounded to 0.1 ms, as the text shows them.
#[test]
fn test_json_durations_are_rounded() {
    let hooks = Hooks::new();
    hooks.python(
        "r",
        "[\"agent:start\"]",
        "def handle(e, c):\n    return 1\n",
    );
    let o = run(&hooks, &["test", "agent:start", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ms = v["duration_ms"].as_f64().unwrap();
    assert_eq!((ms * 10.0).round() / 10.0, ms, "{v}");
}

/// Issue 24: a long name does not push the other columns of `list` out of line, and the
/// interpreter is said once, not under every Python hook.
#[test]
fn list_columns_fit_long_names_and_the_interpreter_is_said_once() {
    let hooks = Hooks::new();
    let long = "a-hook-name-well-over-twenty-four-characters";
    hooks.python(long, "[\"agent:start\"]", "def handle(e, c): pass\n");
    hooks.python("short", "[\"agent:start\"]", "def handle(e, c): pass\n");
    let o = run(&hooks, &["list"]);
    let out = stdout(&o);
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("NAME") || l.starts_with(long) || l.starts_with("short "))
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    let kind_at: Vec<usize> = rows
        .iter()
        .map(|r| r.find(" python ").or_else(|| r.find(" KIND ")).unwrap())
        .collect();
    assert!(kind_at.iter().all(|k| *k == kind_at[0]), "{out}");
    assert_eq!(out.matches("interpreter").count(), 1, "{out}");
    let o = run(&hooks, &["check"]);
    assert_eq!(
        stdout(&o).matches("interpreter").count(),
        1,
        "{}",
        stdout(&o)
    );
}

/// Issue 24: `new` creates a missing HERMES_HOME private (0700), as `serve` does.
#[test]
fn new_creates_hermes_home_private() {
    use std::os::unix::fs::PermissionsExt;
    let hooks = Hooks::new();
    let home = hooks.tmp.path().join("fresh-home");
    let o = Command::new(bin())
        .args(["new", "first", "--kind", "python"])
        .env("HERMES_HOME", &home)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    assert!(home.join("hooks/first/HOOK.yaml").is_file());
}

/// Issue 24: `list --live HOST:PORT` talks TCP, as `emit --listen HOST:PORT` does.
#[test]
fn list_live_takes_host_port() {
    let hooks = Hooks::new();
    hooks.python("live", "[\"agent:start\"]", "def handle(e, c): pass\n");
    let serve = crate::util::Serve::start(&hooks, &[]);
    let o = run_bare(&hooks, &["list", "--live", &serve.addr]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout(&o).contains("live"), "{}", stdout(&o));
}

/// Issue 24: `serve --help` shows no worker-only fleet option, `worker --help` no edge-only one.
#[cfg(feature = "fleet")]
#[test]
fn fleet_options_show_where_they_apply() {
    let hooks = Hooks::new();
    let serve = stdout(&run_bare(&hooks, &["serve", "--help"]));
    let worker = stdout(&run_bare(&hooks, &["worker", "--help"]));
    assert!(
        serve.contains("--gateway-id") && !serve.contains("--ack-wait"),
        "{serve}"
    );
    assert!(
        worker.contains("--ack-wait") && !worker.contains("--gateway-id"),
        "{worker}"
    );
    let dead = stdout(&run_bare(&hooks, &["dead", "--help"]));
    assert!(dead.contains("Example: hermes-hooks dead"), "{dead}");
}

/// Issue 24: a blank line a hook prints is not a log line, and a handler's traceback is one
/// ERROR record (not one INFO line per traceback line).
#[test]
fn blank_prints_are_dropped_and_a_traceback_is_one_record() {
    let hooks = Hooks::new();
    hooks.python(
        "noisy",
        "[\"agent:start\"]",
        "def handle(e, c):\n    print()\n    print('before')\n    print('   ')\n    raise ValueError('boom')\n",
    );
    let o = run(&hooks, &["test", "agent:start"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let info: Vec<&str> = err.lines().filter(|l| l.contains(" INFO ")).collect();
    assert_eq!(info.len(), 1, "only `before` is an info line:\n{err}");
    assert!(info[0].contains("before"), "{err}");
    let errors = err.lines().filter(|l| l.contains(" ERROR ")).count();
    assert_eq!(errors, 1, "the traceback is one record:\n{err}");
    assert_eq!(
        err.matches("Traceback (most recent call last)").count(),
        1,
        "{err}"
    );
    assert!(err.contains("ValueError: boom"), "{err}");
}
