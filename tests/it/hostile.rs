//! Hostile hooks: attacks by someone who controls one hook's files (its HOOK.yaml, its
//! handler, what it writes while it runs) against the sandbox and the filesystem, as issue 46
//! reproduced them on d69d285. One test per attack; each doc comment names the issue-46 row
//! (or suspected case) it reproduces. To add a case: build the hook with [`Lab`], run the
//! attack through `check`, `serve` ([`Lab::serve`], [`call`]) or the package commands
//! ([`Lab::hh`]), and assert the refusal says what to fix. The control-API rows (3, 5, 6, 7)
//! live in `hostile_api.rs`.
//!
//! "The secret" stands for `/etc/shadow` or `$HERMES_HOME/.env`: a file in the test's own
//! directory that no grant covers, so a hook that reads it has escaped.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, bin, poll};

const T: Duration = Duration::from_secs(30);

/// A hook handler that does what the event asks: read or write a path, say a variable, make a
/// link, exit.
const PY_OPS: &str = r#"import os, sys

def handle(event, context):
    op, arg = context["op"], context.get("arg")
    if op == "read":
        with open(arg) as f:
            return f.read()
    if op == "write":
        with open(arg, "w") as f:
            f.write("written")
        return "written"
    if op == "env":
        return os.environ.get(arg, "<unset>")
    if op == "plant":  # replace the directory `arg` by a link to /, then die
        os.rmdir(arg)
        os.symlink("/", arg)
        os._exit(3)
    raise ValueError(op)
"#;

/// One `HERMES_HOME`, hook root and secret per test.
struct Lab {
    hooks: Hooks,
    secret: PathBuf,
}

impl Lab {
    fn new() -> Self {
        let hooks = Hooks::new();
        let secret = hooks.tmp.path().join("shadow");
        std::fs::write(&secret, "root:SECRET-HASH").unwrap();
        std::fs::write(hooks.home().join(".env"), "GATEWAY_KEY=k3y\n").unwrap();
        Self { hooks, secret }
    }

    fn secret(&self) -> String {
        self.secret.display().to_string()
    }

    /// A Python hook in directory `dir` with `yaml` after its `events:` line and [`PY_OPS`].
    fn python(&self, dir: &str, name_line: &str, yaml: &str) -> PathBuf {
        self.hooks.add(
            dir,
            &[
                (
                    "HOOK.yaml",
                    &format!("{name_line}\nevents: [\"{dir}:*\"]\n{yaml}"),
                ),
                ("handler.py", PY_OPS),
            ],
        )
    }

    /// `check` on the hook root: (success, stdout and stderr).
    fn check(&self) -> (bool, String) {
        let o = self.hh(&["check"]);
        (o.status.success(), text(&o))
    }

    /// The binary with `args`, this lab's `HERMES_HOME` and hook root.
    fn hh(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .args(args)
            .arg("--hooks-dir")
            .arg(self.hooks.root())
            .env("HERMES_HOME", self.hooks.home())
            .env_remove("HERMES_HOOKS_TRUST")
            .env_remove("HERMES_HOOKS_SANDBOX_DEFAULT")
            .output()
            .unwrap()
    }

    fn serve(&self, env: &[(&str, &str)]) -> Serve {
        let mut cmd = Command::new(bin());
        cmd.arg("serve")
            .arg("--hooks-dir")
            .arg(self.hooks.root())
            .args(["--listen", "127.0.0.1:0"])
            .env_remove("HERMES_HOOKS_SANDBOX_DEFAULT")
            .env_remove("HERMES_HOOKS_TRUST");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Serve::spawn(cmd, &self.hooks)
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The result of one event for `hook` (events `HOOK:x`), or its error.
fn call(serve: &Serve, hook: &str, op: &str, arg: impl std::fmt::Display) -> Result<Value, String> {
    let (_, v) = serve.post(
        "/v1/collect",
        &json!({"event": format!("{hook}:x"), "context": {"op": op, "arg": arg.to_string()}}),
    );
    match (&v["results"][0], &v["errors"][0]) {
        (r, Value::Null) if !r.is_null() => Ok(r["result"].clone()),
        (_, e) if !e.is_null() => Err(e["error"].as_str().unwrap_or_default().to_string()),
        _ => Err(format!("no answer: {v}")),
    }
}

// --- Row 1: a hook name is one path component ---

/// Issue 46 row 1: `name: ".."` made the state directory `$HERMES_HOME/hook-state/..` (the
/// whole `$HERMES_HOME`, its `.env` and the hook's own HOOK.yaml writable). Every name that is
/// not one harmless path component is refused, saying what to write, by `check`, by the
/// service (the hook is not loaded) and by `install`.
#[test]
fn row1_a_name_that_is_not_one_path_component_is_refused_everywhere() {
    let lab = Lab::new();
    for (dir, name) in [
        ("dotdot", "\"..\""),
        ("dot", "\".\""),
        ("hidden", "\".env\""),
        ("slash", "\"a/../..\""),
        ("long", &"x".repeat(65)),
    ] {
        lab.python(dir, &format!("name: {name}"), "sandbox: strict\n");
    }
    let (ok, out) = lab.check();
    assert!(!ok, "{out}");
    for dir in ["dotdot", "dot", "hidden", "slash", "long"] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("{dir}/HOOK.yaml")))
            .unwrap_or_else(|| panic!("nothing about {dir}:\n{out}"));
        assert!(
            line.contains("name") && line.contains("e.g. `name: my-hook`"),
            "{line}"
        );
    }
    assert!(!out.contains("hook-state/.."), "{out}");
    let serve = lab.serve(&[]);
    let (_, hooks) = serve.get("/v1/hooks");
    assert_eq!(hooks["hooks"].as_array().map(Vec::len), Some(0), "{hooks}");
    drop(serve);
    // `install` refuses the same package.
    let src = lab.hooks.tmp.path().join("pkg");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(
        src.join("HOOK.yaml"),
        "name: \"..\"\nevents: [\"x:*\"]\nsandbox: strict\n",
    )
    .unwrap();
    std::fs::write(src.join("handler.py"), PY_OPS).unwrap();
    let o = lab.hh(&["install", src.to_str().unwrap()]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("e.g. `name: my-hook`"), "{}", text(&o));
    assert!(!lab.hooks.home().join("hook-state").exists());
}

/// Issue 46 suspected case and row 1: `update` did not look at the new version's `name:`. A
/// new version that renames itself (to another hook's name, or to `..`) is refused and the
/// installed version stays.
#[test]
fn row1_update_rechecks_the_new_name() {
    let lab = Lab::new();
    let src = lab.hooks.tmp.path().join("pkg");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("HOOK.yaml"), "name: pkg\nevents: [\"x:*\"]\n").unwrap();
    std::fs::write(src.join("handler.py"), PY_OPS).unwrap();
    let o = lab.hh(&["install", src.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    for renamed in ["operator-hook", "\"..\""] {
        std::fs::write(
            src.join("HOOK.yaml"),
            format!("name: {renamed}\nevents: [\"x:*\"]\n"),
        )
        .unwrap();
        let o = lab.hh(&["update", "pkg"]);
        assert!(!o.status.success(), "{renamed}: {}", text(&o));
        let t = text(&o);
        assert!(t.contains("name"), "{t}");
        let installed = std::fs::read_to_string(lab.hooks.root().join("pkg/HOOK.yaml")).unwrap();
        assert!(installed.starts_with("name: pkg"), "{installed}");
    }
}

// --- Row 2: the kernel gets exactly what `check` shows ---

/// Issue 46 row 2: `write: ["{state_dir}/cache"]`; the handler replaces `cache` by a link to
/// `/` and dies. On d69d285 the restarted worker was granted `/` (it read the secret and wrote
/// anywhere). Now the grant is never the link's target: the restart is refused saying which
/// link to delete, `check` says the same, and nothing outside is readable.
#[testenv::needs(landlock4)]
#[test]
fn row2_a_link_planted_in_the_state_directory_is_not_followed_after_a_restart() {
    let lab = Lab::new();
    lab.python(
        "cacher",
        "name: cacher",
        "sandbox:\n  write: [\"{state_dir}/cache\"]\n",
    );
    let serve = lab.serve(&[]);
    let cache = lab.hooks.home().join("hook-state/cacher/cache");
    assert!(cache.is_dir(), "the service made the state subdirectory");
    let e = call(&serve, "cacher", "read", lab.secret()).unwrap_err();
    assert!(e.contains("Permission"), "{e}");
    let _ = call(&serve, "cacher", "plant", cache.display());
    assert!(
        std::fs::symlink_metadata(&cache).is_ok_and(|m| m.file_type().is_symlink()),
        "the hook planted its link"
    );
    // Whatever the restarted worker answers, it never reads the secret through the link.
    poll(
        T,
        "the restarted hook to answer or be refused",
        || match call(&serve, "cacher", "read", cache.join(lab.secret()).display()) {
            Ok(v) => panic!("read through the planted link: {v}"),
            Err(e) if e.contains("no answer") => None,
            Err(e) => Some(e),
        },
    );
    assert_eq!(
        call(&serve, "cacher", "read", lab.secret()).ok(),
        None,
        "read the secret"
    );
    let (_, shown) = serve.get("/v1/hooks/cacher");
    let last = shown["last_error"].to_string();
    assert!(last.contains("symbolic link"), "{shown}");
    drop(serve);
    // `check` and a new service say so before anything starts.
    let (ok, out) = lab.check();
    assert!(!ok, "{out}");
    assert!(
        out.contains("symbolic link") && out.contains("cache") && out.contains("delete the link"),
        "{out}"
    );
    assert!(!out.contains("write:   /\n"), "{out}");
}

/// Issue 46 row 2: `check` and `/v1/hooks` show the resolved rule: an operator's link outside
/// what the hook writes is followed once, and the target is what is shown and granted.
#[testenv::needs(landlock4)]
#[test]
fn row2_check_shows_the_resolved_grant() {
    let lab = Lab::new();
    let real = lab.hooks.tmp.path().join("real-data");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join("f.txt"), "data").unwrap();
    let alias = lab.hooks.tmp.path().join("data-alias");
    std::os::unix::fs::symlink(&real, &alias).unwrap();
    lab.python(
        "reader",
        "name: reader",
        &format!("sandbox:\n  read: [\"{}\"]\n", alias.display()),
    );
    let (ok, out) = lab.check();
    assert!(ok, "{out}");
    let real = real.canonicalize().unwrap();
    assert!(out.contains(&real.display().to_string()), "{out}");
    let serve = lab.serve(&[]);
    let (_, shown) = serve.get("/v1/hooks/reader");
    assert!(
        shown["sandbox"]["read"]
            .to_string()
            .contains(&real.display().to_string()),
        "{shown}"
    );
    assert_eq!(
        call(&serve, "reader", "read", alias.join("f.txt").display()),
        Ok(json!("data"))
    );
}

// --- Row 4: nothing the hook controls runs before its sandbox ---

/// Issue 46 row 4: `env: {PYTHONPATH: /}` granted the whole filesystem (every import path
/// entry was granted read). A sandboxed hook may not set a variable that steers the
/// interpreter or the loader: `check` and the service refuse it, naming the variable.
#[testenv::needs(landlock4)]
#[test]
fn row4_interpreter_steering_variables_in_env_are_refused() {
    let lab = Lab::new();
    for (dir, env) in [
        ("pypath", "{PYTHONPATH: /}"),
        ("preload", "{LD_PRELOAD: /tmp/x.so}"),
        ("startup", "{PYTHONSTARTUP: x.py, BASH_ENV: /tmp/x}"),
    ] {
        lab.python(
            dir,
            &format!("name: {dir}"),
            &format!("env: {env}\nsandbox: strict\n"),
        );
    }
    // Asking to see the service's own such variable is the same.
    lab.python(
        "granted",
        "name: granted",
        "sandbox:\n  env: [PYTHONPATH]\n",
    );
    // An option that loads nothing stays allowed.
    lab.python(
        "seeded",
        "name: seeded",
        "env: {PYTHONHASHSEED: \"0\"}\nsandbox: strict\n",
    );
    let (ok, out) = lab.check();
    assert!(!ok, "{out}");
    for bad in ["PYTHONPATH", "LD_PRELOAD", "BASH_ENV, PYTHONSTARTUP"] {
        assert!(
            out.contains(&format!("sets {bad}, which steer the interpreter")),
            "{bad}: {out}"
        );
    }
    let serve = lab.serve(&[("PYTHONPATH", "/")]);
    for hook in ["pypath", "preload", "startup", "granted"] {
        let e = call(&serve, hook, "read", lab.secret()).unwrap_err();
        assert!(e.contains("steer the interpreter"), "{hook}: {e}");
    }
    let e = call(&serve, "seeded", "read", lab.secret()).unwrap_err();
    assert!(e.contains("Permission"), "{e}");
}

/// Issue 46 row 4: `env: {PYTHONPATH: "."}`, `cwd: hook` and a `sitecustomize.py` starting a
/// thread that reads the secret: on d69d285 the thread ran before the sandbox and read it. The
/// variable is refused; without it the hook's `sitecustomize.py` (and a `.pth`) are never
/// imported, in a forked worker or one started from scratch.
#[testenv::needs(landlock4)]
#[test]
fn row4_a_sitecustomize_in_the_hook_never_runs_before_the_sandbox() {
    let lab = Lab::new();
    let leak = lab.hooks.out().join("leak.txt");
    let site = format!(
        "import threading\ndef steal():\n    data = open({s:?}).read()\n    open({l:?}, 'w').write(data)\nt = threading.Thread(target=steal)\nt.start()\nt.join()\n",
        s = lab.secret(),
        l = leak.display().to_string()
    );
    for (dir, env) in [
        ("withpath", "env: {PYTHONPATH: \".\"}\n"),
        ("forked", ""),
        ("fresh", "env: {PYTHONHASHSEED: \"1\"}\n"),
    ] {
        let d = lab.python(
            dir,
            &format!("name: {dir}"),
            &format!("{env}cwd: hook\nsandbox: strict\n"),
        );
        std::fs::write(d.join("sitecustomize.py"), &site).unwrap();
        std::fs::write(d.join("usercustomize.py"), &site).unwrap();
        std::fs::write(d.join("evil.pth"), "import sitecustomize\n").unwrap();
    }
    let serve = lab.serve(&[]);
    let e = call(&serve, "withpath", "read", lab.secret()).unwrap_err();
    assert!(e.contains("steer the interpreter"), "{e}");
    for hook in ["forked", "fresh"] {
        let e = call(&serve, hook, "read", lab.secret()).unwrap_err();
        assert!(e.contains("Permission"), "{hook}: {e}");
    }
    assert_eq!(
        serve.get("/v1/hooks/fresh").1["worker"]["start"],
        "fresh",
        "the fresh case ran fresh"
    );
    assert!(
        !leak.exists(),
        "the hook's sitecustomize ran before the sandbox"
    );
}

// --- Suspected: the service's secrets ---

/// Issue 46 suspected case: a strict hook saw every `HERMES_*` variable, so a service started
/// with `HERMES_HOOKS_TOKEN` handed its hooks the API token. No hook, confined or not, Python
/// (forked or fresh) or executable, receives it; a confined one does not get other
/// `HERMES_*` credentials either unless it names them.
#[test]
fn suspected_the_api_token_never_reaches_a_hook() {
    let lab = Lab::new();
    lab.python("strict", "name: strict", "sandbox: strict\n");
    lab.python(
        "fresh",
        "name: fresh",
        "env: {PYTHONHASHSEED: \"0\"}\nsandbox: strict\n",
    );
    lab.python("open", "name: open", "sandbox: none\n");
    lab.python(
        "named",
        "name: named",
        "sandbox:\n  env: [HERMES_GATEWAY_TOKEN]\n",
    );
    let exe = lab.hooks.exec(
        "exe",
        "[\"exe:*\"]",
        "#!/bin/sh\nprintf '\"%s|%s\"' \"$HERMES_HOOKS_TOKEN\" \"$HERMES_HOOKS_TOKEN_FILE\"\n",
    );
    assert!(exe.is_dir());
    let serve = lab.serve(&[
        ("HERMES_HOOKS_TOKEN", "api-t0ken"),
        ("HERMES_HOOKS_TOKEN_FILE", "/run/token"),
        ("HERMES_GATEWAY_TOKEN", "gw-t0ken"),
    ]);
    for hook in ["strict", "fresh", "open", "named"] {
        for var in ["HERMES_HOOKS_TOKEN", "HERMES_HOOKS_TOKEN_FILE"] {
            assert_eq!(
                call(&serve, hook, "env", var),
                Ok(json!("<unset>")),
                "{hook} saw {var}"
            );
        }
        assert_eq!(
            call(&serve, hook, "env", "HERMES_HOME"),
            Ok(json!(lab.hooks.home().display().to_string())),
            "{hook}"
        );
    }
    assert_eq!(call(&serve, "exe", "x", ""), Ok(json!("|")));
    if testenv::has!(landlock4) {
        assert_eq!(
            call(&serve, "strict", "env", "HERMES_GATEWAY_TOKEN"),
            Ok(json!("<unset>"))
        );
        assert_eq!(
            call(&serve, "named", "env", "HERMES_GATEWAY_TOKEN"),
            Ok(json!("gw-t0ken"))
        );
    }
}

// --- Row 8: link chains inside a hook's tree ---

/// Makes, under `dir`, issue 46 row 8's pair of links: `a/b/c/d/e/f/g/h/up -> ../../../../../../../..`
/// (the top of `dir`) and `manual -> a/b/c/d/e/f/g/h/up/../../outside/secret`: each link's text
/// stays inside `dir`, but the chain lands on `dir/../../outside/secret`.
fn chain_links(dir: &std::path::Path) {
    let deep = dir.join("a/b/c/d/e/f/g/h");
    std::fs::create_dir_all(&deep).unwrap();
    std::os::unix::fs::symlink("../../../../../../../..", deep.join("up")).unwrap();
    std::os::unix::fs::symlink(
        "a/b/c/d/e/f/g/h/up/../../outside/secret",
        dir.join("manual"),
    )
    .unwrap();
}

/// Issue 46 row 8: `install` accepted a package whose links, followed one after the other,
/// leave it (`check_link` read each link's text only); a hook granted `{hook_dir}/manual` then
/// read the file outside. The installer resolves the chain and refuses it; the trust scan
/// refuses a hook placed by hand with the same links; and a grant under `{hook_dir}` that
/// resolves outside it is refused by `check` and the service.
#[testenv::needs(landlock4)]
#[test]
fn row8_a_link_chain_leaving_the_tree_is_refused_by_install_and_the_grant() {
    let lab = Lab::new();
    let outside = lab.hooks.tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "root:SECRET-HASH").unwrap();
    let yaml = "name: manual\nevents: [\"manual:*\"]\nsandbox:\n  read: [\"{hook_dir}/manual\"]\n";
    let src = lab.hooks.tmp.path().join("src/pkg");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("HOOK.yaml"), yaml).unwrap();
    std::fs::write(src.join("handler.py"), PY_OPS).unwrap();
    chain_links(&src);
    assert_eq!(
        std::fs::read_to_string(src.join("manual")).unwrap(),
        "root:SECRET-HASH",
        "the chain does lead out"
    );
    let o = lab.hh(&["install", src.to_str().unwrap()]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("leaves the hook directory through its other links"),
        "{}",
        text(&o)
    );
    assert!(!lab.hooks.root().join("manual").exists());
    // Placed by hand: the trust scan resolves the same chain and refuses the hook.
    let dir = lab
        .hooks
        .add("manual", &[("HOOK.yaml", yaml), ("handler.py", PY_OPS)]);
    chain_links(&dir);
    let (ok, out) = lab.check();
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "manual/manual is a symbolic link that reads as staying in the hook directory but leads"
        ),
        "{out}"
    );
    // A grant under {hook_dir} that resolves outside it is refused however it gets there (here
    // `..`; with --insecure-permissions the scan above is off, the grant's check is not).
    std::fs::remove_dir_all(&dir).unwrap();
    lab.python(
        "climber",
        "name: climber",
        "sandbox:\n  read: [\"{hook_dir}/../../outside/secret\"]\n",
    );
    let (ok, out) = lab.check();
    assert!(!ok, "{out}");
    assert!(out.contains("outside {hook_dir}"), "{out}");
    let serve = lab.serve(&[]);
    let e = call(&serve, "climber", "read", outside.join("secret").display()).unwrap_err();
    assert!(e.contains("outside {hook_dir}"), "{e}");
}

// --- Suspected: names shared with an operator's hook ---

/// Issue 46 suspected case: `install` did not look at the hooks already in the roots, and
/// approvals are keyed by name, so a package named like an operator's hook could take its
/// approval (`--yes`) or drop it (`remove`). The install is refused naming the other hook,
/// and the approval file is untouched; `remove` of a package keeps the approval while another
/// hook of that name runs.
#[test]
fn suspected_a_package_cannot_take_or_drop_an_operators_approval() {
    let lab = Lab::new();
    let trust = lab.hooks.home().join("hooks-trust.json");
    // The operator's hook, in a directory named otherwise, approved.
    lab.python("operator-dir", "name: policy", "");
    let o = lab.hh(&["enable", "policy", "--trust", "explicit"]);
    assert!(o.status.success(), "{}", text(&o));
    let approved = std::fs::read(&trust).unwrap();
    assert!(String::from_utf8_lossy(&approved).contains("policy"));
    let src = lab.hooks.tmp.path().join("src/policy");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("HOOK.yaml"), "name: policy\nevents: [\"x:*\"]\n").unwrap();
    std::fs::write(src.join("handler.py"), PY_OPS).unwrap();
    for extra in [&[][..], &["--trust", "explicit", "--yes"][..]] {
        let mut args = vec!["install", src.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = lab.hh(&args);
        assert!(!o.status.success(), "{extra:?}: {}", text(&o));
        assert!(
            text(&o).contains("a hook named policy already runs from")
                && text(&o).contains("operator-dir"),
            "{}",
            text(&o)
        );
        assert_eq!(std::fs::read(&trust).unwrap(), approved, "{extra:?}");
        assert!(!lab.hooks.root().join("policy").exists());
    }
    // A package installed first, then an operator's hook of the same name: `remove` of the
    // package leaves that name's approval alone.
    std::fs::write(src.join("HOOK.yaml"), "name: pkg\nevents: [\"x:*\"]\n").unwrap();
    let o = lab.hh(&[
        "install",
        src.to_str().unwrap(),
        "--trust",
        "explicit",
        "--yes",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    lab.python("pkg-by-hand", "name: pkg", "");
    let o = lab.hh(&["enable", "pkg", "--trust", "explicit"]);
    let before = std::fs::read_to_string(&trust).unwrap();
    assert!(before.contains("\"pkg\""), "{}: {before}", text(&o));
    let o = lab.hh(&["remove", "pkg"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("the approval of pkg stays"),
        "{}",
        text(&o)
    );
    assert!(std::fs::read_to_string(&trust).unwrap().contains("\"pkg\""));
}

// --- Row 9: extension modules ---

/// Builds the extension module `name` (returning `name`'s own word from `word()`) into `dir`
/// with `cc` against the headers of the `python3` the hooks run; `None` when there is no
/// compiler or no `Python.h` (the caller skips, CI fails).
fn build_extension(dir: &std::path::Path, name: &str) -> Option<()> {
    let info = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX'))",
        ])
        .output()
        .ok()?;
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    let mut lines = info.lines();
    let (include, suffix) = (lines.next()?, lines.next()?);
    if !std::path::Path::new(include).join("Python.h").exists() {
        return None;
    }
    let c = dir.join(format!("{name}.c"));
    std::fs::write(
        &c,
        format!(
            "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n\
             static PyObject *word(PyObject *self, PyObject *args) {{ return PyUnicode_FromString(\"{name}\"); }}\n\
             static PyMethodDef methods[] = {{{{\"word\", word, METH_NOARGS, NULL}}, {{NULL, NULL, 0, NULL}}}};\n\
             static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, \"{name}\", NULL, -1, methods}};\n\
             PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&def); }}\n"
        ),
    )
    .unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-I", include, "-o"])
        .arg(dir.join(format!("{name}{suffix}")))
        .arg(&c)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&c).unwrap();
    Some(())
}

/// Issue 46 row 9: a hook with two extension modules: on d69d285 the second failed ("does not
/// define module export function (PyInit_ext_b)"): both were loaded from the same
/// `/proc/self/fd/N` name and the dynamic loader returned the first. Each now loads from a name
/// of its own, in a forked worker, a fresh one and a sandboxed one.
#[test]
fn row9_two_extension_modules_each_load_their_own_library() {
    let lab = Lab::new();
    let code = "import ext_a, ext_b\n\ndef handle(event, context):\n    return ext_a.word() + '+' + ext_b.word()\n";
    for (name, yaml) in [
        ("twoext", ""),
        ("twofresh", "env: {PYTHONHASHSEED: \"0\"}\n"),
        ("twostrict", "sandbox: strict\n"),
    ] {
        let dir = lab.hooks.add(
            name,
            &[
                (
                    "HOOK.yaml",
                    &format!("name: {name}\nevents: [\"{name}:*\"]\n{yaml}"),
                ),
                ("handler.py", code),
            ],
        );
        for ext in ["ext_a", "ext_b"] {
            // Never skipped: without them the test fails, saying what to install.
            assert!(
                build_extension(&dir, ext).is_some(),
                "cannot build {ext}: this test needs a C compiler and python3's Python.h \
                 (apt-get install gcc python3-dev; .ci/run installs them)"
            );
        }
    }
    let serve = lab.serve(&[]);
    let mut hooks = vec!["twoext", "twofresh"];
    if testenv::has!(landlock4) {
        hooks.push("twostrict");
    }
    for hook in hooks {
        assert_eq!(
            call(&serve, hook, "x", ""),
            Ok(json!("ext_a+ext_b")),
            "{hook}: {}",
            serve.get(&format!("/v1/hooks/{hook}")).1["last_error"]
        );
    }
}

/// Issue 46 row 4 ("nothing the hook controls runs before its sandbox"): a sandboxed Python
/// hook naming an interpreter inside its own directory (a virtualenv it ships, whose `.pth`
/// files run at interpreter start, before the worker confines itself) is refused, saying
/// where to put the virtualenv instead.
#[test]
fn row4_an_interpreter_the_hook_ships_is_refused_for_a_sandboxed_hook() {
    let lab = Lab::new();
    let dir = lab.python(
        "shipped",
        "name: shipped",
        "python: venv/bin/python\nsandbox: strict\n",
    );
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let python = String::from_utf8_lossy(&out.stdout).trim().to_string();
    std::fs::create_dir_all(dir.join("venv/bin")).unwrap();
    std::os::unix::fs::symlink(&python, dir.join("venv/bin/python")).unwrap();
    std::fs::write(
        dir.join("venv/pyvenv.cfg"),
        "include-system-site-packages = false\n",
    )
    .unwrap();
    let (ok, out) = lab.check();
    assert!(!ok, "{out}");
    assert!(
        out.contains("`python: ") && out.contains("install the virtualenv outside"),
        "{out}"
    );
    // Unconfined, the same hook is the operator's choice.
    std::fs::write(
        dir.join("HOOK.yaml"),
        "name: shipped\nevents: [\"shipped:*\"]\npython: venv/bin/python\nsandbox: none\n",
    )
    .unwrap();
    let (ok, out) = lab.check();
    assert!(ok, "{out}");
}
