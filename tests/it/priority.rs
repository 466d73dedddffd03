//! Issue 22: hook work yields the CPU to the gateway. Python workers (forked or started from
//! scratch) and executables run at the service's nice value + 10 by default; `nice:` / `sched:`
//! in HOOK.yaml and the host's default (`serve --worker-nice`, `--worker-sched`) change it.

use std::time::Duration;

use hermes_hooks::Host;
use hermes_hooks::priority::{Priority, Sched, own_nice};
use serde_json::{Value, json};

use crate::util::{Hooks, collect_one, config};

const T: Duration = Duration::from_secs(20);

/// A Python handler answering with its nice value and whether it runs under SCHED_IDLE.
const REPORT_PY: &str = "import os\n\ndef handle(e, c):\n    return [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0) == os.SCHED_IDLE]\n";

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

#[tokio::test]
async fn python_workers_run_below_the_service_by_default_and_hooks_can_choose() {
    let hooks = Hooks::new();
    python_hook(&hooks, "default", "a:x", "");
    python_hook(&hooks, "nicer", "b:x", "nice: 15\n");
    python_hook(&hooks, "idle", "c:x", "sched: idle\n");
    // Above the fork server's priority: started from scratch, where it can have it.
    python_hook(&hooks, "eager", "d:x", "nice: 2\n");
    let (host, report) = Host::start(config(&hooks)).await;
    assert_eq!(report.loaded.len(), 4, "{report:?}");
    let got = |ev: &'static str| collect_one(&host, ev, json!({}));
    assert_eq!(got("a:x").await, Ok(Some(expect(10, false))));
    assert_eq!(got("b:x").await, Ok(Some(expect(15, false))));
    assert_eq!(got("c:x").await, Ok(Some(expect(10, true))));
    assert_eq!(got("d:x").await, Ok(Some(expect(2, false))));
    let eager = host.hook("eager").unwrap();
    assert_eq!(
        eager.worker.as_ref().map(|w| w.start.as_str()),
        Some("fresh"),
        "{eager:?}"
    );
    host.shutdown(T).await;
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
    assert_eq!(
        collect_one(&host, "f:x", json!({})).await,
        Ok(Some(expect(4, false)))
    );
    host.shutdown(T).await;
}
