//! Issue 20: trust that holds. Every byte that runs was approved: one regression test per way
//! the review ran unapproved code (the table rows, named `row_N_...`).

use std::time::Duration;

use hermes_hooks::trust::{TrustMode, TrustPolicy, set_enabled};
use hermes_hooks::{Host, LoadReport};
use serde_json::json;

use crate::util::{Hooks, collect_one, config};

const T: Duration = Duration::from_secs(20);

async fn start(hooks: &Hooks, mode: TrustMode) -> (Host, LoadReport) {
    let mut cfg = config(hooks);
    cfg.trust = TrustPolicy {
        mode,
        insecure_permissions: false,
    };
    Host::start(cfg).await
}

fn explicit() -> TrustPolicy {
    TrustPolicy {
        mode: TrustMode::Explicit,
        insecure_permissions: false,
    }
}

fn approve(hooks: &Hooks, name: &str) {
    set_enabled(&[hooks.root()], &hooks.home(), &explicit(), name, true)
        .unwrap_or_else(|e| panic!("approving {name}: {e}"));
}

/// Row 2: a file sourced by an approved script, or read as a program by a tool it runs, is
/// covered whatever its name or mode: `lib.bash` (no `.sh`, no exec bit) and `fmt.awk`.
#[tokio::test]
async fn row_2_sourced_files_of_any_name_are_covered() {
    let hooks = Hooks::new();
    let dir = hooks.exec(
        "e",
        "[\"x:*\"]",
        "#!/bin/sh\n. ./lib.bash\nawk -v v=\"$(value)\" -f fmt.awk /dev/null\n",
    );
    std::fs::write(dir.join("lib.bash"), "value() { echo approved; }\n").unwrap();
    std::fs::write(
        dir.join("fmt.awk"),
        "BEGIN { printf \"\\\"%s-awk\\\"\\n\", v }\n",
    )
    .unwrap();
    approve(&hooks, "e");
    let (host, report) = start(&hooks, TrustMode::Explicit).await;
    assert_eq!(report.loaded, vec!["e"], "{report:#?}");
    assert_eq!(
        collect_one(&host, "x:go", json!({})).await,
        Ok(Some(json!("approved-awk")))
    );
    for (file, injected) in [
        ("lib.bash", "value() { echo injected; }\n"),
        ("fmt.awk", "BEGIN { printf \"\\\"injected\\\"\\n\" }\n"),
    ] {
        let before = std::fs::read(dir.join(file)).unwrap();
        std::fs::write(dir.join(file), injected).unwrap();
        let out = collect_one(&host, "x:go", json!({})).await;
        let err = out.expect_err("a call with an edited sourced file must be refused");
        assert!(err.contains(&format!("{file} changed")), "{err}");
        std::fs::write(dir.join(file), before).unwrap();
    }
    host.shutdown(T).await;
}

/// Row 9: revoking an approval stops the hook at once; the events still queued are reported as
/// not run (undelivered), none runs with the revoked code.
#[tokio::test]
async fn row_9_revoked_hook_does_not_drain_its_queue() {
    let hooks = Hooks::new();
    let ran = hooks.out().join("ran.txt");
    hooks.python(
        "slow",
        "[\"x:*\"]",
        &format!(
            "import time\n\ndef handle(event, context):\n    with open({:?}, 'a') as f:\n        f.write('x\\n')\n    time.sleep(0.05)\n",
            ran.display().to_string()
        ),
    );
    approve(&hooks, "slow");
    let (host, report) = start(&hooks, TrustMode::Explicit).await;
    assert_eq!(report.loaded, vec!["slow"], "{report:#?}");
    for _ in 0..100 {
        host.emit("x:go", json!({})).unwrap();
    }
    let count = || {
        std::fs::read_to_string(&ran)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    crate::util::poll_async(T, "the first event to run", || (count() > 0).then_some(())).await;
    set_enabled(&[hooks.root()], &hooks.home(), &explicit(), "slow", false).unwrap();
    let before = count();
    let report = host.reload().await;
    assert!(report.loaded.is_empty(), "{report:#?}");
    // Whatever the stopped version would still run has run once the host is shut down.
    host.shutdown(T).await;
    let after = count();
    // At most the call that was running when the reload came finishes its line.
    assert!(
        after <= before + 1,
        "{} events ran after the approval was revoked",
        after - before
    );
    let tally = host.accounts()["slow"];
    assert!(tally.balanced(), "{tally:?}");
    assert!(
        tally.undelivered + tally.failed >= 100 - after as u64,
        "queued events must be reported: {tally:?}"
    );
}
