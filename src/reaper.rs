//! Reaping the orphans of hooks. A process a hook leaves behind (a background job of a script,
//! a daemon it started) is re-parented when its parent exits: to init, or to this service when it
//! is PID 1 (in a container) or a child subreaper (`HERMES_HOOKS_SUBREAPER=1` sets
//! `PR_SET_CHILD_SUBREAPER`, so a hook's orphans stay under the service). Then nobody else reaps
//! them, and each would stay a zombie.
//!
//! The reaper wakes on SIGCHLD (and once a second), lists this process's children
//! (`/proc/self/task/*/children`) and reaps those that are zombies and not the leader of their
//! own process group. Every process the service starts itself leads its own group (workers,
//! executables, fork servers, interpreter probes), and its owner waits for it; an orphan sits
//! in its hook's group. An orphan that made itself a group leader (`setsid`) is left to whoever
//! owns it, as before.

use std::time::Duration;

/// Environment variable that makes the service a child subreaper (`1`, `true`, `yes`, `on`).
pub const SUBREAPER_ENV: &str = "HERMES_HOOKS_SUBREAPER";

/// The running reaper; dropping it stops reaping.
pub struct Reaper {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the reaper when this process is PID 1 or is asked to be a child subreaper.
pub fn start() -> Option<Reaper> {
    let pid1 = std::process::id() == 1;
    let wanted = matches!(
        std::env::var(SUBREAPER_ENV)
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
            .as_str(),
        "1" | "true" | "yes" | "on"
    );
    if !pid1 && !wanted {
        return None;
    }
    if !pid1 {
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            tracing::warn!(
                "cannot become a child subreaper: {}",
                std::io::Error::last_os_error()
            );
            return None;
        }
    }
    let mut sigchld = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch SIGCHLD, orphans are not reaped: {e}");
            return None;
        }
    };
    tracing::info!(pid1, "reaping the orphans of hooks");
    let task = tokio::spawn(async move {
        loop {
            let _ = tokio::time::timeout(Duration::from_secs(1), sigchld.recv()).await;
            let reaped = tokio::task::spawn_blocking(reap_orphans).await.unwrap_or(0);
            if reaped > 0 {
                tracing::debug!(reaped, "reaped orphaned processes");
            }
        }
    });
    Some(Reaper { task })
}

/// Reaps every zombie child that does not lead its own process group; returns how many.
pub fn reap_orphans() -> usize {
    let mut n = 0;
    for pid in children() {
        if is_orphan_zombie(pid) {
            // SAFETY: waitpid on one pid with WNOHANG; the status is written to a local.
            let mut status = 0;
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                n += 1;
            }
        }
    }
    n
}

fn children() -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// A zombie (`Z`) whose process group is not its own, from `/proc/PID/stat`.
fn is_orphan_zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    matches!(fields.as_slice(), [state, _ppid, pgrp, ..] if *state == "Z" && pgrp.parse::<i32>().is_ok_and(|g| g != pid))
}
