//! The other versions of this worker's hooks in the fleet (a rolling update: some workers have
//! a hook's old HOOK.yaml, others its new one), learnt from the workers' status messages, which
//! carry every loaded hook's identity and patterns (`WorkerStatus::patterns`).
//!
//! Used for two things:
//! - a hook's consumer filter covers the patterns of every live version, so the broker never
//!   passes over an event that only another version matches (nats-server ≥ 2.10: one filter
//!   subject per pattern, `filter_subjects`; 2.9 takes one filter subject, so a hook whose
//!   versions need several reads every event);
//! - what becomes of an event this worker's version does not run ([`Versions::fate`], the one
//!   place that decides it): handed on (counted `mismatched`; an ordered hook's lease holder
//!   hands the lease over) when another live version matches it; dead-lettered with the reason
//!   when a version that may still run somewhere matches it (this worker's own, replaced or
//!   being retired; a peer's being retired; a peer's that stopped or vanished within the
//!   consumer grace, whose worker may come back with it; a version changed after the event was
//!   accepted: retired versions are kept with the time they were last seen live, [`RETIRED`]
//!   per hook); skipped only with the proof that no version matches it ([`NoVersion`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;

use super::status::WorkerStatus;
use crate::pattern::PatternSet;

struct Peer {
    seen: Instant,
    /// `seen` by the clock events carry (their acceptance time).
    seen_at: SystemTime,
    interval: Duration,
    /// Identity -> (patterns, compiled).
    hooks: BTreeMap<String, (Vec<String>, Arc<PatternSet>)>,
    /// Identity -> (the highest stream sequence it still runs, since when): its versions
    /// being retired by a worker that stops ([`WorkerStatus::retiring`]).
    retiring: BTreeMap<String, (u64, SystemTime)>,
    /// Its `--ack-wait` (zero: not said).
    ack_wait: Duration,
    /// Its hooks are loaded ([`WorkerStatus::loaded`]): until then its versions are not
    /// known, and no event is proven nobody's.
    loaded: bool,
    /// Its worker id.
    worker: String,
}

impl Peer {
    /// Until when its version of `key` was live for new events: the start of its retirement
    /// if it is being retired, else `at`.
    fn live_until(&self, key: &str, at: SystemTime) -> SystemTime {
        self.retiring
            .get(key)
            .map_or(at, |(_, since)| (*since).min(at))
    }
}

/// How long an event's fate waits for a worker that is loading its hooks (a restart during a
/// rolling update: its version is on its disk, not yet in its status).
pub const LOADING: Duration = Duration::from_secs(10);

/// Retired versions kept per hook (the most recently seen).
pub const RETIRED: usize = 8;

/// A version of a hook no longer live (changed, removed, or its worker gone).
#[derive(Clone)]
struct Retired {
    patterns: Vec<String>,
    set: Arc<PatternSet>,
    worker: String,
    /// Until when it was live for new events, at the latest: the start of its retirement
    /// when it was retired (it ran only what was in the stream before), else its end.
    seen: SystemTime,
    /// When it stopped running at all (when that was learnt): an event accepted before then
    /// that it matched, during its retirement too, was owed by it.
    ended: SystemTime,
    /// Its worker stopped or vanished running it (rather than changing it while it went on
    /// running): the version may still be on that worker's disk and come back.
    gone: bool,
}

/// The proof that no version of a hook this worker knows of matches an event (live, retiring,
/// this worker's own, one whose worker stopped or vanished within the consumer grace, one
/// changed after the event was accepted): the only way an event a hook's consumer delivered is
/// acknowledged without a run or a dead letter ([`Versions::fate`] alone makes one).
pub struct NoVersion(());

/// What becomes of an event this worker's version of a hook does not run ([`Versions::fate`]).
pub enum Fate {
    /// Another live worker's version runs it.
    Elsewhere,
    /// A version that may run it is not live for it now: dead-lettered, with this reason.
    Owed(String),
    /// No version matches it.
    Nobody(NoVersion),
}

/// What the other live workers run, and the versions that were live before; cheap to clone.
#[derive(Clone, Default)]
pub struct Versions {
    peers: Arc<Mutex<HashMap<String, Peer>>>,
    since: Arc<Mutex<Option<Instant>>>,
    /// This worker's own versions (identity -> patterns).
    own: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    /// Identity -> retired versions, most recently seen last.
    retired: Arc<Mutex<HashMap<String, Vec<Retired>>>>,
    /// Identity -> when this worker began to retire its own version of it (a held change,
    /// [`Versions::retiring_own`]): live for new events until then.
    own_retiring: Arc<Mutex<HashMap<String, SystemTime>>>,
    /// Identity -> the patterns of this worker's next version of it, on disk and held until
    /// the running one ran what only it matches ([`Versions::holding_own`]).
    own_next: Arc<Mutex<HashMap<String, Arc<PatternSet>>>>,
}

/// Records `patterns` of hook `key`, run by `worker`, as live for new events until `seen` and
/// running until `ended`.
fn retire(
    retired: &mut HashMap<String, Vec<Retired>>,
    key: &str,
    patterns: &[String],
    worker: &str,
    (seen, ended): (SystemTime, SystemTime),
    gone: bool,
) {
    let Ok(set) = PatternSet::new(patterns) else {
        return;
    };
    let list = retired.entry(key.to_string()).or_default();
    list.retain(|r| r.patterns != patterns);
    list.push(Retired {
        patterns: patterns.to_vec(),
        set: Arc::new(set),
        worker: worker.to_string(),
        seen,
        ended: ended.max(seen),
        gone,
    });
    if list.len() > RETIRED {
        list.remove(0);
    }
}

impl Versions {
    /// Records a worker's status (`me`'s own is ignored).
    pub fn update(&self, me: &str, status: WorkerStatus) {
        if status.worker == me {
            return;
        }
        let Ok(mut peers) = self.peers.lock() else {
            return;
        };
        let hooks: BTreeMap<_, _> = if status.running {
            status
                .patterns
                .into_iter()
                .filter_map(|(id, p)| {
                    let set = PatternSet::new(&p).ok()?;
                    Some((id, (p, Arc::new(set))))
                })
                .collect()
        } else {
            BTreeMap::new()
        };
        // The versions this worker ran until now and no longer does (one it was retiring was
        // live for new events until its retirement began).
        let now = SystemTime::now();
        let before = peers.get(&status.worker);
        {
            let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
            if status.running {
                // Back (or still) running another version of a hook: the one it ran before was
                // changed, it does not come back with it. A hook it does not list (yet: a
                // restarted worker's first load is not done) keeps its versions gone: they may
                // still come back (the nemesis's seed 15933431368365335045: a worker's first
                // status after a restart, before its hooks loaded, made the events only its
                // old version matched look like nobody's). A gone version learnt changed only
                // now was on its worker's disk until now, as far as anyone knows: an event
                // accepted meanwhile that only it matched is owed a dead letter, not skipped
                // (the nemesis's seed 17722090543346195135 on 2.15: an event accepted after a
                // rolling update's drain ended, while the stopping worker still had the old
                // version, was skipped once that worker came back with the new one).
                for (key, list) in retired.iter_mut() {
                    let Some((running, _)) = hooks.get(key) else {
                        continue;
                    };
                    for r in list
                        .iter_mut()
                        .filter(|r| r.worker == status.worker && r.patterns != *running)
                    {
                        if r.gone {
                            r.ended = r.ended.max(now);
                        }
                        r.gone = false;
                    }
                }
            }
            if let Some(before) = before {
                for (key, (p, _)) in &before.hooks {
                    let until = before.live_until(key, now);
                    match hooks.get(key) {
                        Some((running, _)) if running == p => {}
                        // Changed while its worker goes on running.
                        Some(_) => {
                            retire(&mut retired, key, p, &status.worker, (until, now), false)
                        }
                        // Stopped, removed, or not loaded again yet: it may come back.
                        None => retire(&mut retired, key, p, &status.worker, (until, now), true),
                    }
                }
            }
        }
        let retiring = status
            .retiring
            .iter()
            .map(|(key, bound)| {
                let since = before
                    .and_then(|b| b.retiring.get(key))
                    .map_or(now, |(_, since)| *since);
                (key.clone(), (*bound, since))
            })
            .collect();
        if !status.running {
            peers.remove(&status.worker);
            return;
        }
        peers.insert(
            status.worker.clone(),
            Peer {
                seen: Instant::now(),
                seen_at: SystemTime::now(),
                interval: Duration::from_millis(status.interval_ms),
                hooks,
                retiring,
                ack_wait: Duration::from_millis(status.ack_wait_ms),
                loaded: status.loaded,
                worker: status.worker,
            },
        );
    }

    /// The longest `--ack-wait` of the live workers that have hook `key` (`None`: none said):
    /// the hook's consumer waits that long (issue 56 row 2: one rule, so workers that differ
    /// never rewrite it back and forth).
    pub fn longest_ack_wait(&self, key: &str) -> Option<Duration> {
        self.live(|peers| {
            peers
                .iter()
                .filter(|p| p.hooks.contains_key(key) && !p.ack_wait.is_zero())
                .map(|p| p.ack_wait)
                .max()
        })
    }

    fn live<T>(&self, f: impl FnOnce(Vec<&Peer>) -> T) -> T {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers.retain(|worker, p| {
            let alive = p.seen.elapsed() < p.interval * 3 + Duration::from_secs(1);
            if !alive {
                // Gone without a word (killed): live until its next status was due at most.
                let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
                for (key, (patterns, _)) in &p.hooks {
                    let ended = p.seen_at + p.interval;
                    let until = p.live_until(key, ended);
                    retire(&mut retired, key, patterns, worker, (until, ended), true);
                }
            }
            alive
        });
        f(peers.values().collect())
    }

    /// Records this worker's own versions (identity -> patterns): one it no longer runs is
    /// retired, live until now.
    pub fn set_own(&self, me: &str, now: BTreeMap<String, Vec<String>>) {
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        let mut since = self.own_retiring.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = self.own_next.lock().unwrap_or_else(|p| p.into_inner());
        for (key, p) in own.iter() {
            if now.get(key) != Some(p) {
                let ended = SystemTime::now();
                let until = since.remove(key).unwrap_or(ended);
                retire(&mut retired, key, p, me, (until, ended), false);
                next.remove(key);
            }
        }
        *own = now;
    }

    /// What the broker kept of the versions the workers ran ([`super::version_log`]), read
    /// as this worker starts: its own earlier versions count as replaced now (an event they
    /// matched that was accepted before is owed a run or a dead letter), a peer's as gone since
    /// its record's time (it may come back with it; a status it sends again says otherwise).
    pub fn seed(&self, me: &str, records: &[super::version_log::Record]) {
        let now = SystemTime::now();
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        for r in records {
            if r.worker == me {
                retire(&mut retired, &r.key, &r.patterns, me, (now, now), false);
            } else {
                let at = r.at();
                retire(&mut retired, &r.key, &r.patterns, &r.worker, (at, at), true);
            }
        }
    }

    /// This worker began to retire its own version of hook `key` (a change held until it ran
    /// what only it matches): once replaced, it counts as live for new events until now.
    pub fn retiring_own(&self, key: &str) {
        let mut since = self.own_retiring.lock().unwrap_or_else(|p| p.into_inner());
        since.entry(key.to_string()).or_insert_with(SystemTime::now);
    }

    /// This worker's retirement of its version of `key` was called off (the held change was
    /// reverted): the version stays live.
    pub fn not_retiring_own(&self, key: &str) {
        let mut since = self.own_retiring.lock().unwrap_or_else(|p| p.into_inner());
        since.remove(key);
        drop(since);
        let mut next = self.own_next.lock().unwrap_or_else(|p| p.into_inner());
        next.remove(key);
    }

    /// This worker's versions (identity -> patterns), as last recorded.
    pub fn own_versions(&self) -> BTreeMap<String, Vec<String>> {
        self.own.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This worker holds a change of hook `key` whose version has `patterns` (on disk, loaded
    /// once the running version ran what only it matches).
    pub fn holding_own(&self, key: &str, patterns: &[String]) {
        if let Ok(set) = PatternSet::new(patterns) {
            let mut next = self.own_next.lock().unwrap_or_else(|p| p.into_inner());
            next.insert(key.to_string(), Arc::new(set));
        }
    }

    /// Whether this worker's held next version of hook `key` matches `event`: an event that
    /// entered the stream during the hold is that version's too, not only the retiring one's
    /// (issue 56 row 4).
    pub fn next_matches(&self, key: &str, event: &str) -> bool {
        let next = self.own_next.lock().unwrap_or_else(|p| p.into_inner());
        next.get(key).is_some_and(|s| s.matches(event).is_some())
    }

    /// Whether every live worker's versions are known as of `accepted` (its last status came
    /// later): an event accepted after that may be for a version not heard of yet. Never before
    /// this worker listened long enough to have heard every live worker ([`Versions::settled`]):
    /// a worker that just started knows no peer, and no peer is not "every peer known" (the
    /// nemesis's seed 17722090543346195135: a restarted worker took an ordered hook's lease
    /// within a second and judged events for a live version nobody's).
    pub fn known_at(&self, accepted: SystemTime, own_interval: Duration) -> bool {
        self.settled(own_interval)
            && self.live(|peers| peers.iter().all(|p| p.loaded && p.seen_at > accepted))
    }

    /// A live worker whose hooks are not loaded yet (one that just started): what it will run
    /// is not known.
    fn loading(&self) -> Option<String> {
        self.live(|peers| peers.iter().find(|p| !p.loaded).map(|p| p.worker.clone()))
    }

    /// The longest a worker waits for [`Versions::known_at`]: the slowest status interval and
    /// a second.
    pub fn patience(&self, own_interval: Duration) -> Duration {
        let slowest = self.live(|peers| peers.iter().map(|p| p.interval).max());
        slowest.unwrap_or(own_interval).max(own_interval) + Duration::from_secs(1)
    }

    /// Waits (at most [`Versions::patience`], and until this worker has [`Versions::settled`])
    /// until every live worker's versions are known as of `accepted`.
    /// A worker still loading its hooks is waited for longer, up to [`LOADING`].
    pub async fn wait_known(&self, accepted: SystemTime, own_interval: Duration) {
        let began = Instant::now();
        while !self.known_at(accepted, own_interval) {
            if !self.undecided(began, own_interval) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether a decision waiting since `began` for the fleet's versions to be known
    /// ([`Versions::known_at`]) may wait longer: until this worker [`Versions::settled`], for
    /// [`Versions::patience`], and for a worker still loading its hooks up to [`LOADING`].
    pub fn undecided(&self, began: Instant, own_interval: Duration) -> bool {
        let now = Instant::now();
        !self.settled(own_interval)
            || now < began + self.patience(own_interval)
            || (now < began + LOADING && self.loading().is_some())
    }

    /// What becomes of `event` of hook `key` (at stream sequence `seq`, accepted at `accepted`)
    /// that this worker's running version does not run: it does not match it, or this worker
    /// retires its version and the event entered the stream after that began. The one place
    /// that decides whether such an event may leave the stream unrun (`horizon`: the consumer
    /// grace, how long a version whose worker stopped or vanished may come back).
    pub fn fate(
        &self,
        key: &str,
        event: &str,
        seq: Option<u64>,
        accepted: SystemTime,
        horizon: Duration,
    ) -> Fate {
        if self.other_matches(key, event, seq) {
            return Fate::Elsewhere;
        }
        if self.next_matches(key, event) {
            return Fate::Owed(format!(
                "this worker's next version of the hook, held until the running one ran what only it matches, matches {event:?}; the running version does not (a rolling update by reload)"
            ));
        }
        // This worker's version as last recorded: replaced by a reload its hook tasks have not
        // followed yet, or being retired.
        let own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = own.get(key)
            && PatternSet::new(p).is_ok_and(|set| set.matches(event).is_some())
        {
            return Fate::Owed(format!(
                "this worker's version of the hook, with events {p:?}, matches {event:?} but was replaced or is being retired (a rolling update); no live version that takes new events matches it"
            ));
        }
        drop(own);
        let retiring = self.live(|peers| {
            peers.iter().find_map(|p| {
                let (patterns, set) = p.hooks.get(key)?;
                (p.retiring.contains_key(key) && set.matches(event).is_some())
                    .then(|| patterns.clone())
            })
        });
        if let Some(p) = retiring {
            return Fate::Owed(format!(
                "the version of the hook with events {p:?}, which matches {event:?}, is being retired (a rolling update) and takes no new events; no other live version matches it"
            ));
        }
        let since = SystemTime::now()
            .checked_sub(horizon)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        let found = retired.get(key).and_then(|l| {
            l.iter().rev().find(|r| {
                r.set.matches(event).is_some()
                    && (r.ended >= accepted || (r.gone && r.ended >= since))
            })
        });
        match found {
            Some(r) if r.gone && r.ended < accepted => Fate::Owed(format!(
                "no live version of the hook matches {event:?}; the version with events {:?} matches it, but its worker {} stopped or vanished (last seen {}): it may come back with it, then `dead replay` runs this event",
                r.patterns,
                r.worker,
                crate::time::rfc3339(r.ended)
            )),
            // Accepted while it was being retired (the stream's later events were not its to
            // run): nobody took it since (the nemesis's seed 13663793569343371674 on 2.9: 25
            // events a retiring version alone matched were skipped once its worker came back
            // with another version).
            Some(r) if r.seen < accepted => Fate::Owed(format!(
                "no live version of the hook matches {event:?}; the version with events {:?} (worker {}) matched it, but was being retired when it was accepted (it took no new events from {} and ran until {}: a rolling update)",
                r.patterns,
                r.worker,
                crate::time::rfc3339(r.seen),
                crate::time::rfc3339(r.ended)
            )),
            Some(r) => Fate::Owed(format!(
                "no live version of the hook matches {event:?}; the version with events {:?} (worker {}), which matched it when it was accepted, is gone (live until {} at the latest: a rolling update)",
                r.patterns,
                r.worker,
                crate::time::rfc3339(r.seen)
            )),
            None => {
                drop(retired);
                match self.loading() {
                    // Its version is on its disk, not yet in its status: it may match.
                    Some(w) => Fate::Owed(format!(
                        "no version of the hook this worker knows of matches {event:?}, but worker {w} has not loaded its hooks yet (it just started): its version may match it, then `dead replay` runs this event"
                    )),
                    None => Fate::Nobody(NoVersion(())),
                }
            }
        }
    }

    /// The pattern lists of hook `key`'s versions retired within `horizon` (distinct): a
    /// consumer's filter keeps them that long, so that events they matched and nobody read
    /// yet are still delivered (and dead-lettered rather than passed over unseen).
    pub fn recently_retired(&self, key: &str, horizon: Duration) -> Vec<Vec<String>> {
        let retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        let since = SystemTime::now()
            .checked_sub(horizon)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut v: Vec<Vec<String>> = retired
            .get(key)
            .map(|l| {
                l.iter()
                    .filter(|r| r.ended >= since)
                    .map(|r| r.patterns.clone())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v.dedup();
        v
    }

    /// Whether another live worker's version of hook `key` matches `event` at stream sequence
    /// `seq` (a version being retired runs only what was in the stream when its retirement
    /// began; `None`: whatever the sequence).
    pub fn other_matches(&self, key: &str, event: &str, seq: Option<u64>) -> bool {
        self.live(|peers| {
            peers.iter().any(|p| {
                p.hooks
                    .get(key)
                    .is_some_and(|(_, set)| set.matches(event).is_some())
                    && p.retiring
                        .get(key)
                        .is_none_or(|(bound, _)| seq.is_none_or(|s| s <= *bound))
            })
        })
    }

    /// Whether this worker, stopping, must drain its version `mine` of hook `key` before it
    /// goes ([`super::worker`]'s retirement): another live worker runs another version of the
    /// hook (a rolling update) and none runs this one, so events only it matches would be
    /// dead-lettered.
    pub fn sole_version(&self, key: &str, mine: &[String]) -> bool {
        let others = self.others(key);
        !others.is_empty() && !others.iter().any(|o| o.as_slice() == mine)
    }

    /// The pattern lists of hook `key` on the other live workers (distinct, sorted).
    pub fn others(&self, key: &str) -> Vec<Vec<String>> {
        let mut v: Vec<Vec<String>> = self.live(|peers| {
            peers
                .iter()
                .filter_map(|p| p.hooks.get(key).map(|(p, _)| p.clone()))
                .collect()
        });
        v.sort();
        v.dedup();
        v
    }

    /// Whether this worker has listened long enough to know every live worker (three of the
    /// slowest status intervals): only then may a consumer's filter be narrowed.
    pub fn settled(&self, own_interval: Duration) -> bool {
        let started = *self
            .since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
        let slowest = self.live(|peers| {
            peers
                .iter()
                .map(|p| p.interval)
                .max()
                .unwrap_or(own_interval)
                .max(own_interval)
        });
        started.elapsed() >= slowest * 3 + Duration::from_secs(1)
    }
}

/// Follows every worker's status until the subscription ends.
pub async fn follow(client: async_nats::Client, subject: String, me: String, versions: Versions) {
    let _ = versions.settled(Duration::ZERO);
    let mut sub = match client.subscribe(subject.clone()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(
                "fleet: cannot subscribe to {subject}: {e}; other versions of the hooks are unknown to this worker"
            );
            return;
        }
    };
    while let Some(msg) = sub.next().await {
        if let Ok(s) = serde_json::from_slice::<WorkerStatus>(&msg.payload) {
            versions.update(&me, s);
        }
    }
}

/// The consumer filter subjects for a hook whose live versions have `versions` as patterns
/// (this worker's own first): one subject per pattern (exact names and `ns:*`), none covered
/// by another; every event (`<prefix>.ev.>`) as soon as one pattern is another glob, or, when
/// `multi` is false (nats-server 2.9: one filter per consumer), as soon as more than one
/// subject is needed.
pub fn filters(cfg: &super::FleetConfig, versions: &[Vec<String>], multi: bool) -> Vec<String> {
    let subjects = versions
        .iter()
        .flatten()
        .map(|p| cfg.hook_filter(std::slice::from_ref(p)))
        .collect();
    normalize(cfg, subjects, multi)
}

/// `config` with `filters` as its filter subject(s).
pub fn with_filters(
    mut config: async_nats::jetstream::consumer::pull::Config,
    filters: &[String],
) -> async_nats::jetstream::consumer::pull::Config {
    match filters {
        [one] => config.filter_subject = one.clone(),
        many => config.filter_subjects = many.to_vec(),
    }
    config
}

/// Updates consumer `name` of `stream`: the server's own config (read back as it stores it,
/// not through typed fields) with `changes` and `filters` applied.
pub async fn update_consumer(
    js: &async_nats::jetstream::Context,
    stream: &str,
    name: &str,
    changes: serde_json::Value,
    filters: &[String],
) -> Result<(), String> {
    use serde_json::Value;
    let info: Value = js
        .request(
            format!("CONSUMER.INFO.{stream}.{name}"),
            &serde_json::json!({}),
        )
        .await
        .map_err(|e| e.to_string())?;
    if let Some(e) = info.get("error") {
        return Err(e.to_string());
    }
    let mut config = info["config"].clone();
    let Value::Object(c) = &mut config else {
        return Err("no config in the consumer's info".into());
    };
    if let Value::Object(ch) = changes {
        c.extend(ch);
    }
    c.remove("filter_subject");
    c.remove("filter_subjects");
    match filters {
        [one] => c.insert("filter_subject".into(), one.clone().into()),
        many => c.insert("filter_subjects".into(), many.to_vec().into()),
    };
    let create = |config: &Value| {
        let body = serde_json::json!({"stream_name": stream, "config": config});
        async move {
            let answer: Value = js
                .request(format!("CONSUMER.CREATE.{stream}.{name}"), &body)
                .await
                .map_err(|e| (None, e.to_string()))?;
            match answer.get("error") {
                Some(e) => Err((e["err_code"].as_u64(), e.to_string())),
                None => Ok(()),
            }
        }
    };
    match create(&config).await {
        Ok(()) => Ok(()),
        // A consumer that starts at a time cannot be updated at all (the server compares the
        // start times as pointers): made again from the first event it has not acknowledged
        // (by sequence, which later updates keep). Events it had delivered and not yet
        // acknowledged come again as first deliveries.
        Err((Some(10012), _)) => {
            let floor = info["ack_floor"]["stream_seq"].as_u64().unwrap_or(0);
            // What the old consumer delivered above its floor comes again as first deliveries:
            // the new one says how far that goes ([`super::repeats`]).
            let top = info["delivered"]["stream_seq"].as_u64().unwrap_or(0);
            if let Value::Object(c) = &mut config {
                let old = c.get("description").and_then(Value::as_str);
                let base = super::repeats::unmarked(old).unwrap_or("").to_string();
                let top = if top > floor { top } else { 0 };
                let description = super::repeats::marked(&base, old, top);
                c.insert("description".into(), description.into());
                c.remove("opt_start_time");
                c.insert("deliver_policy".into(), "by_start_sequence".into());
                c.insert("opt_start_seq".into(), (floor + 1).into());
            }
            let _: Value = js
                .request(
                    format!("CONSUMER.DELETE.{stream}.{name}"),
                    &serde_json::json!({}),
                )
                .await
                .map_err(|e| e.to_string())?;
            tracing::info!(
                consumer = name,
                "fleet: consumer made again from sequence {} to change it (a consumer starting at a time cannot be updated)",
                floor + 1
            );
            create(&config).await.map_err(|(_, e)| e)
        }
        Err((_, e)) => Err(e),
    }
}

/// The filters to give an existing consumer that has `have`: `want`, widened by what it has
/// unless this worker has `settled` (heard from every live worker): another worker's version,
/// not yet heard of, may have set them.
pub fn update_filters(
    cfg: &super::FleetConfig,
    want: &[String],
    have: &async_nats::jetstream::consumer::Config,
    multi: bool,
    settled: bool,
) -> Vec<String> {
    let mut out = want.to_vec();
    if !settled {
        out.extend(super::identity::of_config(have));
    }
    normalize(cfg, out, multi)
}

/// Sorted, without duplicates or subjects another covers; one wide filter when needed.
fn normalize(cfg: &super::FleetConfig, mut subjects: Vec<String>, multi: bool) -> Vec<String> {
    let wide = cfg.events_filter();
    if subjects.iter().any(|s| s == &wide) {
        return vec![wide];
    }
    subjects.sort();
    subjects.dedup();
    let all = subjects.clone();
    subjects.retain(|s| !all.iter().any(|o| o != s && super::subject_matches(o, s)));
    if subjects.is_empty() || (!multi && subjects.len() > 1) {
        return vec![wide];
    }
    subjects
}

/// Whether the broker takes several filter subjects per consumer (nats-server ≥ 2.10).
pub fn multi_filter(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn status(
        worker: &str,
        running: bool,
        patterns: &[&str],
        retiring: Option<u64>,
    ) -> WorkerStatus {
        WorkerStatus {
            worker: worker.into(),
            host: "h".into(),
            pid: 1,
            interval_ms: 1000,
            time: String::new(),
            running,
            hooks: Vec::new(),
            patterns: BTreeMap::from([("k".to_string(), s(patterns))]),
            bundles: true,
            retiring: retiring
                .map(|b| BTreeMap::from([("k".to_string(), b)]))
                .unwrap_or_default(),
            ack_wait_ms: 0,
            loaded: true,
        }
    }

    fn owed(v: &Versions, event: &str, accepted: SystemTime) -> bool {
        matches!(
            v.fate("k", event, Some(1000), accepted, Duration::from_secs(600)),
            Fate::Owed(_)
        )
    }

    fn nobody(v: &Versions, event: &str, accepted: SystemTime) -> bool {
        matches!(
            v.fate("k", event, Some(1000), accepted, Duration::from_secs(600)),
            Fate::Nobody(_)
        )
    }

    /// Issue 48 row 2: a version its worker retires (stopping during a rolling update) matches
    /// only events up to its bound. Issue 56: an event it matches is never skipped while that
    /// version may still run somewhere (being retired, or its worker stopped within the grace).
    #[test]
    fn a_retiring_version_runs_only_what_was_in_the_stream_and_what_it_matches_is_never_skipped() {
        let v = Versions::default();
        v.update("me", status("old", true, &["roll:b"], None));
        assert!(v.other_matches("k", "roll:b", Some(500)));
        assert!(v.sole_version("k", &s(&["roll:c"])));
        assert!(
            !v.sole_version("k", &s(&["roll:b"])),
            "another worker runs it too"
        );
        v.update("me", status("old", true, &["roll:b"], Some(100)));
        assert!(v.other_matches("k", "roll:b", Some(100)));
        assert!(
            !v.other_matches("k", "roll:b", Some(101)),
            "entered after the stop"
        );
        assert!(v.other_matches("k", "roll:b", None));
        let now = SystemTime::now();
        assert!(
            owed(&v, "roll:b", now),
            "after the bound, while being retired: a dead letter, not a skip"
        );
        v.update("me", status("old", false, &[], None));
        assert!(!v.other_matches("k", "roll:b", Some(1)));
        let later = SystemTime::now() + Duration::from_secs(5);
        assert!(
            owed(&v, "roll:b", later),
            "its worker stopped: it may come back with it"
        );
        assert!(nobody(&v, "roll:x", later), "no version matches it");
        let stopped = SystemTime::now();
        std::thread::sleep(Duration::from_millis(20));
        v.update("me", status("old", true, &["roll:c"], None));
        assert!(
            owed(&v, "roll:b", stopped),
            "accepted while its worker was stopped with the old version on its disk: a dead \
             letter, though the worker came back with another"
        );
        assert!(
            nobody(&v, "roll:b", later),
            "back with another version: accepted after the change, no version matches it"
        );
        assert!(
            owed(&v, "roll:b", now),
            "accepted while the old version was being retired: a dead letter"
        );
        assert!(
            owed(&v, "roll:b", now - Duration::from_secs(5)),
            "accepted while the old version was live: a dead letter"
        );
    }

    /// Versions that knew `w1` running `[nem:a, nem:b]`, which then went without a word
    /// (its statuses stopped).
    fn vanished_w1() -> Versions {
        let v = Versions::default();
        let mut st = status("w1", true, &["nem:a", "nem:b"], None);
        st.interval_ms = 10;
        v.update("me", st);
        std::thread::sleep(Duration::from_millis(1100));
        assert!(!v.other_matches("k", "nem:b", None), "gone");
        v
    }

    /// Issue 56: a worker gone without a word (SIGKILL) keeps its version owed for the grace.
    #[test]
    fn a_vanished_workers_version_stays_owed_for_the_grace() {
        let v = vanished_w1();
        let later = SystemTime::now() + Duration::from_secs(1);
        assert!(owed(&v, "nem:b", later));
        assert!(matches!(
            v.fate("k", "nem:b", Some(1), later, Duration::ZERO),
            Fate::Nobody(_)
        ));
    }

    /// Issue 56 (the nemesis's seed 15933431368365335045): a vanished worker restarted with
    /// the same id says it runs before its hooks are loaded; until it lists the hook again its
    /// old version stays owed (the old code took that first status for a change, and the
    /// events only that version matched, accepted meanwhile, were skipped). Once it lists
    /// another version of the hook, the old one was changed: later events are nobody's.
    #[test]
    fn a_restarted_workers_first_status_is_no_change_of_its_versions() {
        let v = vanished_w1();
        let mut first = status("w1", true, &[], None);
        first.patterns.clear();
        first.loaded = false;
        v.update("me", first);
        let later = SystemTime::now() + Duration::from_secs(1);
        assert!(
            owed(&v, "nem:b", later),
            "not loaded again yet: the old version may come back"
        );
        assert!(
            owed(&v, "nem:x", later),
            "a worker loading its hooks: the version on its disk may match anything"
        );
        assert!(
            !v.known_at(later - Duration::from_secs(5), Duration::ZERO),
            "not known"
        );
        v.update("me", status("w1", true, &["nem:a", "nem:b"], None));
        assert!(v.other_matches("k", "nem:b", None), "back with it");
        assert!(nobody(&v, "nem:x", later), "loaded: nothing matches it");
        v.update("me", status("w1", true, &["nem:a", "nem:c"], None));
        let after = SystemTime::now() + Duration::from_secs(2);
        assert!(
            nobody(&v, "nem:b", after),
            "changed while running: accepted after the change, no version matches it"
        );
    }

    #[test]
    fn filters_cover_every_version_without_overlap() {
        let c = super::super::FleetConfig::new("nats://h:1");
        let f =
            |v: &[&[&str]], multi| filters(&c, &v.iter().map(|p| s(p)).collect::<Vec<_>>(), multi);
        assert_eq!(
            f(&[&["a:x", "b:*"]], true),
            ["hermes.ev.e.a.x", "hermes.ev.e.b.*"]
        );
        assert_eq!(f(&[&["a:x", "b:*"]], false), ["hermes.ev.>"]);
        assert_eq!(f(&[&["a:x"]], false), ["hermes.ev.e.a.x"]);
        assert_eq!(
            f(&[&["a:x", "b:y"], &["a:x", "b:y", "c:z"]], true),
            ["hermes.ev.e.a.x", "hermes.ev.e.b.y", "hermes.ev.e.c.z"]
        );
        assert_eq!(f(&[&["a:*", "a:x"]], true), ["hermes.ev.e.a.*"], "covered");
        assert_eq!(f(&[&["a:x"], &["*"]], true), ["hermes.ev.>"]);
        assert!(multi_filter("2.10.0"));
        assert!(multi_filter("v2.15.1"));
        assert!(!multi_filter("2.9.10"));
        assert!(!multi_filter(""));
    }
}
