//! A loaded hook ([`LoadedHook`]): one bounded FIFO queue (`queue.rs`), counters (`stats.rs`) and one
//! worker task (`worker.rs`) per version of a hook.
//!
//! `emit` pushes a [`Job`] onto each matching hook's queue and returns; it takes one short mutex
//! per queue and never waits for a handler. The worker pops jobs in order, gets the handler ready
//! (restart after a crash), calls it under the hook's timeout and reports the outcome to whoever
//! waits for it (`emit_collect`) and to the hook's counters. A full queue applies the hook's
//! overflow policy and counts the drop. A version whose files changed hands its queue to the
//! next version (`handover.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::discovery::HookSpec;
use crate::handler::Signals;
use crate::notices::Notices;

/// The next [`LoadedHook`]'s version number.
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

pub(crate) mod handover;
pub mod history;
mod queue;
mod stats;
mod worker;

pub use handover::Reloader;
pub use queue::*;
pub use stats::*;

/// The one clock of the process for rate-limited logging: every version of every hook measures
/// from it, so a reloaded hook's drop log keeps its rhythm.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// A hook that is loaded: its spec, its queue, its counters and its worker.
///
/// When a hook changes on reload, the new version shares the old one's queue and counters: events
/// queued before the change stay in the one FIFO and are delivered once, in order, by whichever
/// version takes them; the new worker starts when the old one has finished its in-flight call.
pub struct LoadedHook {
    /// What was discovered.
    pub spec: HookSpec,
    /// Events waiting for the worker (shared across versions of the hook).
    pub queue: Arc<HookQueue>,
    /// Counters and state (shared across versions of the hook).
    pub stats: Arc<HookStats>,
    /// Shared with the handler: its restarts and stuck calls; that a newer version took over.
    signals: Arc<Signals>,
    /// The handler's restart count already added to `stats.restarts`.
    restarts_seen: AtomicU64,
    /// The worker task, taken when the hook is stopped.
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Becomes true when the worker has finished (drained and shut its handler down).
    finished: watch::Sender<bool>,
    /// Jobs this version's worker has taken from the queue and not settled yet.
    in_flight: AtomicUsize,
    /// Where `handler_error`, `handler_timeout`, `worker_restart`, `queue_overflow` go.
    notices: Notices,
    /// Asks the host for a reload (the hand-over when the hook's files changed).
    reloader: OnceLock<Reloader>,
    /// A reload tried newer files of this hook and could not load them: a worker refused for
    /// changed files does not ask for another reload of the same files.
    newer_failed: AtomicBool,
    /// This version's number, unique in the process: stamped on the jobs it queues, so the
    /// version that pops them checks its patterns only against jobs another one queued.
    version: u64,
}

impl LoadedHook {
    /// This version of the hook, as its worker pops the queue it may have taken over.
    pub fn version(&self) -> queue::Version<'_> {
        queue::Version {
            id: self.version,
            hook: &self.spec.name,
            patterns: &self.spec.patterns,
        }
    }

    /// A hook with an empty queue and no worker yet.
    pub fn new(spec: HookSpec) -> Arc<Self> {
        Self::new_with(spec, Notices::default(), Arc::default())
    }

    /// A hook with an empty queue that reports to `notices`; `signals` are its handler's.
    pub fn new_with(spec: HookSpec, notices: Notices, signals: Arc<Signals>) -> Arc<Self> {
        Self::new_with_stats(spec, notices, signals, Arc::default())
    }

    /// [`LoadedHook::new_with`] going on with `stats`: the counters and history of a version
    /// of the same name no version uses any more (a hook disabled, then enabled again).
    pub fn new_with_stats(
        spec: HookSpec,
        notices: Notices,
        signals: Arc<Signals>,
        stats: Arc<HookStats>,
    ) -> Arc<Self> {
        stats.set_status(Status::Idle);
        let queue = Arc::new(HookQueue::new(
            spec.manifest.queue_capacity,
            spec.manifest.overflow,
            stats.clone(),
        ));
        Self::with_queue(spec, queue, stats, notices, signals)
    }

    /// The next version of `prev`: same queue and counters, new spec and handler.
    pub fn successor(spec: HookSpec, prev: &LoadedHook, signals: Arc<Signals>) -> Arc<Self> {
        prev.queue
            .set_limits(spec.manifest.queue_capacity, spec.manifest.overflow);
        let hook = Self::with_queue(
            spec,
            prev.queue.clone(),
            prev.stats.clone(),
            prev.notices.clone(),
            signals,
        );
        if let Some(r) = prev.reloader.get() {
            hook.set_reloader(r.clone());
        }
        hook
    }

    /// Where the worker asks for a reload when the hook's files changed (set once, by the host;
    /// a successor inherits it).
    pub fn set_reloader(&self, reloader: Reloader) {
        let _ = self.reloader.set(reloader);
    }

    /// A reload could not load the hook's newer files (this version keeps running).
    pub fn note_newer_version_failed(&self) {
        self.newer_failed.store(true, Ordering::Relaxed);
    }

    fn with_queue(
        spec: HookSpec,
        queue: Arc<HookQueue>,
        stats: Arc<HookStats>,
        notices: Notices,
        signals: Arc<Signals>,
    ) -> Arc<Self> {
        Arc::new(Self {
            spec,
            queue,
            stats,
            signals,
            restarts_seen: AtomicU64::new(0),
            worker: Mutex::new(None),
            finished: watch::channel(false).0,
            in_flight: AtomicUsize::new(0),
            notices,
            reloader: OnceLock::new(),
            newer_failed: AtomicBool::new(false),
            version: NEXT_VERSION.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// What the hook's handler shares with its worker (restarts, stuck, how it was started).
    pub fn signals(&self) -> &Signals {
        &self.signals
    }

    /// The hook's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The worker's state; `stuck` while the handler waits out a call it could not interrupt.
    pub fn status(&self) -> Status {
        match self.stats.status() {
            Status::Busy | Status::Idle | Status::Restarting if self.signals.stuck() => {
                Status::Stuck
            }
            s => s,
        }
    }

    /// Queues `job`, counting and logging drops. Returns false when the job was refused.
    pub fn enqueue(&self, mut job: Job) -> bool {
        job.queued_for = self.version;
        self.account(self.queue.push(job))
    }

    /// Queues several jobs under one lock; returns, per job, whether it was accepted.
    pub fn enqueue_many(&self, mut jobs: Vec<Job>) -> Vec<bool> {
        for job in &mut jobs {
            job.queued_for = self.version;
        }
        self.queue
            .push_many(jobs)
            .into_iter()
            .map(|p| self.account(p))
            .collect()
    }

    /// Counts one push outcome and fails the jobs that were dropped or refused.
    fn account(&self, pushed: Pushed) -> bool {
        match pushed {
            Pushed::Queued => {
                self.stats.queued.fetch_add(1, Ordering::Relaxed);
                self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                true
            }
            Pushed::DroppedOldest(old) => {
                self.stats.queued.fetch_add(1, Ordering::Relaxed);
                self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                self.count_drop();
                old.fail("dropped: the hook's queue was full (drop_oldest)");
                true
            }
            Pushed::Refused(job) => {
                let closed = self.stats.status() == Status::Stopped;
                if !closed {
                    self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                    self.count_drop();
                }
                if closed {
                    job.stopped("the hook is stopping");
                } else {
                    job.fail("dropped: the hook's queue was full (drop_newest)");
                }
                false
            }
        }
    }

    fn count_drop(&self) {
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        self.stats.drops_unlogged.fetch_add(1, Ordering::Relaxed);
        self.report_drops(false);
    }

    /// Logs (and sends `queue_overflow` for) drops not reported yet: at most once a second, or
    /// now when `force`. The worker calls it after each event, so a burst's tail is reported
    /// even when no further drop comes.
    pub fn report_drops(&self, force: bool) {
        if self.stats.drops_unlogged.load(Ordering::Relaxed) == 0 {
            return;
        }
        let now = (epoch().elapsed().as_millis() as u64).max(1);
        let last = self.stats.last_drop_log_ms.load(Ordering::Relaxed);
        let due = force || last == 0 || now.saturating_sub(last) >= 1000;
        if !due
            || self
                .stats
                .last_drop_log_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let n = self.stats.drops_unlogged.swap(0, Ordering::Relaxed);
        if n == 0 {
            return;
        }
        let total = self.stats.dropped.load(Ordering::Relaxed);
        tracing::warn!(
            hook = %self.spec.name,
            dropped = n,
            total_dropped = total,
            "queue full (capacity {}, {}): {n} event(s) dropped",
            self.queue.capacity(),
            self.queue.overflow().as_str()
        );
        self.notices.send(
            "queue_overflow",
            serde_json::json!({
                "hook": self.spec.name,
                "dropped": n,
                "total_dropped": total,
                "capacity": self.queue.capacity(),
                "overflow": self.queue.overflow().as_str(),
            }),
        );
    }

    /// Sets the jobs this version has taken and not settled to `n` (the hook's shared count
    /// follows); returns the previous value.
    pub(super) fn set_in_flight(&self, n: usize) -> usize {
        let old = self.in_flight.swap(n, Ordering::SeqCst);
        if n >= old {
            self.stats.in_flight.fetch_add(n - old, Ordering::SeqCst);
            self.stats
                .in_flight_ms
                .fetch_add(self.timeout_ms() * (n - old) as u64, Ordering::SeqCst);
        } else {
            self.stats.in_flight.fetch_sub(old - n, Ordering::SeqCst);
            self.stats
                .in_flight_ms
                .fetch_sub(self.timeout_ms() * (old - n) as u64, Ordering::SeqCst);
        }
        old
    }

    /// One more job taken from the queue (a handler's free slot, a Python window's refill).
    pub(super) fn took_one(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.stats.in_flight.fetch_add(1, Ordering::SeqCst);
        self.stats
            .in_flight_ms
            .fetch_add(self.timeout_ms(), Ordering::SeqCst);
    }

    /// One taken job settled.
    pub(super) fn settled_one(&self) {
        if self
            .in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            self.stats.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.stats
                .in_flight_ms
                .fetch_sub(self.timeout_ms(), Ordering::SeqCst);
        }
    }

    /// This version's `timeout:` in milliseconds.
    fn timeout_ms(&self) -> u64 {
        u64::try_from(self.spec.manifest.timeout.as_millis()).unwrap_or(u64::MAX / 1024)
    }

    /// Events ahead of one queued now: those queued, plus those the workers of every version
    /// have taken and not settled (the running calls, a Python window written ahead).
    pub fn ahead(&self) -> usize {
        self.queue.len() + self.stats.in_flight()
    }

    /// How long the events ahead of one queued now may take: this version's `timeout:` for each
    /// queued one, and for each taken one the `timeout:` of the version that took it (a call
    /// running under the previous version keeps its budget after a reload).
    pub fn ahead_budget(&self) -> std::time::Duration {
        let queued = u32::try_from(self.queue.len()).unwrap_or(u32::MAX);
        let taken = self.stats.in_flight_ms.load(Ordering::SeqCst);
        self.spec
            .manifest
            .timeout
            .saturating_mul(queued)
            .saturating_add(std::time::Duration::from_millis(taken))
    }

    /// Events waiting to run, as `/v1/hooks` shows the queue depth: those queued, plus those
    /// taken ahead beyond the calls that can run at once (a Python worker's window, issue 47).
    pub fn waiting(&self) -> usize {
        let running = self.spec.manifest.concurrency.max(1);
        self.queue.len() + self.stats.in_flight().saturating_sub(running)
    }

    /// Hands the queue to a newer version: this worker stops after its current call.
    pub fn supersede(&self) {
        self.signals.supersede();
    }

    /// Stops accepting events; the worker finishes the queue, then stops.
    pub fn close(&self) {
        self.stats.set_status(Status::Stopped);
        self.queue.close();
    }

    /// Waits until the worker has finished.
    pub async fn finished(&self) {
        let mut rx = self.finished.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// True once the worker has finished (or was never started... and aborted).
    pub fn is_finished(&self) -> bool {
        *self.finished.borrow()
    }

    /// Kills the worker now (after a drain deadline) and waits until it is gone; returns how many
    /// events were left: still queued, or taken by this version and not settled (counted in
    /// `undelivered`).
    pub async fn abort(&self) -> usize {
        self.stop_now("the host stopped before this event was handled")
            .await
    }

    /// Stops the worker now because this version may no longer run (its approval was revoked,
    /// its tree became unsafe): the running call is killed and every queued event is reported
    /// `why`, never run with the code that lost its approval. Returns how many events were left.
    pub async fn stop_now(&self, why: &str) -> usize {
        self.queue.close();
        let task = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            // Dropping the handler kills its processes (process group + kill_on_drop). Waiting
            // for the cancelled task means no call settles after the count below.
            task.abort();
            let _ = task.await;
        }
        let left = self.queue.take_all();
        let n = left.len() + self.set_in_flight(0);
        for job in left {
            job.stopped(why);
        }
        self.stats
            .undelivered
            .fetch_add(n as u64, Ordering::Relaxed);
        self.stats.set_status(Status::Stopped);
        self.finished.send_replace(true);
        n
    }
}
