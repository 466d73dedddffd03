//! Issue 22: hook work yields the CPU to the gateway. Python workers (forked or started from
//! scratch) and executables run at the service's nice value + 10 under SCHED_IDLE by default;
//! `nice:` / `sched:` in HOOK.yaml and the host's default (`serve --worker-nice`,
//! `--worker-sched`) change it. `serve`'s own runtime threads lower themselves too
//! (`--service-nice`, `--service-sched`), while a hook can still have more than they have.

use std::time::Duration;

use hermes_hooks::Host;
use hermes_hooks::bench_support::own_nice;
use hermes_hooks::priority::{Priority, Sched};
use serde_json::{Value, json};

use crate::util::{Hooks, Serve, collect_one, config, http};

const T: Duration = Duration::from_secs(20);

/// A Python handler answering with its nice value, whether it runs under SCHED_IDLE and its pid.
const REPORT_PY: &str = "import os\n\ndef handle(e, c):\n    return [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0) == os.SCHED_IDLE, os.getpid()]\n";

fn python_hook(hooks: &Hooks, name: &str, event: &str, extra_yaml: &str) {
    hooks.add(
        name,
        &[
            ("HOOK.yaml", &format!("events: [\"{event}\"]\n{extra_yaml}")),
            ("handler.py", REPORT_PY),
        ],
    );
}

fn expect(nice: i32, idle: bool) -> Value {
    json!([(own_nice() + nice).clamp(-20, 19), idle])
}

/// What a [`REPORT_PY`] answer says about its process: its (nice, SCHED_IDLE) while the collect
/// waited for it, and its own priority once the collect was answered (read from /proc). Issue
/// 33: a collect raises the hook's SCHED_IDLE process to the normal class at the service's
/// nice value while it waits, then lowers it again.
fn during_and_after(v: Value) -> (Value, Value) {
    let pid = v[2].as_u64().unwrap_or_else(|| panic!("no pid in {v}"));
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let nice: i32 = fields[19 - 3].parse().unwrap();
    let policy: i32 = fields[41 - 3].parse().unwrap();
    (
        json!([v[0], v[1]]),
        json!([nice, policy == libc::SCHED_IDLE]),
    )
}

/// A collect of a SCHED_IDLE hook runs it at the service's own priority, normal class.
fn raised() -> Value {
    json!([own_nice(), false])
}

#[tokio::test]
async fn python_workers_run_below_the_service_by_default_and_hooks_can_choose() {
    let hooks = Hooks::new();
    python_hook(&hooks, "default", "a:x", "");
    python_hook(&hooks, "nicer", "b:x", "nice: 15\n");
    python_hook(&hooks, "normal", "c:x", "sched: normal\n");
    // Above the fork server's priority: started from scratch, where it can have it.
    python_hook(&hooks, "eager", "d:x", "nice: 2\n");
    let (host, report) = Host::start(config(&hooks)).await;
    assert_eq!(report.loaded.len(), 4, "{report:?}");
    let host = &host;
    let got = |ev: &'static str| async move {
        during_and_after(collect_one(host, ev, json!({})).await.unwrap().unwrap())
    };
    assert_eq!(got("a:x").await, (raised(), expect(10, true)));
    assert_eq!(got("b:x").await, (raised(), expect(15, true)));
    assert_eq!(got("c:x").await, (expect(10, false), expect(10, false)));
    assert_eq!(got("d:x").await, (raised(), expect(2, true)));
    let eager = host.hook("eager").unwrap();
    assert_eq!(
        eager.worker.as_ref().map(|w| w.start.as_str()),
        Some("fresh"),
        "{eager:?}"
    );
    assert!(
        eager.worker.as_ref().unwrap().reason.starts_with(
            "`nice: 2` is below the fork server's nice +10 (serve --worker-nice); a forked \
             process cannot lower its nice value"
        ),
        "{eager:?}"
    );
    // A normal policy is above the fork server's SCHED_IDLE: started from scratch too, and
    // the reason says so in HOOK.yaml's and serve's words (issue 38).
    let normal = host.hook("normal").unwrap();
    assert_eq!(
        normal.worker.as_ref().map(|w| w.start.as_str()),
        Some("fresh"),
        "{normal:?}"
    );
    assert!(
        normal.worker.as_ref().unwrap().reason.starts_with(
            "`sched: normal` asks for normal scheduling and the fork server runs under SCHED_IDLE"
        ),
        "{normal:?}"
    );
    host.shutdown(T).await;
}

/// (nice, SCHED_IDLE) of each thread of `pid`, by thread name.
fn threads(pid: u32) -> Vec<(String, i32, bool)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(entry) = entry else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (head, rest) = stat.rsplit_once(')').unwrap();
        let name = head.split_once('(').unwrap().1.to_string();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state is field 3; nice is field 19, policy field 41 (proc(5)).
        let nice: i32 = fields[19 - 3].parse().unwrap();
        let policy: i32 = fields[41 - 3].parse().unwrap();
        out.push((name, nice, policy == libc::SCHED_IDLE));
    }
    out
}

fn collect_result(serve: &Serve, event: &str) -> Value {
    let body = serde_json::to_vec(&json!({ "event": event })).unwrap();
    let ct = [("Content-Type", "application/json")];
    let (status, _, b) = http(&serve.addr, "POST", "/v1/collect", &ct, &body);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
    let v: Value = serde_json::from_slice(&b).unwrap();
    v["results"][0]["result"].clone()
}

#[test]
fn the_services_runtime_threads_run_idle_and_a_hook_can_still_ask_for_normal() {
    let hooks = Hooks::new();
    python_hook(&hooks, "default", "a:x", "");
    python_hook(&hooks, "normal", "n:x", "sched: normal\nnice: 10\n");
    hooks.exec("sh", "[\"e:x\"]", "#!/bin/sh\ncat >/dev/null\nnice\n");
    let mut serve = Serve::start(&hooks, &[]);
    let base = own_nice();
    let pid = serve.child.id();
    // A new connection (the readiness probes) raises the runtime threads for 250 ms (issue 33):
    // idle again once nothing is pending.
    let all = crate::util::poll(T, "the runtime threads idle again", || {
        let all = threads(pid);
        all.iter()
            .filter(|(name, _, _)| name.starts_with("tokio-r"))
            .all(|(_, _, idle)| *idle)
            .then_some(all)
    });
    let workers: Vec<_> = all
        .iter()
        .filter(|(name, _, _)| name.starts_with("tokio-r"))
        .collect();
    assert!(!workers.is_empty(), "{all:?}");
    for (name, nice, idle) in &workers {
        assert!(*idle, "{name} is not SCHED_IDLE: {all:?}");
        assert_eq!(*nice, (base + 10).clamp(-20, 19), "{name}: {all:?}");
    }
    // The main thread and the spawner keep the service's starting priority...
    let spawner = all.iter().find(|(name, _, _)| name == "hermes-spawner");
    assert_eq!(
        spawner.map(|(_, n, i)| (*n, *i)),
        Some((base, false)),
        "{all:?}"
    );
    // ...so that hooks get what they ask for, whatever the runtime's threads have.
    assert_eq!(
        during_and_after(collect_result(&serve, "a:x")),
        (raised(), expect(10, true))
    );
    assert_eq!(
        during_and_after(collect_result(&serve, "n:x")).1,
        expect(10, false)
    );
    // An executable started for a collect starts raised (a process per event).
    assert_eq!(collect_result(&serve, "e:x"), json!(base));
    serve.terminate();
}

#[test]
fn serve_can_keep_its_threads_at_normal_priority() {
    let hooks = Hooks::new();
    python_hook(&hooks, "default", "a:x", "");
    let mut serve = Serve::start(
        &hooks,
        &[
            "--service-sched",
            "normal",
            "--service-nice",
            "0",
            "--worker-sched",
            "normal",
        ],
    );
    let all = threads(serve.child.id());
    assert!(
        all.iter().all(|(_, n, idle)| !idle && *n == own_nice()),
        "{all:?}"
    );
    assert_eq!(
        during_and_after(collect_result(&serve, "a:x")).0,
        expect(10, false)
    );
    serve.terminate();
}

#[tokio::test]
async fn the_hosts_default_applies_to_executables_and_fresh_workers() {
    let hooks = Hooks::new();
    hooks.exec("sh", "[\"e:x\"]", "#!/bin/sh\ncat >/dev/null\nnice\n");
    // PYTHON* in env: started from scratch, not forked.
    python_hook(&hooks, "fresh", "f:x", "env: {PYTHONHASHSEED: '1'}\n");
    let mut cfg = config(&hooks);
    cfg.worker_priority = Priority {
        nice: 4,
        sched: Sched::Normal,
    };
    let (host, report) = Host::start(cfg).await;
    assert_eq!(report.loaded.len(), 2, "{report:?}");
    assert_eq!(
        collect_one(&host, "e:x", json!({})).await,
        Ok(Some(json!((own_nice() + 4).clamp(-20, 19))))
    );
    let f = collect_one(&host, "f:x", json!({})).await.unwrap().unwrap();
    assert_eq!(during_and_after(f), (expect(4, false), expect(4, false)));
    host.shutdown(T).await;
}

/// Issue 33: a nice-0 busy loop in the service's own session (autogroup: the same scheduling
/// group), pinned to the service's CPU, used to starve the default SCHED_IDLE worker and service
/// threads: a 50 ms deny hook with `timeout: 3` timed out (the deny lost, the worker killed).
/// Now every collect gets its hook's verdict in time, and the worker lives on.
#[test]
fn collects_answer_in_time_with_a_busy_loop_on_the_services_cpu() {
    let hooks = Hooks::new();
    hooks.add(
        "deny",
        &[
            ("HOOK.yaml", "events: [\"command:*\"]\ntimeout: 3\n"),
            (
                "handler.py",
                "import os, time\n\ndef handle(e, c):\n    t = time.process_time()\n    while time.process_time() - t < 0.05:\n        pass\n    return {'decision': 'deny', 'pid': os.getpid()}\n",
            ),
        ],
    );
    let cpu = "1";
    let mut cmd = std::process::Command::new("taskset");
    cmd.args(["-c", cpu, crate::util::bin(), "serve", "--hooks-dir"])
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0"]);
    let mut serve = Serve::spawn(cmd, &hooks);
    // A child of this process like the service: the same session, so the same autogroup.
    let _busy = crate::util::BusyLoop::on_cpu(cpu);
    let mut pids = std::collections::BTreeSet::new();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let started = std::time::Instant::now();
        let body = serde_json::to_vec(&json!({"event": "command:run"})).unwrap();
        let ct = [("Content-Type", "application/json")];
        let (status, _, b) = http(&serve.addr, "POST", "/v1/collect", &ct, &body);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&b));
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["errors"], json!([]), "collect {i}: {v}");
        assert_eq!(
            v["results"][0]["result"]["decision"], "deny",
            "collect {i}: {v}"
        );
        pids.insert(v["results"][0]["result"]["pid"].as_u64());
        slowest = slowest.max(started.elapsed());
    }
    eprintln!("slowest collect under the busy loop: {slowest:?}");
    assert!(slowest < Duration::from_secs(3), "{slowest:?}");
    assert_eq!(pids.len(), 1, "the worker was never killed: {pids:?}");
    serve.terminate();
}

/// Issue 33: a service that may not raise SCHED_IDLE work again (no CAP_SYS_NICE: here run as
/// `nobody`) would leave decisions starving on a busy CPU, so its defaults are the normal class:
/// its hooks run at nice +10, not idle, and it says why. Runs only as root (to become nobody).
///
/// Issue 50 ("the first hour"): this failed from a clone whose parent directory is mode 0700 (a
/// `mktemp -d`, anything under /root): `nobody` could neither run the binary in the checkout's
/// `target/` nor enter the checkout it was started in. The binary is now copied into the test's
/// own world-readable temp dir and the service starts there.
#[testenv::needs(setpriv_root)]
#[test]
fn without_cap_sys_nice_the_defaults_are_the_normal_class() {
    let hooks = Hooks::new();
    python_hook(&hooks, "default", "a:x", "");
    let top = hooks.root().parent().unwrap().to_path_buf();
    // What `nobody` runs and where it starts: inside the temp dir, never inside the checkout.
    let own_bin = top.join("hermes-hooks");
    std::fs::copy(crate::util::bin(), &own_bin).expect("copy the binary under test");
    crate::util::set_mode(&top, 0o755);
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&top)
        .status()
        .expect("chown");
    assert!(chown.success());
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&own_bin)
        .args(["serve", "--hooks-dir"])
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(&top);
    let mut serve = Serve::spawn(cmd, &hooks);
    let (during, after) = during_and_after(collect_result(&serve, "a:x"));
    assert_eq!(during, expect(10, false), "{}", serve.log());
    assert_eq!(after, expect(10, false));
    assert!(serve.log().contains("no CAP_SYS_NICE"), "{}", serve.log());
    serve.terminate();
}

/// (nice, SCHED_IDLE) of process `pid`'s main thread, from /proc.
fn proc_priority(pid: u64) -> Option<(i32, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let nice: i32 = fields[19 - 3].parse().ok()?;
    let policy: i32 = fields[41 - 3].parse().ok()?;
    Some((nice, policy == libc::SCHED_IDLE))
}

/// Starts a collect of `event` on a thread of its own; its answer comes through the handle.
fn collect_in_background(serve: &Serve, event: &str) -> std::thread::JoinHandle<Value> {
    let addr = serve.addr.clone();
    let body = serde_json::to_vec(&json!({ "event": event })).unwrap();
    std::thread::spawn(move || {
        let ct = [("Content-Type", "application/json")];
        let (_, _, b) = http(&addr, "POST", "/v1/collect", &ct, &body);
        serde_json::from_slice(&b).unwrap_or(Value::Null)
    })
}

/// Issue 47, row 3 (a): an executable already running when a collect for its hook arrives
/// stayed SCHED_IDLE (exec never registered its processes with the hook's boost), so on a busy
/// CPU the running event, and the decision behind it, waited for idle time. It is now raised
/// while the collect waits, and lowered again after.
#[test]
fn a_running_executable_is_raised_while_a_collect_waits() {
    let hooks = Hooks::new();
    let out = hooks.out();
    let script = format!(
        "#!/bin/sh\ncat >/dev/null\necho $$ > {out}/pid\nwhile [ ! -e {out}/go ]; do sleep 0.02; done\necho '{{\"decision\": \"deny\"}}'\n",
        out = out.display()
    );
    hooks.exec("slow", r#"["agent:step", "command:run"]"#, &script);
    let serve = Serve::start(&hooks, &[]);
    let (s, _) = serve.post("/v1/events", &json!({"event": "agent:step"}));
    assert_eq!(s, 202);
    let pid: u64 = crate::util::poll(T, "the running handler", || {
        std::fs::read_to_string(out.join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    assert_eq!(proc_priority(pid), Some(((own_nice() + 10).min(19), true)));
    let waiting = collect_in_background(&serve, "command:run");
    crate::util::poll(T, "the running handler raised", || {
        (proc_priority(pid) == Some((own_nice(), false))).then_some(())
    });
    std::fs::write(out.join("go"), "").unwrap();
    let v = waiting.join().unwrap();
    assert_eq!(v["results"][0]["result"]["decision"], "deny", "{v}");
}

/// Issue 47, row 3 (b): a Python worker restarted while a collect waits lowered itself to
/// SCHED_IDLE right after the fork server forked it, racing the service that raised it: its
/// import and the decision ran idle. It now starts raised and the service lowers it only
/// after: hook code (the import, the call) runs raised.
#[test]
fn a_worker_restarted_for_a_collect_runs_its_import_raised() {
    let hooks = Hooks::new();
    let code = "import os\n\nAT_IMPORT = [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0) == os.SCHED_IDLE]\n\ndef handle(e, c):\n    if e == 'agent:crash':\n        os._exit(3)\n    return {'import': AT_IMPORT, 'call': [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0) == os.SCHED_IDLE]}\n";
    hooks.python("guard", r#"["agent:crash", "command:run"]"#, code);
    // The service and a busy loop on one CPU, in one session (autogroup): the forked worker
    // gets the CPU late, after the service raised it, as on a busy machine.
    let cpu = "1";
    let mut cmd = std::process::Command::new("taskset");
    cmd.args(["-c", cpu, crate::util::bin(), "serve", "--hooks-dir"])
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0"]);
    let serve = Serve::spawn(cmd, &hooks);
    let _busy = crate::util::BusyLoop::on_cpu(cpu);
    for round in 0..3 {
        let (s, _) = serve.post("/v1/events", &json!({"event": "agent:crash"}));
        assert_eq!(s, 202);
        crate::util::poll(T, "the crash", || {
            let (_, v) = serve.get("/v1/hooks/guard");
            (v["counters"]["failed"].as_u64() == Some(round + 1)).then_some(())
        });
        let got = collect_result(&serve, "command:run");
        assert_eq!(
            got,
            json!({"import": raised(), "call": raised()}),
            "round {round}"
        );
    }
}

/// Issue 47, row 3 (c): a collect that arrives while its hook's old version runs and is then
/// answered by the version a reload loaded (handler.py edited meanwhile) boosted only the old
/// version's process: the new one ran the decision SCHED_IDLE. The boost cell is now shared by
/// the versions of a hook.
#[test]
fn a_collect_waiting_across_a_reload_raises_the_new_version() {
    let hooks = Hooks::new();
    let out = hooks.out();
    let code = |tag: &str| {
        format!(
            "import os, time\n\ndef handle(e, c):\n    if e == 'agent:slow':\n        open({go:?} + '.started', 'w').close()\n        while not os.path.exists({go:?}):\n            time.sleep(0.02)\n        return None\n    return {{'version': '{tag}', 'call': [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0) == os.SCHED_IDLE]}}\n",
            go = out.join("go").display().to_string()
        )
    };
    let dir = hooks.python("guard", r#"["agent:slow", "command:run"]"#, &code("old"));
    let serve = Serve::start(&hooks, &[]);
    let (s, _) = serve.post("/v1/events", &json!({"event": "agent:slow"}));
    assert_eq!(s, 202);
    crate::util::poll(T, "the old version's slow call", || {
        out.join("go.started").exists().then_some(())
    });
    let waiting = collect_in_background(&serve, "command:run");
    crate::util::poll(T, "the collect queued", || {
        let (_, v) = serve.get("/v1/hooks/guard");
        (v["queue"]["depth"].as_u64() == Some(1)).then_some(())
    });
    std::fs::write(dir.join("handler.py"), code("new")).unwrap();
    let (s, v) = serve.post("/v1/reload", &json!({}));
    assert!(s < 300, "{s} {v}");
    std::fs::write(out.join("go"), "").unwrap();
    let v = waiting.join().unwrap();
    assert_eq!(
        v["results"][0]["result"],
        json!({"version": "new", "call": raised()}),
        "{v}"
    );
}

/// Whether process `pid` has a thread named `name` (as /proc shows it: at most 15 bytes).
fn has_thread(pid: u32, name: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(Result::ok).any(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
        })
        .unwrap_or(false)
}

/// Issue 47, row 6: the thread that raises the service for a new connection (issue 33) was
/// missing in 7 of 10 TCP starts and 1 of 10 socket starts: the listener came up before any
/// runtime thread had lowered itself, and the watch silently decided it was not needed. It is
/// now there every time.
#[test]
fn the_connection_watch_starts_every_time() {
    let hooks = Hooks::new();
    let mut missing = Vec::new();
    for i in 0..20 {
        let tcp = i % 2 == 0;
        let serve = if tcp {
            Serve::start(&hooks, &[])
        } else {
            let mut cmd = std::process::Command::new(crate::util::bin());
            cmd.arg("serve").arg("--hooks-dir").arg(hooks.root());
            let child = {
                cmd.env("HERMES_HOME", hooks.home())
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
                cmd.spawn().unwrap()
            };
            let sock = hooks.home().join("hooks.sock");
            crate::util::poll(T, "the socket", || sock.exists().then_some(()));
            let pid = child.id();
            let found = (0..100).any(|_| {
                std::thread::sleep(Duration::from_millis(20));
                has_thread(pid, "hermes-accept-w")
            });
            if !found {
                missing.push(format!("socket start {i}"));
            }
            let mut child = child;
            crate::util::signal(pid, libc::SIGTERM);
            let _ = child.wait();
            continue;
        };
        let pid = serve.child.id();
        let found = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            has_thread(pid, "hermes-accept-w")
        });
        if !found {
            missing.push(format!("TCP start {i}"));
        }
    }
    assert!(missing.is_empty(), "no connection watch in: {missing:?}");
}
