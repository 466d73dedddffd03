//! A hook's bounded FIFO of [`Job`]s, with its overflow policy; one consumer (the hook's worker).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Notify, oneshot};

use super::stats::HookStats;
use crate::manifest::Overflow;

/// What one handler invocation produced, as reported to a waiting `emit_collect`.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    /// The result (`None` = the handler returned nothing) or the error message.
    pub result: Result<Option<Value>, String>,
    /// Time spent in the handler (zero when it never ran).
    pub duration: Duration,
    /// Never started, and why ([`NotRun`]): the event is someone else's to run or to settle.
    pub not_run: Option<NotRun>,
}

/// Why a queued job was given back unstarted ([`CallOutcome::not_run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRun {
    /// Its start gate was shut ([`Job::gate`]): the lease that let it start may be another
    /// worker's now, and the event is that worker's to run.
    GateShut,
    /// The version of the hook that took the queue over (a reload) does not match the event,
    /// which an earlier version matched when it was queued: no event runs on a version whose
    /// patterns do not match it (issue 56). A fleet worker decides its fate
    /// ([`crate::fleet::versions::Versions::fate`]); a local one counts it dropped.
    Unmatched,
    /// The hook (or the host) stopped before the job finished: still queued, written to a
    /// worker's pipe and not started, or killed at the drain's deadline. Its outcome here is
    /// none, and the event is the next worker's or version's to run: a fleet worker hands it
    /// back to the broker, so that an ordered hook's next holder runs it in stream order
    /// (issue 56: retried as a failure, such events ran on the next holder after later ones
    /// had started; one that had started runs again, shown as a repeat).
    Stopped,
}

impl CallOutcome {
    /// An outcome with no result from a hook (`why`), the handler never having run.
    pub fn failed(why: impl Into<String>) -> Self {
        Self {
            result: Err(why.into()),
            duration: Duration::ZERO,
            not_run: None,
        }
    }
}

/// One event waiting in a hook's queue.
pub struct Job {
    /// Event name, shared by every hook the event was queued to.
    pub event: Arc<str>,
    /// Event context, shared likewise.
    pub context: Arc<crate::handler::context::Context>,
    /// Where the outcome goes, for `emit_collect`; `None` for fire-and-forget.
    pub reply: Option<oneshot::Sender<CallOutcome>>,
    /// A fleet lease holder's bound on starting it (issue 48): once shut, the job is never
    /// started and its waiter is told so ([`Job::refuse`]).
    pub gate: Option<Arc<crate::start_gate::StartGate>>,
    /// The version of the hook that queued it (set by [`crate::hook::LoadedHook::enqueue`];
    /// 0 until then): that version matched it; another checks its own patterns (`Version`).
    pub queued_for: u64,
}

impl Job {
    /// Someone waits for this job's outcome (a collect still within its deadline).
    pub fn awaited(&self) -> bool {
        self.reply.as_ref().is_some_and(|r| !r.is_closed())
    }

    /// Whoever waited for this job's outcome has gone (a collect whose deadline passed, or
    /// whose caller went away): running it would be work for nobody.
    pub fn abandoned(&self) -> bool {
        self.reply.as_ref().is_some_and(|r| r.is_closed())
    }

    /// Reports that the job will never run.
    pub fn fail(self, why: &str) {
        if let Some(reply) = self.reply {
            let _ = reply.send(CallOutcome::failed(why));
        }
    }

    /// Reports that the job was never started because its hook stopped (`why`):
    /// [`NotRun::Stopped`].
    pub fn stopped(self, why: &str) {
        if let Some(reply) = self.reply {
            let _ = reply.send(CallOutcome {
                not_run: Some(NotRun::Stopped),
                ..CallOutcome::failed(why)
            });
        }
    }

    /// Whether its start gate is shut (it must not start: [`Job::refuse`]).
    pub fn gate_shut(&self) -> bool {
        self.gate.as_ref().is_some_and(|g| !g.open())
    }

    /// Reports that the job was not started because its start gate is shut (and shuts it, so
    /// that nothing after it starts either).
    pub fn refuse(self) {
        if let Some(g) = &self.gate {
            g.shut();
        }
        if let Some(reply) = self.reply {
            let _ = reply.send(CallOutcome {
                result: Err(GATE_SHUT.to_string()),
                duration: Duration::ZERO,
                not_run: Some(NotRun::GateShut),
            });
        }
    }

    /// Reports that the job was not started because the version of the hook now popping the
    /// queue does not match it ([`NotRun::Unmatched`]); without a waiter it is counted in
    /// `dropped` and logged.
    fn unmatched(self, hook: &str, dropped: &AtomicU64) {
        match self.reply {
            Some(reply) => {
                let _ = reply.send(CallOutcome {
                    result: Err(UNMATCHED.to_string()),
                    duration: Duration::ZERO,
                    not_run: Some(NotRun::Unmatched),
                });
            }
            None => {
                dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(hook, event = %self.event, "{UNMATCHED}; dropped");
            }
        }
    }
}

/// What a job the hook's new version does not match reports.
pub const UNMATCHED: &str = "not started: queued for an earlier version of the hook, and the version \
     loaded since does not match the event (its `events:` changed)";

/// What a job refused by its start gate reports.
pub const GATE_SHUT: &str =
    "not started: the fleet lease that let it start may be another worker's now";

/// What happened to a pushed job.
pub enum Pushed {
    /// Queued.
    Queued,
    /// Queued; the oldest job was dropped to make room and is returned.
    DroppedOldest(Job),
    /// Refused (queue full with `drop_newest`, or closed); the job is returned.
    Refused(Job),
}

/// The version of the hook that pops the queue: its name and patterns.
pub struct Version<'a> {
    /// Its number ([`Job::queued_for`] of the jobs it queued itself).
    pub id: u64,
    /// The hook's name, for logs.
    pub hook: &'a str,
    /// The patterns of the version popping.
    pub patterns: &'a crate::pattern::PatternSet,
}

struct QueueState {
    jobs: VecDeque<Job>,
    closed: bool,
}

impl QueueState {
    /// The first job someone still waits for; abandoned collects before it are dropped and
    /// counted in `dropped` (they were accepted, so the hook's counters must account for them).
    /// Only a job `version` matches is returned: every job was queued to a version that
    /// matched it, and a reload hands the queue to the next version ([`NotRun::Unmatched`]).
    fn pop_live(&mut self, dropped: &AtomicU64, version: &Version<'_>) -> Option<Job> {
        loop {
            let job = self.jobs.pop_front()?;
            if job.gate_shut() {
                // Not dropped: the fleet worker hands it to whoever holds the lease now.
                job.refuse();
                continue;
            }
            if job.queued_for != version.id && version.patterns.matches(&job.event).is_none() {
                if let Some(g) = job.gate.as_ref().filter(|g| g.ordered()) {
                    // Work that starts in queue order: nothing after this job starts before
                    // its fate is decided (the jobs behind it are refused, [`Job::refuse`]).
                    g.shut();
                }
                job.unmatched(version.hook, dropped);
                continue;
            }
            if !job.abandoned() {
                return Some(job);
            }
            dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(event = %job.event, "a collect whose caller gave up is dropped before it started");
        }
    }
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
    /// The hook's counters: a collect dropped because its caller gave up counts as `dropped`.
    stats: Arc<HookStats>,
}

impl HookQueue {
    /// An empty queue counting what it drops in `stats`.
    pub fn new(capacity: usize, overflow: Overflow, stats: Arc<HookStats>) -> Self {
        Self {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                closed: false,
            }),
            notify: Notify::new(),
            capacity: AtomicUsize::new(capacity.max(1)),
            trim_pending: AtomicBool::new(false),
            overflow: AtomicU8::new(overflow as u8),
            stats,
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
                // The oldest job nobody waits for makes room: a decision someone waits for
                // (a collect) is never dropped for another caller's events (issue 57 row 6).
                // When every queued job is awaited, the new one is refused instead.
                Overflow::DropOldest => match st.jobs.iter().position(|j| !j.awaited()) {
                    Some(i) => match st.jobs.remove(i) {
                        Some(old) => Pushed::DroppedOldest(old),
                        None => Pushed::Queued,
                    },
                    None => return Pushed::Refused(job),
                },
            }
        } else {
            Pushed::Queued
        };
        st.jobs.push_back(job);
        outcome
    }

    /// Next job; `None` once the queue is closed and empty.
    pub async fn pop(&self, version: &Version<'_>) -> Option<Job> {
        loop {
            {
                let mut st = self.lock();
                if let Some(job) = st.pop_live(&self.stats.dropped, version) {
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

    /// The next queued job, without waiting.
    pub fn try_pop(&self, version: &Version<'_>) -> Option<Job> {
        let mut st = self.lock();
        let job = st.pop_live(&self.stats.dropped, version)?;
        if shrink_if_drained(&mut st.jobs) {
            self.trim_pending.store(true, Ordering::Relaxed);
        }
        Some(job)
    }

    /// Up to `max` queued jobs, without waiting.
    pub fn try_pop_many(&self, max: usize, version: &Version<'_>) -> Vec<Job> {
        let mut st = self.lock();
        let mut jobs = Vec::with_capacity(max.min(st.jobs.len()));
        while jobs.len() < max
            && let Some(job) = st.pop_live(&self.stats.dropped, version)
        {
            jobs.push(job);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn job(awaited: bool) -> (Job, Option<oneshot::Receiver<CallOutcome>>) {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            event: Arc::from("e"),
            context: Arc::new(crate::handler::context::Context::new(serde_json::json!({}))),
            reply: awaited.then_some(tx),
            gate: None,
            queued_for: 0,
        };
        (job, awaited.then_some(rx))
    }

    /// Issue 57 row 6: a flood of events on a `drop_oldest` queue never drops a decision someone
    /// waits for; when only decisions are queued, the newcomer is refused instead.
    #[test]
    fn drop_oldest_never_drops_an_awaited_job() {
        let q = HookQueue::new(2, Overflow::DropOldest, Arc::new(HookStats::default()));
        let (decision, _wait) = job(true);
        assert!(matches!(q.push(decision), Pushed::Queued));
        let (event, _) = job(false);
        assert!(matches!(q.push(event), Pushed::Queued));
        for _ in 0..10 {
            let (event, _) = job(false);
            match q.push(event) {
                Pushed::DroppedOldest(old) => assert!(old.reply.is_none(), "a decision dropped"),
                _ => panic!("an event was not queued in place of the oldest event"),
            }
        }
        let (second, _wait2) = job(true);
        assert!(matches!(q.push(second), Pushed::DroppedOldest(_)));
        let (third, _) = job(true);
        assert!(
            matches!(q.push(third), Pushed::Refused(_)),
            "two decisions queued, full"
        );
        let (late, _) = job(false);
        assert!(matches!(q.push(late), Pushed::Refused(_)));
        let any = crate::pattern::PatternSet::new(&["*".to_string()]).expect("a pattern");
        let version = Version {
            id: 1,
            hook: "h",
            patterns: &any,
        };
        assert!(q.try_pop(&version).is_some_and(|j| j.awaited()));
    }

    /// Issue 56: a job queued for a version that matched it is never started by a version that
    /// does not (a reload hands the queue over): a waiter is told why, otherwise it counts as
    /// dropped; the next job the version matches is returned.
    #[test]
    fn a_version_does_not_pop_what_it_does_not_match() {
        let stats = Arc::new(HookStats::default());
        let q = HookQueue::new(8, Overflow::DropOldest, stats.clone());
        let (awaited, rx) = job(true);
        let (fire, _) = job(false);
        let (mut other, _) = job(false);
        other.event = Arc::from("f");
        for j in [awaited, fire, other] {
            assert!(matches!(q.push(j), Pushed::Queued));
        }
        let only_f = crate::pattern::PatternSet::new(&["f".to_string()]).expect("a pattern");
        let version = Version {
            id: 1,
            hook: "h",
            patterns: &only_f,
        };
        let popped = q.try_pop(&version).expect("the job f matches");
        assert_eq!(&*popped.event, "f");
        let told = rx.expect("a waiter").try_recv().expect("told");
        assert_eq!(told.not_run, Some(NotRun::Unmatched));
        assert_eq!(stats.dropped.load(Ordering::Relaxed), 1);
    }

    /// Issue 56 (the nemesis's seed 17722090543346195135): jobs under an ordered hook's lease
    /// gate start in queue order, so the first one a reload's version does not match stops the
    /// queue for that lease: it is told `Unmatched`, the gate shuts, and the jobs behind it
    /// under the same gate are refused (the fleet worker hands them back in stream order),
    /// though the version matches them; a job under no gate is popped as before.
    #[test]
    fn an_unmatched_job_under_an_ordered_gate_stops_the_jobs_behind_it() {
        let q = HookQueue::new(8, Overflow::DropOldest, Arc::new(HookStats::default()));
        let until = crate::start_gate::monotonic_ns() + 60_000_000_000;
        let gate = Arc::new(crate::start_gate::StartGate::in_order(until));
        let mut waits = Vec::new();
        for event in ["b", "a", "a"] {
            let (mut j, rx) = job(true);
            j.event = Arc::from(event);
            j.gate = Some(gate.clone());
            waits.push(rx.expect("a waiter"));
            assert!(matches!(q.push(j), Pushed::Queued));
        }
        let (mut free, _) = job(false);
        free.event = Arc::from("a");
        assert!(matches!(q.push(free), Pushed::Queued));
        let only_a = crate::pattern::PatternSet::new(&["a".to_string()]).expect("a pattern");
        let version = Version {
            id: 1,
            hook: "h",
            patterns: &only_a,
        };
        let popped = q.try_pop(&version).expect("the job under no gate");
        assert!(popped.gate.is_none());
        assert!(gate.is_shut(), "the ordered gate shut at the unmatched job");
        let told: Vec<_> = waits
            .iter_mut()
            .map(|rx| rx.try_recv().expect("told").not_run)
            .collect();
        assert_eq!(
            told,
            [
                Some(NotRun::Unmatched),
                Some(NotRun::GateShut),
                Some(NotRun::GateShut)
            ]
        );
    }
}
