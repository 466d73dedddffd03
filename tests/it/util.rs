//! Test harness: temporary hook roots, the real binary serving on port 0, a small HTTP/1.1
//! client over real sockets, and polling with deadlines (never sleeps as synchronisation).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// Path of the binary under test: this build's, or the one `HERMES_HOOKS_TEST_BIN` names (say
/// an older commit's build, to see a test fail on the code before a fix:
/// `HERMES_HOOKS_TEST_BIN=/old/target/debug/hermes-hooks cargo test --test it NAME`; the flags
/// a test passes must exist in that build).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    BIN.get_or_init(|| match std::env::var("HERMES_HOOKS_TEST_BIN") {
        Ok(p) if !p.is_empty() => p.leak(),
        _ => env!("CARGO_BIN_EXE_hermes-hooks"),
    })
}

/// True once `pid` has exited (gone, or a zombie waiting for its reaper: dead either way).
#[allow(dead_code)] // not every test target that includes this file watches processes
pub fn is_dead(pid: impl std::fmt::Display) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.is_empty() || status.contains("State:\tZ")
}

/// Polls `f` until it returns `Some` or `timeout` passes; panics with `what` on timeout.
pub fn poll<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Async flavour of [`poll`].
pub async fn poll_async<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `emit_collect` of `event` on a host where exactly one hook matches: that hook's outcome,
/// within 30 s (above the hand-over's 20 s bound: a test of a refused restart sees the
/// refusal, not the deadline).
pub async fn collect_one(
    host: &hermes_hooks::Host,
    event: &str,
    ctx: Value,
) -> Result<Option<Value>, String> {
    let out = host
        .emit_collect(event, ctx, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    out[0].result.clone()
}

/// Reads a JSON-lines file, ignoring a missing file.
pub fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A temporary hook root plus a temporary HERMES_HOME.
pub struct Hooks {
    pub tmp: tempfile::TempDir,
}

impl Hooks {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(tmp.path().join("hooks")).unwrap();
        std::fs::create_dir_all(tmp.path().join("home")).unwrap();
        std::fs::create_dir_all(tmp.path().join("out")).unwrap();
        Self { tmp }
    }

    /// The hook root.
    pub fn root(&self) -> PathBuf {
        self.tmp.path().join("hooks")
    }

    /// HERMES_HOME for the host under test.
    pub fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    /// A directory where handlers write what they saw.
    pub fn out(&self) -> PathBuf {
        self.tmp.path().join("out")
    }

    /// Creates `root/name` with the given files (relative path, content).
    pub fn add(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.root().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        self.with_files(dir, files)
    }

    /// A Python hook on `events` (YAML list body, e.g. `["agent:start"]`) with handler `code`.
    pub fn python(&self, name: &str, events: &str, code: &str) -> PathBuf {
        self.add(
            name,
            &[
                ("HOOK.yaml", &format!("name: {name}\nevents: {events}\n")),
                ("handler.py", code),
            ],
        )
    }

    /// `dir`, a hook [`Hooks::python`] or [`Hooks::exec`] just made, with `files` (relative
    /// path, content) added beside its handler: the helper modules or sourced scripts a trust
    /// test approves and then edits.
    pub fn with_files(&self, dir: PathBuf, files: &[(&str, &str)]) -> PathBuf {
        for (file, content) in files {
            let p = dir.join(file);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(&p, content).unwrap();
        }
        dir
    }

    /// A Python hook that appends `{"event", "context"}` to out/<name>.jsonl and returns `ret`
    /// (a Python expression).
    pub fn recorder(&self, name: &str, events: &str, ret: &str) -> PathBuf {
        let out = self.out().join(format!("{name}.jsonl"));
        let code = format!(
            "import json\n\ndef handle(event, context):\n    with open({out:?}, 'a') as f:\n        f.write(json.dumps({{'event': event, 'context': context}}) + '\\n')\n    return {ret}\n",
            out = out.display().to_string()
        );
        self.python(name, events, &code)
    }

    /// Lines recorded by [`Hooks::recorder`] hook `name`.
    pub fn recorded(&self, name: &str) -> Vec<Value> {
        read_jsonl(&self.out().join(format!("{name}.jsonl")))
    }

    /// An executable hook (`handler`, mode 0755) with `script` as its content.
    pub fn exec(&self, name: &str, events: &str, script: &str) -> PathBuf {
        let dir = self.add(
            name,
            &[
                ("HOOK.yaml", &format!("name: {name}\nevents: {events}\n")),
                ("handler", script),
            ],
        );
        set_mode(&dir.join("handler"), 0o755);
        dir
    }
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A host configuration for in-process tests.
pub fn config(hooks: &Hooks) -> hermes_hooks::HostConfig {
    hermes_hooks::HostConfig {
        roots: vec![hooks.root()],
        hermes_home: hooks.home(),
        python: "python3".into(),
        runtime_dir: hooks.home().join("cache"),
        trust: Default::default(),
        gateway_hooks_only: false,
        worker_priority: Default::default(),
        sandbox_default: Default::default(),
        config_hooks: true,
    }
}

/// The binary running `serve` on 127.0.0.1:0; killed (and reaped) on drop.
pub struct Serve {
    pub child: Child,
    pub addr: String,
    pub stderr: Arc<Mutex<Vec<String>>>,
    pub stdout: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    /// Starts `serve --listen 127.0.0.1:0` on `roots` with HERMES_HOME = hooks.home(), and
    /// waits until it is ready.
    pub fn start(hooks: &Hooks, extra: &[&str]) -> Self {
        let mut cmd = Command::new(bin());
        cmd.arg("serve")
            .arg("--hooks-dir")
            .arg(hooks.root())
            .args(["--listen", "127.0.0.1:0"]);
        cmd.args(extra);
        Self::spawn(cmd, hooks)
    }

    /// Starts a prepared `serve` command and waits until it is ready (first load done).
    pub fn spawn(cmd: Command, hooks: &Hooks) -> Self {
        let serve = Self::spawn_listening(cmd, hooks);
        poll(Duration::from_secs(30), "readyz", || {
            (serve.get("/readyz").0 == 200).then_some(())
        });
        serve
    }

    /// Starts a prepared `serve` command and waits until it listens (the first load may still
    /// be running).
    pub fn spawn_listening(mut cmd: Command, hooks: &Hooks) -> Self {
        // HERMES_TEST_LOG: another filter for the services' logs (say
        // `info,hermes_hooks::fleet=debug`, to follow a soak's failure).
        let log = std::env::var("HERMES_TEST_LOG").unwrap_or_else(|_| "info".into());
        cmd.env("HERMES_HOME", hooks.home())
            .env("HERMES_HOOKS_LOG", log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn hermes-hooks");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let err_pipe = child.stderr.take().unwrap();
        let out_pipe = child.stdout.take().unwrap();
        for (pipe, sink) in [
            (Box::new(err_pipe) as Box<dyn Read + Send>, stderr.clone()),
            (Box::new(out_pipe), stdout.clone()),
        ] {
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    sink.lock().unwrap().push(line);
                }
            });
        }
        let lines = stderr.clone();
        let addr = poll(
            Duration::from_secs(30),
            "the listening address on stderr",
            || {
                lines.lock().unwrap().iter().find_map(|l| {
                    l.split("listening on http://")
                        .nth(1)
                        .map(|a| a.split_whitespace().next().unwrap_or("").to_string())
                })
            },
        );
        Self {
            child,
            addr,
            stderr,
            stdout,
        }
    }

    /// Every stdout line so far, each parsed as JSON (`serve --output json`'s notices).
    pub fn stdout_json(&self) -> Vec<Value> {
        self.stdout
            .lock()
            .unwrap()
            .iter()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
            })
            .collect()
    }

    /// Everything the service logged so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let (s, _, b) = http(&self.addr, "GET", path, &[], b"");
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let body = serde_json::to_vec(body).unwrap();
        let (s, _, b) = http(
            &self.addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            &body,
        );
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// The first notice of `kind` on stdout (`--output json`), waiting for the reader thread to
    /// catch up with a service that may just have exited.
    #[allow(dead_code)] // not every test target that includes this file reads notices
    pub fn notice(&self, kind: &str) -> Value {
        poll(Duration::from_secs(10), &format!("a {kind} notice"), || {
            self.stdout
                .lock()
                .unwrap()
                .iter()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["type"] == kind)
        })
    }

    /// Asks for a reload (`POST /v1/reload`, 200 expected) and checks that its report lists
    /// `hook` under `key` (`started`, `stopped`, ...); returns the report.
    pub fn reload_lists(&self, key: &str, hook: &str) -> Value {
        let (status, report) = self.post("/v1/reload", &serde_json::json!({}));
        assert_eq!(status, 200, "{report}");
        assert!(
            report[key]
                .as_array()
                .is_some_and(|a| a.iter().any(|n| n == hook)),
            "the reload's report does not list {hook} as {key}: {report}"
        );
        report
    }

    /// The `/metrics` exposition, as text.
    pub fn metrics(&self) -> String {
        let (_, _, b) = http(&self.addr, "GET", "/metrics", &[], b"");
        String::from_utf8_lossy(&b).to_string()
    }

    /// SIGKILL (no chance to stop its workers or acknowledge anything), and reap.
    pub fn sigkill(&mut self) {
        signal(self.child.id(), libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for exit, returning the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        self.begin_stop();
        self.wait_exit(Duration::from_secs(20))
    }

    /// Sends SIGTERM and returns at once (the service stops in its own time: [`Serve::wait_exit`]).
    pub fn begin_stop(&self) {
        signal(self.child.id(), libc::SIGTERM);
    }

    /// Waits up to `within` for the process to exit, returning its exit code; past that it is
    /// killed (`None`).
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM first so the service stops its workers; then make sure.
            self.terminate();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // A failed test shows what the service warned about (a broker refusing to store,
            // a hook that did not load) next to its panic message.
            let lines = self.stderr.lock().map(|l| l.clone()).unwrap_or_default();
            let bad: Vec<&String> = lines
                .iter()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect();
            let from = bad.len().saturating_sub(20);
            eprintln!(
                "hermes-hooks on {}: last {} of {} warning/error line(s):",
                self.addr,
                bad.len() - from,
                bad.len()
            );
            for l in &bad[from..] {
                eprintln!("  {l}");
            }
        }
    }
}

/// The pids of the children of `pid` (`/proc/PID/task/*/children`), zombies included.
pub fn child_pids(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let kids = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
    }
    out
}

/// Sends a signal to a process.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as i32, sig) };
}

/// One HTTP/1.1 request with `Connection: close`; returns status, headers (lower-case names)
/// and body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

/// [`http`] without a body, tolerating a service that goes away: the status, or `None` when
/// the connection was refused or closed without an answer.
pub fn http_result(addr: &str, method: &str, path: &str) -> Option<u16> {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return None;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return None;
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    if raw.is_empty() {
        return None;
    }
    Some(parse_response(&raw).0)
}

/// Parses a raw HTTP/1.1 response (Content-Length, chunked, or to EOF).
pub fn parse_response(raw: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(p) = rest.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(String::from_utf8_lossy(&rest[..p]).trim(), 16).unwrap_or(0);
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[p + 2..p + 2 + size]);
            rest = &rest[p + 2 + size + 2..];
        }
        body = out;
    }
    (status, headers, body)
}

/// A host over `hooks` under the trust `mode` (permissions checked).
pub async fn start_trusted(
    hooks: &Hooks,
    mode: hermes_hooks::TrustMode,
) -> (hermes_hooks::Host, hermes_hooks::LoadReport) {
    let mut cfg = config(hooks);
    cfg.trust = hermes_hooks::TrustPolicy {
        mode,
        insecure_permissions: false,
    };
    hermes_hooks::Host::start(cfg).await
}

/// Approves the hook `name` (`enable` in explicit mode), as an operator would.
pub fn approve(hooks: &Hooks, name: &str) {
    let policy = hermes_hooks::TrustPolicy {
        mode: hermes_hooks::TrustMode::Explicit,
        insecure_permissions: false,
    };
    hermes_hooks::cli::set_enabled(&[hooks.root()], &hooks.home(), &policy, name, true)
        .unwrap_or_else(|e| panic!("approving {name}: {e}"));
}

/// Approves the one hook `name`, starts an explicit-mode host and checks that `event` answers
/// `first` (the approved code runs).
pub async fn approved_host(
    hooks: &Hooks,
    name: &str,
    event: &str,
    first: Value,
) -> hermes_hooks::Host {
    approve(hooks, name);
    let (host, report) = start_trusted(hooks, hermes_hooks::TrustMode::Explicit).await;
    assert_eq!(report.loaded, vec![name], "{report:#?}");
    assert_eq!(
        collect_one(&host, event, serde_json::json!({})).await,
        Ok(Some(first))
    );
    host
}

/// Writes `content` over `file` and checks that the next `event` is refused with an error
/// saying `<name> changed` (the name of the file), then shuts the host down.
pub async fn assert_edit_refused(
    host: hermes_hooks::Host,
    file: &Path,
    content: &str,
    event: &str,
) {
    std::fs::write(file, content).unwrap();
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let err = collect_one(&host, event, serde_json::json!({}))
        .await
        .expect_err("a call after the edit must be refused");
    assert!(err.contains(&format!("{name} changed")), "{err}");
    host.shutdown(Duration::from_secs(20)).await;
}

/// A nice-0 busy loop (`sh`) pinned to `cpu` with `taskset`, a child of this process (so in its
/// session and autogroup, like a service it starts); killed and reaped on drop.
#[allow(dead_code)] // not every test target that includes this file needs one
pub struct BusyLoop(Child);

#[allow(dead_code)]
impl BusyLoop {
    pub fn on_cpu(cpu: &str) -> Self {
        Self(
            Command::new("taskset")
                .args(["-c", cpu, "sh", "-c", "while :; do :; done"])
                .spawn()
                .expect("start a busy loop (taskset, util-linux)"),
        )
    }
}

impl Drop for BusyLoop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How many tests a Python unittest run says it ran (its `Ran N tests` line on stderr; 0 without).
pub fn unittest_ran(stderr: &str) -> u32 {
    stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")
                .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        })
        .unwrap_or(0)
}

/// Lines `N START END` (an event's number and when its call began and ended, in the handler's
/// clock units) as a handler wrote them to `path`.
pub fn read_spans(path: &Path) -> Vec<(u64, u128, u128)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// Seconds since the Unix epoch (the clock the recording hooks stamp their `t` with).
pub fn epoch_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Python (needs `json` and `os` imported) for a handler that records the patterns of its
/// version: `_patterns()` reads the `events:` line (JSON) of the HOOK.yaml beside it, called
/// when the module is imported (a version's worker imports it when the version loads).
pub const PY_PATTERNS: &str = r#"def _patterns():
    here = os.path.dirname(os.path.abspath(__file__))
    for line in open(os.path.join(here, "HOOK.yaml")):
        if line.startswith("events:"):
            return json.loads(line.split(":", 1)[1])
"#;
