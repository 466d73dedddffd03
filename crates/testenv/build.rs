//! Build script: facts about the test machine, for `#[testenv::needs(...)]` (src/lib.rs). A test
//! that cannot run here is marked `#[testenv::needs(FACILITY)]`, so `cargo test` lists it as
//! ignored with its reason instead of counting an early return as passed (issue 50). The facts
//! reach the macros as `TESTENV_MISSING` (the missing facilities, comma-separated); only this
//! crate and the test targets that use it are rebuilt when they change, never the service
//! (issue 60: this used to be the service's own build script).
//!
//! - `nats`: no `nats-server` (the fleet tests). Looked up as the tests look the broker up:
//!   `HERMES_NATS_SERVER` (a file), else `nats-server` on `PATH`, in `/usr/sbin` or
//!   `/usr/local/sbin`.
//! - `zsh`, `fish`: the shell is not on `PATH` (the completion scripts are checked by their
//!   shells).
//! - `fuse`: no `/dev/fuse`, or no Python with mfusepy (`HERMES_FUSE_PYTHON`, else
//!   `target/fuse-venv/bin/python`, which `.ci/run` installs): the tests whose hook files sit on
//!   a FUSE mount that stalls (issue 47).
//! - `gateway_venv`: neither `HERMES_AGENT_VENV` nor `target/hermes-agent-venv` (made by
//!   `.ci/hermes-agent-venv.sh`, which needs the network) exists: the real-gateway test.
//! - `landlock4`: the kernel has no Landlock ABI >= 4 (the sandbox tests).
//!
//! With `CI` set none of those is ever missing: `.ci/run` installs what they need, and a missing
//! one fails its tests. The following are properties of the machine CI cannot install, decided
//! whether or not `CI` is set:
//!
//! - `root`: not run as root (a test chowns a hook to another user).
//! - `setpriv_root`: not run as root or no `setpriv` (a test becomes `nobody`).
//! - `private_group`, `shared_group`: this user's primary group is not a private one (another
//!   user has it or it lists members), or there is no other group to give files to (as root:
//!   another user's primary group; else a supplementary group): the tests of group-writable
//!   hooks. The same reading of /etc/passwd and /etc/group as tests/it/dropin.rs's `private_gid`
//!   and `shared_gid`.
//! - `pid_namespace`: `unshare --pid --fork --mount-proc true` fails here.
//! - `man`: `man` or `groff` is missing (the man page is rendered).
//!
//! Decided again when one of the variables below or /etc/passwd, /etc/group changes; after
//! installing a program or making a venv without changing them, `touch crates/testenv/build.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn search_path() -> Vec<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).collect()
}

fn on_path(program: &str) -> bool {
    search_path().iter().any(|d| d.join(program).is_file())
}

fn nats_server_found() -> bool {
    if let Some(p) = std::env::var_os("HERMES_NATS_SERVER") {
        return PathBuf::from(p).is_file();
    }
    search_path()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .any(|d| d.join("nats-server").is_file())
}

/// The gateway's venv the real-gateway test would use without making one.
fn gateway_venv_found() -> bool {
    if std::env::var_os("HERMES_AGENT_VENV").is_some() {
        return true;
    }
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out; the test looks in <target>.
    let out = std::env::var_os("OUT_DIR").map(PathBuf::from);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            out.as_deref()
                .and_then(|o| o.ancestors().nth(4))
                .map(Path::to_path_buf)
        });
    target.is_some_and(|t| t.join("hermes-agent-venv/bin/python").exists())
}

/// The effective user id, from /proc (no libc in the build script).
fn effective_uid() -> Option<u32> {
    status_fields("Uid:").get(1).copied()
}

/// A field of this process's /proc/self/status line `key`, split on whitespace.
fn status_fields(key: &str) -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// (name, uid, primary gid) of every account in /etc/passwd.
fn passwd() -> Vec<(String, u32, u32)> {
    std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((
                f.first()?.to_string(),
                f.get(2)?.parse().ok()?,
                f.get(3)?.parse().ok()?,
            ))
        })
        .collect()
}

/// Whether this user's primary group is private: nobody else's primary group, and it lists no
/// member but this user.
fn private_group_here(uid: u32) -> bool {
    let users = passwd();
    let Some((name, _, primary)) = users.iter().find(|(_, u, _)| *u == uid) else {
        return false;
    };
    if users.iter().any(|(_, u, g)| g == primary && *u != uid) {
        return false;
    }
    let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
    groups.lines().any(|l| {
        let f: Vec<&str> = l.split(':').collect();
        f.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(*primary)
            && f.get(3)
                .unwrap_or(&"")
                .split(',')
                .filter(|m| !m.is_empty())
                .all(|m| m == name)
    })
}

/// Whether this process may give its files a group that is not its private one.
fn shared_group_here(uid: u32) -> bool {
    let users = passwd();
    let primary = users.iter().find(|(_, u, _)| *u == uid).map(|(_, _, g)| *g);
    if uid == 0 {
        return users.iter().any(|(_, u, g)| *u != 0 && Some(*g) != primary);
    }
    status_fields("Groups:")
        .into_iter()
        .any(|g| Some(g) != primary)
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The kernel's Landlock ABI version (a negative number without Landlock, or off Linux).
#[cfg(target_os = "linux")]
fn landlock_abi() -> i64 {
    unsafe extern "C" {
        fn syscall(number: std::ffi::c_long, ...) -> std::ffi::c_long;
    }
    // SAFETY: the VERSION query of landlock_create_ruleset (444 on every architecture with the
    // generic syscall table and on x86_64) reads no memory: a null attr, size 0, flag 1.
    unsafe { syscall(444, std::ptr::null::<u8>(), 0usize, 1u32) as i64 }
}

/// The kernel's Landlock ABI version (a negative number without Landlock, or off Linux).
#[cfg(not(target_os = "linux"))]
fn landlock_abi() -> i64 {
    -1
}

/// `/dev/fuse` and a Python that imports mfusepy (`tests/it/stall.rs` looks it up the same way).
fn fuse_found() -> bool {
    let python = std::env::var_os("HERMES_FUSE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // The workspace's root: this crate is crates/testenv.
            let dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
            PathBuf::from(dir).join("../../target/fuse-venv/bin/python")
        });
    Path::new("/dev/fuse").exists()
        && python.is_file()
        && Command::new(&python)
            .args(["-c", "import mfusepy"])
            .output()
            .is_ok_and(|o| o.status.success())
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=/etc/passwd");
    println!("cargo::rerun-if-changed=/etc/group");
    for var in [
        "PATH",
        "HERMES_NATS_SERVER",
        "HERMES_AGENT_VENV",
        "CARGO_TARGET_DIR",
        "CI",
        "HERMES_FUSE_PYTHON",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let ci = std::env::var_os("CI").is_some();
    let mut missing: Vec<&str> = Vec::new();
    if !ci {
        if !nats_server_found() {
            missing.push("nats");
        }
        if !on_path("zsh") {
            missing.push("zsh");
        }
        if !on_path("fish") {
            missing.push("fish");
        }
        if !gateway_venv_found() {
            missing.push("gateway_venv");
        }
        if landlock_abi() < 4 {
            missing.push("landlock4");
        }
        if !fuse_found() {
            missing.push("fuse");
        }
    }
    let uid = effective_uid();
    if uid != Some(0) {
        missing.push("root");
    }
    if uid != Some(0) || !Path::new("/usr/bin/setpriv").exists() {
        missing.push("setpriv_root");
    }
    if !uid.is_some_and(private_group_here) {
        missing.push("private_group");
    }
    if !uid.is_some_and(shared_group_here) {
        missing.push("shared_group");
    }
    if !runs("unshare", &["--pid", "--fork", "--mount-proc", "true"]) {
        missing.push("pid_namespace");
    }
    if !(on_path("man") && on_path("groff")) {
        missing.push("man");
    }
    println!("cargo::rustc-env=TESTENV_MISSING={}", missing.join(","));
}
