//! The wheel (issue 26) pins the client and the service together: the versions and the protocol
//! they state must agree across the crate, both Python projects and the client's code.
//! (`.ci/wheel.sh` builds, installs and runs the wheel itself.)

use std::path::Path;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The value of the first `key = "value"` (or `KEY = "value"`) line in `text`.
fn quoted(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let rest = line
            .trim()
            .strip_prefix(key)?
            .trim_start()
            .strip_prefix('=')?;
        Some(rest.trim().trim_matches('"').to_string())
    })
}

#[test]
fn the_client_and_the_service_state_one_version_and_one_protocol() {
    let version = env!("CARGO_PKG_VERSION");
    let pure = read("clients/python/pyproject.toml");
    assert_eq!(
        quoted(&pure, "version").as_deref(),
        Some(version),
        "clients/python/pyproject.toml's version is the crate's"
    );
    let init = read("clients/python/hermes_hooks/__init__.py");
    assert_eq!(
        quoted(&init, "__version__").as_deref(),
        Some(version),
        "hermes_hooks.__version__ is the crate's"
    );
    // The wheel takes its version from Cargo.toml.
    let wheel = read("pyproject.toml");
    assert!(wheel.contains("dynamic = [\"version\"]"), "{wheel}");
    assert!(wheel.contains("bindings = \"bin\""), "{wheel}");
    assert!(
        wheel.contains("python-source = \"clients/python\""),
        "{wheel}"
    );
    let transport = read("clients/python/hermes_hooks/_transport.py");
    assert_eq!(
        quoted(&transport, "PROTOCOL").as_deref(),
        Some(hermes_hooks::server::PROTOCOL_VERSION.to_string().as_str()),
        "the client speaks the service's protocol"
    );
    let launcher = read("clients/python/wheel-data/scripts/hermes-hooks-gateway");
    assert!(
        launcher.starts_with("#!python\n"),
        "pip rewrites only `#!python`"
    );
    assert!(launcher.contains("from hermes_hooks.shim import main"));
}
