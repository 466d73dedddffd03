//! In-process cost of `Host::emit` with 10 matching hooks (divan).
//!
//! `cargo bench --bench emit`. The hooks are real Python workers; their queues are large enough
//! that no event is dropped during the run, so this measures the path the gateway pays for:
//! validate, load the snapshot, match 10 pattern sets, push 10 jobs.

use std::sync::LazyLock;
use std::time::Duration;

use hermes_hooks::{Host, HostConfig};
use serde_json::{Value, json};

struct Fixture {
    host: Host,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn fixture(matching: usize, total: usize) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("hooks");
    for i in 0..total {
        let hook = root.join(format!("hook{i:02}"));
        std::fs::create_dir_all(&hook).expect("mkdir");
        let event = if i < matching {
            "agent:start"
        } else {
            "session:end"
        };
        std::fs::write(
            hook.join("HOOK.yaml"),
            format!("events: [{event}, \"command:*\"]\nqueue: {{capacity: 1000000}}\n"),
        )
        .expect("write");
        std::fs::write(hook.join("handler.py"), "def handle(e, c):\n    pass\n").expect("write");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config = HostConfig {
        roots: vec![root],
        hermes_home: dir.path().to_path_buf(),
        python: "python3".into(),
        runtime_dir: dir.path().join("cache"),
        trust: Default::default(),
        gateway_hooks_only: false,
        worker_priority: Default::default(),
        sandbox_default: Default::default(),
        config_hooks: true,
    };
    let (host, report) = rt.block_on(Host::start(config));
    assert_eq!(report.loaded.len(), total, "{:?}", report.skipped);
    Fixture {
        host,
        _rt: rt,
        _dir: dir,
    }
}

static TEN: LazyLock<Fixture> = LazyLock::new(|| fixture(10, 10));
static TEN_OF_FIFTY: LazyLock<Fixture> = LazyLock::new(|| fixture(10, 50));

fn context() -> Value {
    json!({"platform": "telegram", "user_id": "42", "chat_id": "c", "session_id": "s", "message": "hello"})
}

fn main() {
    divan::main();
}

/// 10 hooks, all matching `agent:start`.
#[divan::bench(sample_count = 200, sample_size = 200)]
fn emit_10_matching(b: divan::Bencher) {
    let host = &TEN.host;
    b.with_inputs(context)
        .bench_local_values(|ctx| host.emit("agent:start", ctx));
}

/// 50 hooks loaded, 10 matching: the cost of patterns that do not match.
#[divan::bench(sample_count = 200, sample_size = 200)]
fn emit_10_matching_of_50(b: divan::Bencher) {
    let host = &TEN_OF_FIFTY.host;
    b.with_inputs(context)
        .bench_local_values(|ctx| host.emit("agent:start", ctx));
}

/// No hook matches: the floor.
#[divan::bench(sample_count = 200, sample_size = 200)]
fn emit_0_matching(b: divan::Bencher) {
    let host = &TEN.host;
    b.with_inputs(context)
        .bench_local_values(|ctx| host.emit("reaction:added", ctx));
    std::thread::sleep(Duration::from_millis(1));
}
