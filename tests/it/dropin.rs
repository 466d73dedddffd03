//! Drop-in on an ordinary machine (issue 19): default permissions under umask 002 (OpenSSH's
//! user-group-modes rule), directories without HOOK.yaml, the gateway's environment and working
//! directory, decisions that never fail open.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::util::{Hooks, bin};

/// The user database as files (what a default Ubuntu account has; NSS-only users are not seen).
fn passwd() -> Vec<(u32, u32)> {
    std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
        })
        .collect()
}

/// `gid` -> its listed members, from /etc/group.
fn group_members(gid: u32) -> Option<Vec<String>> {
    std::fs::read_to_string("/etc/group")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.get(2)?.parse::<u32>().ok()? == gid).then(|| {
                f.get(3)
                    .unwrap_or(&"")
                    .split(',')
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect()
            })
        })
}

fn my_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The gid new files of this user get, when it is a private group by the files' account:
/// nobody else has it as primary group and it lists no other member. `None` otherwise (the
/// private-group case cannot be made real on this machine).
pub fn private_gid() -> Option<u32> {
    let me = my_uid();
    let users = passwd();
    let primary = users.iter().find(|(u, _)| *u == me)?.1;
    let shared = users.iter().any(|(u, g)| *g == primary && *u != me);
    let members = group_members(primary)?;
    let name = std::fs::read_to_string("/etc/passwd")
        .ok()?
        .lines()
        .find(|l| l.split(':').nth(2) == Some(&me.to_string()))?
        .split(':')
        .next()?
        .to_string();
    (!shared && members.iter().all(|m| *m == name)).then_some(primary)
}

/// A group this process may give its files that is *not* its private group: as root, the
/// primary group of another user (a group with another member); otherwise a supplementary group
/// of ours (not our primary). `None` when there is none.
pub fn shared_gid() -> Option<u32> {
    let me = my_uid();
    let users = passwd();
    let primary = users.iter().find(|(u, _)| *u == me).map(|(_, g)| *g);
    if me == 0 {
        return users
            .iter()
            .find(|(u, g)| *u != 0 && Some(*g) != primary)
            .map(|(_, g)| *g);
    }
    let mut groups = vec![0 as libc::gid_t; 256];
    // SAFETY: the buffer holds 256 gids and its length is passed.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    groups.truncate(n.max(0) as usize);
    groups.into_iter().find(|g| Some(*g) != primary)
}

fn chgrp(path: &Path, gid: u32) {
    std::os::unix::fs::lchown(path, None, Some(gid)).unwrap();
}

/// Copies `src` into `dst` the way `git clone` writes a checkout: every directory created with
/// 0777 and every file with 0666 (0777 when executable), under umask 002, in a child process
/// (the umask is process-wide: changing the test runner's would touch the other tests).
fn clone_under_umask_002(src: &Path, dst: &Path) {
    let script = r#"
import os, shutil, stat, sys
src, dst = sys.argv[1], sys.argv[2]
os.umask(0o002)
for top, dirs, files in os.walk(src):
    rel = os.path.relpath(top, src)
    os.makedirs(os.path.join(dst, rel), 0o777, exist_ok=True)
    for f in files:
        s = os.path.join(top, f)
        mode = 0o777 if os.stat(s).st_mode & 0o100 else 0o666
        fd = os.open(os.path.join(dst, rel, f), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with open(s, "rb") as i, os.fdopen(fd, "wb") as o:
            shutil.copyfileobj(i, o)
"#;
    let st = Command::new("python3")
        .args(["-c", script])
        .arg(src)
        .arg(dst)
        .status()
        .unwrap();
    assert!(st.success());
}

fn list_json(root: &Path, home: &Path) -> Value {
    let o = Command::new(bin())
        .args(["list", "--json", "--hooks-dir"])
        .arg(root)
        .env("HERMES_HOME", home)
        .env_remove("HERMES_HOOKS_TRUST")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn check(root: &Path, home: &Path) -> (i32, String) {
    let o = Command::new(bin())
        .args(["check", "--hooks-dir"])
        .arg(root)
        .env("HERMES_HOME", home)
        .env_remove("HERMES_HOOKS_TRUST")
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn names(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap_or("").to_string())
        .collect()
}

// --- 1. permissions under umask 002 ---

#[testenv::needs(
    private_group,
    shared_group,
    "needs a private primary group and a second group to give files to"
)]
#[test]
fn a_clone_under_umask_002_loads_every_example_and_a_shared_group_still_refuses() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks-examples");
    let expected: Vec<String> = {
        let mut v: Vec<String> = std::fs::read_dir(&examples)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("HOOK.yaml").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert!(expected.len() >= 9, "{expected:?}");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hooks");
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    clone_under_umask_002(&examples, &root);
    // The fixture is what the issue describes: 0775 directories, 0664 files.
    let hook = root.join("agent-logger");
    assert_eq!(std::fs::metadata(&hook).unwrap().mode() & 0o777, 0o775);
    assert_eq!(
        std::fs::metadata(hook.join("HOOK.yaml")).unwrap().mode() & 0o777,
        0o664
    );
    let private = private_gid().expect("this user's primary group is private (crates/testenv)");
    assert_eq!(std::fs::metadata(&hook).unwrap().gid(), private);

    let v = list_json(&root, &home);
    let mut loaded = names(&v, "hooks");
    loaded.sort();
    assert_eq!(loaded, expected, "skipped: {:#}", v["skipped"]);
    let (code, out) = check(&root, &home);
    assert_eq!(code, 0, "{out}");

    // The same modes with a group somebody else is in: refused, one command for the tree.
    let shared = shared_gid().expect("a second group to give files to (crates/testenv)");
    let helper = root.join("agent-logger").join("handler.py");
    chgrp(&helper, shared);
    let v = list_json(&root, &home);
    let s = v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "agent-logger")
        .unwrap_or_else(|| panic!("agent-logger not refused: {v:#}"));
    assert_eq!(s["code"], "permissions", "{s}");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("writable by its group, which is not the owner's private group"),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("`chmod -R go-w {}`", hook.display())),
        "{reason}"
    );
    chgrp(&helper, private);
    chgrp(&hook, shared);
    let v = list_json(&root, &home);
    assert!(!names(&v, "hooks").contains(&"agent-logger".to_string()));
}

#[test]
fn data_files_a_hook_writes_are_not_checked_but_its_code_is() {
    let hooks = Hooks::new();
    let dir = hooks.python("stateful", "[agent:start]", "def handle(e, c):\n    pass\n");
    // A state file anybody may write: data, not code.
    std::fs::write(dir.join("state.json"), "{}").unwrap();
    std::fs::set_permissions(dir.join("state.json"), PermissionsExt::from_mode(0o666)).unwrap();
    std::fs::create_dir(dir.join("logs")).unwrap();
    std::fs::write(dir.join("logs/run.log"), "x").unwrap();
    std::fs::set_permissions(dir.join("logs/run.log"), PermissionsExt::from_mode(0o662)).unwrap();
    let v = list_json(&hooks.root(), &hooks.home());
    assert_eq!(names(&v, "hooks"), ["stateful"], "{v:#}");
    // Code writable by others (bytecode included) is refused.
    std::fs::create_dir(dir.join("__pycache__")).unwrap();
    let pyc = dir.join("__pycache__/handler.cpython-311.pyc");
    std::fs::write(&pyc, "not really bytecode").unwrap();
    std::fs::set_permissions(&pyc, PermissionsExt::from_mode(0o646)).unwrap();
    let v = list_json(&hooks.root(), &hooks.home());
    assert!(names(&v, "hooks").is_empty(), "{v:#}");
    let reason = v["skipped"][0]["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("writable by others (mode 0646)"),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("`chmod -R go-w {}`", dir.display())),
        "{reason}"
    );
}

// --- 4. directories without HOOK.yaml ---

#[test]
fn directories_without_hook_yaml_are_not_hooks_and_never_cause_a_rescan() {
    let hooks = Hooks::new();
    hooks.python("real", "[\"x:*\"]", "def handle(e, c):\n    return 1\n");
    // Present at start: ignored by list, check and /v1/hooks.
    hooks.add(
        "_disabled",
        &[("handler.py", "def handle(e, c):\n    return 2\n")],
    );
    std::fs::create_dir_all(hooks.root().join("__pycache__")).unwrap();
    let (code, out) = check(&hooks.root(), &hooks.home());
    assert_eq!(code, 0, "{out}");
    let v = list_json(&hooks.root(), &hooks.home());
    assert_eq!(names(&v, "hooks"), ["real"]);
    assert_eq!(v["skipped"], serde_json::json!([]), "{v:#}");

    let serve = crate::util::Serve::start(&hooks, &[]);
    let (status, body) = serve.get("/v1/hooks");
    assert_eq!(status, 200);
    assert_eq!(body["skipped"], serde_json::json!([]), "{body:#}");
    // Appearing while serving: a log directory a hook makes, a helper in a disabled directory.
    std::fs::create_dir_all(hooks.root().join("logs")).unwrap();
    std::fs::write(hooks.root().join("logs/run.log"), "x\n").unwrap();
    std::fs::write(hooks.root().join("_disabled/more.py"), "X = 1\n").unwrap();
    std::fs::create_dir_all(hooks.root().join("_disabled/pkg")).unwrap();
    // The barrier: a real hook moved in (one change); every earlier rescan is logged by then.
    let staging = hooks.tmp.path().join("staging");
    std::fs::create_dir_all(staging.join("late")).unwrap();
    std::fs::write(staging.join("late/HOOK.yaml"), "events: [\"y:*\"]\n").unwrap();
    std::fs::write(
        staging.join("late/handler.py"),
        "def handle(e, c):\n    return 1\n",
    )
    .unwrap();
    std::fs::rename(staging.join("late"), hooks.root().join("late")).unwrap();
    crate::util::poll(std::time::Duration::from_secs(20), "the new hook", || {
        serve
            .get("/v1/hooks")
            .1
            .to_string()
            .contains("\"late\"")
            .then_some(())
    });
    // The reload is visible in /v1/hooks a moment before its log line is written.
    let rescans = crate::util::poll(
        std::time::Duration::from_secs(20),
        "the rescan's log line",
        || {
            let n = serve
                .log()
                .matches("hooks reloaded after a change on disk")
                .count();
            (n > 0).then_some(n)
        },
    );
    assert_eq!(
        rescans,
        1,
        "only the new hook may cause a rescan:\n{}",
        serve.log()
    );
    assert_eq!(serve.get("/v1/hooks").1["skipped"], serde_json::json!([]));
}

// --- 3. decisions never fail open ---

#[test]
fn a_slow_decision_is_waited_for_and_a_timed_out_one_is_reported_as_such() {
    let hooks = Hooks::new();
    // Denies after 5.5 s, within its own timeout: the old 5 s default answered [] (fail open).
    hooks.add(
        "slow-deny",
        &[
            ("HOOK.yaml", "events: [\"command:*\"]\ntimeout: 20\n"),
            (
                "handler.py",
                "import time\n\ndef handle(e, c):\n    time.sleep(5.5)\n    return {'decision': 'deny'}\n",
            ),
        ],
    );
    hooks.add(
        "too-slow",
        &[
            ("HOOK.yaml", "events: [\"command:stop\"]\ntimeout: 1\n"),
            (
                "handler.py",
                "import time\n\ndef handle(e, c):\n    time.sleep(30)\n    return {'decision': 'allow'}\n",
            ),
        ],
    );
    let serve = crate::util::Serve::start(&hooks, &[]);
    let started = std::time::Instant::now();
    let (status, body) = serve.post(
        "/v1/collect",
        &serde_json::json!({"event": "command:deploy", "context": {}}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"],
        serde_json::json!([{"hook": "slow-deny", "result": {"decision": "deny"}}]),
        "{body:#}"
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(5400));

    // A hook past its own timeout: an error marked timed_out, and the others still count.
    let (status, body) = serve.post(
        "/v1/collect",
        &serde_json::json!({"event": "command:stop", "context": {}}),
    );
    assert_eq!(status, 200, "{body}");
    let errors = body["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{body:#}");
    assert_eq!(errors[0]["hook"], "too-slow");
    assert_eq!(errors[0]["timed_out"], true, "{body:#}");
    assert_eq!(body["results"][0]["hook"], "slow-deny", "{body:#}");

    // A caller's shorter deadline still holds.
    let started = std::time::Instant::now();
    let (status, body) = serve.post(
        "/v1/collect",
        &serde_json::json!({"event": "command:deploy", "timeout_ms": 300}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(body["errors"][0]["timed_out"], true, "{body:#}");
}

// --- 2. the gateway's environment and working directory ---

/// `serve` started in `cwd` with `env` added (as the gateway's launcher would).
fn serve_in(hooks: &Hooks, cwd: &Path, env: &[(&str, &str)]) -> crate::util::Serve {
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(cwd)
        .env_remove("TZ")
        .env_remove("LC_ALL")
        .env_remove("LC_CTYPE")
        .env("LANG", "C");
    for (k, v) in env {
        cmd.env(k, v);
    }
    crate::util::Serve::spawn(cmd, hooks)
}

fn decide(serve: &crate::util::Serve, event: &str) -> Value {
    let (status, body) = serve.post(
        "/v1/collect",
        &serde_json::json!({"event": event, "timeout_ms": 20000}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["errors"], serde_json::json!([]), "{body:#}");
    body["results"][0]["result"].clone()
}

#[test]
fn hooks_get_the_gateways_env_file_and_working_directory() {
    let hooks = Hooks::new();
    std::fs::write(
        hooks.home().join(".env"),
        "TELEGRAM_BOT_TOKEN=123:from-file\nexport STALE=from-file\nOVERRIDDEN=from-file\n",
    )
    .unwrap();
    let report = "import json, os\n\ndef handle(e, c):\n    return {k: os.environ.get(k) for k in ('TELEGRAM_BOT_TOKEN', 'STALE', 'OVERRIDDEN')} | {'cwd': os.getcwd()}\n";
    hooks.add(
        "py-default",
        &[
            (
                "HOOK.yaml",
                "events: [\"env:py\"]\nenv: {OVERRIDDEN: from-hook}\n",
            ),
            ("handler.py", report),
        ],
    );
    hooks.add(
        "py-own-dir",
        &[
            ("HOOK.yaml", "events: [\"env:own\"]\ncwd: hook\n"),
            ("handler.py", report),
        ],
    );
    hooks.exec(
        "sh-env",
        "[\"env:sh\"]",
        "#!/bin/sh\nprintf '{\"token\": \"%s\", \"cwd\": \"%s\"}' \"$TELEGRAM_BOT_TOKEN\" \"$(pwd)\"\n",
    );
    let gateway_dir = hooks.tmp.path().join("gateway-cwd");
    std::fs::create_dir_all(&gateway_dir).unwrap();
    let serve = serve_in(&hooks, &gateway_dir, &[("STALE", "from-shell")]);

    let py = decide(&serve, "env:py");
    assert_eq!(py["TELEGRAM_BOT_TOKEN"], "123:from-file", "{py}");
    assert_eq!(
        py["STALE"], "from-file",
        "the file beats the shell, as in the gateway: {py}"
    );
    assert_eq!(
        py["OVERRIDDEN"], "from-hook",
        "the hook's env: beats the file: {py}"
    );
    assert_eq!(py["cwd"], gateway_dir.display().to_string());
    let own = decide(&serve, "env:own");
    assert_eq!(
        own["cwd"],
        hooks.root().join("py-own-dir").display().to_string()
    );
    let sh = decide(&serve, "env:sh");
    assert_eq!(sh["token"], "123:from-file");
    assert_eq!(sh["cwd"], gateway_dir.display().to_string());

    // Changed: an executable reads it at its next event; a Python worker, which took its
    // environment when it started, is replaced (the watcher sees the file change).
    std::fs::write(
        hooks.home().join(".env"),
        "TELEGRAM_BOT_TOKEN=456:rotated-token\n",
    )
    .unwrap();
    assert_eq!(decide(&serve, "env:sh")["token"], "456:rotated-token");
    crate::util::poll(
        std::time::Duration::from_secs(20),
        "the python worker with the new .env",
        || (decide(&serve, "env:py")["TELEGRAM_BOT_TOKEN"] == "456:rotated-token").then_some(()),
    );
}

#[test]
fn forked_workers_honour_the_hooks_time_zone_and_locale() {
    let hooks = Hooks::new();
    hooks.add(
        "tz",
        &[
            (
                "HOOK.yaml",
                "events: [\"tz:now\"]\nenv: {TZ: Asia/Tokyo, LC_ALL: POSIX}\n",
            ),
            (
                "handler.py",
                "import locale, time\n\ndef handle(e, c):\n    return [time.strftime('%Z'), locale.setlocale(locale.LC_CTYPE)]\n",
            ),
        ],
    );
    let serve = serve_in(&hooks, hooks.tmp.path(), &[]);
    let got = decide(&serve, "tz:now");
    // The fork server runs under LANG=C, which CPython coerces to C.UTF-8 (PEP 538); a fresh
    // interpreter under LC_ALL=POSIX keeps "C", and so must a forked worker.
    assert_eq!(got, serde_json::json!(["JST", "C"]), "{}", serve.log());
    let (_, info) = serve.get("/v1/hooks/tz");
    assert!(info.to_string().contains("forked"), "not forked: {info:#}");
}

// --- 4. module names as written ---

#[test]
fn a_hooks_module_is_named_as_the_original_host_names_it() {
    let hooks = Hooks::new();
    hooks.python(
        "hook-a",
        "[\"name:of\"]",
        "import logging\n\ndef handle(e, c):\n    return [__name__, logging.getLogger(__name__).name]\n",
    );
    let serve = serve_in(&hooks, hooks.tmp.path(), &[]);
    assert_eq!(
        decide(&serve, "name:of"),
        serde_json::json!(["hermes_hook_hook-a", "hermes_hook_hook-a"])
    );
}

// --- 4. the smaller items ---

#[test]
fn a_relative_python_is_the_hooks_own_file_for_trust_and_for_the_fork_server() {
    let hooks = Hooks::new();
    let dir = hooks.add(
        "venv-hook",
        &[
            (
                "HOOK.yaml",
                "events: [\"py:which\"]\npython: venv/bin/python\n",
            ),
            (
                "handler.py",
                "import os\n\ndef handle(e, c):\n    return os.environ.get('STARTED_BY_WRAPPER')\n",
            ),
            (
                "venv/bin/python",
                "#!/bin/sh\nSTARTED_BY_WRAPPER=yes exec python3 \"$@\"\n",
            ),
        ],
    );
    crate::util::set_mode(&dir.join("venv/bin/python"), 0o755);
    // Started elsewhere: a relative path must not be looked up from the service's directory.
    let serve = serve_in(&hooks, hooks.tmp.path(), &[]);
    assert_eq!(decide(&serve, "py:which"), "yes", "{}", serve.log());
}

#[test]
fn test_with_hook_names_an_in_gateway_hook_as_such() {
    let hooks = Hooks::new();
    hooks.add(
        "gw-patcher",
        &[
            ("HOOK.yaml", "events: [\"agent:start\"]\nruns: gateway\n"),
            ("handler.py", "def handle(e, c):\n    return 1\n"),
        ],
    );
    let o = Command::new(bin())
        .args(["test", "agent:start", "--hook", "gw-patcher", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("runs inside the gateway"), "{text}");
    assert!(!text.contains("is not loaded or does not match"), "{text}");
}

#[test]
fn a_missing_plugin_module_is_not_blamed_on_the_interpreter() {
    let hooks = Hooks::new();
    hooks.python(
        "uses-plugin",
        "[\"agent:start\"]",
        "import os, sys\nsys.path.insert(0, os.path.join(os.environ['HERMES_HOME'], 'plugins'))\nimport kanban_bridge\n\ndef handle(e, c):\n    return 1\n",
    );
    hooks.python(
        "uses-package",
        "[\"agent:start\"]",
        "import surely_not_installed_pkg\n\ndef handle(e, c):\n    return 1\n",
    );
    let v = list_json(&hooks.root(), &hooks.home());
    let reason = |name: &str| {
        v["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} loaded: {v:#}"))["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let plugin = reason("uses-plugin");
    assert!(plugin.contains("plugins"), "{plugin}");
    assert!(
        plugin.contains("\"kanban_bridge\" is not there"),
        "{plugin}"
    );
    assert!(!plugin.contains("lacks it"), "{plugin}");
    let package = reason("uses-package");
    assert!(package.contains("lacks it"), "{package}");
}
