//! The fleet view: workers publish their status (hooks, counters, lag, last errors) on
//! `<prefix>.status.<worker>` at a fixed interval; the edge keeps the latest of each, forgets a
//! worker that has been silent for three intervals (its hooks no other worker serves stay in the
//! view as served by no worker, so collect answers name them), and shows the whole fleet in
//! `/v1/hooks` and `list --live`. The edge also matches events against the fleet's hooks from this view (for
//! collect, and the `queued` count).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::pattern::{MatchKind, PatternSet};

/// Fleet counters of one hook on one worker.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FleetCounters {
    /// Events received from the stream (for this hook's consumer; a bundle's each).
    pub delivered: u64,
    /// Redeliveries among them (delivered more than once).
    pub redelivered: u64,
    /// Handled and acknowledged.
    pub acked: u64,
    /// Failed and handed back for a retry.
    pub retried: u64,
    /// Published to the dead-letter subject.
    pub dead: u64,
    /// Not for this hook (no pattern matches, or a replay for another hook): acknowledged.
    pub skipped: u64,
    /// Routed here by a consumer filter another version of the hook set, not matched by this
    /// worker's version: handed back for another worker (dead-lettered on the last delivery).
    #[serde(default)]
    pub mismatched: u64,
    /// Delivered again after this worker had finished them (a broker crash lost the
    /// acknowledgement): acknowledged again without running the handler.
    #[serde(default)]
    pub already_done: u64,
    /// First deliveries of events the hook's consumer had delivered before (a broker that
    /// crashed lost consumer state and replayed them); those this worker had finished are
    /// also in `already_done` (not run again), the others ran again.
    #[serde(default)]
    pub duplicate: u64,
}

/// One hook in a worker's status.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HookStatus {
    /// Hook name.
    pub name: String,
    /// `events:` patterns.
    pub events: Vec<String>,
    /// Handler kind.
    pub kind: String,
    /// Local worker state (`idle`, `running`, ...).
    pub status: String,
    /// Timeout per invocation, seconds.
    pub timeout_s: f64,
    /// Deliveries before the dead-letter subject.
    pub max_deliver: i64,
    /// Events in flight at once across the fleet.
    pub concurrency: i64,
    /// Events in the stream not yet handled by this hook (pending + unacknowledged), when known.
    pub lag: Option<u64>,
    /// The local counters (ok, failed, timeouts, ...), as `/v1/hooks` shows them.
    pub counters: Value,
    /// Fleet counters.
    pub fleet: FleetCounters,
    /// Last error, if any.
    pub last_error: Option<Value>,
}

/// A worker's status message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Worker id.
    pub worker: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Interval between status messages, ms.
    pub interval_ms: u64,
    /// RFC 3339 time of this message.
    pub time: String,
    /// False in the last message of a worker that is stopping.
    pub running: bool,
    /// Its hooks.
    pub hooks: Vec<HookStatus>,
    /// Every hook it has loaded, by identity, with its patterns (also before its consumer
    /// exists): what the other workers know of this version ([`super::versions`]).
    #[serde(default)]
    pub patterns: BTreeMap<String, Vec<String>>,
    /// It reads bundles (several events in one stream message, [`super::envelope`]); absent
    /// in an older worker's status.
    #[serde(default)]
    pub bundles: bool,
    /// The hooks (by identity) whose version this worker is retiring as it stops: each still
    /// runs the events up to this stream sequence (what was in the stream when the retirement
    /// began) that no other version matches, for up to `--retire-drain` (issue 48).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retiring: BTreeMap<String, u64>,
    /// Its `--ack-wait`, ms (0: an older worker's status): a hook's consumer waits the longest
    /// of the live workers' (issue 56 row 2, [`super::versions::Versions::longest_ack_wait`]).
    #[serde(default)]
    pub ack_wait_ms: u64,
    /// Its hooks are loaded and each has its place in the fleet (false in the statuses of a
    /// worker that just started): until then the others do not take its `patterns` for what
    /// it runs (issue 56: an event only its version on disk matched was skipped). Absent in an
    /// older worker's status: taken as loaded.
    #[serde(default = "loaded_unsaid")]
    pub loaded: bool,
}

fn loaded_unsaid() -> bool {
    true
}

struct Entry {
    seen: Instant,
    status: WorkerStatus,
}

/// A hook of the fleet with its compiled patterns, for matching at the edge.
struct FleetHook {
    name: String,
    patterns: PatternSet,
    /// It runs several events at once (`concurrency` above 1): bundling its events would put
    /// a bundle's on one worker and let each worker holding one run `concurrency` of them
    /// (the limit is per message in flight), so they go alone.
    spread: bool,
}

#[derive(Default)]
struct ViewState {
    workers: BTreeMap<String, Entry>,
    /// Hooks no live worker serves any more because their workers died or stopped (not because
    /// a live worker dropped them): their patterns and when the last worker went. They still
    /// match (their consumers keep the events; collect names them with an error) for
    /// [`GONE_KEPT`].
    gone: BTreeMap<String, (Vec<String>, Instant)>,
    /// Whether each hook in the view ran several events at once when a worker last reported it
    /// (a gone hook keeps its last value).
    concurrent: HashMap<String, bool>,
    /// Compiled hooks, rebuilt when the set of (hook, patterns) changes.
    hooks: Vec<FleetHook>,
    key: Vec<(String, Vec<String>, bool)>,
    /// [`FleetView::route`]'s answers per event name, for the compiled hooks as they are.
    matches: HashMap<String, (Vec<String>, bool)>,
    /// When silent workers were last looked for by [`FleetView::matching`].
    checked: Option<Instant>,
}

/// Most event names whose matching hooks the view remembers.
const MATCHES_KEPT: usize = 1024;

/// How often [`FleetView::matching`] looks for silent workers (not on every event: an edge
/// takes tens of thousands a second).
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How long a hook whose workers all went stays in the view.
pub const GONE_KEPT: Duration = Duration::from_secs(24 * 3600);

/// The edge's view of the fleet.
#[derive(Clone, Default)]
pub struct FleetView {
    state: Arc<Mutex<ViewState>>,
}

impl FleetView {
    /// Records a status message.
    pub fn update(&self, status: WorkerStatus) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        for h in &status.hooks {
            st.gone.remove(&h.name);
            st.concurrent.insert(h.name.clone(), h.concurrency > 1);
        }
        if status.running {
            // Hooks a live worker dropped were removed there: not "gone", just out of the view
            // (unless another worker serves them).
            st.workers.insert(
                status.worker.clone(),
                Entry {
                    seen: Instant::now(),
                    status,
                },
            );
        } else if let Some(e) = st.workers.remove(&status.worker) {
            Self::leave(&mut st, e);
        }
        Self::expire(&mut st);
        Self::recompile(&mut st);
    }

    /// A worker left (stopped or silent): its hooks that no other worker serves become gone.
    fn leave(st: &mut ViewState, e: Entry) {
        for h in e.status.hooks {
            let served = st
                .workers
                .values()
                .any(|w| w.status.hooks.iter().any(|o| o.name == h.name));
            if !served {
                st.gone.insert(h.name, (h.events, Instant::now()));
            }
        }
    }

    fn expire(st: &mut ViewState) {
        let silent = |e: &Entry| {
            let limit = Duration::from_millis(e.status.interval_ms.saturating_mul(3) + 1000);
            e.seen.elapsed() >= limit
        };
        let left: Vec<String> = st
            .workers
            .iter()
            .filter(|(_, e)| silent(e))
            .map(|(k, _)| k.clone())
            .collect();
        for k in left {
            if let Some(e) = st.workers.remove(&k) {
                Self::leave(st, e);
            }
        }
        st.gone.retain(|_, (_, t)| t.elapsed() < GONE_KEPT);
    }

    fn recompile(st: &mut ViewState) {
        let mut key: Vec<(String, Vec<String>, bool)> = st
            .workers
            .values()
            .flat_map(|e| e.status.hooks.iter())
            .map(|h| (h.name.clone(), h.events.clone(), false))
            .chain(
                st.gone
                    .iter()
                    .map(|(n, (ev, _))| (n.clone(), ev.clone(), false)),
            )
            .collect();
        key.sort();
        key.dedup_by(|a, b| a.0 == b.0);
        for (name, _, spread) in &mut key {
            let mut serving = st
                .workers
                .values()
                .filter_map(|w| w.status.hooks.iter().find(|h| h.name == *name))
                .peekable();
            *spread = if serving.peek().is_some() {
                serving.any(|h| h.concurrency > 1)
            } else {
                // Gone: as its workers last reported it.
                st.concurrent.get(name).copied().unwrap_or(false)
            };
        }
        st.concurrent
            .retain(|name, _| key.iter().any(|(n, _, _)| n == name));
        if key == st.key {
            return;
        }
        st.matches.clear();
        st.hooks = key
            .iter()
            .filter_map(|(name, events, spread)| {
                PatternSet::new(events).ok().map(|patterns| FleetHook {
                    name: name.clone(),
                    patterns,
                    spread: *spread,
                })
            })
            .collect();
        st.key = key;
    }

    /// The fleet's hooks matching `event`, in match order: exact matches first, then wildcard
    /// matches, each by hook name (the fleet has no single discovery order).
    pub fn matching(&self, event: &str) -> Vec<String> {
        self.route(event).0
    }

    /// How long a collect of an event matching `hooks` waits by default: for each hook, its
    /// `timeout:` once for each event its workers last reported not yet settled (`lag`: in the
    /// stream, queued, in a window or running; issue 47), once for a call that started since the
    /// report and once for this event, plus the answer's second ([`crate::decision::fleet_budget`]);
    /// the longest of these. `None` when no live worker reports any of them.
    pub fn collect_budget(&self, hooks: &[String]) -> Option<Duration> {
        let st = self.state.lock().ok()?;
        st.workers
            .values()
            .flat_map(|e| e.status.hooks.iter())
            .filter(|h| hooks.contains(&h.name))
            .filter(|h| h.timeout_s.is_finite() && h.timeout_s > 0.0)
            .map(|h| {
                crate::decision::fleet_budget(
                    Duration::from_secs_f64(h.timeout_s),
                    h.lag.unwrap_or(0),
                )
            })
            .max()
    }

    /// [`FleetView::matching`], and whether `event`s may go to the stream in bundles: every
    /// live worker reads them and no matching hook runs several events at once.
    pub fn route(&self, event: &str) -> (Vec<String>, bool) {
        let Ok(mut st) = self.state.lock() else {
            return (Vec::new(), false);
        };
        if st.checked.is_none_or(|t| t.elapsed() >= CHECK_EVERY) {
            Self::expire(&mut st);
            Self::recompile(&mut st);
            st.checked = Some(Instant::now());
        }
        if let Some((hit, unspread)) = st.matches.get(event) {
            return (hit.clone(), *unspread && Self::all_read_bundles(&st));
        }
        let mut exact = Vec::new();
        let mut wild = Vec::new();
        // Cached without the workers' capability (which changes with no recompile).
        let mut unspread = true;
        for h in &st.hooks {
            let kind = h.patterns.matches(event);
            match kind {
                Some(MatchKind::Exact) => exact.push(h.name.clone()),
                Some(_) => wild.push(h.name.clone()),
                None => {}
            }
            unspread &= kind.is_none() || !h.spread;
        }
        exact.extend(wild);
        if st.matches.len() < MATCHES_KEPT {
            st.matches
                .insert(event.to_string(), (exact.clone(), unspread));
        }
        (exact, unspread && Self::all_read_bundles(&st))
    }

    /// Whether there is a live worker and every live worker reads bundles (an older one would
    /// drop a bundle as unreadable).
    fn all_read_bundles(st: &ViewState) -> bool {
        !st.workers.is_empty() && st.workers.values().all(|w| w.status.bundles)
    }

    /// Number of live workers.
    #[cfg(test)]
    pub fn workers(&self) -> usize {
        self.state.lock().map(|s| s.workers.len()).unwrap_or(0)
    }

    /// The fleet's hooks as `/v1/hooks` shows them (one entry per hook, with the workers that
    /// serve it and its lag), and the workers.
    pub fn render(&self) -> (Vec<Value>, Vec<Value>) {
        let Ok(mut st) = self.state.lock() else {
            return (Vec::new(), Vec::new());
        };
        Self::expire(&mut st);
        let mut hooks: BTreeMap<String, Value> = BTreeMap::new();
        // Per hook: its workers, the fleet counters and the local counters, summed.
        type Sums = (Vec<String>, FleetCounters, BTreeMap<String, u64>);
        let mut sums: HashMap<String, Sums> = HashMap::new();
        let mut workers = Vec::new();
        for (id, e) in &st.workers {
            workers.push(json!({
                "worker": id,
                "host": e.status.host,
                "pid": e.status.pid,
                "last_seen_ms": e.seen.elapsed().as_millis() as u64,
                "hooks": e.status.hooks.iter().map(|h| h.name.clone()).collect::<Vec<_>>(),
            }));
            for h in &e.status.hooks {
                let entry = hooks.entry(h.name.clone()).or_insert_with(|| {
                    json!({
                        "name": h.name,
                        "description": "",
                        "events": h.events,
                        "kind": h.kind,
                        "path": "",
                        "root": format!("fleet:{id}"),
                        "status": h.status,
                        "timeout_s": h.timeout_s,
                        "max_deliver": h.max_deliver,
                        "concurrency": h.concurrency,
                        "lag": h.lag,
                        "last_error": h.last_error,
                    })
                });
                if h.status == "running" {
                    entry["status"] = json!("running");
                }
                if let (Some(l), Some(prev)) = (h.lag, entry["lag"].as_u64()) {
                    entry["lag"] = json!(l.max(prev));
                } else if h.lag.is_some() {
                    entry["lag"] = json!(h.lag);
                }
                if h.last_error.is_some() {
                    entry["last_error"] = h.last_error.clone().unwrap_or(Value::Null);
                }
                let s = sums.entry(h.name.clone()).or_default();
                s.0.push(id.clone());
                let f = &mut s.1;
                f.delivered += h.fleet.delivered;
                f.redelivered += h.fleet.redelivered;
                f.acked += h.fleet.acked;
                f.retried += h.fleet.retried;
                f.dead += h.fleet.dead;
                f.skipped += h.fleet.skipped;
                f.mismatched += h.fleet.mismatched;
                f.already_done += h.fleet.already_done;
                f.duplicate += h.fleet.duplicate;
                if let Value::Object(c) = &h.counters {
                    for (k, v) in c {
                        *s.2.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                    }
                }
            }
        }
        for (name, (events, since)) in &st.gone {
            hooks.entry(name.clone()).or_insert_with(|| {
                json!({
                    "name": name,
                    "description": "",
                    "events": events,
                    "kind": "",
                    "path": "",
                    "root": "fleet:",
                    "status": "no_worker",
                    "workers": [],
                    "no_worker_since_ms": since.elapsed().as_millis() as u64,
                    "last_error": {"message": "no worker of the fleet serves this hook (its workers stopped or died)"},
                })
            });
        }
        let hooks = hooks
            .into_iter()
            .map(|(name, mut v)| {
                if let Some((w, f, c)) = sums.remove(&name) {
                    v["workers"] = json!(w);
                    v["fleet"] = json!(f);
                    v["counters"] = json!(c);
                }
                v
            })
            .collect();
        (hooks, workers)
    }
}

/// Listens to every worker's status and feeds `view` until the subscription ends.
pub async fn follow(client: async_nats::Client, subject: String, view: FleetView) {
    use futures_util::StreamExt;
    let mut sub = match client.subscribe(subject.clone()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(
                "fleet: cannot subscribe to {subject}: {e}; the fleet view stays empty"
            );
            return;
        }
    };
    while let Some(msg) = sub.next().await {
        match serde_json::from_slice::<WorkerStatus>(&msg.payload) {
            Ok(s) => view.update(s),
            Err(e) => tracing::debug!("fleet: unreadable status on {}: {e}", msg.subject),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(name: &str, events: &[&str], lag: u64) -> HookStatus {
        HookStatus {
            name: name.into(),
            events: events.iter().map(|e| e.to_string()).collect(),
            kind: "python".into(),
            status: "idle".into(),
            timeout_s: 30.0,
            max_deliver: 4,
            concurrency: 1,
            lag: Some(lag),
            counters: json!({"ok": 1}),
            fleet: FleetCounters::default(),
            last_error: None,
        }
    }

    fn worker(id: &str, running: bool, hooks: Vec<HookStatus>) -> WorkerStatus {
        WorkerStatus {
            worker: id.into(),
            host: "h".into(),
            pid: 1,
            interval_ms: 1000,
            time: String::new(),
            running,
            hooks,
            patterns: BTreeMap::new(),
            bundles: true,
            retiring: BTreeMap::new(),
            ack_wait_ms: 0,
            loaded: true,
        }
    }

    /// Issue 47, row 2 in fleet mode: the edge's default collect deadline counts the events its
    /// workers report not settled (in the stream, queued, in a window, running) ahead of this
    /// one, not only one running call.
    #[test]
    fn the_fleet_budget_counts_what_the_workers_report_ahead() {
        let view = FleetView::default();
        let mut slow = hook("slow", &["agent:start"], 200);
        slow.timeout_s = 1.0;
        view.update(worker(
            "w1",
            true,
            vec![slow, hook("idle", &["agent:*"], 0)],
        ));
        let budget = view.collect_budget(&["slow".into()]).unwrap();
        assert_eq!(
            budget,
            Duration::from_secs(203),
            "200 ahead, 1 since, this one, 1 s"
        );
        let idle = view.collect_budget(&["idle".into()]).unwrap();
        assert_eq!(idle, Duration::from_secs(61));
        assert_eq!(view.collect_budget(&["nobody".into()]), None);
    }

    #[test]
    fn matching_is_exact_first_then_wildcard_by_name_and_hooks_merge_across_workers() {
        let view = FleetView::default();
        view.update(worker(
            "w1",
            true,
            vec![
                hook("zeta", &["agent:start"], 2),
                hook("alpha", &["agent:*"], 1),
            ],
        ));
        view.update(worker(
            "w2",
            true,
            vec![hook("beta", &["*"], 0), hook("zeta", &["agent:start"], 5)],
        ));
        assert_eq!(view.matching("agent:start"), ["zeta", "alpha", "beta"]);
        assert_eq!(view.matching("session:start"), ["beta"]);
        let (hooks, workers) = view.render();
        assert_eq!(workers.len(), 2);
        let zeta = hooks.iter().find(|h| h["name"] == "zeta").unwrap();
        assert_eq!(zeta["workers"], json!(["w1", "w2"]));
        assert_eq!(zeta["lag"], 5, "the largest lag reported");
        assert_eq!(zeta["counters"]["ok"], 2, "counters summed over workers");
        // A worker that says it stops leaves the view at once; its hook that no other worker
        // serves stays known (collect names it) as served by no worker.
        view.update(worker("w2", false, vec![]));
        assert_eq!(view.matching("session:start"), ["beta"]);
        assert_eq!(view.workers(), 1);
        let (hooks, _) = view.render();
        let beta = hooks.iter().find(|h| h["name"] == "beta").unwrap();
        assert_eq!(beta["status"], "no_worker", "{beta}");
        assert_eq!(beta["workers"], json!([]));
        // A live worker that drops a hook removes it.
        view.update(worker("w1", true, vec![hook("alpha", &["agent:*"], 1)]));
        assert_eq!(view.matching("agent:start"), ["alpha", "beta"]);
        view.update(worker("w3", true, vec![hook("beta", &["*"], 0)]));
        view.update(worker("w3", true, vec![]));
        assert_eq!(view.matching("session:start"), Vec::<String>::new());
    }

    #[test]
    fn bundles_only_while_every_live_worker_reads_them_and_no_hook_spreads() {
        let view = FleetView::default();
        let bundles = |event: &str| view.route(event).1;
        assert!(
            !bundles("agent:start"),
            "no worker yet: an older one may come"
        );
        view.update(worker("w1", true, vec![hook("a", &["agent:*"], 0)]));
        assert!(bundles("agent:start"));
        let mut old = worker("w2", true, vec![]);
        old.bundles = false;
        view.update(old);
        assert!(
            !bundles("agent:start"),
            "an older worker would drop a bundle"
        );
        view.update(worker("w2", false, vec![]));
        assert!(bundles("agent:start"));
        // A hook running several events at once: its events are not bundled (a bundle goes to
        // one worker, and its limit counts messages); other events are.
        let mut c = hook("c", &["session:*"], 0);
        c.concurrency = 4;
        view.update(worker("w1", true, vec![hook("a", &["agent:*"], 0), c]));
        assert!(!bundles("session:start"));
        // Its workers gone, it stays a hook that runs several at once.
        view.update(worker("w5", true, vec![hook("a", &["agent:*"], 0)]));
        view.update(worker("w1", false, vec![]));
        assert!(!bundles("session:start"), "a gone concurrent hook");
        assert!(bundles("agent:start"));
        assert!(bundles("agent:start"));
        // An older worker's status has no such key.
        let old: WorkerStatus = serde_json::from_value(json!({
            "worker": "w4", "host": "h", "pid": 1, "interval_ms": 1000, "time": "",
            "running": true, "hooks": []
        }))
        .unwrap();
        assert!(!old.bundles);
    }
}
