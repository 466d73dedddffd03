//! Issue 13 hardening: what runs is what was loaded and approved (every file that can run, before
//! every process start), the permissions of the whole hook tree, a broken edit never replaces a
//! working version across restarts, and the input edges of the service.

use std::time::Duration;

use hermes_hooks::TrustMode;
use hermes_hooks::{LoadReport, SkipCode};
use serde_json::{Value, json};

use crate::util::{
    Hooks, approve, approved_host, assert_edit_refused, collect_one, set_mode,
    start_trusted as start,
};

const T: Duration = Duration::from_secs(20);

/// A Python hook on `x:*` that returns `helper.value()` and exits hard on `x:crash`.
const IMPORTS_HELPER: &str = "import os\nimport helper\n\ndef handle(event, context):\n    if event == 'x:crash':\n        os._exit(3)\n    return helper.value()\n";

fn skip_of(report: &LoadReport, name: &str) -> (SkipCode, String) {
    report
        .skipped
        .iter()
        .find(|s| s.name == name)
        .map(|s| (s.code, s.reason.clone()))
        .unwrap_or_else(|| panic!("{name} was expected among the skipped: {report:#?}"))
}

/// The reproduction of issue 13: an approved hook imports helper.py; replacing helper.py must not
/// change what runs, neither at the worker's restart nor at the next reload.
#[tokio::test]
async fn replaced_helper_never_runs_under_an_approval() {
    let hooks = Hooks::new();
    let dir = hooks.with_files(
        hooks.python("h", "[\"x:*\"]", IMPORTS_HELPER),
        &[("helper.py", "def value():\n    return 'approved'\n")],
    );
    let host = approved_host(&hooks, "h", "x:go", json!("approved")).await;

    std::fs::write(
        dir.join("helper.py"),
        "def value():\n    return 'injected'\n",
    )
    .unwrap();
    let crashed = collect_one(&host, "x:crash", json!({})).await;
    assert!(crashed.is_err(), "the crash event should fail: {crashed:?}");
    let after = collect_one(&host, "x:go", json!({})).await;
    let err = after.expect_err("the restart with a replaced helper.py must be refused");
    assert!(
        err.contains("not started") && err.contains("helper.py changed"),
        "the refusal should name helper.py: {err}"
    );
    // The refused restart asked for a reload, which may already have refused the new helper.py
    // (not approved) and stopped the hook; while it is listed, its last error names helper.py.
    if let Some(info) = host.hook("h") {
        let last = serde_json::to_string(&info.last_error).unwrap();
        assert!(last.contains("helper.py changed"), "last_error: {last}");
    }

    // The next scan refuses the hook: its approval does not cover the new helper.py.
    let report = host.reload().await;
    let (code, reason) = skip_of(&report, "h");
    assert_eq!(code, SkipCode::NotApproved, "{reason}");
    assert!(reason.contains("helper.py changed"), "{reason}");
    let out = host
        .emit_collect("x:go", json!({}), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        out.iter()
            .all(|o| o.result != Ok(Some(Value::from("injected")))),
        "the injected helper ran: {out:?}"
    );

    // Approving again is what lets the new helper run.
    approve(&hooks, "h");
    let report = host.reload().await;
    assert_eq!(report.started, vec!["h"], "{report:#?}");
    assert_eq!(
        collect_one(&host, "x:go", json!({})).await,
        Ok(Some(json!("injected")))
    );
    host.shutdown(T).await;
}

/// The worker that replaces one killed at its timeout is checked too.
#[tokio::test]
async fn replaced_helper_never_runs_after_a_timeout_restart() {
    let hooks = Hooks::new();
    let dir = hooks.add(
        "slow",
        &[
            ("HOOK.yaml", "name: slow\nevents: [\"x:*\"]\ntimeout: 1\n"),
            (
                "handler.py",
                "import time\nimport helper\n\ndef handle(event, context):\n    if event == 'x:hang':\n        time.sleep(60)\n    return helper.value()\n",
            ),
            ("helper.py", "def value():\n    return 'approved'\n"),
        ],
    );
    let host = approved_host(&hooks, "slow", "x:go", json!("approved")).await;
    std::fs::write(
        dir.join("helper.py"),
        "def value():\n    return 'injected'\n",
    )
    .unwrap();
    let hung = collect_one(&host, "x:hang", json!({})).await;
    assert!(
        hung.as_ref().is_err_and(|e| e.contains("timed out")),
        "{hung:?}"
    );
    let err = collect_one(&host, "x:go", json!({}))
        .await
        .expect_err("the worker replacing the timed-out one must not import the new helper.py");
    assert!(err.contains("helper.py changed"), "{err}");
    host.shutdown(T).await;
}

/// An executable hook is checked before each call: a replaced script it sources is refused.
#[tokio::test]
async fn executable_call_refused_when_a_sourced_script_changed() {
    let hooks = Hooks::new();
    let dir = hooks.with_files(
        hooks.exec(
            "e",
            "[\"x:*\"]",
            "#!/bin/sh\n. \"$HERMES_HOOK_DIR/lib.sh\"\nvalue\n",
        ),
        &[("lib.sh", "value() { echo '\"approved\"'; }\n")],
    );
    let host = approved_host(&hooks, "e", "x:go", json!("approved")).await;
    let injected = "value() { echo '\"injected\"'; }\n";
    assert_edit_refused(host, &dir.join("lib.sh"), injected, "x:go").await;
}

/// An approval written before approvals covered helper files passes only a one-file hook.
#[tokio::test]
async fn old_approval_without_files_covers_only_a_lone_handler() {
    let hooks = Hooks::new();
    hooks.with_files(
        hooks.python("h", "[\"x:*\"]", IMPORTS_HELPER),
        &[("helper.py", "def value():\n    return 1\n")],
    );
    approve(&hooks, "h");
    let file = hooks.home().join("hooks-trust.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    v["hooks"]["h"].as_object_mut().unwrap().remove("files");
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
    let (host, report) = start(&hooks, TrustMode::Explicit).await;
    let (code, reason) = skip_of(&report, "h");
    assert_eq!(code, SkipCode::NotApproved);
    assert!(reason.contains("helper.py"), "{reason}");
    host.shutdown(T).await;
}

/// A working Python hook whose handler.py is broken after it loaded does not import the broken
/// file at its next crash restart; restoring the file lets it start again.
#[tokio::test]
async fn broken_edit_is_not_imported_at_a_crash_restart() {
    let hooks = Hooks::new();
    let marker = hooks.out().join("imports.txt");
    let good = format!(
        "import os\nopen({m:?}, 'a').write('good\\n')\n\ndef handle(event, context):\n    if event == 'x:crash':\n        os._exit(3)\n    return 'good'\n",
        m = marker.display().to_string()
    );
    let broken = format!(
        "open({m:?}, 'a').write('broken\\n')\nraise RuntimeError('half-written edit')\n",
        m = marker.display().to_string()
    );
    let dir = hooks.python("p", "[\"x:*\"]", &good);
    let (host, report) = start(&hooks, TrustMode::All).await;
    assert_eq!(report.loaded, vec!["p"], "{report:#?}");
    assert_eq!(
        collect_one(&host, "x:go", json!({})).await,
        Ok(Some(json!("good")))
    );

    std::fs::write(dir.join("handler.py"), &broken).unwrap();
    let report = host.reload().await;
    let (code, reason) = skip_of(&report, "p");
    assert_eq!(code, SkipCode::LoadFailed, "{reason}");
    assert!(reason.contains("keeps running"), "{reason}");
    let imports = || std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(
        imports(),
        "good\nbroken\n",
        "the reload tried the edit once"
    );

    let crashed = collect_one(&host, "x:crash", json!({})).await;
    assert!(crashed.is_err(), "{crashed:?}");
    let err = collect_one(&host, "x:go", json!({}))
        .await
        .expect_err("the restart must be refused while handler.py is broken");
    assert!(
        err.contains("not started") && err.contains("handler.py changed"),
        "{err}"
    );
    assert_eq!(
        imports(),
        "good\nbroken\n",
        "the broken handler.py was imported at the restart"
    );

    // The working source back in place: the same version starts again.
    std::fs::write(dir.join("handler.py"), &good).unwrap();
    let mut result = collect_one(&host, "x:go", json!({})).await;
    let deadline = std::time::Instant::now() + T;
    while result.is_err() && std::time::Instant::now() < deadline {
        // Each refused restart set a backoff that the next event waits out (no sleep here).
        result = collect_one(&host, "x:go", json!({})).await;
    }
    assert_eq!(result, Ok(Some(json!("good"))));
    host.shutdown(T).await;
}

/// Permissions of the whole tree: a group-writable helper module, a world-writable package
/// directory and a `python:` interpreter writable by others are refused like the handler.
#[tokio::test]
async fn unsafe_permissions_anywhere_in_the_tree_are_refused() {
    let hooks = Hooks::new();
    let a = hooks.python(
        "a",
        "[\"x:*\"]",
        "import helper\n\ndef handle(e, c):\n    return 1\n",
    );
    std::fs::write(a.join("helper.py"), "").unwrap();
    set_mode(&a.join("helper.py"), 0o664);
    // Group-writable counts only for a group shared with others (issue 19's private-group rule).
    if let Some(shared) = crate::dropin::shared_gid() {
        std::os::unix::fs::lchown(a.join("helper.py"), None, Some(shared)).unwrap();
    } else {
        set_mode(&a.join("helper.py"), 0o666);
    }
    let b = hooks.python("b", "[\"x:*\"]", "def handle(e, c):\n    return 1\n");
    std::fs::create_dir_all(b.join("pkg/sub")).unwrap();
    set_mode(&b.join("pkg/sub"), 0o777);
    let elsewhere = hooks.tmp.path().join("bin");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let py = elsewhere.join("python-wrapper");
    std::fs::write(&py, "#!/bin/sh\nexec python3 \"$@\"\n").unwrap();
    set_mode(&py, 0o777);
    hooks.add(
        "c",
        &[
            (
                "HOOK.yaml",
                &format!("name: c\nevents: [\"x:*\"]\npython: {}\n", py.display()),
            ),
            ("handler.py", "def handle(e, c):\n    return 1\n"),
        ],
    );
    let (host, report) = start(&hooks, TrustMode::All).await;
    for (name, needle) in [
        ("a", "helper.py"),
        ("b", "pkg/sub"),
        ("c", "python interpreter"),
    ] {
        let (code, reason) = skip_of(&report, name);
        assert_eq!(code, SkipCode::Permissions, "{name}: {reason}");
        assert!(
            reason.contains(needle) && reason.contains("writable"),
            "{name}: {reason}"
        );
    }
    host.shutdown(T).await;
}

/// A local HTTPS endpoint whose certificate is signed by a certificate authority made here.
/// Counts TCP connections (each delivery attempt opens one) and answers every request with
/// `{"via": "tls"}`.
struct TlsEndpoint {
    addr: std::net::SocketAddr,
    ca_pem: String,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tls_endpoint() -> TlsEndpoint {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "hermes-hooks test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der()).into(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = tls.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let body = br#"{"via": "tls"}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(head.as_bytes()).await;
                let _ = tls.write_all(body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    TlsEndpoint {
        addr,
        ca_pem: ca_cert.pem(),
        connections,
        task,
    }
}

/// HTTPS for real: trusted through `ca_file:`, and an untrusted certificate is one clear,
/// final error (one connection, no retry).
#[tokio::test]
async fn https_webhook_trusts_ca_file_and_refuses_unknown_issuers() {
    use std::sync::atomic::Ordering;
    let endpoint = tls_endpoint().await;
    let hooks = Hooks::new();
    let url = format!("https://{}/deliver?token=s3cret", endpoint.addr);
    let trusted = hooks.add(
        "trusted",
        &[(
            "HOOK.yaml",
            &format!("name: trusted\nevents: [\"a:*\"]\nurl: {url}\nca_file: ca.pem\ntimeout: 5\n"),
        )],
    );
    std::fs::write(trusted.join("ca.pem"), &endpoint.ca_pem).unwrap();
    hooks.add(
        "untrusted",
        &[(
            "HOOK.yaml",
            &format!("name: untrusted\nevents: [\"b:*\"]\nurl: {url}\ntimeout: 5\n"),
        )],
    );
    let (host, report) = start(&hooks, TrustMode::All).await;
    assert_eq!(report.loaded, vec!["trusted", "untrusted"], "{report:#?}");
    assert_eq!(
        collect_one(&host, "a:go", json!({})).await,
        Ok(Some(json!({"via": "tls"})))
    );
    // The listing shows the endpoint without its path and query.
    let shown = host.hook("trusted").unwrap().handler;
    assert_eq!(shown, format!("https://{}/…", endpoint.addr));

    let before = endpoint.connections.load(Ordering::SeqCst);
    let err = collect_one(&host, "b:go", json!({}))
        .await
        .expect_err("a certificate from an unknown authority must fail");
    assert!(
        err.contains("not trusted") && err.contains("ca_file") && err.contains("not retried"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "the error leaks the query: {err}");
    assert_eq!(
        endpoint.connections.load(Ordering::SeqCst) - before,
        1,
        "an untrusted certificate is not retried"
    );
    host.shutdown(T).await;
}

// --- input edges and the service's files (through the real binary) ---

use crate::util::{Serve, bin, poll};

#[test]
fn drain_timeout_must_be_a_sane_number_of_seconds() {
    let hooks = Hooks::new();
    for bad in ["nan", "-1", "1e12", "inf", "soon"] {
        let out = std::process::Command::new(bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--drain-timeout", bad])
            .arg("--hooks-dir")
            .arg(hooks.root())
            .env("HERMES_HOME", hooks.home())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--drain-timeout {bad}: {err}");
        assert!(
            err.contains("--drain-timeout") && !err.contains("panicked"),
            "--drain-timeout {bad}: {err}"
        );
    }
}

/// A child killed and reaped when the test ends, however it ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn home_and_socket_are_private_even_with_umask_0() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let hooks = Hooks::new();
    let home = hooks.tmp.path().join("fresh-home");
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("serve")
        .arg("--hooks-dir")
        .arg(hooks.root())
        .env("HERMES_HOME", &home)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: umask(2) is async-signal-safe and touches nothing but the child's own mask.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let mut child = Reaped(cmd.spawn().unwrap());
    let sock = home.join("hooks.sock");
    poll(T, "the socket to appear", || {
        std::fs::symlink_metadata(&sock)
            .ok()
            .filter(|m| m.file_type().is_socket())
    });
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let (home_mode, sock_mode) = (mode(&home), mode(&sock));
    // The staging directory goes right after the rename that publishes the socket.
    poll(T, "no staging directory left next to the socket", || {
        std::fs::read_dir(&home)
            .unwrap()
            .filter_map(|e| e.ok())
            .all(|e| !e.file_name().to_string_lossy().starts_with(".hooks-sock-"))
            .then_some(())
    });
    crate::util::signal(child.0.id(), libc::SIGTERM);
    let _ = child.0.wait();
    assert_eq!(home_mode, 0o700, "HERMES_HOME created by the service");
    assert_eq!(sock_mode, 0o600, "the socket");
}

#[test]
fn bearer_scheme_is_case_insensitive() {
    let hooks = Hooks::new();
    let token_file = hooks.tmp.path().join("token");
    std::fs::write(&token_file, "t0ken\n").unwrap();
    let serve = Serve::start(&hooks, &["--token-file", token_file.to_str().unwrap()]);
    for value in ["Bearer t0ken", "bearer t0ken", "BEARER  t0ken"] {
        let (status, _, body) = crate::util::http(
            &serve.addr,
            "GET",
            "/v1/hooks",
            &[("Authorization", value)],
            b"",
        );
        assert_eq!(status, 200, "{value:?}: {}", String::from_utf8_lossy(&body));
    }
    let (status, _, _) = crate::util::http(
        &serve.addr,
        "GET",
        "/v1/hooks",
        &[("Authorization", "bearer wrong")],
        b"",
    );
    assert_eq!(status, 401);
}

#[test]
fn a_client_leaving_mid_body_is_not_a_413() {
    use std::io::{Read, Write};
    let hooks = Hooks::new();
    let serve = Serve::start(&hooks, &[]);
    let mut s = std::net::TcpStream::connect(&serve.addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(
        b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"event\": ",
    )
    .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let head = String::from_utf8_lossy(&raw);
    assert!(
        !head.contains(" 413 "),
        "a body cut short by the client is not too large: {head}"
    );
}

#[tokio::test]
async fn handler_error_texts_are_capped() {
    let hooks = Hooks::new();
    hooks.python(
        "loud",
        "[\"x:*\"]",
        "def handle(event, context):\n    raise ValueError('x' * 200000)\n",
    );
    let (host, _) = start(&hooks, TrustMode::All).await;
    let err = collect_one(&host, "x:go", json!({}))
        .await
        .expect_err("the handler raises");
    assert!(err.len() <= 4200, "error text of {} bytes", err.len());
    assert!(err.contains("more bytes cut"), "{}", &err[err.len() - 60..]);
    let last = host.hook("loud").unwrap().last_error.unwrap().message;
    assert!(last.len() <= 4300, "last_error of {} bytes", last.len());
    host.shutdown(T).await;
}

/// A hook writing a state file into its own directory does not make the watcher rescan.
#[test]
fn a_hook_writing_into_its_own_directory_causes_no_rescan() {
    let hooks = Hooks::new();
    hooks.python(
        "writer",
        "[\"x:*\"]",
        "import os, time\n\nos.chdir(os.environ['HERMES_HOOK_DIR'])\n\ndef handle(event, context):\n    for i in range(60):\n        with open('state.json', 'w') as f:\n            f.write('{\"n\": %d}' % i)\n        with open('hook.log', 'a') as f:\n            f.write('line\\n')\n        time.sleep(0.025)\n    return 'done'\n",
    );
    let serve = Serve::start(&hooks, &[]);
    let (status, body) = serve.post("/v1/collect", &json!({"event": "x:go"}));
    assert_eq!(status, 200, "{body}");
    // A change that matters, as the barrier: once it is loaded, every earlier rescan is logged.
    // Built elsewhere and moved in, so that it is one change (one rescan) however slow the
    // machine is.
    let staging = hooks.tmp.path().join("staging");
    std::fs::create_dir_all(staging.join("late")).unwrap();
    std::fs::write(
        staging.join("late/HOOK.yaml"),
        "name: late\nevents: [\"y:*\"]\n",
    )
    .unwrap();
    std::fs::write(
        staging.join("late/handler.py"),
        "def handle(e, c):\n    return 1\n",
    )
    .unwrap();
    std::fs::rename(staging.join("late"), hooks.root().join("late")).unwrap();
    poll(T, "the new hook to load", || {
        serve
            .get("/v1/hooks")
            .1
            .to_string()
            .contains("\"late\"")
            .then_some(())
    });
    // The reload's log line can reach the reader thread after /v1/hooks shows the new hook.
    let rescans = poll(T, "the reload's log line", || {
        let n = serve
            .log()
            .matches("hooks reloaded after a change on disk")
            .count();
        (n > 0).then_some(n)
    });
    assert_eq!(
        rescans,
        1,
        "only the new hook should cause a rescan:\n{}",
        serve.log()
    );
}
