//! The gateway's drop-in Python client (`clients/python`) against the real service: runs its
//! unittest suite with `HERMES_HOOKS_BIN` pointing at the binary under test, under a `HOME`
//! holding an empty `.hermes` that must stay empty (the suite never writes an operator's home).

use std::process::Command;

#[test]
fn python_client_suite_passes_against_the_real_service() {
    let root = env!("CARGO_MANIFEST_DIR");
    let home = tempfile::tempdir().expect("tempdir");
    let dot_hermes = home.path().join(".hermes");
    std::fs::create_dir(&dot_hermes).unwrap();
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
        // As on an operator's machine: the default home is ~/.hermes, and it exists.
        .env("HOME", home.path())
        .env_remove("HERMES_HOME")
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
    let ran = crate::util::unittest_ran(&stderr);
    assert!(ran >= 30, "only {ran} client tests ran:\n{stderr}");
    assert!(
        !stderr.contains("skipped="),
        "client tests were skipped:\n{stderr}"
    );
    let written: Vec<_> = std::fs::read_dir(&dot_hermes)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert!(
        written.is_empty(),
        "the client tests wrote into $HOME/.hermes: {written:?}"
    );
}
