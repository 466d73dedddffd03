//! `serve --gateway-lease FILE`: a service that a gateway's client started (autostart) stops by
//! itself once no gateway has used it for `--linger` seconds, so the last gateway's exit leaves
//! no orphan while a gateway restart finds the service still there.
//!
//! Each gateway holds a shared `flock` on FILE for as long as it runs (the kernel releases it when
//! the gateway exits, however it exits, even on SIGKILL). The service tries a non-blocking
//! exclusive lock now and then and lets go of it at once: getting it means no gateway holds the
//! file. When that has been so for the whole linger, the returned future resolves and the
//! service drains and stops as on SIGTERM.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// Longest pause between two looks at the lease.
const MAX_POLL: Duration = Duration::from_secs(1);
/// Shortest pause between two looks at the lease (a linger of 0).
const MIN_POLL: Duration = Duration::from_millis(50);

/// Opens (creating it, mode 0600) the lease file `serve --gateway-lease` names.
pub fn open(path: &Path) -> Result<File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot open --gateway-lease {}: {e}", path.display()))
}

/// The lease taken exclusively by a service that decided to stop: no gateway can take its
/// shared lock (and then probe and adopt the service) until this is dropped, which the caller
/// does once the service refuses new work (issue 47: a gateway that took the lease between the
/// decision and the draining flag adopted a service that then exited).
#[derive(Debug)]
pub struct Decided(File);

impl Drop for Decided {
    fn drop(&mut self) {
        // SAFETY: flock on the descriptor this value owns; releases the exclusive lock.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Resolves once no process has held `file` for `linger` in a row (looked at every
/// `linger / 4`, between 50 ms and 1 s), holding the file's exclusive lock ([`Decided`]).
pub async fn unused_for(file: File, linger: Duration) -> Decided {
    let poll = (linger / 4).clamp(MIN_POLL, MAX_POLL);
    let mut unused_since: Option<Instant> = None;
    loop {
        let fd = file.as_raw_fd();
        // SAFETY: flock on a descriptor borrowed from a live File.
        let got = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if !got {
            unused_since = None;
        } else {
            let since = *unused_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= linger {
                tracing::info!(
                    "no gateway has held the lease for {:.1} s (--gateway-lease): stopping",
                    since.elapsed().as_secs_f64()
                );
                return Decided(file);
            }
            // SAFETY: as above; releases the lock just taken.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
        }
        tokio::time::sleep(poll).await;
    }
}
