//! The gateway's drop-in Python client (`clients/python`) against the real service: runs its
//! unittest suite with `HERMES_HOOKS_BIN` pointing at the binary under test.

use std::process::Command;

#[test]
fn python_client_suite_passes_against_the_real_service() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .args([
            "-m",
            "unittest",
            "discover",
            "-s",
            "clients/python/tests",
            "-v",
        ])
        .current_dir(root)
        .env("HERMES_HOOKS_BIN", crate::util::bin())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // The suite's one timing bound (emit with no service); roomy for a loaded CI machine,
        // still far below a network wait.
        .env("HERMES_HOOKS_TEST_EMIT_LIMIT_MS", "50")
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python client tests failed:\n{stderr}"
    );
    // The suite must actually have run against the binary, not skipped itself.
    assert!(!stderr.contains("HERMES_HOOKS_BIN is not set"), "{stderr}");
    let ran = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")
                .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        })
        .unwrap_or(0);
    assert!(ran >= 30, "only {ran} client tests ran:\n{stderr}");
    assert!(
        !stderr.contains("skipped="),
        "client tests were skipped:\n{stderr}"
    );
}
