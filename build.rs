//! Build script: two facts about the machine for the test summary. Without `nats-server` (and
//! outside CI) it sets `cfg(hermes_no_nats)`, under which the fleet tests are marked
//! `#[cfg_attr(hermes_no_nats, ignore = "...")]`: `cargo test` then counts them as ignored,
//! not as passed. Likewise `cfg(hermes_no_fuse)` without `/dev/fuse` or a Python with mfusepy
//! (`HERMES_FUSE_PYTHON`, else `target/fuse-venv/bin/python`, which `.ci/run` installs) for the
//! tests whose hook files sit on a FUSE mount that stalls (issue 47). With `CI` set neither cfg
//! is ever set: a missing broker or FUSE fails those tests. The crate itself does not use them.
//!
//! Looked up as the tests look the broker up: `HERMES_NATS_SERVER` (a file), else `nats-server`
//! on `PATH`, in `/usr/sbin` or `/usr/local/sbin`. Decided again when one of those variables
//! changes; after installing `nats-server` without changing them, `touch build.rs`.

use std::path::PathBuf;

fn nats_server_found() -> bool {
    if let Some(p) = std::env::var_os("HERMES_NATS_SERVER") {
        return PathBuf::from(p).is_file();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .any(|d| d.join("nats-server").is_file())
}

/// `/dev/fuse` and a Python that imports mfusepy (`tests/it/stall.rs` looks it up the same way).
fn fuse_found() -> bool {
    let python = std::env::var_os("HERMES_FUSE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
            PathBuf::from(dir).join("target/fuse-venv/bin/python")
        });
    std::path::Path::new("/dev/fuse").exists()
        && python.is_file()
        && std::process::Command::new(&python)
            .args(["-c", "import mfusepy"])
            .output()
            .is_ok_and(|o| o.status.success())
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(hermes_no_nats)");
    println!("cargo::rustc-check-cfg=cfg(hermes_no_fuse)");
    println!("cargo::rerun-if-changed=build.rs");
    for var in ["PATH", "HERMES_NATS_SERVER", "CI", "HERMES_FUSE_PYTHON"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if std::env::var_os("CI").is_none() && !nats_server_found() {
        println!("cargo::rustc-cfg=hermes_no_nats");
    }
    if std::env::var_os("CI").is_none() && !fuse_found() {
        println!("cargo::rustc-cfg=hermes_no_fuse");
    }
}
