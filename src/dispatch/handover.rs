//! The hand-over of a hook's queue when its files changed under a version that must start a
//! process (a Python worker restarted after a crash, an executable's next call): that version may
//! not run the new files (only the files it was loaded with run), so the events wait for the
//! version being loaded from them. The worker asks the host for a reload at once (the file
//! watcher may not have seen the edit yet) and waits until a newer version supersedes it; only
//! when none follows within [`HANDOVER_WAIT`] (a broken edit, an unapproved one) or the hook is
//! removed are the waiting events failed: counted, and logged once for all of them.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Job, LoadedHook, Status, set_running};
use crate::handler::HandlerError;

/// How long the events of a version whose files changed wait for the next version.
const HANDOVER_WAIT: Duration = Duration::from_secs(10);
/// How often the wait asks again for a reload (an edit saved in several writes may load only at
/// the second scan) and looks whether the hook was removed.
const RECHECK: Duration = Duration::from_millis(100);
const REQUEST_EVERY: Duration = Duration::from_secs(1);

/// Asks the host for a rescan of the hook roots, from a hook's worker. Requests coalesce: one
/// pending request stands for any number.
#[derive(Clone, Debug, Default)]
pub struct Reloader(Option<mpsc::Sender<()>>);

impl Reloader {
    /// A reloader and the receiving end the host serves.
    pub fn channel() -> (Self, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel(1);
        (Self(Some(tx)), rx)
    }

    /// Asks for a reload (nothing when no host serves requests, e.g. a hook built in a test).
    pub fn request(&self) {
        if let Some(tx) = &self.0 {
            let _ = tx.try_send(());
        }
    }
}

/// The worker could not start `jobs` (or a process for them) because the hook's files changed:
/// they go back to the front of the queue, and the worker waits for the next version to take the
/// queue over. Returns when it did (the worker then stops), or after failing what waited.
pub(super) async fn await_next_version(hook: &LoadedHook, jobs: Vec<Job>, why: &str) {
    if !jobs.is_empty() {
        hook.queue.push_front_many(jobs);
    }
    hook.in_flight.store(0, Ordering::SeqCst);
    set_running(hook, Status::Pending);
    tracing::info!(
        hook = %hook.spec.name,
        waiting = hook.queue.len(),
        "the hook's files changed since this version was loaded; its events wait for the new version"
    );
    let deadline = Instant::now() + HANDOVER_WAIT;
    let mut asked = None::<Instant>;
    loop {
        if hook.signals.superseded() {
            return;
        }
        let now = Instant::now();
        if now >= deadline || hook.stats.status() == Status::Stopped {
            break;
        }
        if asked.is_none_or(|t| now.duration_since(t) >= REQUEST_EVERY) {
            if let Some(r) = hook.reloader.get() {
                r.request();
            }
            asked = Some(now);
        }
        tokio::select! {
            biased;
            _ = hook.signals.wait_superseded() => return,
            _ = tokio::time::sleep(RECHECK.min(deadline - now)) => {}
        }
    }
    let removed = hook.stats.status() == Status::Stopped;
    let reason = if removed {
        format!("{why} (the hook was removed or stopped before a new version loaded)")
    } else {
        format!(
            "{why} (no new version loaded within {})",
            crate::time::fmt_duration(HANDOVER_WAIT)
        )
    };
    fail_waiting(hook, hook.queue.take_all(), &reason);
    set_running(hook, Status::Idle);
}

/// Fails `jobs` that never started: each counted and answered, one log line and one
/// `handler_error` notice for all of them.
fn fail_waiting(hook: &LoadedHook, jobs: Vec<Job>, why: &str) {
    let Some(first) = jobs.first().map(|j| j.event.clone()) else {
        return;
    };
    let n = jobs.len();
    let msg = crate::text::cap(HandlerError::Changed(why.to_string()).to_string());
    for job in jobs {
        hook.stats.observe(Duration::ZERO);
        hook.stats.failed.fetch_add(1, Ordering::Relaxed);
        job.fail(&msg);
    }
    tracing::warn!(hook = %hook.spec.name, events = n, "{n} waiting event(s) failed: {msg}");
    hook.stats.set_last_error(format!("{first}: {msg}"));
    hook.notices.send(
        "handler_error",
        serde_json::json!({"hook": hook.spec.name, "event": &*first, "error": msg, "events": n}),
    );
}
