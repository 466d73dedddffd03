//! The hand-over of a reloaded Python hook: once the new version is ready, the old worker starts
//! no further call. Its pipelined requests are already written, so the host tells it (SIGUSR2,
//! sent through a pidfd so a reused pid is never hit); the runner finishes the call in progress
//! and answers the rest `skipped`, which the worker hands back to the queue for the new version.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::api::Signals;

/// Watches one worker process for the hook being superseded; stops watching when dropped.
#[derive(Debug)]
pub struct Retire(Option<JoinHandle<()>>);

impl Retire {
    /// Sends SIGUSR2 to the process behind `pidfd` once `signals` says the hook was superseded.
    pub fn watch(pidfd: Option<OwnedFd>, signals: Arc<Signals>) -> Self {
        let Some(pidfd) = pidfd else {
            return Self(None);
        };
        Self(Some(tokio::spawn(async move {
            signals.wait_superseded().await;
            // SAFETY: pidfd_send_signal with a pidfd owned here and no siginfo.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    libc::SIGUSR2,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        })))
    }
}

impl Drop for Retire {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// A pidfd for `pid` (a child not reaped yet), or `None` when the kernel has none.
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open returns a new descriptor owned by nobody else, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
