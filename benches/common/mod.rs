//! Shared by the benches: the release service on 127.0.0.1:0, started and stopped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The service binary the benches run: `$HERMES_HOOKS_BIN` when set (another build, for an A/B
/// such as `benches/ab.py`), else this tree's.
pub fn bin() -> std::ffi::OsString {
    std::env::var_os("HERMES_HOOKS_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_hermes-hooks").into())
}

/// `hermes-hooks serve --listen 127.0.0.1:0` on one hook root; stopped (SIGTERM) on drop.
pub struct Service {
    pub child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl Service {
    /// Starts the service on `root` with `HERMES_HOME=home` and waits until its hooks are loaded.
    pub fn start(root: &Path, home: &Path) -> Self {
        let root = root.to_string_lossy();
        Self::spawn(&["serve", "--hooks-dir", &root], home)
    }

    /// Runs `hermes-hooks ARGS --listen 127.0.0.1:0 --drain-timeout 0` (a `serve` or a fleet
    /// `worker`) with `HERMES_HOME=home` and waits until its hooks are loaded.
    ///
    /// With `HERMES_BENCH_SESSIONS` set, each in a session of its own, as separate services (or a
    /// driver that starts each with a new session) run: with the scheduler's autogroups each
    /// then gets its own share of the CPUs, whatever its processes' priorities.
    pub fn spawn(args: &[&str], home: &Path) -> Self {
        let mut cmd = Command::new(bin());
        cmd.args(args)
            .args(["--listen", "127.0.0.1:0", "--drain-timeout", "0"])
            .env("HERMES_HOME", home)
            .env("HERMES_HOOKS_LOG", "info")
            .stderr(Stdio::piped())
            .stdout(Stdio::null());
        if std::env::var_os("HERMES_BENCH_SESSIONS").is_some() {
            use std::os::unix::process::CommandExt;
            // SAFETY: setsid(2) is async-signal-safe and touches no memory of ours.
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn hermes-hooks");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut addr = None;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(a) = line.split("listening on http://").nth(1) {
                    addr = a.split_whitespace().next().map(str::to_string);
                }
                if line.contains("hooks loaded") {
                    let _ = tx.send(addr.clone().unwrap_or_default());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("hooks loaded");
        Self { child, addr }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The `p` quantile (0..=1) of `v`, nearest rank.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(((v.len() - 1) as f64) * p).round() as usize]
}

/// Reads one keep-alive HTTP/1.1 response (status line, headers, Content-Length body); returns
/// the status line.
pub fn read_response(reader: &mut impl std::io::BufRead) -> String {
    let mut status = String::new();
    reader.read_line(&mut status).expect("status line");
    let mut len = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("header");
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().expect("length");
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).expect("body");
    status
}

/// One HTTP/1.1 request on a new connection (`Connection: close`); returns the body.
pub fn request(addr: &str, method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body).expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    let at = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |i| i + 4);
    out.split_off(at)
}
