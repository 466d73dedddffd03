//! Issue 35: trust that holds, second round. Unapproved code the review ran inside a running
//! worker (planted bytecode behind a namespace package, a path entry inside the tree), in the
//! gateway (an impostor on the TCP port: `clients/python/tests/test_impostor.py`), and through a
//! native library (`.so`) or a sourced shell file.

use serde_json::{Value, json};

use std::time::Duration;

use crate::util::{Hooks, Serve, approve, poll};

const T: Duration = Duration::from_secs(20);

/// Compiles `source` to CPython bytecode at `target` with the `python3` on PATH.
fn plant_bytecode(source: &str, target: &std::path::Path) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("planted.py");
    std::fs::write(&src, source).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let out = std::process::Command::new("python3")
        .args(["-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"])
        .arg(&src)
        .arg(target)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// The one result (or error) of a `/v1/collect` of `event` on a service running one hook.
fn collect(serve: &Serve, event: &str) -> Result<Value, String> {
    let (status, body) = serve.post("/v1/collect", &json!({"event": event}));
    assert_eq!(status, 200, "{body}");
    if let Some(r) = body["results"].get(0) {
        return Ok(r["result"].clone());
    }
    Err(body["errors"][0]["error"]
        .as_str()
        .unwrap_or("")
        .to_string())
}

/// Item 1: a hook approved under `--trust explicit` whose handler lazily imports `lib` (a bare
/// helper directory: a namespace package), `yaml` (site-packages) and a module of a `vendor/`
/// directory it puts on `sys.path` itself. After its first event, `lib/__init__.pyc`,
/// `yaml/__init__.pyc` and `vendor/extra.py` are planted in the hook directory (no watcher, so
/// the running worker is what is tested): none of them runs, each is refused and logged with
/// the hook and the file. Today's runner hands all three to Python's plain path finder.
#[test]
fn item_1_planted_files_behind_namespace_and_path_entries_never_run() {
    let hooks = Hooks::new();
    let dir = hooks.python(
        "h",
        "[\"x:*\"]",
        "import importlib, os, sys\n\n\
         def handle(event, context):\n    \
             if event == 'x:go':\n        \
                 return 'started'\n    \
             name = event[2:]\n    \
             if name == 'extra':\n        \
                 sys.path.append(os.path.join(os.path.dirname(__file__), 'vendor'))\n    \
             module = importlib.import_module(name)\n    \
             return getattr(module, 'PLANTED', 'clean')\n",
    );
    std::fs::create_dir(dir.join("lib")).unwrap();
    std::fs::write(dir.join("lib").join("util.py"), "VALUE = 1\n").unwrap();
    std::fs::create_dir(dir.join("vendor")).unwrap();
    approve(&hooks, "h");
    let serve = Serve::start(&hooks, &["--trust", "explicit", "--no-watch"]);
    assert_eq!(collect(&serve, "x:go"), Ok(json!("started")));

    let evil = "PLANTED = 'ran'\n";
    plant_bytecode(evil, &dir.join("lib").join("__init__.pyc"));
    plant_bytecode(evil, &dir.join("yaml").join("__init__.pyc"));
    std::fs::write(dir.join("vendor").join("extra.py"), evil).unwrap();
    for (module, file) in [
        ("lib", "lib/__init__.pyc"),
        ("yaml", "yaml/__init__.pyc"),
        ("extra", "vendor/extra.py"),
    ] {
        let out = collect(&serve, &format!("x:{module}"));
        let err = out.expect_err(&format!("the planted {file} must be refused"));
        assert!(
            err.contains(file) && err.contains("not imported"),
            "{module}: {err}"
        );
        // The log line travels through the service's stderr reader: wait for it.
        poll(
            T,
            &format!("the refusal of {file} logged with the hook and the file"),
            || {
                serve
                    .log()
                    .lines()
                    .any(|l| {
                        l.contains("hook 'h'") && l.contains(file) && l.contains("not imported")
                    })
                    .then_some(())
            },
        );
    }
}

/// Item 2, the CLI's own client (`emit`, `list --live`): over TCP it sends the token only after
/// the process on the port proved that it holds it. A real impostor process-side listener (a
/// thread of this test on its own port) answers every request with a made-up proof and records
/// what it receives: the token never reaches it, and `emit` fails with one clear error.
#[test]
fn item_2_the_cli_sends_no_token_to_an_impostor() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let recorder = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(Duration::from_millis(300)));
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                recorder.lock().unwrap().extend_from_slice(&buf[..n]);
                let body = format!("{{\"proof\": \"{}\"}}", "0".repeat(64));
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "cli-s3cret\n").unwrap();
    let out = std::process::Command::new(crate::util::bin())
        .args(["emit", "agent:start", "--listen", &addr, "--token-file"])
        .arg(&token_file)
        .env("HERMES_HOME", tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let seen = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(
        !seen.contains("cli-s3cret"),
        "the impostor got the token:\n{seen}"
    );
    assert!(seen.contains("POST /v1/proof"), "{seen}");
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("did not prove"), "{stderr}");
}
