//! Dynamic-library hooks (divan + a percentile table).
//!
//! `cargo bench --bench dylib` (needs `cc` and `python3`).
//!
//! - `emit_through_noop_dylib`: events per second through one no-op C hook, from the library's
//!   in-process `Host::emit` until the hook's worker has run every call: emit, queue, worker task,
//!   hand-off to the library's thread, the call, the reply. The context is the 5-key gateway
//!   context of `benches/emit.rs`, built per event.
//! - After divan, an `emit_collect` round-trip table (p50/p99/max over 5,000 calls after a
//!   warm-up) for a dylib hook and for the same hook in Python (`handler.py`).

use std::process::Command;
use std::sync::LazyLock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hermes_hooks::{Host, HostConfig};
use serde_json::{Value, json};

const NOOP_C: &str = r#"
#include <stdint.h>
#include <stddef.h>
typedef struct { uint8_t *ptr; size_t len; } HermesHookBuf;
uint32_t hermes_hook_abi_version(void) { return 1; }
int32_t hermes_hook_handle(const uint8_t *e, size_t el, const uint8_t *c, size_t cl, HermesHookBuf *out) {
    (void)e; (void)el; (void)c; (void)cl; out->ptr = NULL; out->len = 0; return 0;
}
void hermes_hook_free(HermesHookBuf b) { (void)b; }
"#;

/// `{"ok": true}`, as the Python twin returns.
const OK_C: &str = r#"
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
typedef struct { uint8_t *ptr; size_t len; } HermesHookBuf;
uint32_t hermes_hook_abi_version(void) { return 1; }
int32_t hermes_hook_handle(const uint8_t *e, size_t el, const uint8_t *c, size_t cl, HermesHookBuf *out) {
    (void)e; (void)el; (void)c; (void)cl;
    static const char r[] = "{\"ok\": true}";
    out->ptr = malloc(sizeof r - 1); memcpy(out->ptr, r, sizeof r - 1); out->len = sizeof r - 1;
    return 0;
}
void hermes_hook_free(HermesHookBuf b) { free(b.ptr); }
"#;

struct Fixture {
    host: Host,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

/// One hook named `name` on `bench:*`: a C library built from `c_source`, or `handler.py`.
fn fixture(name: &str, c_source: Option<&str>, python: &str) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("hooks");
    let hook = root.join(name);
    std::fs::create_dir_all(&hook).expect("mkdir");
    std::fs::write(
        hook.join("HOOK.yaml"),
        "events: [\"bench:*\"]\nqueue: {capacity: 1000000}\n",
    )
    .expect("write HOOK.yaml");
    match c_source {
        Some(src) => {
            let c = dir.path().join("handler.c");
            std::fs::write(&c, src).expect("write handler.c");
            let status = Command::new("cc")
                .args(["-O2", "-shared", "-fPIC", "-o"])
                .arg(hook.join("handler.so"))
                .arg(&c)
                .status()
                .expect("run cc");
            assert!(status.success(), "cc failed");
        }
        None => std::fs::write(hook.join("handler.py"), python).expect("write handler.py"),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = HostConfig::from_env(vec![root]);
    config.hermes_home = dir.path().to_path_buf();
    config.python = "python3".into();
    config.runtime_dir = dir.path().join("cache");
    let (host, report) = rt.block_on(Host::start(config));
    assert_eq!(report.loaded.len(), 1, "{:?}", report.skipped);
    Fixture {
        host,
        rt,
        _dir: dir,
    }
}

static NOOP: LazyLock<Fixture> = LazyLock::new(|| fixture("noop", Some(NOOP_C), ""));

fn context() -> Value {
    json!({"platform": "telegram", "user_id": "42", "chat_id": "c", "session_id": "s", "message": "hello"})
}

const EVENTS: u64 = 100_000;

fn main() {
    divan::main();
    round_trips();
}

/// Emits every context to the no-op dylib hook, then waits until its worker ran them all.
fn emit_all_and_wait(contexts: impl Iterator<Item = Value>) {
    let fx = &*NOOP;
    let stats = fx
        .host
        .snapshot()
        .get("noop")
        .expect("hook noop")
        .stats
        .clone();
    let done = stats.ok.load(Ordering::Relaxed) + EVENTS;
    for ctx in contexts {
        let queued = fx.host.emit("bench:noop", ctx);
        debug_assert_eq!(queued.ok(), Some(1));
    }
    while stats.ok.load(Ordering::Relaxed) < done {
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(
        stats.dropped.load(Ordering::Relaxed),
        0,
        "events were dropped"
    );
}

/// 100,000 events through one no-op dylib hook, each with a context built on the spot: emit them
/// all, wait until the worker ran them.
#[divan::bench(sample_count = 15, sample_size = 1)]
fn emit_through_noop_dylib(b: divan::Bencher) {
    b.counter(divan::counter::ItemsCount::new(EVENTS))
        .bench_local(|| emit_all_and_wait((0..EVENTS).map(|_| context())));
}

/// The same, with the 100,000 contexts built before the timed part: what the host costs, without
/// the caller's own cost of building a context per event.
#[divan::bench(sample_count = 15, sample_size = 1)]
fn emit_through_noop_dylib_contexts_prebuilt(b: divan::Bencher) {
    b.counter(divan::counter::ItemsCount::new(EVENTS))
        .with_inputs(|| (0..EVENTS).map(|_| context()).collect::<Vec<_>>())
        .bench_local_values(|contexts| emit_all_and_wait(contexts.into_iter()));
}

/// A handler that does nothing, inline on the worker task: the dispatcher's own ceiling.
struct Inline;

impl hermes_hooks::bench_support::Handler for Inline {
    fn call<'a>(
        &'a mut self,
        calls: Vec<hermes_hooks::bench_support::Call>,
        report: &'a mut hermes_hooks::bench_support::Report<'_>,
    ) -> hermes_hooks::bench_support::BoxFuture<'a, ()> {
        Box::pin(async move {
            for i in 0..calls.len() {
                report(i, Ok(None));
            }
        })
    }
}

/// The same 100,000 events through the dispatcher to an inline no-op handler (no library, no
/// thread hand-off): the ceiling the dispatcher itself puts on any handler kind.
#[divan::bench(sample_count = 15, sample_size = 1)]
fn emit_through_inline_noop_handler(b: divan::Bencher) {
    let fx = &*NOOP;
    let spec = fx
        .host
        .snapshot()
        .get("noop")
        .expect("hook noop")
        .spec
        .clone();
    let hook = hermes_hooks::bench_support::LoadedHook::new(spec);
    {
        let _guard = fx.rt.enter();
        hook.start_worker(Box::new(Inline), None);
    }
    let stats = hook.stats.clone();
    b.counter(divan::counter::ItemsCount::new(EVENTS))
        .bench_local(|| {
            let done = stats.ok.load(Ordering::Relaxed) + EVENTS;
            let event: std::sync::Arc<str> = std::sync::Arc::from("bench:noop");
            for _ in 0..EVENTS {
                hook.enqueue(hermes_hooks::bench_support::Job {
                    event: event.clone(),
                    context: std::sync::Arc::new(context().into()),
                    reply: None,
                    gate: None,
                    queued_for: 0,
                });
            }
            while stats.ok.load(Ordering::Relaxed) < done {
                std::thread::sleep(Duration::from_micros(200));
            }
        });
    hook.close();
}

/// p50/p99 of `emit_collect` for a C hook and the same hook in Python.
fn round_trips() {
    const WARMUP: usize = 500;
    const CALLS: usize = 5_000;
    println!("\nemit_collect round trip, one hook returning {{\"ok\": true}}, {CALLS} calls:");
    println!(
        "{:<8} {:>10} {:>10} {:>10} {:>10}",
        "kind", "p50", "p99", "max", "mean"
    );
    let mut p50s = Vec::new();
    for (kind, fx) in [
        ("dylib", fixture("ok", Some(OK_C), "")),
        (
            "python",
            fixture(
                "ok",
                None,
                "def handle(event, context):\n    return {'ok': True}\n",
            ),
        ),
    ] {
        let mut times: Vec<Duration> = fx.rt.block_on(async {
            let mut times = Vec::with_capacity(CALLS);
            for i in 0..WARMUP + CALLS {
                let start = Instant::now();
                let out = fx
                    .host
                    .emit_collect("bench:collect", context(), Duration::from_secs(10))
                    .await
                    .expect("emit_collect");
                let elapsed = start.elapsed();
                assert_eq!(out[0].result, Ok(Some(json!({"ok": true}))), "{out:?}");
                if i >= WARMUP {
                    times.push(elapsed);
                }
            }
            times
        });
        times.sort();
        let pct = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
        let mean = times.iter().sum::<Duration>() / times.len() as u32;
        println!(
            "{kind:<8} {:>10.1?} {:>10.1?} {:>10.1?} {:>10.1?}",
            pct(0.50),
            pct(0.99),
            times[times.len() - 1],
            mean
        );
        p50s.push(pct(0.50));
        fx.rt.block_on(fx.host.shutdown(Duration::from_secs(5)));
    }
    if let [dylib, python] = p50s[..] {
        println!(
            "python p50 / dylib p50 = {:.1}x",
            python.as_secs_f64() / dylib.as_secs_f64()
        );
    }
}
