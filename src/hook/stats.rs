//! A hook's counters, worker state and duration histogram, shared across its versions; [`Tally`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

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

    pub(super) fn from_u8(v: u8) -> Self {
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
    /// Events dropped by the overflow policy, and collects dropped before they started because
    /// their caller gave up (deadline passed or went away).
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
    pub(super) drops_unlogged: AtomicU64,
    /// Milliseconds since the process [`epoch`] at the last drop log line.
    pub(super) last_drop_log_ms: AtomicU64,
    /// Events the workers of every version have taken from the queue and not settled (running,
    /// or written ahead to a Python worker's window): work a collect waits behind (issue 47).
    pub(super) in_flight: AtomicUsize,
    /// The sum, over those events, of the `timeout:` (in ms) of the version that took each: a
    /// running call keeps the budget of the version that runs it, also once a reload loaded a
    /// version with another timeout (issue 59 row 5).
    pub(super) in_flight_ms: AtomicU64,
    /// The last error, when, and `ok` at that moment (later successes supersede it).
    last_error: Mutex<Option<(SystemTime, String, u64)>>,
    /// When the first of the calls that failed since the last one that returned ended (none
    /// while the last call returned): how long the hook has been failing (issue 60).
    failing_since: Mutex<Option<SystemTime>>,
    /// The last hour by minute (issue 50): counters as the host's ticker saw them, and
    /// handler durations for percentiles.
    pub history: Mutex<super::history::History>,
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
        // A call that never ran (failed while waiting) has no duration worth a percentile.
        if !d.is_zero() {
            self.history
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .duration(SystemTime::now(), d);
        }
    }

    /// The counters as the history records them; `received`: the host's.
    pub fn totals(&self, received: u64) -> super::history::Totals {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        super::history::Totals {
            accepted: get(&self.accepted),
            ok: get(&self.ok),
            failed: get(&self.failed),
            timeouts: get(&self.timeouts),
            dropped: get(&self.dropped),
            received,
        }
    }

    /// Events taken from the queue by the hook's workers (all versions) and not settled yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Current worker state.
    pub fn status(&self) -> Status {
        Status::from_u8(self.status.load(Ordering::Relaxed))
    }

    pub(super) fn set_status(&self, s: Status) {
        self.status.store(s as u8, Ordering::Relaxed);
    }

    /// The most recent error and when it happened.
    pub fn last_error(&self) -> Option<(SystemTime, String)> {
        let last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref().map(|(t, m, _)| (*t, m.clone()))
    }

    /// Invocations that returned normally since the last error (0 without one): a stale error
    /// is one later successes superseded.
    pub fn ok_since_last_error(&self) -> u64 {
        let last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        let at = last.as_ref().map_or(u64::MAX, |(_, _, ok)| *ok);
        self.ok.load(Ordering::Relaxed).saturating_sub(at)
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

    /// Counts a call that returned: the hook is no longer failing.
    pub fn call_ok(&self) {
        self.ok.fetch_add(1, Ordering::Relaxed);
        *self.failing_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Counts a call that failed (or an event failed before its call started): the first of a
    /// run starts the time the hook has been failing.
    pub fn call_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.failing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(SystemTime::now);
    }

    /// When the hook's current run of failed calls began, if its last call failed.
    pub fn failing_since(&self) -> Option<SystemTime> {
        *self.failing_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an error as the hook's last one.
    pub fn set_last_error(&self, msg: String) {
        let msg = crate::text::cap(msg);
        let ok = self.ok.load(Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((SystemTime::now(), msg, ok));
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
