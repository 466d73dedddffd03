//! The wire format of an event in the stream: the event id and the gateway id (so that a handler
//! can de-duplicate: delivery in fleet mode is at-least-once), the name, the context, and for a
//! replay the one hook it is meant for. Also the dead-letter record.
//!
//! A stream message holds one event ([`Envelope`], format 1) or a **bundle** (format 2): several
//! events of one name accepted in one request, `{"v":2,"gateway","event","time","events":
//! [{"id","context"},...]}`. The broker then stores, delivers and acknowledges one message for
//! up to [`BUNDLE_EVENTS`] events (by default); a worker runs them one by one, in order, and acknowledges the
//! message when every one of them is finished ([`read`] gives them as envelopes).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::handler::context::Context;

/// Version of the envelope format.
pub const VERSION: u32 = 1;
/// Version of the bundle format (several events in one stream message).
pub const BUNDLE: u32 = 2;
/// Most events in one bundle, unless the edge is told otherwise (`--fleet-bundle`).
pub const BUNDLE_EVENTS: usize = 128;
/// Most bytes of one bundle (less when the broker's `max_payload` is lower): a larger event
/// goes alone.
pub const BUNDLE_BYTES: usize = 64 * 1024;

/// The context key under which a fleet worker tells the handler about the delivery:
/// `{"event_id", "gateway_id", "delivered", "stream_seq"}` (`stream_seq` 0 for collect).
pub const CONTEXT_KEY: &str = "_fleet";
/// [`CONTEXT_KEY`] as it appears in JSON text.
const CONTEXT_KEY_QUOTED: &str = "\"_fleet\"";

/// One event as published to the stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    /// Format version.
    pub v: u32,
    /// Unique event id (also the `Nats-Msg-Id`, prefixed by the gateway id).
    pub id: String,
    /// The edge that accepted it.
    pub gateway: String,
    /// Event name.
    pub event: String,
    /// Event context (a JSON object), as text: a worker passes it on without building an object.
    pub context: Box<RawValue>,
    /// RFC 3339 time of acceptance.
    pub time: String,
    /// Replays only: the one hook this copy is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<String>,
    /// True when `id` is the client's own event id (the same from every edge it is sent to).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_id: bool,
}

impl Envelope {
    /// The JetStream de-duplication id: the client's event id as is (`c:ID`, whichever edge
    /// it reaches), else the edge's id prefixed by the gateway id.
    pub fn msg_id(&self) -> String {
        if self.client_id {
            format!("c:{}", self.id)
        } else {
            format!("{}:{}", self.gateway, self.id)
        }
    }

    /// The context a handler sees: the event's, plus [`CONTEXT_KEY`]. Made from the stream's
    /// text without building an object (the key is appended to the object's text), except when
    /// the event's context already has that key (the worker's replaces it); `None` when the
    /// context is not an object (nothing a fleet edge publishes).
    pub fn handler_context(&self, delivered: i64, stream_seq: u64) -> Option<Context> {
        let fleet = FleetInfo {
            event_id: &self.id,
            gateway_id: &self.gateway,
            delivered,
            stream_seq,
        };
        let text = self.context.get().trim_ascii();
        // `null` is an empty context, as everywhere else.
        let inner = match text {
            "null" => "",
            _ => text.strip_prefix('{')?.strip_suffix('}')?,
        };
        if inner.contains(CONTEXT_KEY_QUOTED) {
            let mut object: Map<String, Value> = serde_json::from_str(text).ok()?;
            object.insert(CONTEXT_KEY.into(), serde_json::to_value(&fleet).ok()?);
            return Some(Context::new(Value::Object(object)));
        }
        let fleet = serde_json::to_string(&fleet).ok()?;
        let mut out = String::with_capacity(text.len() + fleet.len() + CONTEXT_KEY.len() + 5);
        out.push('{');
        if !inner.trim_ascii().is_empty() {
            out.push_str(inner);
            out.push(',');
        }
        out.push('"');
        out.push_str(CONTEXT_KEY);
        out.push_str("\":");
        out.push_str(&fleet);
        out.push('}');
        Some(Context::from_object_text(out))
    }
}

/// What [`CONTEXT_KEY`] holds.
#[derive(Serialize)]
struct FleetInfo<'a> {
    event_id: &'a str,
    gateway_id: &'a str,
    delivered: i64,
    stream_seq: u64,
}

/// A stream message as the broker delivers it, one event or a bundle.
#[derive(Deserialize)]
struct Wire {
    v: u32,
    #[serde(default)]
    id: Option<String>,
    gateway: String,
    event: String,
    #[serde(default)]
    context: Option<Box<RawValue>>,
    time: String,
    #[serde(default)]
    hook: Option<String>,
    #[serde(default)]
    client_id: bool,
    #[serde(default)]
    events: Option<Vec<Item>>,
}

/// One event of a bundle.
#[derive(Deserialize)]
struct Item {
    id: String,
    context: Box<RawValue>,
}

/// [`Item`] as written.
#[derive(Serialize)]
struct ItemRef<'a> {
    id: &'a str,
    context: &'a RawValue,
}

/// The events of a stream message, in order: one, or a bundle's.
pub fn read(payload: &[u8]) -> Result<Vec<Envelope>, String> {
    let w: Wire = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
    let Some(items) = w.events else {
        let (Some(id), Some(context)) = (w.id, w.context) else {
            return Err("an event without its id or context".into());
        };
        return Ok(vec![Envelope {
            v: w.v,
            id,
            gateway: w.gateway,
            event: w.event,
            context,
            time: w.time,
            hook: w.hook,
            client_id: w.client_id,
        }]);
    };
    if items.is_empty() {
        return Err("a bundle without events".into());
    }
    Ok(items
        .into_iter()
        .map(|i| Envelope {
            // Each event as an envelope of its own (a retry or dead letter of it is one).
            v: VERSION,
            id: i.id,
            gateway: w.gateway.clone(),
            event: w.event.clone(),
            context: i.context,
            time: w.time.clone(),
            hook: None,
            client_id: false,
        })
        .collect())
}

/// Bytes a bundle takes besides its events' ids and contexts, at most: the head with these
/// names, and per event its keys and punctuation ([`BUNDLE_ITEM_EXTRA`]).
pub fn bundle_head_len(gateway: &str, event: &str, time: &str) -> usize {
    // `{"v":2,"gateway":"","event":"","time":"","events":[]}` is 53 bytes; a character JSON
    // escapes takes at most 6 (`\u001f`).
    64 + 6 * (gateway.len() + event.len() + time.len())
}

/// Bytes an event of a bundle takes besides its id and context text: `{"id":"","context":}`
/// and a comma.
pub const BUNDLE_ITEM_EXTRA: usize = 24;

/// A bundle's payload: `events` (id, context) of the event `event`, accepted at `time` by
/// `gateway`. Ids are written as they are: only an edge's own ids (no character to escape)
/// go into bundles.
pub fn write_bundle<'a>(
    gateway: &str,
    event: &str,
    time: &str,
    events: impl Iterator<Item = (&'a str, &'a RawValue)>,
) -> Vec<u8> {
    #[derive(Serialize)]
    struct Head<'a> {
        v: u32,
        gateway: &'a str,
        event: &'a str,
        time: &'a str,
    }
    let head = Head {
        v: BUNDLE,
        gateway,
        event,
        time,
    };
    let mut buf = Vec::with_capacity(4096);
    // Strings and raw JSON always encode. The head's closing brace makes room for the events.
    let _ = serde_json::to_writer(&mut buf, &head);
    buf.pop();
    buf.extend_from_slice(b",\"events\":[");
    for (i, (id, context)) in events.enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        let _ = serde_json::to_writer(&mut buf, &ItemRef { id, context });
    }
    buf.extend_from_slice(b"]}");
    buf
}

/// A context object as the envelope's text.
pub fn raw_context(context: &Value) -> Box<RawValue> {
    // A JSON value always encodes; `null` (an empty context) if it somehow did not.
    serde_json::value::to_raw_value(context).unwrap_or_default()
}

/// Makes event ids unique across restarts of an edge: boot time and pid, then a counter.
#[derive(Debug)]
pub struct IdGen {
    boot: String,
    seq: AtomicU64,
}

impl Default for IdGen {
    fn default() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        Self {
            boot: format!("{nanos:x}{:x}", std::process::id()),
            seq: AtomicU64::new(0),
        }
    }
}

impl IdGen {
    /// The next id.
    pub fn next(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n:x}", self.boot)
    }
}

/// What the dead-letter subject holds for an event a hook could not handle.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Format version.
    pub v: u32,
    /// The hook that failed.
    pub hook: String,
    /// Its identity (`id:`, else the name), which a replay goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_id: Option<String>,
    /// The last error.
    pub error: String,
    /// How many deliveries were made.
    pub deliveries: i64,
    /// The worker that made the last one.
    pub worker: String,
    /// RFC 3339 time it was dead-lettered.
    pub time: String,
    /// Sequence of the event in the event stream.
    pub stream_seq: u64,
    /// The event.
    pub envelope: Envelope,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(context: &str) -> Envelope {
        Envelope {
            v: VERSION,
            id: "x-1".into(),
            gateway: "gw".into(),
            event: "agent:start".into(),
            context: RawValue::from_string(context.into()).unwrap(),
            time: String::new(),
            hook: None,
            client_id: false,
        }
    }

    fn handler_context(context: &str) -> Option<Value> {
        let c = envelope(context).handler_context(2, 9)?;
        Some(serde_json::from_str(c.json().unwrap()).unwrap())
    }

    #[test]
    fn ids_are_unique_and_context_gets_the_delivery() {
        let g = IdGen::default();
        assert_ne!(g.next(), g.next());
        let e = envelope(r#"{"a":1}"#);
        assert_eq!(e.msg_id(), "gw:x-1");
        let c = handler_context(r#"{"a": 1, "b": {"c": "}"}}"#).unwrap();
        assert_eq!(c["a"], 1);
        assert_eq!(c["b"]["c"], "}");
        assert_eq!(c["_fleet"]["delivered"], 2);
        assert_eq!(c["_fleet"]["stream_seq"], 9);
        assert_eq!(c["_fleet"]["event_id"], "x-1");
        assert_eq!(c["_fleet"]["gateway_id"], "gw");
        let back: Envelope = serde_json::from_slice(&serde_json::to_vec(&e).unwrap()).unwrap();
        assert_eq!(back.hook, None);
        assert_eq!(back.context.get(), r#"{"a":1}"#);
    }

    #[test]
    fn the_delivery_key_is_added_to_any_object_and_replaces_the_events_own() {
        assert_eq!(CONTEXT_KEY_QUOTED, format!("\"{CONTEXT_KEY}\""));
        for empty in ["{}", "{ }", "null"] {
            let c = handler_context(empty).unwrap();
            assert_eq!(c.as_object().unwrap().len(), 1, "{empty}");
            assert_eq!(c["_fleet"]["delivered"], 2);
        }
        let c = handler_context(r#"{"_fleet": "mine", "z": 1}"#).unwrap();
        assert_eq!(c["_fleet"]["delivered"], 2);
        assert_eq!(c["z"], 1);
        // The key's name inside a value is no key: appended as usual.
        let c = handler_context(r#"{"note": "_fleet", "s": "\"_fleet\""}"#).unwrap();
        assert_eq!(c["note"], "_fleet");
        assert_eq!(c["_fleet"]["delivered"], 2);
        for not_object in ["[1]", "\"s\"", "3", "true"] {
            assert!(handler_context(not_object).is_none(), "{not_object}");
        }
    }

    #[test]
    fn a_bundle_reads_back_as_its_events_in_order_and_a_single_event_as_one() {
        let contexts = [r#"{"n":0}"#, r#"{"n":1,"s":"a\"b"}"#, "{}"];
        let raws: Vec<Box<RawValue>> = contexts
            .iter()
            .map(|c| RawValue::from_string(c.to_string()).unwrap())
            .collect();
        let ids = ["b-0", "b-1", "b-2"];
        let time = "2026-12-01T00:00:00Z";
        let payload = write_bundle(
            "gw",
            "agent:step",
            time,
            ids.iter().copied().zip(raws.iter().map(|r| &**r)),
        );
        let estimate = bundle_head_len("gw", "agent:step", time)
            + ids
                .iter()
                .zip(contexts)
                .map(|(i, c)| i.len() + c.len() + BUNDLE_ITEM_EXTRA)
                .sum::<usize>();
        assert!(payload.len() <= estimate, "{} > {estimate}", payload.len());
        let events = read(&payload).unwrap();
        assert_eq!(events.len(), 3);
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e.id, ids[i]);
            assert_eq!(e.context.get(), contexts[i]);
            assert_eq!((e.event.as_str(), e.gateway.as_str()), ("agent:step", "gw"));
            assert_eq!(e.time, time);
            assert_eq!(e.msg_id(), format!("gw:{}", ids[i]));
            assert!(e.hook.is_none() && !e.client_id);
        }
        let one = read(&serde_json::to_vec(&envelope(r#"{"a":1}"#)).unwrap()).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].id, "x-1");
        assert!(read(br#"{"v":2,"gateway":"g","event":"e","time":"t","events":[]}"#).is_err());
        assert!(read(br#"{"v":1,"gateway":"g","event":"e","time":"t"}"#).is_err());
        assert!(read(b"not json").is_err());
    }
}
