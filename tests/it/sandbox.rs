//! Sandboxed hooks (`sandbox:` in HOOK.yaml): a strict Python hook (forked and fresh worker)
//! and a strict executable each try what their grants do not allow (read a private key in the
//! test's home, write outside, connect to an undeclared local port, see an undeclared variable,
//! start a program): each fails and the service log says what was denied and which key would
//! allow it; what they declare succeeds. A hot-reloaded hook gets its new rules; `check` and
//! `/v1/hooks` show what is enforced; `--sandbox-default strict` confines hooks without the key;
//! a library hook asking for a sandbox is refused. On a kernel without Landlock ABI 4 the tests
//! that need it are listed as ignored with the reason (`#[testenv::needs(landlock4)]`, crates/testenv);
//! never under `CI`, where they fail instead.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, bin, poll};

const T: Duration = Duration::from_secs(30);

/// What the hooks under test try; the same operations for the Python and executable kinds.
const PY_OPS: &str = r#"import os, socket, subprocess

def run(context):
    op, arg = context["op"], context.get("arg")
    if op == "read":
        with open(arg) as f:
            return f.read()
    if op == "write":
        with open(arg, "w") as f:
            f.write("written")
        return "written"
    if op == "connect":
        socket.create_connection(("127.0.0.1", int(arg)), timeout=5).close()
        return "connected"
    if op == "env":
        return os.environ[arg]
    if op == "spawn":
        return subprocess.run([arg], capture_output=True).returncode
    if op == "pid":
        return os.getpid()
    raise ValueError(op)
"#;

struct World {
    hooks: Hooks,
    secret: PathBuf,
    open_port: TcpListener,
    closed_port: TcpListener,
}

impl World {
    fn new() -> Self {
        let hooks = Hooks::new();
        let keys = hooks.tmp.path().join("dot-ssh");
        std::fs::create_dir_all(&keys).unwrap();
        let secret = keys.join("id_ed25519");
        std::fs::write(&secret, "PRIVATE KEY").unwrap();
        std::fs::create_dir_all(hooks.out().join("granted")).unwrap();
        std::fs::write(hooks.out().join("readable.txt"), "public").unwrap();
        std::fs::write(
            hooks.home().join(".env"),
            "SECRET_TOKEN=s3cret\nDECLARED_TOKEN=d3clared\n",
        )
        .unwrap();
        Self {
            hooks,
            secret,
            open_port: TcpListener::bind("127.0.0.1:0").unwrap(),
            closed_port: TcpListener::bind("127.0.0.1:0").unwrap(),
        }
    }

    fn port(l: &TcpListener) -> u16 {
        l.local_addr().unwrap().port()
    }

    /// The `sandbox:` block every hook under test declares.
    fn sandbox(&self) -> String {
        format!(
            "sandbox:\n  read: [\"{out}/readable.txt\"]\n  write: [\"{out}/granted\"]\n  connect: [\"localhost:{port}\"]\n  env: [DECLARED_TOKEN]\n",
            out = self.hooks.out().display(),
            port = Self::port(&self.open_port)
        )
    }

    fn python(&self, name: &str, extra: &str) {
        self.hooks.add(
            name,
            &[
                (
                    "HOOK.yaml",
                    &format!(
                        "name: {name}\nevents: [\"{name}:*\"]\n{extra}{}",
                        self.sandbox()
                    ),
                ),
                (
                    "handler.py",
                    &format!("{PY_OPS}\ndef handle(event, context):\n    return run(context)\n"),
                ),
            ],
        );
    }

    fn exec(&self, name: &str) {
        let dir = self.hooks.add(
            name,
            &[
                (
                    "HOOK.yaml",
                    &format!("name: {name}\nevents: [\"{name}:*\"]\n{}", self.sandbox()),
                ),
                (
                    "handler",
                    &format!(
                        "#!{}\nimport json, sys\n{PY_OPS}\nprint(json.dumps(run(json.load(sys.stdin)[\"context\"])))\n",
                        system_python()
                    ),
                ),
            ],
        );
        crate::util::set_mode(&dir.join("handler"), 0o755);
    }
}

/// The system's Python for a `#!` line: a version manager's shim on `PATH` (pyenv's is a
/// bash script running more programs) is not what a confined executable hook would name.
fn system_python() -> &'static str {
    ["/usr/bin/python3", "/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("/usr/bin/python3")
}

/// The result of one event for `hook`, or its error.
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

fn logged(serve: &Serve, what: &str) {
    poll(T, &format!("the log to say {what:?}"), || {
        serve.log().contains(what).then_some(())
    });
}

/// Every forbidden access of `hook` fails (and is logged, for Python with the path or port and
/// the key that would allow it); every declared one succeeds.
fn assert_confined(w: &World, serve: &Serve, hook: &str, python: bool) {
    let out = w.hooks.out();
    let secret = w.secret.display().to_string();
    // Not declared: fail (first: what an unconfined hook would do).
    let e = call(serve, hook, "read", &secret).unwrap_err();
    assert!(e.contains("Permission"), "{hook} read the key: {e}");
    let outside = out.join(format!("{hook}-outside.txt"));
    let e = call(serve, hook, "write", outside.display()).unwrap_err();
    assert!(e.contains("Permission"), "{hook} wrote outside: {e}");
    assert!(!outside.exists());
    let e = call(serve, hook, "connect", World::port(&w.closed_port)).unwrap_err();
    assert!(e.contains("Permission"), "{hook} connected: {e}");
    let e = call(serve, hook, "env", "SECRET_TOKEN").unwrap_err();
    assert!(e.contains("KeyError"), "{hook} saw the variable: {e}");
    let e = call(serve, hook, "env", "SERVICE_SECRET").unwrap_err();
    assert!(
        e.contains("KeyError"),
        "{hook} saw the service's variable: {e}"
    );
    let e = call(serve, hook, "spawn", "/usr/bin/id").unwrap_err();
    assert!(e.contains("Permission"), "{hook} started a program: {e}");
    // Declared: succeed.
    assert_eq!(
        call(serve, hook, "read", out.join("readable.txt").display()),
        Ok(json!("public"))
    );
    let granted = out.join("granted").join(format!("{hook}.txt"));
    assert_eq!(
        call(serve, hook, "write", granted.display()),
        Ok(json!("written"))
    );
    assert_eq!(std::fs::read_to_string(&granted).unwrap(), "written");
    let state = w.hooks.home().join("hook-state").join(hook).join("s.txt");
    assert_eq!(
        call(serve, hook, "write", state.display()),
        Ok(json!("written"))
    );
    assert_eq!(
        call(serve, hook, "connect", World::port(&w.open_port)),
        Ok(json!("connected"))
    );
    assert_eq!(
        call(serve, hook, "env", "DECLARED_TOKEN"),
        Ok(json!("d3clared"))
    );
    assert_eq!(
        call(serve, hook, "env", "HERMES_HOOK_NAME"),
        Ok(json!(hook))
    );
    if python {
        // The ruleset the service built for the worker (handed over with the fork request) is
        // closed once enforced: the hook holds no descriptor of it.
        let pid = call(serve, hook, "pid", "").unwrap();
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
        let open: Vec<String> = fds
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|l| l.display().to_string())
            .collect();
        assert!(
            !open.iter().any(|l| l.contains("landlock")),
            "{hook} holds a ruleset: {open:?}"
        );
        logged(serve, &format!("sandbox: denied reading {secret}"));
        logged(
            serve,
            &format!("sandbox: denied writing {}", outside.display()),
        );
        logged(
            serve,
            &format!(
                "denied a connection to 127.0.0.1 port {p} (PermissionError: [Errno 13] Permission denied): to allow it, add port {p} under `connect:`",
                p = World::port(&w.closed_port)
            ),
        );
        logged(serve, "the hook looked up the variable SECRET_TOKEN");
        logged(serve, "denied starting /usr/bin/id");
        logged(serve, "`sandbox:` at HOOK.yaml line 3");
    } else {
        logged(serve, "sandbox: access denied");
    }
}

fn serve(w: &World, extra: &[&str]) -> Serve {
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .arg("--hooks-dir")
        .arg(w.hooks.root())
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env("SERVICE_SECRET", "from-the-service")
        .env_remove(hermes_hooks_sandbox_env());
    Serve::spawn(cmd, &w.hooks)
}

fn hermes_hooks_sandbox_env() -> &'static str {
    "HERMES_HOOKS_SANDBOX_DEFAULT"
}

#[testenv::needs(landlock4)]
#[test]
fn strict_python_hooks_forked_and_fresh_and_a_strict_executable_are_held_to_their_grants() {
    let w = World::new();
    w.python("pyfork", "");
    // A PYTHON* variable is read at interpreter start: this worker starts from scratch.
    w.python("pyfresh", "env: {PYTHONHASHSEED: \"0\"}\n");
    w.exec("exe");
    let serve = serve(&w, &[]);
    assert_eq!(serve.get("/v1/hooks/pyfork").1["worker"]["start"], "forked");
    assert_eq!(serve.get("/v1/hooks/pyfresh").1["worker"]["start"], "fresh");
    assert_confined(&w, &serve, "pyfork", true);
    assert_confined(&w, &serve, "pyfresh", true);
    assert_confined(&w, &serve, "exe", false);
    let shown = serve.get("/v1/hooks/exe").1;
    assert_eq!(shown["sandbox"]["mode"], "custom", "{shown}");
    assert!(
        shown["sandbox"]["enforced"]
            .as_str()
            .is_some_and(|e| e.starts_with("landlock ABI")),
        "{shown}"
    );
}

#[testenv::needs(landlock4)]
#[test]
fn a_reloaded_hook_gets_its_new_rules_and_the_default_confines_hooks_without_the_key() {
    let w = World::new();
    w.hooks.python(
        "plain",
        "[\"plain:*\"]",
        &format!("{PY_OPS}\ndef handle(event, context):\n    return run(context)\n"),
    );
    w.hooks.python(
        "open",
        "[\"open:*\"]",
        &format!("{PY_OPS}\ndef handle(event, context):\n    return run(context)\n"),
    );
    std::fs::write(
        w.hooks.root().join("open/HOOK.yaml"),
        "name: open\nevents: [\"open:*\"]\nsandbox: none\n",
    )
    .unwrap();
    let secret = w.secret.display().to_string();
    let serve = serve(&w, &["--sandbox-default", "strict"]);
    // No `sandbox:` key: strict by the service's default; `sandbox: none` stays open.
    let e = call(&serve, "plain", "read", &secret).unwrap_err();
    assert!(e.contains("Permission"), "{e}");
    assert_eq!(
        call(&serve, "open", "read", &secret),
        Ok(json!("PRIVATE KEY"))
    );
    assert_eq!(serve.get("/v1/hooks/plain").1["sandbox"]["mode"], "strict");
    // The hook now grants itself the file: the reloaded version reads it.
    std::fs::write(
        w.hooks.root().join("plain/HOOK.yaml"),
        format!("name: plain\nevents: [\"plain:*\"]\nsandbox:\n  read: [\"{secret}\"]\n"),
    )
    .unwrap();
    let (s, _) = serve.post("/v1/reload", &json!({}));
    assert_eq!(s, 200);
    poll(T, "the reloaded hook to read the file", || {
        (call(&serve, "plain", "read", &secret) == Ok(json!("PRIVATE KEY"))).then_some(())
    });
    // And back: the next version is refused the file again.
    std::fs::write(
        w.hooks.root().join("plain/HOOK.yaml"),
        "name: plain\nevents: [\"plain:*\"]\nsandbox: strict\n",
    )
    .unwrap();
    serve.post("/v1/reload", &json!({}));
    poll(T, "the reloaded hook to be refused the file", || {
        call(&serve, "plain", "read", &secret)
            .is_err_and(|e| e.contains("Permission"))
            .then_some(())
    });
}

fn check(hooks: &Hooks, env_default: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new(bin());
    cmd.arg("check")
        .arg("--hooks-dir")
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .env_remove(hermes_hooks_sandbox_env());
    if let Some(d) = env_default {
        cmd.env(hermes_hooks_sandbox_env(), d);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[testenv::needs(landlock4)]
#[test]
fn check_shows_each_hooks_permissions_and_a_library_hook_with_a_sandbox_is_refused() {
    let w = World::new();
    w.exec("exe");
    w.hooks.add(
        "lib",
        &[
            (
                "HOOK.yaml",
                "name: lib\nevents: [\"lib:*\"]\nsandbox: strict\n",
            ),
            ("handler.so", "not loaded: refused before"),
        ],
    );
    w.hooks.add(
        "web",
        &[(
            "HOOK.yaml",
            "name: web\nevents: [\"web:*\"]\nurl: https://example.org/x\nsandbox: strict\n",
        )],
    );
    let (ok, out) = check(&w.hooks, None);
    assert!(!ok, "the library hook is a problem:\n{out}");
    let port = World::port(&w.open_port);
    for want in [
        "sandbox: custom (landlock ABI",
        &format!("connect: port {port} (localhost: host not enforced)"),
        "env:     HERMES_*, LANG, LANGUAGE, LC_*, TZ, PATH, DECLARED_TOKEN",
        "exec:    no",
        &format!("{}", w.hooks.home().join("hook-state/exe").display()),
        "sandbox: strict (nothing local to confine",
        "a library hook runs inside the service, which cannot confine a part of itself, and `sandbox:` at HOOK.yaml line 3",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    // The environment variable is the default for `check` as for `serve`.
    w.hooks.add(
        "bare",
        &[
            ("HOOK.yaml", "name: bare\nevents: [\"bare:*\"]\n"),
            ("handler.py", "def handle(e, c):\n    return None\n"),
        ],
    );
    let bare = |out: &str| {
        let after = out.split("ok      bare").nth(1).unwrap_or("").to_string();
        after.split("\nok ").next().unwrap_or("").to_string()
    };
    let (_, out) = check(&w.hooks, Some("strict"));
    assert!(bare(&out).contains("sandbox: strict (landlock"), "{out}");
    // Unconfined: nothing said, as before sandboxes.
    let (_, out) = check(&w.hooks, None);
    assert!(out.contains("ok      bare"), "{out}");
    assert!(!bare(&out).contains("sandbox:"), "{out}");
}
