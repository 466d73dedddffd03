//! The Python handler kind: the persistent worker, its protocol and its recovery.

use std::time::{Duration, Instant};

use hermes_hooks::Host;
use serde_json::json;

use crate::util::{Hooks, collect_one as one, config, poll_async, set_mode};

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn print_cannot_corrupt_the_protocol() {
    let hooks = Hooks::new();
    hooks.python(
        "printer",
        "[command:x]",
        "import os, sys\nprint('at import')\ndef handle(e, c):\n    print('{\"id\": 1, \"ok\": true, \"result\": \"forged\"}')\n    os.write(1, b'raw fd 1 write\\n')\n    sys.stdout.flush()\n    return 'real'\n",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    for _ in 0..3 {
        assert_eq!(
            one(&host, "command:x", json!({})).await,
            Ok(Some(json!("real")))
        );
    }
    host.shutdown(T).await;
}

#[tokio::test]
async fn module_state_persists_between_events() {
    let hooks = Hooks::new();
    hooks.python(
        "counter",
        "[command:x]",
        "count = 0\ndef handle(e, c):\n    global count\n    count += 1\n    return count\n",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    for i in 1..=5 {
        assert_eq!(one(&host, "command:x", json!({})).await, Ok(Some(json!(i))));
    }
    host.shutdown(T).await;
}

#[tokio::test]
async fn create_task_work_and_threads_outlive_the_call() {
    let hooks = Hooks::new();
    let task_out = hooks.out().join("task.txt");
    let thread_out = hooks.out().join("thread.txt");
    hooks.python(
        "bg",
        "[agent:start]",
        &format!(
            "import asyncio, threading, time\n\
             async def later():\n    await asyncio.sleep(0.3)\n    open({task:?}, 'w').write('task done')\n\
             def worker():\n    time.sleep(0.3)\n    open({thread:?}, 'w').write('thread done')\n\
             def handle(e, c):\n    asyncio.get_event_loop().create_task(later())\n    threading.Thread(target=worker).start()\n    return 'returned first'\n",
            task = task_out.display().to_string(),
            thread = thread_out.display().to_string()
        ),
    );
    let (host, _) = Host::start(config(&hooks)).await;
    assert_eq!(
        one(&host, "agent:start", json!({})).await,
        Ok(Some(json!("returned first")))
    );
    assert!(!task_out.exists(), "the call returned before the task ran");
    poll_async(T, "the background task", || {
        std::fs::read_to_string(&task_out).ok()
    })
    .await;
    poll_async(T, "the background thread", || {
        std::fs::read_to_string(&thread_out).ok()
    })
    .await;
    host.shutdown(T).await;
}

#[tokio::test]
async fn os_exit_and_signals_are_recovered() {
    let hooks = Hooks::new();
    hooks.python(
        "fragile",
        "[command:x]",
        "import os, signal\ncount = 0\ndef handle(e, c):\n    global count\n    count += 1\n    if c.get('exit'):\n        os._exit(3)\n    if c.get('kill'):\n        os.kill(os.getpid(), signal.SIGKILL)\n    return count\n",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    assert_eq!(one(&host, "command:x", json!({})).await, Ok(Some(json!(1))));
    let err = one(&host, "command:x", json!({"exit": true}))
        .await
        .unwrap_err();
    assert!(err.contains("exit code 3"), "{err}");
    // Restarted after backoff; the module state was lost (count starts again).
    assert_eq!(one(&host, "command:x", json!({})).await, Ok(Some(json!(1))));
    let err = one(&host, "command:x", json!({"kill": true}))
        .await
        .unwrap_err();
    assert!(err.contains("signal 9"), "{err}");
    assert_eq!(one(&host, "command:x", json!({})).await, Ok(Some(json!(1))));
    let info = host.hook("fragile").unwrap();
    assert_eq!(info.counters.restarts, 2);
    assert_eq!(info.counters.failed, 2);
    host.shutdown(T).await;
}

#[tokio::test]
async fn hang_past_timeout_is_killed_and_replaced() {
    let hooks = Hooks::new();
    hooks.add(
        "hang",
        &[
            ("HOOK.yaml", "events: [command:x]\ntimeout: 0.5\n"),
            ("handler.py", "import time\ndef handle(e, c):\n    if c.get('hang'):\n        time.sleep(60)\n    return 'alive'\n"),
        ],
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let t0 = Instant::now();
    let err = one(&host, "command:x", json!({"hang": true}))
        .await
        .unwrap_err();
    assert!(err.contains("timed out after 500ms"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(
        one(&host, "command:x", json!({})).await,
        Ok(Some(json!("alive")))
    );
    let info = host.hook("hang").unwrap();
    assert_eq!(info.counters.timeouts, 1);
    host.shutdown(T).await;
}

#[tokio::test]
async fn env_and_python_are_honoured() {
    let hooks = Hooks::new();
    // A wrapper interpreter that marks its environment, then runs the real python3.
    let wrapper = hooks.tmp.path().join("mypython");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nexport VIA_WRAPPER=yes\nexec python3 \"$@\"\n",
    )
    .unwrap();
    set_mode(&wrapper, 0o755);
    hooks.add(
        "envy",
        &[
            (
                "HOOK.yaml",
                &format!("events: [command:x]\nenv: {{GREETING: hello, NUM: 3}}\npython: {}\n", wrapper.display()),
            ),
            (
                "handler.py",
                "import os\ndef handle(e, c):\n    return {k: os.environ.get(k) for k in ['GREETING', 'NUM', 'VIA_WRAPPER', 'HERMES_HOOK_NAME', 'HERMES_HOOK_DIR', 'HERMES_HOME']}\n",
            ),
        ],
    );
    let (host, report) = Host::start(config(&hooks)).await;
    assert_eq!(report.loaded, vec!["envy"], "{:?}", report.skipped);
    let v = one(&host, "command:x", json!({})).await.unwrap().unwrap();
    assert_eq!(v["GREETING"], "hello");
    assert_eq!(v["NUM"], "3");
    assert_eq!(v["VIA_WRAPPER"], "yes");
    assert_eq!(v["HERMES_HOOK_NAME"], "envy");
    assert_eq!(
        v["HERMES_HOOK_DIR"],
        hooks.root().join("envy").display().to_string()
    );
    assert_eq!(v["HERMES_HOME"], hooks.home().display().to_string());
    host.shutdown(T).await;
}

#[tokio::test]
async fn missing_interpreter_is_a_load_error() {
    let hooks = Hooks::new();
    hooks.add(
        "nopython",
        &[
            (
                "HOOK.yaml",
                "events: [command:x]\npython: /no/such/python\n",
            ),
            ("handler.py", "def handle(e, c): pass\n"),
        ],
    );
    let (host, report) = Host::start(config(&hooks)).await;
    assert!(report.loaded.is_empty());
    assert!(
        report.skipped[0].reason.contains("/no/such/python"),
        "{}",
        report.skipped[0].reason
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn unserialisable_result_is_an_error_not_a_crash() {
    let hooks = Hooks::new();
    hooks.python(
        "weird",
        "[command:x]",
        "def handle(e, c):\n    return {1, 2} if c.get('set') else 'fine'\n",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let err = one(&host, "command:x", json!({"set": true}))
        .await
        .unwrap_err();
    assert!(err.contains("not JSON serializable"), "{err}");
    assert_eq!(
        one(&host, "command:x", json!({})).await,
        Ok(Some(json!("fine")))
    );
    assert_eq!(host.hook("weird").unwrap().counters.restarts, 0);
    host.shutdown(T).await;
}

// A synchronous hook whose tree never mentions asyncio runs without an event loop (issue 22: a
// loop costs a forked worker ~0.7 MB of private memory). The handlers below reach asyncio through
// `sys.modules` with split names so that their source does not mention it.
const NO_LOOP_MENTION: &str = "import sys\naio = sys.modules['asyn' 'cio']\n\
                               running = getattr(aio.events, '_get_running' '_loop')\n";

#[tokio::test]
async fn a_sync_hook_that_never_mentions_asyncio_runs_without_an_event_loop() {
    let hooks = Hooks::new();
    hooks.python(
        "plain",
        "[command:x]",
        &format!(
            "{NO_LOOP_MENTION}count = 0\ndef handle(e, c):\n    global count\n    count += 1\n    \
             return [count, running() is None]\n"
        ),
    );
    let (host, _) = Host::start(config(&hooks)).await;
    for i in 1..=3 {
        assert_eq!(
            one(&host, "command:x", json!({})).await,
            Ok(Some(json!([i, true])))
        );
    }
    host.shutdown(T).await;
}

#[tokio::test]
async fn a_sync_handle_that_returns_an_awaitable_gets_the_loop_from_then_on() {
    let hooks = Hooks::new();
    hooks.python(
        "late",
        "[command:x]",
        &format!(
            "{NO_LOOP_MENTION}def handle(e, c):\n    if 'n' in c:\n        return aio.sleep(0.01, result=c['n'])\n    \
             return running() is not None\n"
        ),
    );
    let (host, _) = Host::start(config(&hooks)).await;
    assert_eq!(
        one(&host, "command:x", json!({})).await,
        Ok(Some(json!(false)))
    );
    assert_eq!(
        one(&host, "command:x", json!({"n": 1})).await,
        Ok(Some(json!(1)))
    );
    assert_eq!(
        one(&host, "command:x", json!({})).await,
        Ok(Some(json!(true)))
    );
    assert_eq!(
        one(&host, "command:x", json!({"n": 2})).await,
        Ok(Some(json!(2)))
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn a_sync_hook_whose_helper_module_uses_asyncio_is_called_inside_the_loop() {
    let hooks = Hooks::new();
    hooks.add(
        "helped",
        &[
            ("HOOK.yaml", "name: helped\nevents: [command:x]\n"),
            (
                "handler.py",
                "import helper\ndef handle(e, c):\n    return helper.loop_is_running()\n",
            ),
            (
                "helper.py",
                "import asyncio\ndef loop_is_running():\n    asyncio.get_running_loop()\n    return True\n",
            ),
        ],
    );
    let (host, _) = Host::start(config(&hooks)).await;
    assert_eq!(
        one(&host, "command:x", json!({})).await,
        Ok(Some(json!(true)))
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn a_future_a_sync_handle_returns_is_awaited_on_the_loop_it_belongs_to() {
    let hooks = Hooks::new();
    // `Future()` outside a loop makes the policy's loop current and binds the future to it: the
    // worker must continue on that loop, not a new one.
    hooks.python(
        "fut",
        "[command:x]",
        &format!(
            "{NO_LOOP_MENTION}def handle(e, c):\n    fut = aio.Future()\n    \
             fut.get_loop().call_soon(fut.set_result, c['n'])\n    return fut\n"
        ),
    );
    let (host, _) = Host::start(config(&hooks)).await;
    for n in 1..=2 {
        assert_eq!(
            one(&host, "command:x", json!({"n": n})).await,
            Ok(Some(json!(n)))
        );
    }
    host.shutdown(T).await;
}

/// The runner reads a request line with the C scanner directly (`parse_request`) and leaves
/// everything else to `json.loads`: for any line, both give the same value or the same error.
#[test]
fn the_runners_request_parser_agrees_with_json_loads() {
    let runner = concat!(env!("CARGO_MANIFEST_DIR"), "/src/handler/python/runner.py");
    let script = r#"
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("hh_runner", sys.argv[1])
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)
lines = [b'{"id":1,"event":"a:b","context":{"k":"v","n":[1,2.5,null,true]}}',
         b'{"id": 2, "event": "a:b", "context": {}}', b' {"id":3}', b'{"id":4} ', b'{"id":5}x',
         b'{"a":1}{"b":2}', b'\xff{}', b'"\xed\xa0\x80"', b'"\\ud800"', b'NaN', b'[1,2]', b'',
         b'"caf\xc3\xa9 \xf0\x9f\x98\x80"', b'{"id":6,"context":{"t":"\\u00e9\\ud83d\\ude00"}}',
         b'[' * 100000, b'{"id":7,', b'12', b'{"id":8,"event":"x","context":{"a":1e400}}']
def outcome(f, line):
    try:
        return ("ok", repr(f(line)))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc)[:200])
for line in lines:
    got, want = outcome(runner.parse_request, line), outcome(json.loads, line)
    assert got == want, (line[:80], got, want)
print("agreed on", len(lines), "lines")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, runner])
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("agreed on 18 lines"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Calls written behind a worker's unanswered ones (the window refilled from the queue) run in
/// the order they were emitted, each once; when the worker dies on one of them, the calls
/// written behind it were never started: they go back to the queue and run, once, on the next
/// worker.
#[tokio::test]
async fn a_refilled_window_keeps_order_and_a_crash_inside_it_loses_nothing() {
    let hooks = Hooks::new();
    let out = hooks.out().join("ran.txt");
    let marker = hooks.out().join("crashed");
    hooks.python(
        "window",
        "[job:run]",
        &format!(
            "import os, time\n\
             def handle(e, c):\n    n = c['n']\n    with open({out:?}, 'a') as f:\n        f.write('%d\\n' % n)\n    if n == 0:\n        time.sleep(0.3)\n    if n == 600 and not os.path.exists({marker:?}):\n        open({marker:?}, 'w').close()\n        os._exit(3)\n",
            out = out.display().to_string(),
            marker = marker.display().to_string()
        ),
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let total = 900u64;
    for n in 0..total {
        host.emit("job:run", json!({"n": n})).unwrap();
    }
    let tally = poll_async(T, "every event settled", || {
        let t = *host.accounts().get("window")?;
        (t.ok + t.failed + t.dropped == total).then_some(t)
    })
    .await;
    assert_eq!(
        (tally.ok, tally.failed, tally.dropped),
        (total - 1, 1, 0),
        "{tally:?}"
    );
    let ran: Vec<u64> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(ran, (0..total).collect::<Vec<_>>(), "in order, each once");
    host.shutdown(T).await;
}
