//! The executable handler kind: one process per event, JSON in, optional JSON out.

use std::time::{Duration, Instant};

use hermes_hooks::Host;
use serde_json::{Value, json};

use crate::util::{Hooks, collect_one as one, config, poll_async};

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn gets_the_json_payload_and_its_stdout_reaches_collect() {
    let hooks = Hooks::new();
    let seen = hooks.out().join("stdin.json");
    hooks.exec(
        "echo",
        "[\"command:*\"]",
        &format!(
            "#!/bin/sh\ncat > {}\necho '{{\"decision\": \"allow\"}}'\n",
            seen.display()
        ),
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let r = one(&host, "command:reset", json!({"user_id": "7"})).await;
    assert_eq!(r, Ok(Some(json!({"decision": "allow"}))));
    let payload: Value = serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
    assert_eq!(
        payload,
        json!({"hook_event_name": "command:reset", "event": "command:reset", "context": {"user_id": "7"}, "hook": "echo"})
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn empty_stdout_is_no_result_and_nonzero_exit_is_an_error() {
    let hooks = Hooks::new();
    hooks.exec("quiet", "[command:x]", "#!/bin/sh\ncat >/dev/null\n");
    hooks.exec(
        "failing",
        "[command:y]",
        "#!/bin/sh\necho 'something broke' >&2\nexit 4\n",
    );
    hooks.exec("garbage", "[command:z]", "#!/bin/sh\necho not json\n");
    let (host, _) = Host::start(config(&hooks)).await;
    assert_eq!(one(&host, "command:x", json!({})).await, Ok(None));
    let err = one(&host, "command:y", json!({})).await.unwrap_err();
    assert!(
        err.contains("exit code 4") && err.contains("something broke"),
        "{err}"
    );
    let err = one(&host, "command:z", json!({})).await.unwrap_err();
    assert!(err.contains("not one JSON value"), "{err}");
    host.shutdown(T).await;
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let hooks = Hooks::new();
    let pidfile = hooks.out().join("child.pid");
    let dir = hooks.exec(
        "sleepy",
        "[command:x]",
        &format!(
            "#!/bin/sh\nsleep 60 &\necho $! > {}\nwait\n",
            pidfile.display()
        ),
    );
    std::fs::write(
        dir.join("HOOK.yaml"),
        "name: sleepy\nevents: [command:x]\ntimeout: 0.5\n",
    )
    .unwrap();
    let (host, _) = Host::start(config(&hooks)).await;
    let t0 = Instant::now();
    let err = one(&host, "command:x", json!({})).await.unwrap_err();
    assert!(err.contains("timed out"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    poll_async(T, "the grandchild to be killed", || {
        // The grandchild may linger as a zombie until its reaper runs; a zombie is dead.
        crate::util::is_dead(pid).then_some(())
    })
    .await;
    host.shutdown(T).await;
}

#[tokio::test]
async fn output_beyond_one_mib_is_cut_and_reported() {
    let hooks = Hooks::new();
    hooks.exec(
        "flood",
        "[command:x]",
        "#!/bin/sh\nhead -c 3000000 /dev/zero | tr '\\0' 'a'\nhead -c 3000000 /dev/zero >&2\n",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let err = one(&host, "command:x", json!({})).await.unwrap_err();
    assert!(err.contains("exceeded 1 MiB"), "{err}");
    host.shutdown(T).await;
}

#[test]
fn a_background_child_holding_the_pipes_keeps_the_result_and_logs_and_is_killed() {
    let hooks = Hooks::new();
    let pidfile = hooks.out().join("bg.pid");
    hooks.exec(
        "leaky",
        "[command:x]",
        &format!(
            "#!/bin/sh\necho 'leaky says hello' >&2\necho '{{\"kept\": true}}'\nsleep 60 &\necho $! > {}\n",
            pidfile.display()
        ),
    );
    let serve = crate::util::Serve::start(&hooks, &[]);
    let (status, body) = serve.post("/v1/collect", &json!({"event": "command:x", "context": {}}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["result"],
        json!({"kept": true}),
        "the result printed before the process exited must be kept: {body}"
    );
    crate::util::poll(T, "the handler's stderr line in the service log", || {
        serve.log().contains("leaky says hello").then_some(())
    });
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    crate::util::poll(T, "the background child to be killed", || {
        crate::util::is_dead(pid).then_some(())
    });
}

/// Issue 37: an executable is started without `fork` (`handler/spawn.rs`), and its process still
/// dies with a service that is SIGKILLed mid-event (no shutdown runs, nobody kills its group):
/// the parent-death signal is set in the child before its exec.
#[test]
fn the_process_of_a_service_killed_mid_event_dies_with_it() {
    let hooks = Hooks::new();
    let pidfile = hooks.out().join("slow.pid");
    hooks.exec(
        "slow",
        "[command:x]",
        &format!(
            "#!/bin/sh\necho $$ > {}.tmp\nmv {0}.tmp {0}\nexec sleep 60\n",
            pidfile.display()
        ),
    );
    let mut serve = crate::util::Serve::start(&hooks, &[]);
    let (status, body) = serve.post("/v1/events", &json!({"event": "command:x", "context": {}}));
    assert_eq!(status, 202, "{body}");
    let pid: i32 = crate::util::poll(T, "the handler to start", || {
        std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok()
    });
    assert!(!crate::util::is_dead(pid), "the handler runs");
    crate::util::signal(serve.child.id(), libc::SIGKILL);
    let _ = serve.child.wait();
    crate::util::poll(T, "the handler to die with the service", || {
        crate::util::is_dead(pid).then_some(())
    });
}
