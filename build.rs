//! Build script: one fact about the machine for the test summary. Without `nats-server` (and
//! outside CI) it sets `cfg(hermes_no_nats)`, under which the fleet tests are marked
//! `#[cfg_attr(hermes_no_nats, ignore = "...")]`: `cargo test` then counts them as ignored,
//! not as passed. With `CI` set the cfg is never set: a missing broker fails the fleet tests.
//! The crate itself does not use the cfg.
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

fn main() {
    println!("cargo::rustc-check-cfg=cfg(hermes_no_nats)");
    println!("cargo::rerun-if-changed=build.rs");
    for var in ["PATH", "HERMES_NATS_SERVER", "CI"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if std::env::var_os("CI").is_none() && !nats_server_found() {
        println!("cargo::rustc-cfg=hermes_no_nats");
    }
}
