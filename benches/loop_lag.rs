//! The gateway's event-loop lag with hooks: the original in-process host against the Python
//! client (`clients/python`) and the service, in one run.
//!
//! `cargo bench --bench loop_lag` (builds the release binary first). Runs
//! `benches/loop_lag.py --bin <release binary>`, which starts `hermes-hooks serve` on a Unix
//! socket with 10 trivial Python hooks on `agent:step`, then measures, each case in a fresh
//! Python process and alternating within each round: the monitor alone, the original host with
//! 10 trivial sync hooks, the client, the client with the service frozen (SIGSTOP), and 10 hooks
//! with `runs: gateway`, at 5,000 and 20,000 events/s. Everything runs at normal priority, as a
//! real gateway does. The script prints the Markdown tables of BENCHMARKS.md: the figures, the
//! ratios to the original host against issue 22's goals, and the CPU the service and its hook
//! processes spent per event. Arguments after `--` go to the script, e.g.
//! `cargo bench --bench loop_lag -- --rounds 5 --json`, or `-- --rt` to run each gateway process
//! under `SCHED_FIFO` (needs CAP_SYS_NICE; isolates the client's share from other load).

use std::process::Command;

fn main() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/loop_lag.py");
    // cargo passes `--bench` to harness=false benches; everything else goes to the script.
    let extra: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let status = Command::new("python3")
        .arg(script)
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_hermes-hooks"))
        .args(&extra)
        .status()
        .expect("run python3 benches/loop_lag.py");
    assert!(status.success(), "benches/loop_lag.py failed: {status}");
}
