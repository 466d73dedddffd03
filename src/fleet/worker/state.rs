//! What the parts of a fleet worker share: its options, its state ([`Shared`]), a hook's
//! consumer settings and task, its counters and the events it finished ([`Recent`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::fleet::FleetConfig;
use crate::fleet::status::FleetCounters;
use crate::fleet::versions::Versions;
use crate::host::Host;

/// A hook's change held back ([`Shared::holds`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Hold {
    /// Asked for by the reload; the drain begins at the worker's next look. Each hold has its
    /// own number ([`next_hold`]): a round that computed from one hold never writes over
    /// another that replaced it meanwhile (a revert, then the same change again).
    Pending(u64),
    /// Running what the stream held up to `bound` (a stream sequence), since `began`, when the
    /// consumer's acknowledgement floor was at `from` (for the log: how far the drain got).
    Draining {
        bound: u64,
        from: u64,
        began: tokio::time::Instant,
    },
    /// Done (or past the deadline): the next reload takes the change.
    Released,
    /// The change was reverted (or the hook removed) while held: nothing to load; the worker
    /// ends the drain's announcement at its next look.
    Cancelled,
}

/// The number of a new [`Hold::Pending`].
pub(super) fn next_hold() -> u64 {
    static HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    HOLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// [`WorkerOptions::retire_drain`] by default.
pub const RETIRE_DRAIN: Duration = Duration::from_secs(30);

/// Settings of a worker.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Worker id in the fleet view.
    pub id: String,
    /// The longest an event held by a worker that died waits before another worker runs it
    /// (failover time). The broker's own ack wait and the lease's time to live are a margin
    /// shorter ([`WorkerOptions::broker_wait`]), so the next worker's pull and start fit in it.
    pub ack_wait: Duration,
    /// Delay before the first retry; doubles per delivery, at most a minute.
    pub retry_backoff: Duration,
    /// Interval between status messages.
    pub status_interval: Duration,
    /// How long a removed hook's consumer is kept (a hook coming back, or other workers still
    /// serving it) before it is deleted.
    pub consumer_grace: Duration,
    /// How long a stopping worker keeps running a version of a hook that no other live worker
    /// runs while another version is live (a rolling update), so that events only it matches
    /// run rather than being dead-lettered (zero: not at all).
    pub retire_drain: Duration,
}

impl WorkerOptions {
    /// The broker's ack wait and the ordered hooks' lease time to live: `ack_wait` less a
    /// tenth (at most a second) for the next worker to take over within `ack_wait`. An event
    /// comes back at most this long after its holder's last sign of life, and the lease runs
    /// out at most this long after its last renewal; what follows (the next worker's pull
    /// and its handler's start, 40-90 ms measured) fits in the margin.
    pub fn broker_wait(&self) -> Duration {
        crate::fleet::lease::broker_wait(self.ack_wait)
    }
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            id: format!("{}-{}", crate::fleet::host_name(), std::process::id()),
            ack_wait: Duration::from_secs(30),
            retry_backoff: Duration::from_secs(1),
            status_interval: Duration::from_secs(2),
            consumer_grace: Duration::from_secs(600),
            retire_drain: RETIRE_DRAIN,
        }
    }
}

/// Events this worker finished for a hook, at least the most recent `RECENT / 2` and at most
/// `RECENT`: a broker that crashed may have lost their acknowledgements and deliver them again
/// (as first deliveries). Each is known by its stream sequence and its message id together: a
/// broker back with an empty store reuses sequences for other events.
pub(super) const RECENT: usize = 65_536;

pub(super) type DoneKey = (u64, u64);

/// How many of the latest finished events' keys a holder's note carries to the next holder
/// ([`Recent::latest`]): at least a window of bundles' worth, what a consumer made again from an
/// older ack floor can deliver again.
pub(super) const LATEST: usize = 1024;

/// Two generations of keys: inserts go to `young`; when it holds half of [`RECENT`] it becomes
/// `old` (the previous `old` is dropped). No per-insert eviction and no tombstones to rehash.
#[derive(Default)]
pub(super) struct Recent {
    pub(super) young: std::collections::HashSet<DoneKey, KeyHash>,
    pub(super) old: std::collections::HashSet<DoneKey, KeyHash>,
    /// The [`LATEST`] keys inserted last, oldest first.
    pub(super) last: std::collections::VecDeque<DoneKey>,
}

/// Hashes a [`DoneKey`] by mixing its two words (the second is already a hash of the id).
#[derive(Default, Clone, Copy)]
pub(super) struct KeyHash;

impl std::hash::BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The key of a delivered message in [`Recent`].
pub(super) fn done_key(msg: &jetstream::Message, seq: u64) -> DoneKey {
    let id = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|v| v.as_str())
        .unwrap_or("");
    // FNV-1a over the message id.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (seq, h)
}

impl Recent {
    pub(super) fn insert(&mut self, key: DoneKey) {
        if self.old.contains(&key) || !self.young.insert(key) {
            return;
        }
        if self.last.len() >= LATEST {
            self.last.pop_front();
        }
        self.last.push_back(key);
        if self.young.len() >= RECENT / 2 {
            self.old = std::mem::take(&mut self.young);
            self.young.reserve(RECENT / 2);
        }
    }

    pub(super) fn contains(&self, key: &DoneKey) -> bool {
        self.young.contains(key) || self.old.contains(key)
    }

    /// The keys of the events finished last here, oldest first (at most [`LATEST`]).
    pub(super) fn latest(&self) -> impl Iterator<Item = &DoneKey> {
        self.last.iter()
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) done: Mutex<Recent>,
    /// Events whose handler call started here and is not settled yet ([`Started`]): the same
    /// event of a bundle handed back and delivered again waits for it (issue 34).
    pub(super) started: Mutex<std::collections::HashSet<DoneKey, KeyHash>>,
    pub(super) already_done: AtomicU64,
    pub(super) delivered: AtomicU64,
    /// Stream messages delivered (`delivered` counts their events: a bundle holds several).
    pub(super) messages: AtomicU64,
    pub(super) redelivered: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) dead: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) mismatched: AtomicU64,
    /// An ordered hook's event only another version matches: the lease holder hands over.
    pub(super) handover: tokio::sync::Notify,
    /// First deliveries replayed by a broker that lost consumer state ([`crate::fleet::replayed`]).
    pub(super) high: crate::fleet::replayed::HighWater,
    pub(super) duplicate: AtomicU64,
}

/// An event's handler call in flight (in [`Counters::started`] until dropped).
pub(super) struct Started {
    counters: Arc<Counters>,
    key: DoneKey,
}

impl Started {
    pub(super) fn new(counters: &Arc<Counters>, key: DoneKey) -> Self {
        if let Ok(mut s) = counters.started.lock() {
            s.insert(key);
        }
        Self {
            counters: counters.clone(),
            key,
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(mut s) = self.counters.started.lock() {
            s.remove(&self.key);
        }
    }
}

impl Counters {
    /// Whether the event `key` runs here now (a call started and not settled).
    pub(super) fn running(&self, key: &DoneKey) -> bool {
        self.started.lock().is_ok_and(|s| s.contains(key))
    }

    /// `messages` of the stream in events: times the events per message this worker was
    /// delivered (exact while each event goes alone; an estimate with bundles).
    pub(super) fn events(&self, messages: u64) -> u64 {
        let events = self.delivered.load(Ordering::Relaxed);
        let delivered = self.messages.load(Ordering::Relaxed);
        if delivered == 0 || events <= delivered {
            return messages;
        }
        (messages as f64 * events as f64 / delivered as f64).round() as u64
    }

    pub(super) fn snapshot(&self) -> FleetCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FleetCounters {
            delivered: g(&self.delivered),
            redelivered: g(&self.redelivered),
            acked: g(&self.acked),
            retried: g(&self.retried),
            dead: g(&self.dead),
            skipped: g(&self.skipped),
            mismatched: g(&self.mismatched),
            already_done: g(&self.already_done),
            duplicate: g(&self.duplicate),
        }
    }
}

/// What a hook's consumer is configured from; a change restarts the hook's consumer task.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Settings {
    pub(super) name: String,
    /// The hook's identity ([`crate::fleet::identity`]): names its consumer and lease.
    pub(super) key: String,
    pub(super) timeout: Duration,
    pub(super) max_deliver: i64,
    pub(super) concurrency: u32,
    /// Events this worker may hold for the hook at once (the consumer's `max_ack_pending`):
    /// `concurrency` for a hook that runs several at once, up to [`WINDOW`] (and half its local
    /// queue) for an ordered hook, whose one active puller (the lease holder) feeds them in
    /// stream order into the hook's local queue.
    pub(super) window: u32,
    /// When the hook appeared: the start of a consumer created for it.
    pub(super) since: std::time::SystemTime,
    /// The consumer's filter subjects: this version's and every other live version's patterns
    /// ([`crate::fleet::versions::filters`]).
    pub(super) filters: Vec<String>,
    /// This version's own filter subjects (an event outside them was routed for another).
    pub(super) own: Vec<String>,
}

impl Settings {
    pub(super) fn ordered(&self) -> bool {
        self.concurrency <= 1
    }
}

/// Most events in flight for an ordered hook.
pub const WINDOW: u32 = 512;

pub(super) struct HookTask {
    pub(super) settings: Settings,
    pub(super) stop: watch::Sender<bool>,
    pub(super) consume: JoinHandle<()>,
    pub(super) collect: JoinHandle<()>,
    pub(super) consumer: Arc<Mutex<Option<jetstream::consumer::PullConsumer>>>,
    pub(super) counters: Arc<Counters>,
    /// The hook's name, for a rename that keeps its identity ([`Run::renamed`]).
    pub(super) rename: watch::Sender<String>,
    /// Set when this worker, stopping, retires the hook's version: the highest stream
    /// sequence it still runs (0: not retiring; [`super::tasks`]).
    pub(super) retiring: Arc<AtomicU64>,
}

pub(super) struct Shared {
    /// Each hook's counters, for `/metrics` (kept across a hook's restarts).
    pub(super) counters: Mutex<HashMap<String, Arc<Counters>>>,
    pub(super) host: Host,
    pub(super) cfg: FleetConfig,
    pub(super) opts: WorkerOptions,
    pub(super) client: async_nats::Client,
    pub(super) js: jetstream::Context,
    /// The other live versions of the hooks.
    pub(super) versions: Versions,
    /// The broker takes several filter subjects per consumer (nats-server ≥ 2.10).
    pub(super) multi: std::sync::atomic::AtomicBool,
    /// Stopping: when the service stops waiting for the events in flight.
    pub(super) stop_by: Mutex<Option<tokio::time::Instant>>,
    /// Stopping with versions to retire ([`super::tasks`]): the latest the retirement and the
    /// drain after it may end (the stop waits for the worker that long, not longer).
    pub(super) retire_until: Mutex<Option<tokio::time::Instant>>,
    /// Hooks (by identity) whose change on disk the host holds while their running version
    /// runs what only it matches ([`super::tasks`], issue 48).
    pub(super) holds: Mutex<HashMap<String, Hold>>,
    /// When the broker connection was last lost (monotonic ns; 0: never).
    pub(super) lost: Arc<std::sync::atomic::AtomicU64>,
    /// Hooks (by identity) whose consumer's ack wait differs from this worker's, said once.
    pub(super) said_ack_wait: Mutex<std::collections::HashSet<String>>,
}

pub(super) struct AbortOnDrop(pub(super) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An ordered hook's holder's marks of what it starts on a last allowed delivery
/// (`marks.rs`).
#[derive(Default)]
pub(super) struct Marks {
    pub(super) store: Option<async_nats::jetstream::kv::Store>,
    /// The span last written (`None`: none is in the bucket).
    pub(super) span: Option<crate::fleet::attempts::Span>,
    /// Events started here on their last allowed delivery and not finished.
    pub(super) unfinished: Arc<Mutex<std::collections::BTreeSet<crate::fleet::attempts::Pos>>>,
    /// How many events the next mark reaches over, and when the last was written.
    pub(super) ahead: usize,
    pub(super) written: Option<std::time::Instant>,
    /// The last such event's position, and the stream sequences between two of the hook's
    /// events on average (a mark reaches past what the backlog holds by that much).
    pub(super) last: Option<crate::fleet::attempts::Pos>,
    pub(super) gap: f64,
    /// The bucket could not be written (said once).
    pub(super) warned: bool,
    /// When the bucket last could not be made or opened: not tried again for a while (a
    /// broker that refuses it would otherwise cost every such start a round trip).
    pub(super) failed: Option<std::time::Instant>,
}

/// Keeps an event among those started and not finished while its call lives.
pub(super) struct Unfinished {
    pub(super) set: Arc<Mutex<std::collections::BTreeSet<crate::fleet::attempts::Pos>>>,
    pub(super) pos: crate::fleet::attempts::Pos,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Ok(mut s) = self.set.lock() {
            s.remove(&self.pos);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_keeps_at_least_half_its_size_of_the_latest_keys() {
        let mut r = Recent::default();
        let n = RECENT as u64 * 2 + 17;
        for seq in 1..=n {
            r.insert((seq, seq.wrapping_mul(31)));
        }
        // The latest RECENT / 2 are always there; the oldest are gone.
        for seq in n - RECENT as u64 / 2 + 1..=n {
            assert!(r.contains(&(seq, seq.wrapping_mul(31))), "{seq} forgotten");
        }
        assert!(!r.contains(&(1, 31)));
        assert!(r.young.len() + r.old.len() <= RECENT);
        // The same sequence with another id (a broker that lost its store) is not done.
        assert!(!r.contains(&(n, 0)));
        // Inserting a known key again changes nothing.
        let before = r.young.len();
        r.insert((n, n.wrapping_mul(31)));
        assert_eq!(r.young.len(), before);
    }
}
