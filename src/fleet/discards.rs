//! Events the event stream discards at its limits (`--stream-max-bytes`, `max_age`, a
//! `max_msgs` an operator set; the stream's discard policy is `old`), counted and shown by the
//! edge (`/v1/hooks` `fleet.stream_discarded` and `fleet.discarded_unhandled`, `/metrics`).
//!
//! The event stream has Limits retention and nothing else removes its messages, so its first
//! sequence advancing is exactly what its limits discarded. Every few seconds the edge reads the
//! stream's first sequence and each hook's consumer: of the sequences discarded since the last
//! look, those above the consumer's acknowledgement floor at the last look had not been finished
//! by that hook (lost to it; the server moves the floor past discarded events, so the floor of
//! the last look is the one that counts), at most as many as it had waiting then plus what was
//! published since. For a hook whose consumer takes only some subjects (its filter), at most
//! what it had waiting at the last look: a lower bound (events that arrived and were discarded
//! between two looks are missed). An event acknowledged and discarded between two looks
//! counts as lost (an overcount possible only while the stream discards what hooks just
//! finished). Each edge counts the same stream: take the largest
//! over the edges, not the sum.
//!
//! The stream counts messages; a bundle ([`super::envelope`]) is one message for several
//! events. Each count is turned into events with the events per message this edge has stored
//! so far (exact when it sends each event alone, an estimate when it bundles). With the `new` discard policy the stream refuses instead, and the
//! edge counts those as `refused` (the client is told).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use serde_json::{Value, json};

use super::FleetConfig;

/// How often the edge looks.
pub const EVERY: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    /// The stream's creation time, first and last sequence at the last look.
    stream: Option<(String, u64, u64)>,
    /// Per consumer at the last look: events waiting (pending + unacknowledged), ack floor.
    waiting: HashMap<String, (u64, u64)>,
    discarded: u64,
    /// Consumers seen at the last look.
    consumers: usize,
    /// Per hook (by name): discarded before that hook finished them.
    unhandled: BTreeMap<String, u64>,
}

/// The counts; shared by the edge and its watcher.
#[derive(Default)]
pub struct Discards {
    state: Mutex<State>,
    /// Events and messages this edge has stored in the stream.
    stored: (AtomicU64, AtomicU64),
}

/// One consumer as the watcher sees it.
pub struct Seen {
    /// Consumer name.
    pub consumer: String,
    /// The hook it serves (from its description), else the consumer name.
    pub hook: String,
    /// Stream sequence of its acknowledgement floor.
    pub floor: u64,
    /// Pending + unacknowledged.
    pub waiting: u64,
    /// Its filter takes every event.
    pub wide: bool,
}

impl Discards {
    /// The edge stored a message of `events` events.
    pub fn stored(&self, events: usize) {
        self.stored.0.fetch_add(events as u64, Ordering::Relaxed);
        self.stored.1.fetch_add(1, Ordering::Relaxed);
    }

    /// `messages` of the stream in events (see the module comment).
    fn events(&self, messages: u64) -> u64 {
        let (events, stored) = (
            self.stored.0.load(Ordering::Relaxed),
            self.stored.1.load(Ordering::Relaxed),
        );
        if stored == 0 || events <= stored {
            return messages;
        }
        (messages as f64 * events as f64 / stored as f64).round() as u64
    }

    /// Takes in one look at the stream (`created`, `first` sequence) and its consumers.
    pub fn observe(&self, created: String, (first, last): (u64, u64), consumers: &[Seen]) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let prev = match &st.stream {
            Some((c, f, l)) if *c == created => Some((*f, *l)),
            // First look, or a stream recreated: a new baseline.
            _ => None,
        };
        st.stream = Some((created, first, last));
        // An empty stream says first sequence 0 (or last + 1).
        if let Some((prev, prev_last)) = prev.filter(|(p, _)| first > (*p).max(1)) {
            let prev = prev.max(1);
            st.discarded += self.events(first - prev);
            for c in consumers {
                let Some((had, floor)) = st.waiting.get(&c.consumer).copied() else {
                    continue;
                };
                let from = prev.max(floor + 1);
                let mut lost = first.saturating_sub(from);
                lost = if c.wide {
                    lost.min(had + last.saturating_sub(prev_last))
                } else {
                    lost.min(had)
                };
                let lost = self.events(lost);
                if lost > 0 {
                    *st.unhandled.entry(c.hook.clone()).or_default() += lost;
                    tracing::warn!(hook = %c.hook, lost, "fleet: the event stream discarded events this hook had not handled (stream limits: --stream-max-bytes, max age)");
                }
            }
        }
        st.consumers = consumers.len();
        st.waiting = consumers
            .iter()
            .map(|c| (c.consumer.clone(), (c.waiting, c.floor)))
            .collect();
    }

    /// `{stream_discarded, discarded_unhandled (by hook), stream_consumers}` for the edge's
    /// status; `None` before the first look at the stream (nothing can be counted yet).
    pub fn status(&self) -> Option<Value> {
        let st = self.state.lock().ok()?;
        st.stream.as_ref()?;
        Some(json!({
            "stream_discarded": st.discarded,
            "discarded_unhandled": st.unhandled,
            "stream_consumers": st.consumers,
        }))
    }
}

/// Looks at the stream every [`EVERY`] until `discards` is dropped.
pub async fn watch(
    client: async_nats::Client,
    cfg: FleetConfig,
    discards: std::sync::Weak<Discards>,
) {
    let js = cfg.jetstream(client);
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            tokio::time::sleep(EVERY).await;
        }
        let Some(d) = discards.upgrade() else { return };
        let Ok(mut stream) = js.get_stream(cfg.events_stream()).await else {
            continue;
        };
        let Ok(info) = stream.info().await.cloned() else {
            continue;
        };
        let seqs = (info.state.first_sequence, info.state.last_sequence);
        let consumers = consumers(&stream, &cfg.events_filter()).await;
        d.observe(info.created.to_string(), seqs, &consumers);
    }
}

async fn consumers(stream: &jetstream::stream::Stream, wide: &str) -> Vec<Seen> {
    let prefix = super::identity::description("");
    let names: Vec<String> = stream
        .consumer_names()
        .filter_map(|n| async move { n.ok() })
        .collect()
        .await;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let Ok(i) = stream.consumer_info(&name).await else {
            continue;
        };
        let hook = i
            .config
            .description
            .as_deref()
            .and_then(|d| d.strip_prefix(prefix.as_str()))
            .map_or_else(|| i.name.clone(), str::to_string);
        out.push(Seen {
            hook,
            floor: i.ack_floor.stream_sequence,
            waiting: i.num_pending + i.num_ack_pending as u64,
            wide: super::identity::of_config(&i.config) == [wide],
            consumer: i.name,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(hook: &str, floor: u64, waiting: u64) -> Seen {
        Seen {
            consumer: format!("hook_{hook}"),
            hook: hook.into(),
            floor,
            waiting,
            wide: hook == "slow",
        }
    }

    #[test]
    fn discards_past_a_hooks_floor_are_lost_to_it_at_most_what_it_had_waiting() {
        let d = Discards::default();
        d.observe(
            "t".into(),
            (1, 100),
            &[
                seen("slow", 10, 90),
                seen("few", 0, 3),
                seen("done", 100, 0),
            ],
        );
        assert_eq!(d.status().unwrap()["stream_discarded"], 0, "a baseline");
        // 50 discarded: slow (every event) had acknowledged up to 10, few (a filter) only had
        // 3 waiting, done none.
        // (The server moves the floors past what it discarded: the last look's count.)
        d.observe(
            "t".into(),
            (51, 110),
            &[
                seen("slow", 50, 60),
                seen("few", 50, 0),
                seen("done", 110, 0),
            ],
        );
        let st = d.status().unwrap();
        assert_eq!(st["stream_discarded"], 50);
        assert_eq!(st["discarded_unhandled"], json!({"slow": 40, "few": 3}));
        // A stream recreated: a new baseline, nothing counted for the jump.
        d.observe("t2".into(), (500, 600), &[seen("slow", 0, 5)]);
        assert_eq!(d.status().unwrap()["stream_discarded"], 50);
        // Messages that held 3 events each on average (bundles): counted in events.
        d.stored(1);
        d.stored(5);
        d.observe("t2".into(), (510, 610), &[seen("slow", 520, 0)]);
        let st = d.status().unwrap();
        assert_eq!(st["stream_discarded"], 50 + 30);
        assert_eq!(
            st["discarded_unhandled"]["slow"],
            40 + 30,
            "the 10 messages past its floor"
        );
    }
}
