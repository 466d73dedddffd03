//! Issue 12: Python workers forked from a per-interpreter fork server, and pipelined calls.
//!
//! Tests that kill the fork server, or change how the host forks, run the real binary (its own
//! fork servers); the others share this test process's fork server, as hosts in one process do.

use std::process::Command;
use std::time::{Duration, Instant};

use hermes_hooks::Host;
use hermes_hooks::bench_support::zygote_pid;
use serde_json::{Value, json};

use crate::util::{Hooks, Serve, bin, collect_one as one, config, poll, poll_async};

const T: Duration = Duration::from_secs(20);

/// A handler answering `[pid, ppid, calls so far]`.
const WHO: &str = "import os\ncount = 0\ndef handle(e, c):\n    global count\n    count += 1\n    return [os.getpid(), os.getppid(), count]\n";

fn pids(v: &Result<Option<Value>, String>) -> (u64, u64, u64) {
    let a = v.as_ref().expect("a result").as_ref().expect("a value");
    (
        a[0].as_u64().unwrap(),
        a[1].as_u64().unwrap(),
        a[2].as_u64().unwrap(),
    )
}

/// True while a process with this pid exists (a zombie counts: it was not reaped).
fn exists(pid: u64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn workers_are_forked_and_keep_module_state() {
    let hooks = Hooks::new();
    hooks.python("who", "[command:x]", WHO);
    let (host, _) = Host::start(config(&hooks)).await;
    let first = pids(&one(&host, "command:x", json!({})).await);
    let zygote = zygote_pid("python3").expect("a fork server for python3 runs");
    assert_eq!(
        first.1, zygote as u64,
        "the worker's parent is the fork server"
    );
    assert_ne!(first.1, std::process::id() as u64);
    for n in 2..=4 {
        let again = pids(&one(&host, "command:x", json!({})).await);
        assert_eq!(
            (again.0, again.2),
            (first.0, n),
            "same process, module state kept"
        );
    }
    let info = host.hook("who").unwrap();
    let worker = info
        .worker
        .expect("python hooks say how their worker started");
    assert_eq!(worker.start, "forked", "{}", worker.reason);
    host.shutdown(T).await;
}

#[tokio::test]
async fn startup_env_gets_a_fresh_process_and_list_says_why() {
    let hooks = Hooks::new();
    let lib = hooks.tmp.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("helper_mod_i12.py"), "VALUE = 'from PYTHONPATH'\n").unwrap();
    hooks.add(
        "own-path",
        &[
            (
                "HOOK.yaml",
                &format!("events: [command:x]\nenv: {{PYTHONPATH: {:?}}}\n", lib.display().to_string()),
            ),
            (
                "handler.py",
                "import os, helper_mod_i12\ndef handle(e, c):\n    return [os.getppid(), helper_mod_i12.VALUE]\n",
            ),
        ],
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let got = one(&host, "command:x", json!({})).await.unwrap().unwrap();
    assert_eq!(got[1], json!("from PYTHONPATH"), "PYTHONPATH was honoured");
    assert_eq!(
        got[0].as_u64(),
        Some(std::process::id() as u64),
        "a fresh worker is the host's own child, not a fork of the fork server"
    );
    let worker = host.hook("own-path").unwrap().worker.unwrap();
    assert_eq!(worker.start, "fresh");
    assert!(worker.reason.contains("PYTHONPATH"), "{}", worker.reason);
    host.shutdown(T).await;

    // `list` says it too.
    let out = Command::new(bin())
        .args(["list", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("worker: fresh (env sets PYTHONPATH"),
        "list shows the fresh start and why:\n{text}"
    );
}

#[tokio::test]
async fn timeout_kills_only_that_hook() {
    let hooks = Hooks::new();
    hooks.python("steady", "[command:steady]", WHO);
    hooks.add(
        "slow",
        &[
            ("HOOK.yaml", "events: [command:slow]\ntimeout: 0.5\n"),
            ("handler.py", "import os, time\ndef handle(e, c):\n    if c.get('hang'):\n        time.sleep(60)\n    return os.getpid()\n"),
        ],
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let steady = pids(&one(&host, "command:steady", json!({})).await);
    let slow_pid = one(&host, "command:slow", json!({}))
        .await
        .unwrap()
        .unwrap();
    let zygote = zygote_pid("python3").unwrap();
    let err = one(&host, "command:slow", json!({"hang": true}))
        .await
        .unwrap_err();
    assert!(err.contains("timed out"), "{err}");
    let after = pids(&one(&host, "command:steady", json!({})).await);
    assert_eq!(
        (after.0, after.2),
        (steady.0, steady.2 + 1),
        "the other hook's worker and its state are untouched"
    );
    assert!(
        exists(zygote as u64),
        "the fork server survives a worker's kill"
    );
    let new_slow = one(&host, "command:slow", json!({}))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(new_slow, slow_pid, "the timed-out worker was replaced");
    let slow_pid = slow_pid.as_u64().unwrap();
    poll_async(T, "the killed worker to be reaped", || {
        (!exists(slow_pid)).then_some(())
    })
    .await;
    assert_eq!(host.hook("slow").unwrap().worker.unwrap().start, "forked");
    host.shutdown(T).await;
}

#[tokio::test]
async fn crash_restarts_a_forked_worker_after_the_backoff() {
    let hooks = Hooks::new();
    hooks.python(
        "fragile",
        "[command:x]",
        "import os\ndef handle(e, c):\n    if c.get('exit'):\n        os._exit(3)\n    return os.getpid()\n",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let before = one(&host, "command:x", json!({})).await.unwrap().unwrap();
    let err = one(&host, "command:x", json!({"exit": true}))
        .await
        .unwrap_err();
    assert!(
        err.contains("exit code 3"),
        "the fork server reported the status: {err}"
    );
    let crashed_at = Instant::now();
    let after = one(&host, "command:x", json!({})).await.unwrap().unwrap();
    assert!(
        crashed_at.elapsed() >= Duration::from_millis(90),
        "the restart waited for the 100 ms backoff ({:?})",
        crashed_at.elapsed()
    );
    assert_ne!(before, after);
    let info = host.hook("fragile").unwrap();
    assert_eq!(info.counters.restarts, 1);
    assert_eq!(info.worker.unwrap().start, "forked");
    host.shutdown(T).await;
}

#[tokio::test]
async fn pipelined_calls_keep_their_order_under_load() {
    let hooks = Hooks::new();
    hooks.add(
        "order",
        &[
            ("HOOK.yaml", "events: ['command:*']\nqueue: {capacity: 10000}\n"),
            (
                "handler.py",
                "seen = []\nasync def handle(e, c):\n    if e == 'command:done':\n        return [len(seen), seen == list(range(len(seen)))]\n    seen.append(c['n'])\n",
            ),
        ],
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let n = 5000;
    for i in 0..n {
        assert_eq!(host.emit("command:n", json!({"n": i})).unwrap(), 1);
    }
    let got = one(&host, "command:done", json!({})).await;
    assert_eq!(
        got,
        Ok(Some(json!([n, true]))),
        "every event once, in emit order"
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn the_timeout_of_a_pipelined_call_counts_from_the_previous_answer() {
    let hooks = Hooks::new();
    hooks.add(
        "paced",
        &[
            ("HOOK.yaml", "events: ['command:*']\ntimeout: 0.8\n"),
            (
                "handler.py",
                "import time\ndef handle(e, c):\n    time.sleep(0.3)\n",
            ),
        ],
    );
    let (host, _) = Host::start(config(&hooks)).await;
    // Six calls of 0.3 s sent together take 1.8 s, more than the 0.8 s timeout of any one.
    for i in 0..6 {
        host.emit("command:n", json!({"n": i})).unwrap();
    }
    let info = poll_async(T, "six outcomes", || {
        let info = host.hook("paced").unwrap();
        (info.counters.ok + info.counters.failed == 6).then_some(info)
    })
    .await;
    assert_eq!(
        (info.counters.ok, info.counters.timeouts),
        (6, 0),
        "each call had its own 0.8 s from the answer before it"
    );
    host.shutdown(T).await;
}

/// Events `0..30` to a hook that records each one to a file and misbehaves on event 5 with
/// `misbehave`; returns the recorded sequence once every event has an outcome.
async fn pipeline_with_failure(
    misbehave: &str,
    yaml_extra: &str,
) -> (Vec<u64>, hermes_hooks::HookInfo) {
    let hooks = Hooks::new();
    let out = hooks.out().join("seen.txt");
    hooks.add(
        "once",
        &[
            (
                "HOOK.yaml",
                &format!("events: ['command:*']\nqueue: {{capacity: 1000}}\n{yaml_extra}"),
            ),
            (
                "handler.py",
                &format!(
                    "import os, time\ndef handle(e, c):\n    with open({out:?}, 'a') as f:\n        f.write('%d\\n' % c['n'])\n    if c['n'] == 5:\n        {misbehave}\n",
                    out = out.display().to_string()
                ),
            ),
        ],
    );
    let (host, _) = Host::start(config(&hooks)).await;
    for i in 0..30 {
        host.emit("command:n", json!({"n": i})).unwrap();
    }
    let info = poll_async(T, "an outcome for every event", || {
        let info = host.hook("once").unwrap();
        (info.counters.ok + info.counters.failed == 30).then_some(info)
    })
    .await;
    host.shutdown(T).await;
    let seen = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    (seen, info)
}

#[tokio::test]
async fn a_crash_inside_a_pipeline_runs_every_event_at_most_once() {
    let (seen, info) = pipeline_with_failure("os._exit(1)", "").await;
    assert_eq!(
        seen,
        (0..30).collect::<Vec<u64>>(),
        "each event ran once, in order"
    );
    assert_eq!((info.counters.ok, info.counters.failed), (29, 1));
    assert_eq!(info.counters.restarts, 1);
}

#[tokio::test]
async fn a_timeout_inside_a_pipeline_runs_every_event_at_most_once() {
    let (seen, info) = pipeline_with_failure("time.sleep(60)", "timeout: 0.5\n").await;
    assert_eq!(
        seen,
        (0..30).collect::<Vec<u64>>(),
        "each event ran once, in order"
    );
    assert_eq!((info.counters.ok, info.counters.failed), (29, 1));
    assert_eq!(info.counters.timeouts, 1);
}

/// `[pid, ppid]` of hook `event`'s worker, through the service.
fn who(serve: &Serve, event: &str) -> (u64, u64) {
    let (status, body) = serve.post("/v1/collect", &json!({"event": event, "timeout_ms": 15000}));
    assert_eq!(status, 200, "{body}");
    let r = &body["results"][0]["result"];
    (
        r[0].as_u64().unwrap_or_else(|| panic!("a pid in {body}")),
        r[1].as_u64().unwrap(),
    )
}

#[test]
fn killing_the_fork_server_spares_running_workers_and_new_hooks_still_load() {
    let hooks = Hooks::new();
    hooks.python("first", "[command:first]", WHO);
    let serve = Serve::start(&hooks, &[]);
    let (worker, zygote) = who(&serve, "command:first");
    assert_ne!(zygote, serve.child.id() as u64, "the worker was forked");
    crate::util::signal(zygote as u32, libc::SIGKILL);
    poll(T, "the fork server to be gone", || {
        (!exists(zygote)).then_some(())
    });
    assert_eq!(
        who(&serve, "command:first").0,
        worker,
        "the worker outlived its fork server"
    );
    hooks.python("second", "[command:second]", WHO);
    let (status, _) = serve.post("/v1/reload", &json!({}));
    assert_eq!(status, 200);
    let (_, new_zygote) = who(&serve, "command:second");
    assert_ne!(new_zygote, zygote, "a new fork server started");
    assert_ne!(
        new_zygote,
        serve.child.id() as u64,
        "and the new hook was forked from it"
    );
    let (_, hooks_json) = serve.get("/v1/hooks/second");
    assert_eq!(hooks_json["worker"]["start"], "forked", "{hooks_json}");
}

#[test]
fn no_process_is_left_after_shutdown() {
    let hooks = Hooks::new();
    for name in ["a", "b", "c"] {
        hooks.python(name, &format!("[command:{name}]"), WHO);
    }
    let mut serve = Serve::start(&hooks, &[]);
    let mut pids = Vec::new();
    for name in ["a", "b", "c"] {
        let (pid, ppid) = who(&serve, &format!("command:{name}"));
        pids.push(pid);
        pids.push(ppid);
    }
    assert_eq!(serve.terminate(), Some(0));
    for pid in pids {
        poll(T, &format!("process {pid} to be gone and reaped"), || {
            (!exists(pid)).then_some(())
        });
    }
}

#[test]
fn forking_can_be_turned_off() {
    let hooks = Hooks::new();
    hooks.python("who", "[command:x]", WHO);
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0"])
        .env("HERMES_HOOKS_FORK", "0");
    let serve = Serve::spawn(cmd, &hooks);
    let (_, ppid) = who(&serve, "command:x");
    assert_eq!(
        ppid,
        serve.child.id() as u64,
        "started from scratch by the host"
    );
    let (_, h) = serve.get("/v1/hooks/who");
    assert_eq!(h["worker"]["start"], "fresh", "{h}");
    assert!(
        h["worker"]["reason"]
            .as_str()
            .unwrap()
            .contains("HERMES_HOOKS_FORK"),
        "{h}"
    );
}

/// The command lines of the children of `pid`; an empty one is a zombie's (exited, not reaped).
fn children_of(pid: u32) -> Vec<String> {
    crate::util::child_pids(pid)
        .into_iter()
        .map(|kid| {
            let cmd = std::fs::read(format!("/proc/{kid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).replace('\0', " ")
        })
        .collect()
}

#[test]
fn the_fork_server_started_ahead_stops_when_no_hook_uses_it() {
    // Issue 37: the service starts its default interpreter's fork server as it starts; with no
    // Python hook it is stopped (and reaped) once the first load is over.
    let hooks = Hooks::new();
    hooks.exec("only-exec", "[command:x]", "#!/bin/sh\necho null\n");
    let serve = Serve::start(&hooks, &[]);
    let service = serve.child.id();
    poll(T, "no fork server left under the service", || {
        children_of(service)
            .iter()
            .all(|cmd| !cmd.is_empty() && !cmd.contains("--zygote"))
            .then_some(())
    });
}

#[test]
fn many_python_hooks_start_without_a_thread_each() {
    // Issue 37: starting 50 hooks at once grew the blocking pool to ~135 threads (each keeping
    // its own allocator pages: 47 MB of the service's memory); the pool is bounded now.
    let hooks = Hooks::new();
    for i in 0..30 {
        hooks.python(
            &format!("h{i:02}"),
            "[command:x]",
            "def handle(e, c):\n    return None\n",
        );
    }
    let serve = Serve::start(&hooks, &[]);
    let (_, h) = serve.get("/v1/hooks/h29");
    assert_eq!(h["worker"]["start"], "forked", "{h}");
    // The runtime's workers (one per core), the blocking pool's 8, and a dozen of its own. Each
    // hook's starter thread (its file checks, issue 47) ends when idle: soon after the start.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let count = || {
        std::fs::read_dir(format!("/proc/{}/task", serve.child.id()))
            .unwrap()
            .count()
    };
    let settled = std::time::Instant::now() + Duration::from_secs(10);
    while count() > cores + 8 + 12 && std::time::Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(100));
    }
    let threads = count();
    assert!(
        threads <= cores + 8 + 12,
        "{threads} threads in the service 10 s after starting 30 Python hooks ({cores} cores)"
    );
}
