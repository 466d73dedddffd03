//! One hook's files that stall delay only that hook (issue 47, rows 1 and 4; issue 59, rows 1-4:
//! start-up, readiness, the watcher and reloads): hooks whose files sit on a FUSE mount whose
//! every operation blocks (`stallfs.py`, mfusepy), beside healthy hooks on local disk. No runtime
//! thread and no thread other hooks need may wait on the mount.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, parse_response, poll, set_mode};

/// The Python with mfusepy, as crates/testenv/build.rs looks it up.
fn fuse_python() -> PathBuf {
    std::env::var_os("HERMES_FUSE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuse-venv/bin/python")
        })
}

/// A read-only mirror of a directory on a FUSE mount that blocks while stalled.
struct StallFs {
    child: Child,
    mount: PathBuf,
    flag: PathBuf,
    _flag_dir: tempfile::TempDir,
    _dir: Option<tempfile::TempDir>,
}

impl StallFs {
    /// Mounts a mirror of `source` and waits until it answers.
    fn mount(source: &Path) -> Self {
        Self::mount_with(source, &[])
    }

    /// [`StallFs::mount`] whose stall blocks only the opening and reading of files (`reads`):
    /// names and attributes answer, as a `stat`-keyed check sees them.
    fn mount_reads(source: &Path) -> Self {
        Self::mount_with(source, &["reads"])
    }

    /// [`StallFs::mount`] at `mount` (an empty directory made here: a hook directory inside a
    /// root that is itself a mount).
    fn mount_at(source: &Path, mount: &Path) -> Self {
        std::fs::create_dir(mount).unwrap();
        Self::mount_on(source, mount.to_path_buf(), &[])
    }

    fn mount_with(source: &Path, mode: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let mut fs = Self::mount_on(source, mount, mode);
        fs._dir = Some(dir);
        fs
    }

    fn mount_on(source: &Path, mount: PathBuf, mode: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("stalled");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/stallfs.py");
        let child = Command::new(fuse_python())
            .arg(script)
            .arg(source)
            .arg(&mount)
            .arg(&flag)
            .args(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start stallfs.py (mfusepy: .ci/run installs it in target/fuse-venv)");
        let fs = Self {
            child,
            mount,
            flag,
            _flag_dir: dir,
            _dir: None,
        };
        let first = std::fs::read_dir(source).unwrap().next().unwrap().unwrap();
        poll(Duration::from_secs(20), "the FUSE mount", || {
            fs.mount.join(first.file_name()).exists().then_some(())
        });
        fs
    }

    fn stall(&self) {
        std::fs::write(&self.flag, "").unwrap();
    }

    fn release(&self) {
        let _ = std::fs::remove_file(&self.flag);
    }

    /// Ends the stall when dropped: declared after the service, it is dropped before it, so a
    /// failing test's service is never killed while its threads wait on the mount.
    fn released_on_drop(&self) -> Release {
        Release(self.flag.clone())
    }
}

/// See [`StallFs::released_on_drop`].
struct Release(PathBuf);

impl Drop for Release {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Drop for StallFs {
    fn drop(&mut self) {
        self.release();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}
/// Emits `event` and asserts it is taken (202).
fn emit_202(serve: &Serve, event: &str) {
    let (s, v, took) = quick(&serve.addr, "POST", "/v1/events", &json!({"event": event}));
    assert_eq!(s, 202, "{v} after {took:?}");
}

/// Collects `command:run` (with `timeout_ms` when given) and asserts the one answer is `hook`'s
/// `decision`; returns how long the collect took.
fn assert_decides(serve: &Serve, timeout_ms: Option<u64>, hook: &str, decision: &str) -> Duration {
    let mut body = json!({"event": "command:run"});
    if let Some(ms) = timeout_ms {
        body["timeout_ms"] = json!(ms);
    }
    let started = Instant::now();
    let (s, v, took) = quick(&serve.addr, "POST", "/v1/collect", &body);
    assert_eq!(s, 200, "a collect on {hook} answers ({took:?}): {v}");
    assert_eq!(
        v["results"],
        json!([{"hook": hook, "result": {"decision": decision}}]),
        "{hook} answers after {:?}: {v}",
        started.elapsed()
    );
    took
}

/// One request with a 5 s deadline (a service whose runtime threads hang never answers):
/// status (0 without an answer), body, time taken.
fn quick(addr: &str, method: &str, path: &str, body: &Value) -> (u16, Value, Duration) {
    let started = Instant::now();
    let body = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(body).unwrap()
    };
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    if raw.is_empty() {
        return (0, Value::Null, started.elapsed());
    }
    let (status, _, b) = parse_response(&raw);
    (
        status,
        serde_json::from_slice(&b).unwrap_or(Value::Null),
        started.elapsed(),
    )
}

/// GET `path` within [`quick`]'s deadline (`null` without an answer).
fn get(serve: &Serve, path: &str) -> Value {
    quick(&serve.addr, "GET", path, &Value::Null).1
}

/// A hook directory in `root` with `files` (the handler made executable when named `handler`).
fn hook_in(root: &Path, name: &str, files: &[(&str, &str)]) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, content) in files {
        std::fs::write(dir.join(file), content).unwrap();
        if *file == "handler" {
            set_mode(&dir.join(file), 0o755);
        }
    }
}

const DENY_SH: &str = "#!/bin/sh\ncat >/dev/null\necho '{\"decision\": \"deny\"}'\n";

/// Issue 47, row 1: two executable hooks whose files are on a FUSE mount that stalls, and a
/// healthy executable hook `ok` on local disk. One `agent:step` after the stall used to block
/// both runtime threads in the check before the start (`RunFiles::rescan_cached` and the spawn
/// ran on the runtime thread): `/healthz`, an emit and a collect on `ok` all timed out. The
/// checks and starts now run on each hook's own starter thread.
#[testenv::needs(fuse)]
#[test]
fn exec_hooks_whose_files_stall_delay_only_themselves() {
    let hooks = Hooks::new();
    hooks.exec("ok", r#"["agent:step", "command:run"]"#, DENY_SH);
    let source = tempfile::tempdir().unwrap();
    for name in ["stall-a", "stall-b"] {
        let yaml = format!("name: {name}\nevents: [\"agent:step\"]\ntimeout: 30\n");
        hook_in(
            source.path(),
            name,
            &[("HOOK.yaml", &yaml), ("handler", DENY_SH)],
        );
    }
    let fs = StallFs::mount(source.path());
    let mount = fs.mount.display().to_string();
    let serve = Serve::start(&hooks, &["--hooks-dir", &mount]);
    let _release = fs.released_on_drop();
    let v = get(&serve, "/v1/hooks");
    let loaded: Vec<&str> = v["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["name"].as_str())
        .collect();
    assert!(
        loaded.contains(&"stall-a") && loaded.contains(&"stall-b"),
        "{v}"
    );
    // Each runs once while its files answer.
    emit_202(&serve, "agent:step");
    poll(Duration::from_secs(20), "the first events", || {
        let v = get(&serve, "/v1/hooks");
        v["hooks"]
            .as_array()?
            .iter()
            .all(|h| h["counters"]["ok"].as_u64() == Some(1))
            .then_some(())
    });
    fs.stall();
    emit_202(&serve, "agent:step");
    // The stalled hooks' starts wait on the mount (busy: in their call, checking their files).
    poll(Duration::from_secs(10), "the stalled hooks' starts", || {
        let v = get(&serve, "/v1/hooks");
        v["hooks"]
            .as_array()?
            .iter()
            .filter(|h| h["name"] != "ok")
            .all(|h| h["status"] == "busy")
            .then_some(())
    });
    for _ in 0..3 {
        let (s, _, took) = quick(&serve.addr, "GET", "/healthz", &Value::Null);
        assert_eq!(s, 200, "/healthz answers ({took:?})");
        assert!(took < Duration::from_secs(2), "/healthz took {took:?}");
        let (s, _, took) = quick(
            &serve.addr,
            "POST",
            "/v1/events",
            &json!({"event": "agent:step"}),
        );
        assert_eq!(s, 202, "an emit is taken ({took:?})");
        assert!(took < Duration::from_secs(2), "an emit took {took:?}");
        let took = assert_decides(&serve, None, "ok", "deny");
        assert!(
            took < Duration::from_secs(2),
            "a collect on ok took {took:?}"
        );
    }
    fs.release();
}

/// Issue 47, row 4: ten Python hooks whose files are on a FUSE mount that stalls and a healthy
/// Python hook `h`; a reload, the ten crash, then `h` crashes. The check before each restart ran
/// on the runtime's 8-thread blocking pool without a deadline: the stalled checks took every
/// thread, `h` stayed `restarting` and its collect timed out. Each check now runs on its hook's
/// own starter thread, within a deadline: `h` restarts and answers.
#[testenv::needs(fuse)]
#[test]
fn a_stalled_check_does_not_starve_other_hooks_restarts() {
    let crash_or_deny = "import os\n\ndef handle(event, context):\n    if event == 'agent:crash':\n        os._exit(3)\n    return {'decision': 'deny'}\n";
    let hooks = Hooks::new();
    hooks.python("h", r#"["agent:crash", "command:run"]"#, crash_or_deny);
    let source = tempfile::tempdir().unwrap();
    for i in 0..10 {
        let name = format!("stalled-{i}");
        let yaml = format!("name: {name}\nevents: [\"agent:crash\"]\n");
        hook_in(
            source.path(),
            &name,
            &[("HOOK.yaml", &yaml), ("handler.py", crash_or_deny)],
        );
    }
    let fs = StallFs::mount(source.path());
    let mount = fs.mount.display().to_string();
    let serve = Serve::start(&hooks, &["--hooks-dir", &mount]);
    let _release = fs.released_on_drop();
    let v = get(&serve, "/v1/hooks");
    assert_eq!(v["hooks"].as_array().map(Vec::len), Some(11), "{v}");
    fs.stall();
    // A reload now scans the stalled mount: it may never finish; nothing below waits for it.
    let addr = serve.addr.clone();
    std::thread::spawn(move || quick(&addr, "POST", "/v1/reload", &json!({})));
    // All eleven crash; the next event restarts each (after its backoff): the ten stalled
    // hooks' checks wait on the mount, h crashes once more.
    emit_202(&serve, "agent:crash");
    emit_202(&serve, "agent:crash");
    poll(
        Duration::from_secs(20),
        "the stalled hooks' restarts",
        || {
            let v = get(&serve, "/v1/hooks");
            let restarting = v["hooks"]
                .as_array()?
                .iter()
                .filter(|h| h["name"] != "h" && h["status"] == "restarting")
                .count();
            (restarting == 10).then_some(())
        },
    );
    // h restarts for a collect and answers while the ten still wait on their files.
    assert_decides(&serve, Some(8000), "h", "deny");
    fs.release();
}

/// Issue 47, the reload half of row 4 (the gap left after it): a hooks directory on a FUSE mount
/// that stalls (a root of its own, and a hook linked into the healthy root), beside a healthy
/// executable hook `ok`. The reload's scan ran on one blocking thread without a deadline: once
/// the mount stalled, a reload never finished and `ok`'s edited handler never loaded. Each
/// root's listing and each hook directory's read now run within a deadline, one per hook at a
/// time: the reload finishes, `ok`'s new version answers and the stalled hooks keep running.
#[testenv::needs(fuse)]
#[test]
fn a_stalled_hook_directory_does_not_hold_up_other_hooks_reload() {
    let hooks = Hooks::new();
    let ok = hooks.exec("ok", r#"["command:run"]"#, DENY_SH);
    let source = tempfile::tempdir().unwrap();
    for name in ["far", "linked"] {
        let yaml = format!("name: {name}\nevents: [\"agent:step\"]\n");
        hook_in(
            source.path(),
            name,
            &[("HOOK.yaml", &yaml), ("handler", DENY_SH)],
        );
    }
    let fs = StallFs::mount(source.path());
    std::os::unix::fs::symlink(fs.mount.join("linked"), hooks.root().join("linked")).unwrap();
    let mount = fs.mount.display().to_string();
    let serve = Serve::start(&hooks, &["--hooks-dir", &mount]);
    let _release = fs.released_on_drop();
    let names = |v: &Value| -> Vec<String> {
        v["hooks"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|h| h["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut loaded = names(&get(&serve, "/v1/hooks"));
    loaded.sort();
    assert_eq!(loaded, ["far", "linked", "ok"]);
    fs.stall();
    // ok's handler now allows; a reload (it may take the scan's deadline) picks it up.
    std::fs::write(
        ok.join("handler"),
        "#!/bin/sh\ncat >/dev/null\necho '{\"decision\": \"allow\"}'\n",
    )
    .unwrap();
    let addr = serve.addr.clone();
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        let req = format!(
            "POST /v1/reload HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        let _ = s.write_all(req.as_bytes());
        let _ = s.read_to_end(&mut Vec::new());
    });
    poll(Duration::from_secs(30), "ok's new version", || {
        let (s, v, _) = quick(
            &serve.addr,
            "POST",
            "/v1/collect",
            &json!({"event": "command:run"}),
        );
        (s == 200 && v["results"] == json!([{"hook": "ok", "result": {"decision": "allow"}}]))
            .then_some(())
    });
    let mut loaded = names(&get(&serve, "/v1/hooks"));
    loaded.sort();
    assert_eq!(
        loaded,
        ["far", "linked", "ok"],
        "the stalled hooks keep running"
    );
    let (s, _, took) = quick(&serve.addr, "GET", "/healthz", &Value::Null);
    assert_eq!(s, 200, "/healthz answers ({took:?})");
    fs.release();
}

/// The real interpreter behind `python3` (not pyenv's shim script).
fn real_python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Children of `pid` that are still the service's own binary: a process start that has not
/// reached its `exec` yet (here: waiting on the stalled mount).
fn starts_in_exec(pid: u32) -> usize {
    let own = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    crate::util::child_pids(pid)
        .into_iter()
        .filter(|c| std::fs::read_link(format!("/proc/{c}/exe")).ok() == own)
        .count()
}

/// The fork servers (`runner.py --zygote`) the service `pid` runs.
fn fork_servers(pid: u32) -> Vec<u32> {
    crate::util::child_pids(pid)
        .into_iter()
        .filter(|c| {
            std::fs::read(format!("/proc/{c}/cmdline"))
                .is_ok_and(|b| String::from_utf8_lossy(&b).contains("--zygote"))
        })
        .collect()
}

/// Issue 47, the fork server half of row 4 (the gap left after it): a Python hook `s` whose
/// `python:` is on a FUSE mount that stalls, and a healthy Python hook `h` on the default
/// interpreter. Both fork servers are killed once the mount stalls, `s` restarts first (its fork
/// server's start waits on the mount), then `h` crashes and a collect waits for it. Fork servers
/// were started on the one spawner thread, one at a time under one lock: `h`'s waited behind
/// `s`'s for ever and the collect timed out. Each fork server now starts on a thread of its own,
/// under its own lock, within a deadline: `h` restarts and answers.
#[testenv::needs(fuse)]
#[test]
fn a_stalled_interpreter_does_not_hold_up_other_hooks_fork_servers() {
    let crash_or_deny = "import os\n\ndef handle(event, context):\n    if event.startswith('agent:'):\n        os._exit(3)\n    return {'decision': 'deny'}\n";
    let source = tempfile::tempdir().unwrap();
    // A script on the mount that runs the real interpreter: starting it reads the script.
    let py = source.path().join("py");
    std::fs::write(&py, format!("#!/bin/sh\nexec {} \"$@\"\n", real_python())).unwrap();
    set_mode(&py, 0o755);
    // Only reads stall: the check before s's start (by `stat`) passes, its interpreter's
    // start (which reads the program) waits.
    let fs = StallFs::mount_reads(source.path());
    let hooks = Hooks::new();
    hooks.python("h", r#"["agent:h", "command:run"]"#, crash_or_deny);
    let s = hooks.python("s", r#"["agent:s"]"#, crash_or_deny);
    std::fs::write(
        s.join("HOOK.yaml"),
        format!(
            "events: [\"agent:s\"]\npython: {}\n",
            fs.mount.join("py").display()
        ),
    )
    .unwrap();
    let serve = Serve::start(&hooks, &[]);
    let _release = fs.released_on_drop();
    let pid = serve.child.id();
    let v = get(&serve, "/v1/hooks");
    assert_eq!(v["hooks"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(
        fork_servers(pid).len(),
        2,
        "one fork server per interpreter"
    );
    fs.stall();
    for z in fork_servers(pid) {
        crate::util::signal(z, libc::SIGKILL);
    }
    poll(Duration::from_secs(10), "the fork servers' exits", || {
        fork_servers(pid).is_empty().then_some(())
    });
    // s crashes, and restarts on its next event: its fork server's start waits on the mount.
    emit_202(&serve, "agent:s");
    emit_202(&serve, "agent:s");
    poll(
        Duration::from_secs(20),
        "s's start waiting on the mount",
        || {
            let _ = quick(
                &serve.addr,
                "POST",
                "/v1/events",
                &json!({"event": "agent:s"}),
            );
            (starts_in_exec(pid) > 0).then_some(())
        },
    );
    // h crashes; a collect restarts it, which needs its fork server again.
    emit_202(&serve, "agent:h");
    assert_decides(&serve, Some(4000), "h", "deny");
    fs.release();
}

const ALLOW_SH: &str = "#!/bin/sh\ncat >/dev/null\necho '{\"decision\": \"allow\"}'\n";

/// The names of the hooks `/v1/hooks` lists (empty without an answer).
fn hook_names(serve: &Serve) -> Vec<String> {
    let v = get(serve, "/v1/hooks");
    let mut names: Vec<String> = v["hooks"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|h| h["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Polls until a collect on `command:run` gets `decision` from `hook`.
fn poll_decides(serve: &Serve, within: Duration, hook: &str, decision: &str) {
    poll(within, &format!("{hook}'s {decision}"), || {
        let (s, v, _) = quick(
            &serve.addr,
            "POST",
            "/v1/collect",
            &json!({"event": "command:run", "timeout_ms": 3000}),
        );
        (s == 200 && v["results"] == json!([{"hook": hook, "result": {"decision": decision}}]))
            .then_some(())
    });
}

/// A source directory holding one executable hook `name` (its files at the top: to be mounted
/// as a hook directory).
fn hook_source(name: &str) -> tempfile::TempDir {
    let source = tempfile::tempdir().unwrap();
    let yaml = format!("name: {name}\nevents: [\"agent:step\"]\n");
    std::fs::write(source.path().join("HOOK.yaml"), yaml).unwrap();
    std::fs::write(source.path().join("handler"), DENY_SH).unwrap();
    set_mode(&source.path().join("handler"), 0o755);
    source
}

/// Issue 59, row 1: a hook directory that is a FUSE mount stalled before the start, inside a
/// healthy root beside a healthy hook `ok`. The watcher's recursive watch walked into the mount
/// before the first load (notify's thread blocked in `getattr`): `/readyz` and collects answered
/// 503 for the whole stall. The watches are now armed per hook directory on the threads for
/// hooks' files, each within a deadline: the service gets ready with `ok`, `ok`'s edit is seen
/// by the watcher during the stall, and the stalled hook loads once its mount answers.
#[testenv::needs(fuse)]
#[test]
fn a_stalled_hook_directory_at_start_delays_only_itself() {
    let hooks = Hooks::new();
    let ok = hooks.exec("ok", r#"["command:run"]"#, DENY_SH);
    let source = hook_source("far");
    let fs = StallFs::mount_at(source.path(), &hooks.root().join("far"));
    fs.stall();
    let mut cmd = Command::new(crate::util::bin());
    cmd.arg("serve")
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0"]);
    let started = Instant::now();
    let serve = Serve::spawn_listening(cmd, &hooks);
    let _release = fs.released_on_drop();
    poll(Duration::from_secs(25), "/readyz during the stall", || {
        (quick(&serve.addr, "GET", "/readyz", &Value::Null).0 == 200).then_some(())
    });
    let ready = started.elapsed();
    assert_decides(&serve, None, "ok", "deny");
    assert_eq!(hook_names(&serve), ["ok"]);
    // The watcher sees ok's edit while the mount still stalls.
    std::fs::write(ok.join("handler"), ALLOW_SH).unwrap();
    poll_decides(&serve, Duration::from_secs(15), "ok", "allow");
    fs.release();
    poll(
        Duration::from_secs(20),
        "far, once its mount answers",
        || (hook_names(&serve) == ["far", "ok"]).then_some(()),
    );
    eprintln!("ready after {ready:?} with a stalled hook directory");
}

/// Issue 59, row 2: the only `--hooks-dir` is a FUSE mount stalled before the start. The
/// process never listened (blocked in `stat` checking the argument). It now listens, answers
/// `/healthz` and `/readyz` (ready, with nothing loaded), and loads the root once it answers.
#[testenv::needs(fuse)]
#[test]
fn a_stalled_hooks_dir_at_start_listens_and_loads_once_it_answers() {
    let hooks = Hooks::new();
    let source = tempfile::tempdir().unwrap();
    hook_in(
        source.path(),
        "far",
        &[
            ("HOOK.yaml", "name: far\nevents: [\"command:run\"]\n"),
            ("handler", DENY_SH),
        ],
    );
    let fs = StallFs::mount(source.path());
    fs.stall();
    let mut cmd = Command::new(crate::util::bin());
    cmd.arg("serve")
        .arg("--hooks-dir")
        .arg(&fs.mount)
        .args(["--listen", "127.0.0.1:0"]);
    let serve = Serve::spawn_listening(cmd, &hooks);
    let _release = fs.released_on_drop();
    let (s, _, took) = quick(&serve.addr, "GET", "/healthz", &Value::Null);
    assert_eq!(s, 200, "/healthz answers ({took:?})");
    let started = Instant::now();
    let ready = poll(Duration::from_secs(15), "/readyz during the stall", || {
        let (s, v, _) = quick(&serve.addr, "GET", "/readyz", &Value::Null);
        assert!(s == 200 || s == 503, "{s} {v}");
        (s == 200).then_some(v)
    });
    assert_eq!(ready["hooks"], 0, "{ready} after {:?}", started.elapsed());
    eprintln!("ready after {:?} with the stalled root", started.elapsed());
    fs.release();
    poll(
        Duration::from_secs(20),
        "far, once the root answers",
        || (hook_names(&serve) == ["far"]).then_some(()),
    );
    assert_decides(&serve, None, "far", "deny");
}

/// Issue 59, row 3: a root on a FUSE mount stalls while the service runs; a healthy Python
/// hook's edit was never picked up by the watcher (its task waited on the mount's root in
/// `Roots::arm`, on a blocking thread without a deadline). The watcher now never waits on a
/// root: the edit loads, and the stalled root's hook keeps running.
#[testenv::needs(fuse)]
#[test]
fn a_root_that_stalls_while_running_does_not_stop_the_watcher() {
    let hooks = Hooks::new();
    let h = hooks.python(
        "h",
        r#"["command:run"]"#,
        "def handle(event, context):\n    return {'decision': 'deny'}\n",
    );
    let source = tempfile::tempdir().unwrap();
    hook_in(
        source.path(),
        "far",
        &[
            ("HOOK.yaml", "name: far\nevents: [\"agent:step\"]\n"),
            ("handler", DENY_SH),
        ],
    );
    let fs = StallFs::mount(source.path());
    let mount = fs.mount.display().to_string();
    let serve = Serve::start(&hooks, &["--hooks-dir", &mount]);
    let _release = fs.released_on_drop();
    assert_eq!(hook_names(&serve), ["far", "h"]);
    fs.stall();
    std::fs::write(
        h.join("handler.py"),
        "def handle(event, context):\n    return {'decision': 'allow'}\n",
    )
    .unwrap();
    let started = Instant::now();
    poll_decides(&serve, Duration::from_secs(20), "h", "allow");
    eprintln!("h's edit answered after {:?}", started.elapsed());
    // Once more: the watcher's next reload does not wait on the stalled root again.
    std::fs::write(
        h.join("handler.py"),
        "def handle(event, context):\n    return {'decision': 'deny'}\n",
    )
    .unwrap();
    poll_decides(&serve, Duration::from_secs(10), "h", "deny");
    assert_eq!(hook_names(&serve), ["far", "h"], "far keeps running");
    fs.release();
}

/// Issue 59, row 4: one root stalled, a healthy executable hook `ok` edited from deny to allow
/// while a decision waits. The reload scan waited the whole scan deadline (10 s) on the stalled
/// root, as long as the hand-over of `ok`'s queue waits for its new version: the collect timed
/// out, the next failed "no new version loaded within 10s". The roots are now listed
/// concurrently within a listing deadline, and a root still stalled is not waited on again: the
/// collect gets the new version's allow.
#[testenv::needs(fuse)]
#[test]
fn a_stalled_root_does_not_spend_another_hooks_hand_over() {
    let hooks = Hooks::new();
    let ok = hooks.exec("ok", r#"["command:run"]"#, DENY_SH);
    let source = tempfile::tempdir().unwrap();
    hook_in(
        source.path(),
        "far",
        &[
            ("HOOK.yaml", "name: far\nevents: [\"agent:step\"]\n"),
            ("handler", DENY_SH),
        ],
    );
    let fs = StallFs::mount(source.path());
    let mount = fs.mount.display().to_string();
    let serve = Serve::start(&hooks, &["--hooks-dir", &mount]);
    let _release = fs.released_on_drop();
    assert_decides(&serve, None, "ok", "deny");
    fs.stall();
    std::fs::write(ok.join("handler"), ALLOW_SH).unwrap();
    // At once: the running version sees its files changed and hands its events over.
    let took = assert_decides(&serve, Some(8000), "ok", "allow");
    eprintln!("ok's first collect after the edit took {took:?}");
    let took = assert_decides(&serve, None, "ok", "allow");
    eprintln!("the next collect took {took:?}");
    fs.release();
}

/// Issue 59, row 4 with the stall in a hook directory beside `ok` (a mount inside its root) that
/// stalls while the service runs: the reload's first look at that directory is bounded by the
/// listing's deadline (3 s), not the scan's (10 s, as long as the hand-over waits), so `ok`'s
/// edit is still answered by its new version.
#[testenv::needs(fuse)]
#[test]
fn a_stalled_hook_directory_does_not_spend_a_neighbours_hand_over() {
    let hooks = Hooks::new();
    let ok = hooks.exec("ok", r#"["command:run"]"#, DENY_SH);
    let source = hook_source("far");
    let fs = StallFs::mount_at(source.path(), &hooks.root().join("far"));
    let serve = Serve::start(&hooks, &[]);
    let _release = fs.released_on_drop();
    assert_eq!(hook_names(&serve), ["far", "ok"]);
    assert_decides(&serve, None, "ok", "deny");
    fs.stall();
    std::fs::write(ok.join("handler"), ALLOW_SH).unwrap();
    let took = assert_decides(&serve, Some(8000), "ok", "allow");
    eprintln!("ok's first collect after the edit took {took:?}");
    assert_eq!(hook_names(&serve), ["far", "ok"], "far keeps running");
    fs.release();
}
