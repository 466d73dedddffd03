//! The dynamic-library handler kind (C ABI v1): real libraries built here with `cc` and cargo,
//! loaded by the real `serve` binary, checked through the HTTP API.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, http, poll};

const T: Duration = Duration::from_secs(20);

/// Compiles C `source` into the shared library `out` (via a temporary file and a rename, unless
/// `in_place`: then the compiler writes `out` itself, as a careless rebuild would).
fn cc(source: &str, out: &Path, in_place: bool) {
    let dir = out.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let src = tempfile::Builder::new().suffix(".c").tempfile().unwrap();
    std::fs::write(src.path(), source).unwrap();
    let target = if in_place {
        out.to_path_buf()
    } else {
        dir.join(".handler.tmp")
    };
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&target)
        .arg(src.path());
    build(cmd);
    if !in_place {
        std::fs::rename(&target, out).unwrap();
    }
}

const C_PRELUDE: &str = r#"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>
typedef struct { uint8_t *ptr; size_t len; } HermesHookBuf;
static int32_t put(HermesHookBuf *out, const char *s, int32_t rc) {
    size_t n = strlen(s);
    out->ptr = malloc(n ? n : 1);
    memcpy(out->ptr, s, n);
    out->len = n;
    return rc;
}
static int is(const uint8_t *ev, size_t len, const char *name) {
    return len == strlen(name) && memcmp(ev, name, len) == 0;
}
"#;

const C_FREE: &str = "void hermes_hook_free(HermesHookBuf b) { free(b.ptr); }\n";

/// A C hook directory `name` on `events` with the given extra C code after the prelude.
fn c_hook(hooks: &Hooks, name: &str, yaml_extra: &str, code: &str) -> PathBuf {
    let dir = hooks.add(
        name,
        &[(
            "HOOK.yaml",
            &format!("name: {name}\nevents: [\"test:*\"]\n{yaml_extra}"),
        )],
    );
    cc(
        &format!("{C_PRELUDE}\n{code}"),
        &dir.join("handler.so"),
        false,
    );
    dir
}

/// POST /v1/collect for `event`; returns (results, errors).
fn collect(serve: &Serve, event: &str, context: Value) -> (Vec<Value>, Vec<Value>) {
    let (status, body) = serve.post(
        "/v1/collect",
        &json!({"event": event, "context": context, "timeout_ms": 10_000}),
    );
    assert_eq!(status, 200, "{body}");
    let list = |k: &str| body[k].as_array().cloned().unwrap_or_default();
    (list("results"), list("errors"))
}

/// The single result of `hook` for `event`, or its error.
fn one(serve: &Serve, hook: &str, event: &str, context: Value) -> Result<Value, String> {
    let (results, errors) = collect(serve, event, context);
    if let Some(e) = errors.iter().find(|e| e["hook"] == hook) {
        return Err(e["error"].as_str().unwrap_or_default().to_string());
    }
    let r = results
        .iter()
        .find(|r| r["hook"] == hook)
        .unwrap_or_else(|| panic!("no result from {hook} for {event}: {results:?} {errors:?}"));
    Ok(r["result"].clone())
}

fn metrics(serve: &Serve) -> String {
    let (status, _, body) = http(&serve.addr, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    String::from_utf8(body).unwrap()
}

/// The value of the metric line starting with `prefix` (name and labels).
fn metric(serve: &Serve, prefix: &str) -> Option<f64> {
    metrics(serve)
        .lines()
        .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Shared target dir for the Rust hooks built by these tests (deps compile once, kept across runs).
fn rust_target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dylib-hooks")
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Runs a build command quietly; its output is shown only when it fails.
fn build(mut cmd: Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn c_example_builds_with_its_script_and_answers_through_collect() {
    let hooks = Hooks::new();
    let dest = hooks.root().join("c-counter");
    let mut cmd = Command::new(repo().join("examples/dylib-c/build.sh"));
    cmd.arg(&dest);
    build(cmd);
    let serve = Serve::start(&hooks, &["--no-watch"]);
    let (_, info) = serve.get("/v1/hooks/c-counter");
    assert_eq!(info["kind"], "dylib", "{info}");
    assert_eq!(info["status"], "ready", "{info}");
    let ctx = json!({"platform": "telegram", "command": "reset"});
    let r = one(&serve, "c-counter", "command:reset", ctx.clone()).unwrap();
    assert_eq!(r["handled_by"], "c");
    assert_eq!(r["event"], "command:reset");
    assert_eq!(r["calls"], 1);
    assert_eq!(
        r["context_bytes"],
        serde_json::to_vec(&ctx).unwrap().len(),
        "{r}"
    );
    let r = one(&serve, "c-counter", "command:help", json!({})).unwrap();
    assert_eq!(r["calls"], 2, "state persists between calls: {r}");
}

#[test]
fn rust_sdk_example_builds_with_its_script_and_answers_through_collect() {
    let hooks = Hooks::new();
    let dest = hooks.root().join("rust-pre-route");
    let mut cmd = Command::new(repo().join("examples/dylib-rust/build.sh"));
    cmd.arg(&dest)
        .env("CARGO_TARGET_DIR", rust_target_dir())
        .env("HERMES_HOOK_PROFILE", "debug");
    build(cmd);
    let serve = Serve::start(&hooks, &["--no-watch"]);
    let r = one(
        &serve,
        "rust-pre-route",
        "message:pre_route",
        json!({"message": "/switch abc123", "platform": "slack"}),
    )
    .unwrap();
    assert_eq!(
        r,
        json!({"decision": "switch_session", "session_id": "abc123", "handled_by": "rust"})
    );
    // No decision: no result entry, no error.
    let (results, errors) = collect(&serve, "message:pre_route", json!({"message": "hello"}));
    assert!(
        results.is_empty() && errors.is_empty(),
        "{results:?} {errors:?}"
    );
    // init got the hook directory.
    let r = one(&serve, "rust-pre-route", "command:reset", json!({})).unwrap();
    assert_eq!(r["commands_seen"], 1);
    assert_eq!(
        Path::new(r["hook_dir"].as_str().unwrap())
            .canonicalize()
            .unwrap(),
        dest.canonicalize().unwrap()
    );
}

#[test]
fn a_panicking_rust_handler_is_an_error_entry_and_the_service_lives_on() {
    let krate = tempfile::tempdir().unwrap();
    let sdk = repo().join("sdk");
    std::fs::write(
        krate.path().join("Cargo.toml"),
        format!(
            "[package]\nname = \"hermes-hook-test-panicky\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\n\
             [lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\nhermes-hooks-sdk = {{ path = {:?} }}\n\n[workspace]\n",
            sdk.display().to_string()
        ),
    )
    .unwrap();
    // Same versions as the workspace: builds offline and shares compiled dependencies.
    std::fs::copy(repo().join("Cargo.lock"), krate.path().join("Cargo.lock")).unwrap();
    std::fs::create_dir_all(krate.path().join("src")).unwrap();
    std::fs::write(
        krate.path().join("src/lib.rs"),
        r#"
use hermes_hooks_sdk::serde_json::{Value, json};
fn handle(event: &str, _context: &Value) -> Result<Option<Value>, String> {
    match event {
        "test:panic" => panic!("boom from rust"),
        "test:err" => Err("a plain error".into()),
        _ => Ok(Some(json!({"ok": true}))),
    }
}
hermes_hooks_sdk::export_hook!(handle);
"#,
    )
    .unwrap();
    let target = rust_target_dir();
    let mut cmd = cargo();
    cmd.args(["build", "--offline", "--manifest-path"])
        .arg(krate.path().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
    build(cmd);

    let hooks = Hooks::new();
    let dir = hooks.add(
        "panicky",
        &[("HOOK.yaml", "name: panicky\nevents: [\"test:*\"]\n")],
    );
    std::fs::copy(
        target.join("debug/libhermes_hook_test_panicky.so"),
        dir.join("handler.so"),
    )
    .unwrap();
    let serve = Serve::start(&hooks, &["--no-watch"]);
    let err = one(&serve, "panicky", "test:panic", json!({})).unwrap_err();
    assert!(err.contains("handler panicked: boom from rust"), "{err}");
    assert_eq!(serve.get("/healthz").0, 200);
    let err = one(&serve, "panicky", "test:err", json!({})).unwrap_err();
    assert!(err.contains("a plain error"), "{err}");
    assert_eq!(
        one(&serve, "panicky", "test:ok", json!({})).unwrap(),
        json!({"ok": true})
    );
    let (_, info) = serve.get("/v1/hooks/panicky");
    assert_eq!(info["status"], "ready", "{info}");
    assert_eq!(info["counters"]["failed"], 2, "{info}");
}

#[test]
fn bad_output_from_a_c_handler_is_an_error_for_that_call_only() {
    let hooks = Hooks::new();
    c_hook(
        &hooks,
        "sloppy",
        "",
        &format!(
            r#"
uint32_t hermes_hook_abi_version(void) {{ return 1; }}
int32_t hermes_hook_handle(const uint8_t *ev, size_t n, const uint8_t *c, size_t cn, HermesHookBuf *out) {{
    (void)c; (void)cn;
    if (is(ev, n, "test:badjson")) return put(out, "{{not json", 0);
    if (is(ev, n, "test:badutf8")) return put(out, "\"\xff\xfe\"", 0);
    if (is(ev, n, "test:fail")) return put(out, "went wrong", 7);
    if (is(ev, n, "test:empty")) {{ out->ptr = NULL; out->len = 0; return 0; }}
    return put(out, "{{\"fine\": true}}", 0);
}}
{C_FREE}"#
        ),
    );
    let serve = Serve::start(&hooks, &["--no-watch"]);
    let err = one(&serve, "sloppy", "test:badjson", json!({})).unwrap_err();
    assert!(err.contains("not one JSON value"), "{err}");
    let err = one(&serve, "sloppy", "test:badutf8", json!({})).unwrap_err();
    assert!(err.contains("not valid UTF-8"), "{err}");
    let err = one(&serve, "sloppy", "test:fail", json!({})).unwrap_err();
    assert!(
        err.contains("returned error 7") && err.contains("went wrong"),
        "{err}"
    );
    let (results, errors) = collect(&serve, "test:empty", json!({}));
    assert!(
        results.is_empty() && errors.is_empty(),
        "{results:?} {errors:?}"
    );
    assert_eq!(
        one(&serve, "sloppy", "test:ok", json!({})).unwrap(),
        json!({"fine": true})
    );
    assert_eq!(serve.get("/healthz").0, 200);
}

#[test]
fn abi_problems_are_skipped_with_the_file_and_the_reason() {
    let hooks = Hooks::new();
    let handle = r#"
int32_t hermes_hook_handle(const uint8_t *ev, size_t n, const uint8_t *c, size_t cn, HermesHookBuf *out) {
    (void)ev; (void)n; (void)c; (void)cn; out->ptr = NULL; out->len = 0; return 0;
}
"#;
    c_hook(
        &hooks,
        "wrong-version",
        "",
        &format!("uint32_t hermes_hook_abi_version(void) {{ return 2; }}\n{handle}{C_FREE}"),
    );
    c_hook(
        &hooks,
        "no-free",
        "",
        &format!("uint32_t hermes_hook_abi_version(void) {{ return 1; }}\n{handle}"),
    );
    c_hook(
        &hooks,
        "init-refuses",
        "",
        &format!(
            "uint32_t hermes_hook_abi_version(void) {{ return 1; }}\n{handle}{C_FREE}\
             int32_t hermes_hook_init(const uint8_t *d, size_t n) {{ (void)d; (void)n; return 5; }}\n"
        ),
    );
    let garbage = hooks.add(
        "not-a-library",
        &[
            ("HOOK.yaml", "name: not-a-library\nevents: [\"test:*\"]\n"),
            ("handler.so", "this is not an ELF file\n"),
        ],
    );
    let serve = Serve::start(&hooks, &["--no-watch"]);
    let (_, body) = serve.get("/v1/hooks");
    assert_eq!(body["hooks"].as_array().unwrap().len(), 0, "{body}");
    let skipped = body["skipped"].as_array().unwrap();
    let reason = |name: &str| {
        let s = skipped
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in skipped: {skipped:?}"));
        assert_eq!(s["code"], "load_failed", "{s}");
        assert!(s["file"].as_str().unwrap().ends_with("handler.so"), "{s}");
        s["reason"].as_str().unwrap().to_string()
    };
    let r = reason("wrong-version");
    assert!(
        r.contains("ABI version 2") && r.contains("handler.so"),
        "{r}"
    );
    let r = reason("no-free");
    assert!(r.contains("does not export hermes_hook_free"), "{r}");
    let r = reason("init-refuses");
    assert!(
        r.contains("hermes_hook_init") && r.contains("returned 5"),
        "{r}"
    );
    let r = reason("not-a-library");
    assert!(
        r.contains("cannot load") && r.contains(&garbage.join("handler.so").display().to_string()),
        "{r}"
    );
    // `check` loads the same way and fails on them.
    let out = Command::new(crate::util::bin())
        .args(["check", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("hermes_hook_free"), "{text}");
}

/// C source of a versioned hook whose shutdown appends to `log`.
fn versioned(version: u32, log: &Path) -> String {
    format!(
        r#"{C_PRELUDE}
uint32_t hermes_hook_abi_version(void) {{ return 1; }}
int32_t hermes_hook_handle(const uint8_t *ev, size_t n, const uint8_t *c, size_t cn, HermesHookBuf *out) {{
    (void)ev; (void)n; (void)c; (void)cn;
    return put(out, "{{\"version\": {version}}}", 0);
}}
void hermes_hook_shutdown(void) {{
    FILE *f = fopen({log:?}, "a");
    if (f) {{ fprintf(f, "shutdown {version}\n"); fclose(f); }}
}}
{C_FREE}"#,
        log = log.display().to_string()
    )
}

/// Waits until `log` says library version `version` ran its shutdown ([`versioned`]).
fn wait_shutdown(log: &Path, version: u32) {
    poll(T, &format!("version {version}'s shutdown"), || {
        std::fs::read_to_string(log)
            .ok()?
            .contains(&format!("shutdown {version}"))
            .then_some(())
    });
}

/// Waits until `serve`'s `/v1/hooks/<hook>` satisfies `done` (`what` names it); returns it.
fn wait_info(serve: &Serve, hook: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    poll(T, what, || {
        let (_, info) = serve.get(&format!("/v1/hooks/{hook}"));
        done(&info).then_some(info)
    })
}

/// Posts six events as one batch (one request: the hook's worker takes them as one batch),
/// `{"i": 0..6}`, the third `test:slow`, the others `test:fast`.
fn post_batch_slow_third(serve: &Serve) {
    let events: Vec<Value> = (0..6)
        .map(|i| json!({"event": if i == 2 { "test:slow" } else { "test:fast" }, "context": {"i": i}}))
        .collect();
    let (s, _) = serve.post("/v1/events/batch", &json!({"events": events}));
    assert_eq!(s, 202);
}

#[test]
fn a_rebuilt_library_at_the_same_path_is_really_reloaded() {
    let hooks = Hooks::new();
    let log = hooks.out().join("shutdown.log");
    let dir = hooks.add(
        "versioned",
        &[("HOOK.yaml", "name: versioned\nevents: [\"test:*\"]\n")],
    );
    let lib = dir.join("handler.so");
    cc(&versioned(1, &log), &lib, true);
    let serve = Serve::start(&hooks, &["--no-watch"]);
    assert_eq!(
        one(&serve, "versioned", "test:x", json!({})).unwrap(),
        json!({"version": 1})
    );
    let retained_before = metric(&serve, "hermes_hooks_dylibs_retained").unwrap();

    // Overwrite the very file in place: the host loaded a private copy, so this is safe and the
    // new content is what loads next (same path, and the same inode).
    cc(&versioned(2, &log), &lib, true);
    serve.reload_lists("started", "versioned");
    poll(T, "the new version to answer", || {
        (one(&serve, "versioned", "test:x", json!({})).ok()? == json!({"version": 2})).then_some(())
    });
    // The old copy ran its shutdown and stays mapped, counted.
    wait_shutdown(&log, 1);
    poll(T, "the retained-library gauge to count it", || {
        (metric(&serve, "hermes_hooks_dylibs_retained")? >= retained_before + 1.0).then_some(())
    });
    // Nothing piles up in the runtime directory: private copies are unlinked once mapped.
    let copies = hooks.home().join("cache/hermes-hooks/dylib");
    let left = std::fs::read_dir(&copies).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "private copies left in {}", copies.display());
}

#[test]
fn a_call_past_the_timeout_marks_the_hook_stuck_until_it_returns() {
    let hooks = Hooks::new();
    let release = hooks.out().join("release");
    c_hook(
        &hooks,
        "slowpoke",
        "timeout: 0.3\nqueue: {capacity: 1, overflow: drop_newest}\n",
        &format!(
            r#"
uint32_t hermes_hook_abi_version(void) {{ return 1; }}
int32_t hermes_hook_handle(const uint8_t *ev, size_t n, const uint8_t *c, size_t cn, HermesHookBuf *out) {{
    (void)c; (void)cn;
    if (is(ev, n, "test:slow")) {{
        /* Blocks until the test creates the release file (a library call cannot be interrupted). */
        while (access({release:?}, F_OK) != 0) usleep(5000);
        return put(out, "{{\"slow\": \"done\"}}", 0);
    }}
    return put(out, "{{\"fast\": true}}", 0);
}}
{C_FREE}"#,
            release = release.display().to_string()
        ),
    );
    let serve = Serve::start(&hooks, &["--no-watch"]);
    let err = one(&serve, "slowpoke", "test:slow", json!({})).unwrap_err();
    assert!(err.contains("timed out after 300ms"), "{err}");
    let (_, info) = serve.get("/v1/hooks/slowpoke");
    assert_eq!(info["status"], "stuck", "{info}");
    assert_eq!(info["counters"]["timeouts"], 1, "{info}");
    assert_eq!(
        metric(&serve, "hermes_hooks_hook_stuck{hook=\"slowpoke\"}"),
        Some(1.0)
    );
    // No new calls while stuck: one event waits in the queue, the next overflows (drop_newest).
    for _ in 0..2 {
        let (s, _) = serve.post("/v1/events", &json!({"event": "test:fast"}));
        assert_eq!(s, 202);
    }
    let (_, info) = serve.get("/v1/hooks/slowpoke");
    assert_eq!(info["status"], "stuck", "{info}");
    assert_eq!(info["queue"]["depth"], 1, "{info}");
    assert_eq!(info["counters"]["dropped"], 1, "{info}");
    assert_eq!(info["counters"]["ok"], 0, "{info}");

    // The call returns: the hook resumes with the queued event.
    std::fs::write(&release, "").unwrap();
    let info = wait_info(
        &serve,
        "slowpoke",
        "the hook to resume and run the queued event",
        |info| info["status"] == "ready" && info["counters"]["ok"] == 1,
    );
    assert_eq!(info["queue"]["depth"], 0, "{info}");
    assert_eq!(
        metric(&serve, "hermes_hooks_hook_stuck{hook=\"slowpoke\"}"),
        Some(0.0)
    );
    assert_eq!(
        one(&serve, "slowpoke", "test:fast", json!({})).unwrap(),
        json!({"fast": true})
    );
}

#[test]
fn a_batch_with_a_stuck_call_keeps_order_and_reports_each_call() {
    let hooks = Hooks::new();
    let log = hooks.out().join("calls.log");
    let release = hooks.out().join("release");
    c_hook(
        &hooks,
        "batcher",
        "timeout: 0.3\nqueue: {capacity: 1000}\n",
        &format!(
            r#"
uint32_t hermes_hook_abi_version(void) {{ return 1; }}
int32_t hermes_hook_handle(const uint8_t *ev, size_t n, const uint8_t *c, size_t cn, HermesHookBuf *out) {{
    if (is(ev, n, "test:slow")) {{
        while (access({release:?}, F_OK) != 0) usleep(5000);
    }}
    FILE *f = fopen({log:?}, "a");
    if (f) {{ fwrite(c, 1, cn, f); fputc('\n', f); fclose(f); }}
    (void)out;
    return 0;
}}
{C_FREE}"#,
            release = release.display().to_string(),
            log = log.display().to_string()
        ),
    );
    let serve = Serve::start(&hooks, &["--no-watch"]);
    post_batch_slow_third(&serve);
    let info = wait_info(
        &serve,
        "batcher",
        "the slow call to be reported stuck",
        |info| info["status"] == "stuck",
    );
    assert_eq!(info["counters"]["timeouts"], 1, "{info}");
    std::fs::write(&release, "").unwrap();
    let info = wait_info(&serve, "batcher", "the rest of the batch", |info| {
        info["counters"]["ok"] == 5 && info["status"] == "ready"
    });
    assert_eq!(
        info["counters"]["failed"], 1,
        "only the slow call failed: {info}"
    );
    let order: Vec<i64> = crate::util::read_jsonl(&log)
        .iter()
        .map(|v| v["i"].as_i64().unwrap())
        .collect();
    assert_eq!(
        order,
        vec![0, 1, 2, 3, 4, 5],
        "each call once, in emit order"
    );
}

#[test]
fn a_rebuilt_library_is_picked_up_by_the_watcher() {
    let hooks = Hooks::new();
    let log = hooks.out().join("shutdown.log");
    let dir = hooks.add(
        "watched",
        &[("HOOK.yaml", "name: watched\nevents: [\"test:*\"]\n")],
    );
    let lib = dir.join("handler.so");
    cc(&versioned(1, &log), &lib, false);
    let serve = Serve::start(&hooks, &[]);
    assert_eq!(
        one(&serve, "watched", "test:x", json!({})).unwrap(),
        json!({"version": 1})
    );
    // Rebuilt as a build script does (temp file + rename): no reload request, the watcher sees it.
    cc(&versioned(2, &log), &lib, false);
    poll(T, "the rebuilt library to answer", || {
        (one(&serve, "watched", "test:x", json!({})).ok()? == json!({"version": 2})).then_some(())
    });
    wait_shutdown(&log, 1);
}

/// C source of a batch hook that logs `v<version> <i>` per call and blocks on `test:slow` until
/// `release` exists.
fn blocking_logger(version: u32, log: &Path, release: &Path) -> String {
    format!(
        r#"{C_PRELUDE}
uint32_t hermes_hook_abi_version(void) {{ return 1; }}
int32_t hermes_hook_handle(const uint8_t *ev, size_t n, const uint8_t *c, size_t cn, HermesHookBuf *out) {{
    if (is(ev, n, "test:slow")) {{
        while (access({release:?}, F_OK) != 0) usleep(5000);
    }}
    FILE *f = fopen({log:?}, "a");
    if (f) {{ fprintf(f, "{{\"v\": {version}, \"ctx\": "); fwrite(c, 1, cn, f); fputs("}}\n", f); fclose(f); }}
    (void)out;
    return 0;
}}
{C_FREE}"#,
        release = release.display().to_string(),
        log = log.display().to_string()
    )
}

#[test]
fn a_reload_while_a_batch_is_stuck_delivers_every_event_exactly_once() {
    let hooks = Hooks::new();
    let log = hooks.out().join("calls.log");
    let release = hooks.out().join("release");
    let dir = hooks.add(
        "reloader",
        &[(
            "HOOK.yaml",
            "name: reloader\nevents: [\"test:*\"]\ntimeout: 0.3\nqueue: {capacity: 1000}\n",
        )],
    );
    let lib = dir.join("handler.so");
    cc(&blocking_logger(1, &log, &release), &lib, false);
    let serve = Serve::start(&hooks, &["--no-watch"]);
    post_batch_slow_third(&serve);
    wait_info(
        &serve,
        "reloader",
        "the batch to be stuck on its slow call",
        |info| info["status"] == "stuck",
    );
    // A new version while the old one is stuck in the middle of its batch.
    cc(&blocking_logger(2, &log, &release), &lib, false);
    serve.reload_lists("started", "reloader");
    std::fs::write(&release, "").unwrap();
    let info = wait_info(&serve, "reloader", "every event to be settled", |info| {
        let c = &info["counters"];
        c["ok"]
            .as_u64()
            .zip(c["failed"].as_u64())
            .map(|(o, f)| o + f)
            == Some(6)
    });
    assert_eq!(
        (
            info["counters"]["ok"].as_u64(),
            info["counters"]["failed"].as_u64()
        ),
        (Some(5), Some(1)),
        "only the slow call fails (its timeout), no event fails for not being run: {info}"
    );
    let last = info["last_error"]["message"].as_str().unwrap_or("");
    assert!(
        last.contains("timed out"),
        "the one failure is the timeout: {info}"
    );
    // The stuck call was counted failed at its timeout; it logs once it returns (after the
    // release), which may be after the others settled: wait for six lines, then compare.
    let mut seen: Vec<i64> = poll(T, "every call to have logged", || {
        let lines = crate::util::read_jsonl(&log);
        (lines.len() >= 6).then_some(lines)
    })
    .iter()
    .map(|v| v["ctx"]["i"].as_i64().unwrap())
    .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![0, 1, 2, 3, 4, 5],
        "each event delivered exactly once, to the old or the new version"
    );
}
