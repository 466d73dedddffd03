//! A new user's first hour (issue 50, "The first hour"): each mistake one makes early gets an
//! error or a warning that names the file (or the address) and the way out.

use std::process::{Command, Output};

use crate::util::{Hooks, bin};

/// Runs `hermes-hooks ARGS` with HERMES_HOME = the hooks' home and no HERMES_HOOKS_ADDRESS.
fn run(hooks: &Hooks, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("HERMES_HOME", hooks.home())
        .env_remove("HERMES_HOOKS_ADDRESS")
        .env_remove("HERMES_HOOKS_TOKEN")
        .output()
        .expect("run hermes-hooks")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `emit` after the README's `serve --listen 127.0.0.1:8787`: the service has no socket, and
/// "cannot reach ... hooks.sock (is `hermes-hooks serve` running?)" left the user stuck. The
/// error now says how to reach a TCP service; the TCP variant says where a socket service is.
#[test]
fn emit_without_a_socket_names_listen_and_hermes_hooks_address() {
    let hooks = Hooks::new();
    let o = run(&hooks, &["emit", "agent:start"]);
    let out = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("hooks.sock"), "{out}");
    assert!(out.contains("--listen HOST:PORT"), "{out}");
    assert!(
        out.contains("HERMES_HOOKS_ADDRESS=http://HOST:PORT"),
        "{out}"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let o = run(
        &hooks,
        &[
            "emit",
            "agent:start",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let out = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("--socket PATH"), "{out}");
}

/// Runs `hermes-hooks ARGS --hooks-dir ROOT`.
fn run_in(hooks: &Hooks, args: &[&str]) -> Output {
    let mut all: Vec<&str> = args.to_vec();
    let root = hooks.root().display().to_string();
    all.extend(["--hooks-dir", root.as_str()]);
    run(hooks, &all)
}

/// A shell handler's syntax error said `/proc/self/fd/21: 4: Syntax error` (the descriptor it
/// runs from). It now names the handler's file, in the call's error and the log; and `check`
/// runs `sh -n` on it and fails naming the file.
#[test]
fn a_shell_handlers_syntax_error_names_its_file_in_test_and_check() {
    let hooks = Hooks::new();
    let dir = hooks.exec(
        "broken-sh",
        "[\"agent:start\"]",
        "#!/bin/sh\necho start >&2\nif true; then\n  echo '{}'\n",
    );
    let handler = dir.join("handler").display().to_string();
    let o = run_in(&hooks, &["test", "agent:start"]);
    let out = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(out.contains(&format!("{handler}: ")), "{out}");
    assert!(!out.contains("/proc/self/fd/"), "{out}");
    let o = run_in(&hooks, &["check"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("`/bin/sh -n` finds a syntax error"), "{out}");
    assert!(out.contains(&handler), "{out}");
}

/// `def handel` loaded as "no 'handle' function found": the near miss is now named, with its
/// line and the fix.
#[test]
fn a_misspelt_handle_function_gets_a_did_you_mean() {
    let hooks = Hooks::new();
    hooks.python(
        "typo",
        "[\"agent:start\"]",
        "import os\n\n\ndef handel(event, context):\n    return None\n",
    );
    let o = run_in(&hooks, &["check"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("no 'handle' function found in handler.py; did you mean handle?"),
        "{out}"
    );
    assert!(
        out.contains("'handel' (line 4): rename it to handle"),
        "{out}"
    );
}

/// A near miss of a gateway event name made `check` exit 0 (the hook would never run), and
/// `list --live` did not show the warning the service has. `check` now fails on it, and both
/// lists show it under the hook.
#[test]
fn a_near_miss_event_name_fails_check_and_shows_in_both_lists() {
    let hooks = Hooks::new();
    hooks.python(
        "late",
        "[\"agent:started\"]",
        "def handle(e, c):\n    return None\n",
    );
    let o = run_in(&hooks, &["check"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("late/HOOK.yaml"), "{out}");
    assert!(out.contains("did you mean \"agent:start\"?"), "{out}");
    assert!(out.contains("fix the name in `events:`"), "{out}");
    let o = run_in(&hooks, &["list"]);
    assert!(
        text(&o).contains("    warning: pattern \"agent:started\""),
        "{}",
        text(&o)
    );
    let serve = crate::util::Serve::start(&hooks, &[]);
    let o = run(&hooks, &["list", "--live", &serve.addr]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("    warning: pattern \"agent:started\" matches no known gateway event; did you mean \"agent:start\"?"),
        "{out}"
    );
}

/// `sandbox: strickt` got "write e.g. `sandbox: strict, or sandbox: {...}`" (one pair of
/// backticks around prose and code): now each piece of code has its own, and the near miss is
/// named.
#[test]
fn a_misspelt_sandbox_preset_gets_a_did_you_mean_and_well_quoted_examples() {
    let hooks = Hooks::new();
    hooks.add(
        "s",
        &[
            ("HOOK.yaml", "events: [\"agent:start\"]\nsandbox: strickt\n"),
            ("handler.py", "def handle(e, c):\n    return None\n"),
        ],
    );
    let o = run_in(&hooks, &["check"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("s/HOOK.yaml"), "{out}");
    assert!(
        out.contains("\"strickt\" is not a sandbox; did you mean `sandbox: strict`?"),
        "{out}"
    );
    assert!(
        out.contains("write e.g. `sandbox: strict`, or `sandbox: {read: "),
        "{out}"
    );
    assert!(
        out.trim_end().lines().any(|l| l.ends_with("exec: false}`")),
        "{out}"
    );
}

/// Plain `list` printed the `list --live` table with zero counters: it now says it is the view
/// from disk and has no status or counter columns.
#[test]
fn plain_list_says_it_is_the_view_from_disk_without_counters() {
    let hooks = Hooks::new();
    hooks.python(
        "one",
        "[\"agent:start\"]",
        "def handle(e, c):\n    return None\n",
    );
    let o = run_in(&hooks, &["list"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let first = out.lines().next().unwrap_or("");
    assert!(first.starts_with("on disk in "), "{out}");
    assert!(
        first.contains("`hermes-hooks list --live` asks it"),
        "{out}"
    );
    let header = out.lines().find(|l| l.starts_with("NAME")).expect("header");
    for live_only in ["STATUS", "OK", "FAILED", "DROPPED"] {
        assert!(!header.contains(live_only), "{header}");
    }
}

/// Runs git in `dir` (no global config).
fn git(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.org"])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// A repository of three hooks `a`, `b`, `c` in `hooks`' temp dir, committed; its file:// URL.
fn three_hook_repo(hooks: &Hooks) -> (std::path::PathBuf, String) {
    let repo = hooks.tmp.path().join("pkg");
    for h in ["a", "b", "c"] {
        std::fs::create_dir_all(repo.join(h)).unwrap();
        std::fs::write(
            repo.join(h).join("HOOK.yaml"),
            "events: [\"agent:start\"]\n",
        )
        .unwrap();
        std::fs::write(
            repo.join(h).join("handler.py"),
            "def handle(event, context):\n    return None\n",
        )
        .unwrap();
    }
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "v1"]);
    let url = format!("file://{}", repo.display());
    (repo, url)
}

/// `install --all` refused every hook when one was installed already; it now installs the rest
/// and says which it skipped. `update --all` said the `file://` warning once per hook (three
/// times): now once. `update --dry-run` showed a changed code file by name only: now its lines.
/// And `update` replaced a hand edit without a word: it now says so, shows the edit going, and
/// without `--yes` (and no terminal to ask on) changes nothing and exits 1.
#[test]
fn install_all_update_dry_run_and_a_hand_edit_say_what_they_do() {
    let hooks = Hooks::new();
    let (repo, url) = three_hook_repo(&hooks);
    let o = run_in(&hooks, &["install", &format!("{url}#a")]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = run_in(&hooks, &["install", &url, "--all"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("skipped a: already installed"), "{out}");
    assert!(
        out.contains("`hermes-hooks update a` refreshes it"),
        "{out}"
    );
    assert!(
        out.contains("installed b ") && out.contains("installed c "),
        "{out}"
    );
    let o = run_in(&hooks, &["install", &url, "--all"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("every hook of"), "{out}");
    assert!(out.contains("update --all"), "{out}");

    // A new upstream version of c, and a hand edit of b.
    std::fs::write(
        repo.join("c/handler.py"),
        "def handle(event, context):\n    return {\"v\": 2}\n",
    )
    .unwrap();
    git(&repo, &["commit", "-q", "-am", "v2"]);
    let edited = hooks.root().join("b/handler.py");
    let mut text_b = std::fs::read_to_string(&edited).unwrap();
    text_b.push_str("# my local fix\n");
    std::fs::write(&edited, &text_b).unwrap();

    let o = run_in(&hooks, &["update", "--all", "--dry-run"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(
        out.matches("insecure or local URL scheme").count(),
        1,
        "{out}"
    );
    assert!(
        out.contains("  handler.py:\n    -    return None\n    +    return {\"v\": 2}"),
        "{out}"
    );
    assert!(out.contains("-# my local fix"), "{out}");
    assert!(
        out.contains("warning: b: its files were edited by hand"),
        "{out}"
    );

    let o = run_in(&hooks, &["update", "b"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("not replacing the hand-edited files"), "{out}");
    assert!(out.contains("hermes-hooks update b --yes"), "{out}");
    assert!(
        std::fs::read_to_string(&edited)
            .unwrap()
            .contains("# my local fix")
    );

    let o = run_in(&hooks, &["update", "b", "--yes"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        !std::fs::read_to_string(&edited)
            .unwrap()
            .contains("# my local fix")
    );
}

/// A strict executable that starts a program got the read denial's hint; it now gets its own,
/// naming `exec: true`. And a strict Python hook looking for a file under `~` got a bare
/// FileNotFoundError (HOME is withheld, so `~` is the passwd entry's home): the log now says so.
#[testenv::needs(landlock4)]
#[test]
fn sandbox_denials_of_exec_and_a_withheld_home_say_which_key_helps() {
    let hooks = Hooks::new();
    let dir = hooks.exec(
        "starter",
        "[\"agent:start\"]",
        "#!/bin/sh\ncat >/dev/null\n/usr/bin/id\n",
    );
    std::fs::write(
        dir.join("HOOK.yaml"),
        "name: starter\nevents: [\"agent:start\"]\nsandbox: strict\n",
    )
    .unwrap();
    let o = run_in(&hooks, &["test", "agent:start"]);
    let out = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("sandbox: starting a program was denied"),
        "{out}"
    );
    assert!(
        out.contains("add `exec: true` to `sandbox:` at HOOK.yaml line 3"),
        "{out}"
    );

    let hooks = Hooks::new();
    hooks.add(
        "homely",
        &[
            ("HOOK.yaml", "events: [\"agent:start\"]\nsandbox: strict\n"),
            (
                "handler.py",
                "import os\n\ndef handle(event, context):\n    \
                 with open(os.path.expanduser('~/.config/homely/token')) as f:\n        \
                 return f.read()\n",
            ),
        ],
    );
    let o = Command::new(bin())
        .args(["test", "agent:start", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .env("HOME", hooks.tmp.path())
        .output()
        .expect("run hermes-hooks");
    let out = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("FileNotFoundError"), "{out}");
    assert!(out.contains("the sandbox withholds HOME"), "{out}");
    assert!(out.contains("add HOME under `env:`"), "{out}");
}
