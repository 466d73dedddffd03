//! When work may still start under a lease (issue 48): a fleet worker holding an ordered hook's
//! lease hands each event to the host with a [`StartGate`], and nothing starts it, acknowledges
//! it or hands it back once the gate says the lease may be another worker's.
//!
//! The bound is the system's monotonic clock (`CLOCK_MONOTONIC`, which goes on while a process
//! is stopped with SIGSTOP or starved of CPU): the lease is this worker's at least until the
//! moment its last successful renewal was *sent* plus the lease's time to live (the broker wrote
//! it later and expires it no sooner), less a margin. A worker that wakes past that bound
//! cannot tell whether another worker took over while it slept, so the gate shuts for good on
//! the first look past it, whatever the next renewal says: the holder stands down, and only
//! then looks at the lease again (with a new gate).
//!
//! The same clock is read by Python's `time.monotonic_ns()`: a Python worker is told each
//! call's bound (`start_by`, with the gate's `epoch`) and refuses to start a call past it, and
//! every later call of that epoch (the Python handler's runner), since a process stopped with
//! the service has calls in its pipe that it would otherwise run on waking.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Nanoseconds on `CLOCK_MONOTONIC` (the clock Python's `time.monotonic_ns()` reads on Linux).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Whether work under `gate` may start now: no gate (not fleet work), or one still open. Every
/// handler kind asks this at the last moment before its handler starts (a process forked, a
/// library called, a request sent, a Python call begun: the Python runner asks its own copy
/// of the bound), not only when the job leaves the hook's queue (issue 56 row 8).
pub fn may_start(gate: Option<&StartGate>) -> bool {
    gate.is_none_or(StartGate::open)
}

/// Where [`StartGate`] epochs come from (one per lease holding in this process).
static EPOCHS: AtomicU64 = AtomicU64::new(1);

/// One lease holding's bound on starting work (see the module comment).
#[derive(Debug)]
pub struct StartGate {
    /// Until when (monotonic ns) the lease is surely this worker's.
    until: AtomicU64,
    /// Shut for good (lease lost, a look past the bound, a process that refused a call).
    shut: AtomicBool,
    /// Told to Python workers with each call: their refusal holds for every later call of it.
    epoch: AtomicU64,
    /// Wakes whoever waits for the gate to shut.
    shut_notify: tokio::sync::Notify,
    /// The connection that delivered the work ([`StartGate::linked`]): when it was last lost
    /// (monotonic ns), and that moment as the gate was made.
    link: Option<(Arc<AtomicU64>, u64)>,
    /// The work under it starts in the order it was queued ([`StartGate::in_order`]).
    ordered: bool,
}

impl StartGate {
    /// A gate open until `until_ns` (monotonic ns, [`monotonic_ns`]).
    pub fn new(until_ns: u64) -> Self {
        Self {
            until: AtomicU64::new(until_ns),
            shut: AtomicBool::new(false),
            epoch: AtomicU64::new(EPOCHS.fetch_add(1, Ordering::Relaxed)),
            shut_notify: tokio::sync::Notify::new(),
            link: None,
            ordered: false,
        }
    }

    /// A gate open until `until_ns` for work that must start in the order it was queued (an
    /// ordered hook's lease): a job under it that the hook's version popping the queue does
    /// not match (a reload changed it) shuts it, so that nothing queued after that job starts
    /// before the job's own fate is decided (the hook's queue; the fleet worker gives it
    /// back and hands the lease over in stream order).
    pub fn in_order(until_ns: u64) -> Self {
        Self {
            ordered: true,
            ..Self::new(until_ns)
        }
    }

    /// Whether work under it starts in the order it was queued ([`StartGate::in_order`]).
    pub fn ordered(&self) -> bool {
        self.ordered
    }

    /// A gate open until `until_ns` that also shuts for good once the connection that
    /// delivered the work is lost (`lost`: when it was last lost, monotonic ns): a broker that
    /// restarts may have rolled back its record of the delivery and send the work to another
    /// worker as new (issue 56).
    pub fn linked(until_ns: u64, lost: Arc<AtomicU64>) -> Self {
        let at = lost.load(Ordering::SeqCst);
        Self {
            link: Some((lost, at)),
            ..Self::new(until_ns)
        }
    }

    /// The bound after a renewal sent at `sent_ns` for a lease living `ttl`, less `margin`.
    pub fn bound(sent_ns: u64, ttl: Duration, margin: Duration) -> u64 {
        let live = ttl.saturating_sub(margin).as_nanos() as u64;
        sent_ns.saturating_add(live)
    }

    /// A renewal succeeded: the bound moves to `until_ns` (never back, never once shut).
    pub fn extend(&self, until_ns: u64) {
        if !self.is_shut() {
            self.until.fetch_max(until_ns, Ordering::SeqCst);
        }
    }

    /// Moves the bound to `until_ns` only while the gate is open (a look past the old bound
    /// shuts it first): for a bound whose lapse, even unseen, may have let another worker in.
    pub fn renew(&self, until_ns: u64) {
        if self.open() {
            self.until.fetch_max(until_ns, Ordering::SeqCst);
        }
    }

    /// Shuts the gate for good.
    pub fn shut(&self) {
        if !self.shut.swap(true, Ordering::SeqCst) {
            self.shut_notify.notify_waiters();
        }
    }

    /// Whether the gate was shut.
    pub fn is_shut(&self) -> bool {
        self.shut.load(Ordering::SeqCst)
    }

    /// Whether work may start now: not shut and within the bound. A look past the bound shuts
    /// the gate (a renewal that lands later does not open it again).
    pub fn open(&self) -> bool {
        if self.is_shut() {
            return false;
        }
        let lost = self
            .link
            .as_ref()
            .is_some_and(|(l, at)| l.load(Ordering::SeqCst) != *at);
        if lost || monotonic_ns() >= self.until.load(Ordering::SeqCst) {
            self.shut();
            return false;
        }
        true
    }

    /// Whether the lease is surely still this worker's (within the bound), shut or not: what
    /// it delivered may still be acknowledged or handed back (no other worker can hold those
    /// deliveries yet).
    pub fn within_bound(&self) -> bool {
        monotonic_ns() < self.until.load(Ordering::SeqCst)
    }

    /// The bound a Python worker is told with each call (monotonic ns).
    pub fn start_by(&self) -> u64 {
        self.until.load(Ordering::SeqCst)
    }

    /// The epoch calls are written with now.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// A new epoch for the calls written from now on: a Python worker refused calls of the
    /// current one that only waited in its pipe past their bound (the lease is still this
    /// worker's), and they are written again behind the refused rest.
    pub fn next_epoch(&self) {
        self.epoch
            .store(EPOCHS.fetch_add(1, Ordering::Relaxed), Ordering::SeqCst);
    }

    /// Resolves once the gate is shut, or its bound passed (which shuts it).
    pub async fn closed(&self) {
        loop {
            let notified = self.shut_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.open() {
                return;
            }
            let left = self
                .until
                .load(Ordering::SeqCst)
                .saturating_sub(monotonic_ns());
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_nanos(left)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_shuts_for_good_once_looked_at_past_its_bound() {
        let now = monotonic_ns();
        let g = StartGate::new(now + 60_000_000_000);
        assert!(g.open() && g.within_bound());
        let past = StartGate::new(now.saturating_sub(1));
        assert!(!past.open());
        past.extend(now + 60_000_000_000);
        assert!(!past.open(), "a renewal after the look does not reopen it");
        assert!(past.is_shut());
        g.shut();
        assert!(!g.open() && g.within_bound());
        assert_ne!(g.epoch(), past.epoch());
    }

    #[test]
    fn the_bound_is_the_renewal_sent_plus_the_ttl_less_the_margin() {
        let b = StartGate::bound(1_000, Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(b, 1_000 + 4_000_000_000);
        assert_eq!(
            StartGate::bound(7, Duration::from_secs(1), Duration::from_secs(2)),
            7
        );
    }

    #[test]
    fn a_renewal_never_opens_a_bound_that_lapsed_unseen() {
        let now = monotonic_ns();
        let lapsed = StartGate::new(now.saturating_sub(1));
        lapsed.renew(now + 60_000_000_000);
        assert!(!lapsed.open(), "nobody looked, yet the lapse stands");
        let live = StartGate::new(now + 60_000_000_000);
        live.renew(now + 120_000_000_000);
        assert_eq!(live.start_by(), now + 120_000_000_000);
        assert!(may_start(None) && may_start(Some(&live)) && !may_start(Some(&lapsed)));
    }

    #[tokio::test]
    async fn closed_resolves_when_the_bound_passes() {
        let g = StartGate::new(monotonic_ns() + 30_000_000);
        tokio::time::timeout(Duration::from_secs(5), g.closed())
            .await
            .expect("closed by its bound");
        assert!(g.is_shut());
    }
}
