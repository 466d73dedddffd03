//! `serve --gateway-lease FILE --linger SECS` (issue 26): a service started by a gateway's client
//! keeps serving while any gateway holds a shared lock on the lease file, and stops by itself
//! (draining, exit 0) once none has held it for the linger.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::util::{Hooks, Serve, poll};

/// A gateway's hold on the lease: a shared flock on its own open file description.
fn hold(path: &std::path::Path) -> File {
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .expect("open the lease file");
    // SAFETY: flock on the descriptor of the File just opened.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) };
    assert_eq!(rc, 0, "shared lock on the lease");
    file
}

#[test]
fn the_service_outlives_a_gap_shorter_than_the_linger_and_stops_after_the_last_gateway() {
    let hooks = Hooks::new();
    let lease = hooks.tmp.path().join("hooks.lease");
    let first = hold(&lease);
    let lease_arg = lease.to_str().expect("utf-8 path");
    let mut serve = Serve::start(&hooks, &["--gateway-lease", lease_arg, "--linger", "1"]);

    // A gateway restart: the old one lets go, the new one takes the lease within the linger.
    drop(first);
    let second = hold(&lease);
    // Held: the service keeps serving well past the linger.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(
            serve.child.try_wait().expect("try_wait").is_none(),
            "the service stopped while a gateway held the lease:\n{}",
            serve.log()
        );
        assert_eq!(serve.get("/healthz").0, 200);
        std::thread::sleep(Duration::from_millis(100)); // sampling a "still running" state
    }

    // The last gateway goes: the service drains and exits by itself.
    drop(second);
    let status = poll(Duration::from_secs(30), "the service to stop", || {
        serve.child.try_wait().expect("try_wait")
    });
    assert_eq!(status.code(), Some(0), "{}", serve.log());
    poll(Duration::from_secs(10), "the lease line in the log", || {
        serve
            .log()
            .contains("no gateway has held the lease")
            .then_some(())
    });
}

#[test]
fn linger_needs_a_lease_and_a_sane_number() {
    for args in [
        &["serve", "--linger", "5"][..],
        &["serve", "--gateway-lease", "/tmp/x", "--linger", "-1"][..],
        &["serve", "--gateway-lease", "/tmp/x", "--linger", "nan"][..],
    ] {
        let out = std::process::Command::new(crate::util::bin())
            .args(args)
            .output()
            .expect("run hermes-hooks");
        assert_eq!(out.status.code(), Some(2), "{args:?} is a usage error");
    }
}
