//! The hand-over of a hook's queue when its files changed under a version that must start a
//! process (a Python worker restarted after a crash, an executable's next call): that version may
//! not run the new files (only the files it was loaded with run), so its events wait for the
//! version being loaded from them. This file owns the waiting: the worker asks the host for a
//! reload at once (the file watcher may not have seen the edit yet; not when a load of the new
//! files already failed) and waits until a newer version supersedes it, the hook is removed, or
//! [`HANDOVER_WAIT`] passes. What happens to the events then is the worker's business.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::handler::Signals;

/// How long the events of a version whose files changed wait for the next version: longer than
/// the longest a reload's scan can take (another root's listing within 3 s, another hook
/// directory's read within 10 s, `host/scan.rs`, which checks the bound), so that another
/// hook's stalled files never spend this hook's hand-over (issue 59 row 4).
pub(crate) const HANDOVER_WAIT: Duration = Duration::from_secs(20);
/// How often the wait looks whether the hook was removed.
const RECHECK: Duration = Duration::from_millis(100);
/// How often it asks again for a reload (an edit saved in several writes may load only at the
/// second scan).
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

/// How a wait for the next version ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// A newer version takes the queue over.
    Superseded,
    /// The hook was removed or the host is stopping: no newer version will come.
    Stopped,
    /// No newer version within [`HANDOVER_WAIT`].
    TimedOut,
}

/// Waits for a newer version of the hook (`signals` are this version's). `ask()` is called at
/// once and then every second while the wait lasts (the worker asks for a reload unless loading
/// the new files already failed); `stopped()` says whether the hook was removed.
pub async fn wait_for_next_version(
    signals: &Signals,
    ask: impl Fn(),
    stopped: impl Fn() -> bool,
) -> Waited {
    let deadline = Instant::now() + HANDOVER_WAIT;
    let mut asked = None::<Instant>;
    loop {
        if signals.superseded() {
            return Waited::Superseded;
        }
        if stopped() {
            return Waited::Stopped;
        }
        let now = Instant::now();
        if now >= deadline {
            return Waited::TimedOut;
        }
        if asked.is_none_or(|t| now.duration_since(t) >= REQUEST_EVERY) {
            ask();
            asked = Some(now);
        }
        tokio::select! {
            biased;
            _ = signals.wait_superseded() => {}
            _ = tokio::time::sleep(RECHECK.min(deadline - now)) => {}
        }
    }
}
