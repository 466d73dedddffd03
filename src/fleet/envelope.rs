//! The wire format of an event in the stream: the event id and the gateway id (so that a handler
//! can de-duplicate: delivery in fleet mode is at-least-once), the name, the context, and for a
//! replay the one hook it is meant for. Also the dead-letter record.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::handler::context::Context;

/// Version of the envelope format.
pub const VERSION: u32 = 1;

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
}
