//! Dispatch: one bounded FIFO queue and one worker task per loaded hook.
//!
//! `emit` pushes a [`Job`] onto each matching hook's queue and returns; it takes one short mutex
//! per queue and never waits for a handler. The worker pops jobs in order, gets the handler ready
//! (restart after a crash), calls it under the hook's timeout and reports the outcome to whoever
//! waits for it (`emit_collect`) and to the hook's counters. A full queue applies the hook's
//! overflow policy and counts the drop.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;

use crate::discovery::HookSpec;
use crate::handler::{Call, Handler, HandlerError, HandlerResult, Signals};
use crate::manifest::Overflow;
use crate::notices::Notices;

/// What one handler invocation produced, as reported to a waiting `emit_collect`.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    /// The result (`None` = the handler returned nothing) or the error message.
    pub result: Result<Option<Value>, String>,
    /// Time spent in the handler (zero when it never ran).
    pub duration: Duration,
}

/// One event waiting in a hook's queue.
pub struct Job {
    /// Event name, shared by every hook the event was queued to.
    pub event: Arc<str>,
    /// Event context, shared likewise.
    pub context: Arc<Value>,
    /// Where the outcome goes, for `emit_collect`; `None` for fire-and-forget.
    pub reply: Option<oneshot::Sender<CallOutcome>>,
}

impl Job {
    /// Reports that the job will never run.
    pub fn fail(self, why: &str) {
        if let Some(reply) = self.reply {
            let _ = reply.send(CallOutcome {
                result: Err(why.to_string()),
                duration: Duration::ZERO,
            });
        }
    }
}

/// What happened to a pushed job.
pub enum Pushed {
    /// Queued.
    Queued,
    /// Queued; the oldest job was dropped to make room and is returned.
    DroppedOldest(Job),
    /// Refused (queue full with `drop_newest`, or closed); the job is returned.
    Refused(Job),
}

struct QueueState {
    jobs: VecDeque<Job>,
    closed: bool,
}

/// A bounded FIFO with one consumer (the hook's worker).
pub struct HookQueue {
    state: Mutex<QueueState>,
    notify: Notify,
    /// Bound; changes when a reloaded HOOK.yaml changes `queue:`.
    capacity: AtomicUsize,
    /// A burst's storage was released: return freed memory once the queue stays idle.
    trim_pending: AtomicBool,
    /// Overflow policy (0 = drop_oldest, 1 = drop_newest), likewise.
    overflow: AtomicU8,
}

impl HookQueue {
    /// An empty queue.
    pub fn new(capacity: usize, overflow: Overflow) -> Self {
        Self {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                closed: false,
            }),
            notify: Notify::new(),
            capacity: AtomicUsize::new(capacity.max(1)),
            trim_pending: AtomicBool::new(false),
            overflow: AtomicU8::new(overflow as u8),
        }
    }

    /// Applies new limits (a reloaded HOOK.yaml); already queued jobs stay.
    pub fn set_limits(&self, capacity: usize, overflow: Overflow) {
        self.capacity.store(capacity.max(1), Ordering::Relaxed);
        self.overflow.store(overflow as u8, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while holding this lock cannot leave the deque inconsistent: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pushes `job`, applying the overflow policy when full.
    pub fn push(&self, job: Job) -> Pushed {
        let mut st = self.lock();
        let outcome = self.push_locked(&mut st, job);
        drop(st);
        self.notify.notify_one();
        outcome
    }

    /// Pushes several jobs under one lock and one wake-up (the batch endpoint).
    pub fn push_many(&self, jobs: Vec<Job>) -> Vec<Pushed> {
        let mut st = self.lock();
        let out = jobs
            .into_iter()
            .map(|j| self.push_locked(&mut st, j))
            .collect();
        drop(st);
        self.notify.notify_one();
        out
    }

    fn push_locked(&self, st: &mut QueueState, job: Job) -> Pushed {
        if st.closed {
            return Pushed::Refused(job);
        }
        let outcome = if st.jobs.len() >= self.capacity() {
            match self.overflow() {
                Overflow::DropNewest => return Pushed::Refused(job),
                Overflow::DropOldest => match st.jobs.pop_front() {
                    Some(old) => Pushed::DroppedOldest(old),
                    None => Pushed::Queued,
                },
            }
        } else {
            Pushed::Queued
        };
        st.jobs.push_back(job);
        outcome
    }

    /// Next job; `None` once the queue is closed and empty.
    pub async fn pop(&self) -> Option<Job> {
        loop {
            {
                let mut st = self.lock();
                if let Some(job) = st.jobs.pop_front() {
                    if shrink_if_drained(&mut st.jobs) {
                        self.trim_pending.store(true, Ordering::Relaxed);
                    }
                    return Some(job);
                }
                if st.closed {
                    return None;
                }
            }
            // Single consumer: a notify_one without a waiter leaves a permit, so no wake-up is lost.
            if self.trim_pending.load(Ordering::Relaxed) {
                // A burst drained: once the queue has stayed empty for a moment, hand the freed
                // memory back to the system (not while busy: trimming the heap costs more than a
                // fast hook's events, and a busy queue drains and refills all the time).
                tokio::select! {
                    _ = self.notify.notified() => {}
                    _ = tokio::time::sleep(TRIM_WHEN_IDLE_FOR) => {
                        if self.trim_pending.swap(false, Ordering::Relaxed) {
                            give_memory_back();
                        }
                    }
                }
            } else {
                self.notify.notified().await;
            }
        }
    }

    /// Puts `jobs` back at the front of the queue, in their order (calls a reloaded hook's
    /// previous version never started). They were accepted once: neither the bound nor a closed
    /// queue refuses them.
    pub fn push_front_many(&self, jobs: Vec<Job>) {
        let mut st = self.lock();
        for job in jobs.into_iter().rev() {
            st.jobs.push_front(job);
        }
        drop(st);
        self.notify.notify_one();
    }

    /// Up to `max` queued jobs, without waiting.
    pub fn try_pop_many(&self, max: usize) -> Vec<Job> {
        let mut st = self.lock();
        let n = max.min(st.jobs.len());
        let jobs = st.jobs.drain(..n).collect();
        if shrink_if_drained(&mut st.jobs) {
            self.trim_pending.store(true, Ordering::Relaxed);
        }
        jobs
    }

    /// Refuses new jobs; the worker drains what is queued, then stops.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    /// Removes and returns everything still queued.
    pub fn take_all(&self) -> Vec<Job> {
        self.lock().jobs.drain(..).collect()
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.lock().jobs.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bound.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// The overflow policy.
    pub fn overflow(&self) -> Overflow {
        if self.overflow.load(Ordering::Relaxed) == Overflow::DropNewest as u8 {
            Overflow::DropNewest
        } else {
            Overflow::DropOldest
        }
    }
}

/// Queue storage kept after a drain; a burst's peak is released when the queue empties.
const IDLE_QUEUE_SLOTS: usize = 64;
/// How long a drained queue stays empty before the freed memory goes back to the system.
const TRIM_WHEN_IDLE_FOR: Duration = Duration::from_millis(100);

/// Releases the peak storage of a queue that a burst filled, once it is empty again; true when
/// it did (the caller then returns freed memory to the system).
fn shrink_if_drained(jobs: &mut VecDeque<Job>) -> bool {
    if jobs.is_empty() && jobs.capacity() > IDLE_QUEUE_SLOTS * 4 {
        jobs.shrink_to(IDLE_QUEUE_SLOTS);
        return true;
    }
    false
}

/// After a burst: asks the allocator to hand freed pages back to the system (glibc keeps them
/// otherwise, and the host's RSS would stay at the burst's peak).
fn give_memory_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory held by the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Worker state, as shown by `/v1/hooks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Waiting for events.
    Idle = 0,
    /// Running a handler.
    Busy = 1,
    /// Restarting a crashed worker.
    Restarting = 2,
    /// Stopped (removed, or the host shut down).
    Stopped = 3,
    /// Waiting for the previous version of the hook to finish its queue.
    Pending = 4,
    /// A call past its timeout that cannot be interrupted (a dynamic library) is still running;
    /// no new calls until it returns.
    Stuck = 5,
}

impl Status {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Idle => "ready",
            Status::Busy => "busy",
            Status::Restarting => "restarting",
            Status::Stopped => "stopped",
            Status::Pending => "pending",
            Status::Stuck => "stuck",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => Status::Busy,
            2 => Status::Restarting,
            3 => Status::Stopped,
            4 => Status::Pending,
            5 => Status::Stuck,
            _ => Status::Idle,
        }
    }
}

/// Counters of one hook; all updates are relaxed atomics off the emit path's critical section.
#[derive(Debug, Default)]
pub struct HookStats {
    /// Events accepted into the queue.
    pub queued: AtomicU64,
    /// Events offered to the hook and not refused because it was stopping: `queued` plus those
    /// a full `drop_newest` queue refused. Each ends up exactly once in `ok`, `failed`,
    /// `dropped` or `undelivered`, or is still queued or running.
    pub accepted: AtomicU64,
    /// Events still queued or running when the host stopped after its drain deadline.
    pub undelivered: AtomicU64,
    /// Invocations that returned normally.
    pub ok: AtomicU64,
    /// Invocations that failed (error, crash, timeout).
    pub failed: AtomicU64,
    /// Invocations that exceeded the timeout (also counted in `failed`).
    pub timeouts: AtomicU64,
    /// Events dropped by the overflow policy.
    pub dropped: AtomicU64,
    /// Worker restarts.
    pub restarts: AtomicU64,
    /// Total handler time in microseconds.
    pub busy_us: AtomicU64,
    /// Handler durations, per bucket of [`DURATION_BUCKETS`] (the last one is +Inf); not
    /// cumulative (the exposition sums them).
    pub duration_buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    status: AtomicU8,
    /// Drops not yet logged (logging is rate-limited to one line a second).
    drops_unlogged: AtomicU64,
    /// Milliseconds since the process [`epoch`] at the last drop log line.
    last_drop_log_ms: AtomicU64,
    last_error: Mutex<Option<(SystemTime, String)>>,
}

/// Upper bounds (seconds) of the handler duration histogram.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 300.0,
];

impl HookStats {
    /// Records one handler duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(DURATION_BUCKETS.len());
        self.duration_buckets[i].fetch_add(1, Ordering::Relaxed);
        self.busy_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Current worker state.
    pub fn status(&self) -> Status {
        Status::from_u8(self.status.load(Ordering::Relaxed))
    }

    fn set_status(&self, s: Status) {
        self.status.store(s as u8, Ordering::Relaxed);
    }

    /// The most recent error and when it happened.
    pub fn last_error(&self) -> Option<(SystemTime, String)> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The account of every event offered: see [`Tally`].
    pub fn tally(&self) -> Tally {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Tally {
            accepted: get(&self.accepted),
            ok: get(&self.ok),
            failed: get(&self.failed),
            dropped: get(&self.dropped),
            undelivered: get(&self.undelivered),
        }
    }

    /// Records an error as the hook's last one.
    pub fn set_last_error(&self, msg: String) {
        let msg = crate::text::cap(msg);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some((SystemTime::now(), msg));
    }
}

/// Where every event offered to a hook went. Once the host has stopped,
/// `accepted == ok + failed + dropped + undelivered` for each hook and in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// Offered and not refused for a stopping hook.
    pub accepted: u64,
    /// Handled successfully.
    pub ok: u64,
    /// Handled with an error (crash, timeout, refused start...).
    pub failed: u64,
    /// Dropped by the overflow policy.
    pub dropped: u64,
    /// Queued or running when the host stopped.
    pub undelivered: u64,
}

impl Tally {
    /// Adds `other` in.
    pub fn add(&mut self, other: Tally) {
        self.accepted += other.accepted;
        self.ok += other.ok;
        self.failed += other.failed;
        self.dropped += other.dropped;
        self.undelivered += other.undelivered;
    }

    /// True when every accepted event is accounted for.
    pub fn balanced(&self) -> bool {
        self.accepted == self.ok + self.failed + self.dropped + self.undelivered
    }
}

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
}

impl LoadedHook {
    /// A hook with an empty queue and no worker yet.
    pub fn new(spec: HookSpec) -> Arc<Self> {
        Self::new_with(spec, Notices::default(), Arc::default())
    }

    /// A hook with an empty queue that reports to `notices`; `signals` are its handler's.
    pub fn new_with(spec: HookSpec, notices: Notices, signals: Arc<Signals>) -> Arc<Self> {
        let queue = Arc::new(HookQueue::new(
            spec.manifest.queue_capacity,
            spec.manifest.overflow,
        ));
        Self::with_queue(
            spec,
            queue,
            Arc::new(HookStats::default()),
            notices,
            signals,
        )
    }

    /// The next version of `prev`: same queue and counters, new spec and handler.
    pub fn successor(spec: HookSpec, prev: &LoadedHook, signals: Arc<Signals>) -> Arc<Self> {
        prev.queue
            .set_limits(spec.manifest.queue_capacity, spec.manifest.overflow);
        Self::with_queue(
            spec,
            prev.queue.clone(),
            prev.stats.clone(),
            prev.notices.clone(),
            signals,
        )
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
    pub fn enqueue(&self, job: Job) -> bool {
        self.account(self.queue.push(job))
    }

    /// Queues several jobs under one lock; returns, per job, whether it was accepted.
    pub fn enqueue_many(&self, jobs: Vec<Job>) -> Vec<bool> {
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
                job.fail(if closed {
                    "the hook is stopping"
                } else {
                    "dropped: the hook's queue was full (drop_newest)"
                });
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

    /// Starts the worker; when `after` is given, it first waits for that hook's worker to finish
    /// (a reloaded hook keeps its per-hook order across versions).
    pub fn start_worker(
        self: &Arc<Self>,
        handler: Box<dyn Handler>,
        after: Option<Arc<LoadedHook>>,
    ) {
        if after.is_some() {
            self.stats.set_status(Status::Pending);
        }
        let task = tokio::spawn(run_worker(self.clone(), handler, after));
        *self.worker.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
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
        let n = left.len() + self.in_flight.swap(0, Ordering::SeqCst);
        for job in left {
            job.fail(why);
        }
        self.stats
            .undelivered
            .fetch_add(n as u64, Ordering::Relaxed);
        self.stats.set_status(Status::Stopped);
        self.finished.send_replace(true);
        n
    }
}

async fn run_worker(
    hook: Arc<LoadedHook>,
    mut handler: Box<dyn Handler>,
    after: Option<Arc<LoadedHook>>,
) {
    if let Some(prev) = after {
        prev.finished().await;
        if hook.stats.status() == Status::Pending {
            hook.stats.set_status(Status::Idle);
        }
    }
    let max_calls = handler.max_calls().max(1);
    while let Some(first) = next_job(&hook).await {
        let mut jobs = vec![first];
        if max_calls > 1 {
            jobs.extend(hook.queue.try_pop_many(max_calls - 1));
        }
        run_jobs(&hook, handler.as_mut(), jobs).await;
    }
    handler.shutdown().await;
    if !hook.signals.superseded() {
        hook.stats.set_status(Status::Stopped);
    }
    hook.finished.send_replace(true);
}

/// Sets the worker state unless the hook was stopped meanwhile.
fn set_running(hook: &LoadedHook, s: Status) {
    if hook.stats.status() != Status::Stopped {
        hook.stats.set_status(s);
    }
}

/// The next job, or `None` when the queue is closed or the hook was superseded.
async fn next_job(hook: &LoadedHook) -> Option<Job> {
    tokio::select! {
        biased;
        _ = hook.signals.wait_superseded() => None,
        job = hook.queue.pop() => job,
    }
}

/// Gets the handler ready, hands it `jobs` and settles each as the handler reports it; jobs the
/// handler did not start go back to the front of the queue (for the hook's next version).
async fn run_jobs(hook: &LoadedHook, handler: &mut dyn Handler, jobs: Vec<Job>) {
    hook.in_flight.store(jobs.len(), Ordering::SeqCst);
    set_running(hook, Status::Restarting);
    let ready = handler.ready().await;
    note_restarts(hook);
    if let Err(e) = ready {
        for job in jobs {
            finish(hook, job, Err(e.clone()), Duration::ZERO);
        }
        hook.in_flight.store(0, Ordering::SeqCst);
        set_running(hook, Status::Idle);
        return;
    }
    set_running(hook, Status::Busy);
    let calls: Vec<Call> = jobs
        .iter()
        .map(|j| Call {
            event: j.event.clone(),
            context: j.context.clone(),
        })
        .collect();
    let mut slots: Vec<Option<Job>> = jobs.into_iter().map(Some).collect();
    let mut not_started = Vec::new();
    let mut last = Instant::now();
    {
        let mut report = |i: usize, result: HandlerResult| {
            let Some(job) = slots.get_mut(i).and_then(Option::take) else {
                tracing::error!(hook = %hook.spec.name, "handler reported call {i} twice or out of range");
                return;
            };
            if matches!(result, Err(HandlerError::NotStarted)) {
                not_started.push(job);
                return;
            }
            let now = Instant::now();
            finish(hook, job, result, now - last);
            hook.in_flight.fetch_sub(1, Ordering::SeqCst);
            last = now;
        };
        handler.call(calls, &mut report).await;
    }
    for job in slots.into_iter().flatten() {
        finish(
            hook,
            job,
            Err(HandlerError::Crashed(
                "the handler returned without an outcome for this event".into(),
            )),
            Duration::ZERO,
        );
    }
    if !not_started.is_empty() {
        tracing::info!(
            hook = %hook.spec.name,
            events = not_started.len(),
            "events the handler never started go back to the front of the queue"
        );
        hook.queue.push_front_many(not_started);
    }
    hook.in_flight.store(0, Ordering::SeqCst);
    set_running(hook, Status::Idle);
    // A worker replaced at once after a timeout counts (and is announced) now.
    note_restarts(hook);
    hook.report_drops(false);
}

/// Counts an outcome, logs and announces failures, and answers whoever waits for it.
fn finish(hook: &LoadedHook, job: Job, result: HandlerResult, duration: Duration) {
    hook.stats.observe(duration);
    let timeout = hook.spec.manifest.timeout;
    let result = match result {
        Ok(v) => {
            hook.stats.ok.fetch_add(1, Ordering::Relaxed);
            Ok(v)
        }
        Err(e) => {
            let timed_out = matches!(e, HandlerError::TimedOut(_));
            hook.stats.failed.fetch_add(1, Ordering::Relaxed);
            if timed_out {
                hook.stats.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            // Capped: a handler's error text (a traceback, a response body) can be any size.
            let msg = crate::text::cap(e.to_string());
            tracing::warn!(hook = %hook.spec.name, event = %job.event, "handler failed: {msg}");
            hook.stats.set_last_error(format!("{}: {msg}", job.event));
            if timed_out {
                hook.notices.send(
                    "handler_timeout",
                    serde_json::json!({
                        "hook": hook.spec.name,
                        "event": &*job.event,
                        "timeout_s": timeout.as_secs_f64(),
                    }),
                );
            } else {
                hook.notices.send(
                    "handler_error",
                    serde_json::json!({"hook": hook.spec.name, "event": &*job.event, "error": msg}),
                );
            }
            Err(msg)
        }
    };
    if let Some(reply) = job.reply {
        let _ = reply.send(CallOutcome { result, duration });
    }
}

/// Adds the restarts the handler made since the last look to the hook's count (shared across
/// versions, so it never goes backwards) and announces them (`worker_restart`).
fn note_restarts(hook: &LoadedHook) {
    let now = hook.signals.restarts();
    let seen = hook.restarts_seen.swap(now, Ordering::Relaxed);
    if now > seen {
        let total = hook.stats.restarts.fetch_add(now - seen, Ordering::Relaxed) + (now - seen);
        hook.notices.send(
            "worker_restart",
            serde_json::json!({"hook": hook.spec.name, "restarts": total}),
        );
    }
}
