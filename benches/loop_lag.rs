//! The gateway's event-loop lag with hooks: the original in-process host against the Python
//! client (`clients/python`) and the service, in one run.
//!
//! `cargo bench --bench loop_lag` (builds the release binary first). Runs
//! `benches/loop_lag.py --bin <release binary> --rt`, which starts `hermes-hooks serve` on a Unix
//! socket with 10 trivial Python hooks on `agent:step`, then measures, each case in a fresh
//! Python process and interleaved over rounds: the monitor alone, the original host with 10
//! trivial sync hooks, the client, and the client with the service frozen (SIGSTOP), at 5,000
//! and 20,000 events/s. The script prints the table and the ratios; arguments after `--` are
//! passed to it (e.g. `cargo bench --bench loop_lag -- --rounds 5 --json`).

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
        .arg("--rt")
        .args(&extra)
        .status()
        .expect("run python3 benches/loop_lag.py");
    assert!(status.success(), "benches/loop_lag.py failed: {status}");
}
