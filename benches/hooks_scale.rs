//! Many hooks on a small machine, before and after, in one run.
//!
//! `cargo bench --bench hooks_scale` (release service; `HOOKS_SCALE_SIZES=1,20` to shorten).
//! 1. N trivial Python hooks (N = 1, 20, 50, 200): time from `serve` start to its "hooks loaded"
//!    line, host RSS, and total PSS of the host and every process under it
//!    (`/proc/PID/smaps_rollup`), with workers started from scratch (`HERMES_HOOKS_FORK=0`, the
//!    "before") and forked from the fork server (the "after").
//! 2. Events/s through one trivial Python hook (sync and async `handle`), one request at a time
//!    (`HERMES_HOOKS_PIPELINE=0`, the "before") and pipelined.
//! 3. Events/s through one no-op executable hook with `concurrency` 1 and 4, a naive
//!    `subprocess.run` loop over the same file, and four such loops in four processes at once
//!    (what the machine gives four parallel starts: the ceiling of `concurrency: 4`), in the
//!    same run.
//! 4. Host RSS before, at the peak of, and after a burst that fills a queue.
//!
//! For an A/B (`benches/ab.py`): `HERMES_HOOKS_BIN` runs another build of the service,
//! `HOOKS_SCALE_ONLY` takes a comma-separated list of parts, `HOOKS_SCALE_DEFAULTS=1` measures
//! only the default settings (forked workers, pipelined calls, sync `handle`),
//! `HOOKS_SCALE_EVENTS` / `HOOKS_SCALE_EXEC_EVENTS` set the event counts of parts 2 and 3, and
//! `HOOKS_SCALE_AB=1` adds one `#ab {json}` line per figure for a script to read.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;

use common::request;

fn hook(root: &Path, name: &str, yaml: &str, file: &str, code: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("HOOK.yaml"), yaml).expect("write");
    std::fs::write(dir.join(file), code).expect("write");
    dir
}

/// `serve` on `root` with extra environment; returns it and the time until its hooks loaded.
fn serve(root: &Path, home: &Path, env: &[(&str, &str)]) -> (common::Service, Duration) {
    for (k, v) in env {
        // SAFETY: the bench is single-threaded here; the variable is read by the child only.
        unsafe { std::env::set_var(k, v) };
    }
    let t0 = Instant::now();
    let service = common::Service::start(root, home);
    let ready = t0.elapsed();
    for (k, _) in env {
        // SAFETY: as above.
        unsafe { std::env::remove_var(k) };
    }
    (service, ready)
}

/// Field `key` (kB) of a /proc file, in bytes.
fn proc_kb(path: &str, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// `pid` and every process under it.
fn tree(pid: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::<u32, Vec<u32>>::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(pp) = ppid {
            parent.entry(pp).or_default().push(p);
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        out.extend(parent.get(&out[i]).cloned().unwrap_or_default());
        i += 1;
    }
    out
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// Waits until hook `name`'s ok + failed counters reach `n`; returns the time it took.
fn wait_done(addr: &str, name: &str, n: u64, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let h = get(addr, &format!("/v1/hooks/{name}"));
        let c = &h["counters"];
        let done = c["ok"].as_u64().unwrap_or(0) + c["failed"].as_u64().unwrap_or(0);
        if done >= n {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "{name}: {done} of {n} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn get(addr: &str, path: &str) -> Value {
    serde_json::from_slice(&request(addr, "GET", path, b"")).unwrap_or(Value::Null)
}

/// Sends `n` events `event` in batches of 1,000 with `ctx` as context.
fn send(addr: &str, event: &str, n: usize, ctx: &Value) {
    let mut left = n;
    while left > 0 {
        let k = left.min(1000);
        let events: Vec<Value> = (0..k)
            .map(|_| json!({"event": event, "context": ctx}))
            .collect();
        let body = serde_json::to_vec(&json!({"events": events})).expect("json");
        let _ = request(addr, "POST", "/v1/events/batch", &body);
        left -= k;
    }
}

/// Whether only the default settings are measured (`HOOKS_SCALE_DEFAULTS=1`).
fn defaults_only() -> bool {
    std::env::var("HOOKS_SCALE_DEFAULTS").is_ok_and(|v| v == "1")
}

/// A count from the environment, else `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// With `HOOKS_SCALE_AB=1`: one figure as a `#ab` line (JSON) for `benches/ab.py`.
fn ab(figure: &str, value: f64) {
    if std::env::var("HOOKS_SCALE_AB").is_ok_and(|v| v == "1") {
        println!("#ab {}", json!({"figure": figure, "value": value}));
    }
}

fn startup_and_memory(sizes: &[usize]) {
    println!("## N trivial Python hooks: ready time, host RSS, total PSS (host + workers)");
    println!(
        "| hooks | mode | ready after start | host RSS | PSS total | PSS per hook | processes |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in sizes {
        let modes = [
            ("fresh (before)", vec![("HERMES_HOOKS_FORK", "0")]),
            ("forked (after)", vec![]),
        ];
        for (mode, env) in modes.into_iter().skip(usize::from(defaults_only())) {
            let tmp = tempfile::tempdir().expect("tempdir");
            let root = tmp.path().join("hooks");
            for i in 0..n {
                hook(
                    &root,
                    &format!("h{i:03}"),
                    "events: [agent:start]\n",
                    "handler.py",
                    "def handle(event, context):\n    return None\n",
                );
            }
            let (service, ready) = serve(&root, tmp.path(), &env);
            // Let the workers settle (imports done, pages touched) before reading memory.
            std::thread::sleep(Duration::from_millis(500));
            let pid = service.child.id();
            let procs = tree(pid);
            let pss: u64 = procs
                .iter()
                .map(|p| proc_kb(&format!("/proc/{p}/smaps_rollup"), "Pss:"))
                .sum();
            let rss = proc_kb(&format!("/proc/{pid}/status"), "VmRSS:");
            println!(
                "| {n} | {mode} | {} ms | {} | {} | {} | {} |",
                ready.as_millis(),
                mb(rss),
                mb(pss),
                mb(pss / n as u64),
                procs.len()
            );
            if env.is_empty() {
                ab(&format!("startup_ms_{n}"), ready.as_secs_f64() * 1e3);
                ab(&format!("pss_mb_per_hook_{n}"), pss as f64 / n as f64 / 1e6);
            }
            drop(service);
        }
    }
}

fn python_throughput() {
    println!("\n## Events/s through one trivial Python hook");
    println!("| handle | one at a time (before) | pipelined (after) | ratio |");
    println!("|---|---|---|---|");
    let n = env_count("HOOKS_SCALE_EVENTS", 100_000);
    let kinds = if defaults_only() { 1 } else { 2 };
    for (what, code) in [
        ("sync", "def handle(event, context):\n    return None\n"),
        (
            "async",
            "async def handle(event, context):\n    return None\n",
        ),
    ]
    .into_iter()
    .take(kinds)
    {
        let mut rates = Vec::new();
        let settings = [vec![("HERMES_HOOKS_PIPELINE", "0")], vec![]];
        for env in settings.into_iter().skip(usize::from(defaults_only())) {
            let tmp = tempfile::tempdir().expect("tempdir");
            let root = tmp.path().join("hooks");
            hook(
                &root,
                "py",
                "events: ['bench:*']\nqueue: {capacity: 1000000}\n",
                "handler.py",
                code,
            );
            let (service, _) = serve(&root, tmp.path(), &env);
            let ctx = json!({"platform": "telegram", "user_id": "42", "session_id": "s1", "message": "hello"});
            send(&service.addr, "bench:warm", 2000, &ctx);
            wait_done(&service.addr, "py", 2000, Duration::from_secs(60));
            let t0 = Instant::now();
            send(&service.addr, "bench:x", n, &ctx);
            wait_done(
                &service.addr,
                "py",
                2000 + n as u64,
                Duration::from_secs(300),
            );
            rates.push(n as f64 / t0.elapsed().as_secs_f64());
        }
        let pipelined = rates[rates.len() - 1];
        ab(&format!("python_events_per_s_{what}"), pipelined);
        if let [one, _] = rates[..] {
            println!(
                "| {what} | {one:.0} | {pipelined:.0} | {:.2}x |",
                pipelined / one
            );
        } else {
            println!("| {what} | - | {pipelined:.0} | - |");
        }
    }
}

fn exec_throughput() {
    println!("\n## Events/s through one no-op executable hook");
    let n = env_count("HOOKS_SCALE_EXEC_EVENTS", 3000);
    let tmp = tempfile::tempdir().expect("tempdir");
    let script = "#!/bin/sh\nexit 0\n";
    let mut results = Vec::new();
    for conc in [1, 4] {
        let root = tmp.path().join(format!("hooks{conc}"));
        let dir = hook(
            &root,
            "noop",
            &format!("events: ['bench:*']\nqueue: {{capacity: 100000}}\nconcurrency: {conc}\n"),
            "handler",
            script,
        );
        set_exec(&dir.join("handler"));
        let (service, _) = serve(&root, tmp.path(), &[]);
        send(&service.addr, "bench:warm", 100, &json!({}));
        wait_done(&service.addr, "noop", 100, Duration::from_secs(60));
        let t0 = Instant::now();
        send(&service.addr, "bench:x", n, &json!({"k": "v"}));
        wait_done(
            &service.addr,
            "noop",
            100 + n as u64,
            Duration::from_secs(300),
        );
        results.push((conc, n as f64 / t0.elapsed().as_secs_f64()));
    }
    // The naive loop: subprocess.run of the same file with the same stdin, one after the other;
    // then four such loops in four processes at once: what this machine gives four processes
    // started in parallel, whoever starts them (the ceiling of `concurrency: 4`).
    let file = tmp.path().join("hooks1/noop/handler");
    let naive = naive_loops(&file, n, 1);
    let parallel = naive_loops(&file, n, 4);
    println!("| runner | events/s | vs naive loop |");
    println!("|---|---|---|");
    println!("| naive `subprocess.run` loop (same file) | {naive:.0} | 1.00x |");
    println!(
        "| four naive loops in four processes | {parallel:.0} | {:.2}x |",
        parallel / naive
    );
    ab("exec_naive_events_per_s", naive);
    ab("exec_parallel4_vs_naive", parallel / naive);
    for (conc, rate) in results {
        ab(&format!("exec_events_per_s_c{conc}"), rate);
        ab(&format!("exec_vs_naive_c{conc}"), rate / naive);
        if conc == 4 {
            ab("exec_c4_vs_parallel4", rate / parallel);
        }
        println!(
            "| hook, `concurrency: {conc}` | {rate:.0} | {:.2}x |",
            rate / naive
        );
    }
}

/// Events/s of `loops` Python processes each running `subprocess.run` of `file` (stdin an
/// event, stdout and stderr piped) `n / loops` times, all started together.
fn naive_loops(file: &Path, n: usize, loops: usize) -> f64 {
    let code = format!(
        "import multiprocessing, subprocess, time\n\
         def run(k):\n    for _ in range(k):\n        subprocess.run([{file:?}], input=b'{{\"event\": \"bench:x\"}}\\n', stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n\
         if __name__ == '__main__':\n    k = {n} // {loops}\n    ps = [multiprocessing.get_context('fork').Process(target=run, args=(k,)) for _ in range({loops})]\n    t0 = time.perf_counter()\n    [p.start() for p in ps]\n    [p.join() for p in ps]\n    print(k * {loops} / (time.perf_counter() - t0))\n",
        file = file.display().to_string()
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(code)
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0.0)
}

fn set_exec(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn memory_after_burst() {
    println!("\n## Host RSS around a burst that fills a queue");
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("hooks");
    // The first event waits for a flag file, so the burst stays queued until the peak is read.
    let flag = tmp.path().join("go");
    hook(
        &root,
        "slow",
        "events: ['bench:*']\nqueue: {capacity: 100000}\n",
        "handler.py",
        &format!(
            "import os, time\ndef handle(event, context):\n    while not os.path.exists({:?}):\n        time.sleep(0.01)\n",
            flag.display().to_string()
        ),
    );
    let (service, _) = serve(&root, tmp.path(), &[]);
    let pid = service.child.id();
    let rss = || proc_kb(&format!("/proc/{pid}/status"), "VmRSS:");
    std::thread::sleep(Duration::from_millis(300));
    let idle = rss();
    let n = 100_000usize;
    let ctx = json!({"message": "x".repeat(1000), "platform": "telegram", "user_id": "42"});
    send(&service.addr, "bench:burst", n, &ctx);
    let peak = rss();
    std::fs::write(&flag, b"").expect("flag");
    wait_done(&service.addr, "slow", n as u64, Duration::from_secs(300));
    // The queue hands its memory back once it has been idle for 100 ms: read RSS after 1 s.
    std::thread::sleep(Duration::from_secs(1));
    let after = rss();
    println!(
        "| idle | right after 100,000 events of ~1 KB were queued | 1 s after the queue drained |"
    );
    println!("|---|---|---|");
    println!("| {} | {} | {} |", mb(idle), mb(peak), mb(after));
}

fn main() {
    let sizes: Vec<usize> = std::env::var("HOOKS_SCALE_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 20, 50, 200]);
    // HOOKS_SCALE_ONLY=startup|python|exec|memory runs one part (or a comma-separated list).
    let only = std::env::var("HOOKS_SCALE_ONLY").unwrap_or_default();
    let part = |name: &str| only.is_empty() || only.split(',').any(|p| p.trim() == name);
    if part("startup") {
        startup_and_memory(&sizes);
    }
    if part("python") {
        python_throughput();
    }
    if part("exec") {
        exec_throughput();
    }
    if part("memory") {
        memory_after_burst();
    }
}
