//! The wire format of an event in the stream: the event id and the gateway id (so that a handler
//! can de-duplicate: delivery in fleet mode is at-least-once), the name, the context, and for a
//! replay the one hook it is meant for. Also the dead-letter record.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Version of the envelope format.
pub const VERSION: u32 = 1;

/// The context key under which a fleet worker tells the handler about the delivery:
/// `{"event_id", "gateway_id", "delivered", "stream_seq"}` (`stream_seq` 0 for collect).
pub const CONTEXT_KEY: &str = "_fleet";

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
    /// Event context (a JSON object).
    pub context: Value,
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

    /// [`Envelope::handler_context`], taking the context out of the envelope (left `null`)
    /// instead of copying it.
    pub fn take_handler_context(&mut self, delivered: i64, stream_seq: u64) -> Value {
        let mut ctx = std::mem::take(&mut self.context);
        if let Value::Object(m) = &mut ctx {
            m.insert(
                CONTEXT_KEY.into(),
                serde_json::json!({"event_id": self.id, "gateway_id": self.gateway, "delivered": delivered, "stream_seq": stream_seq}),
            );
        }
        ctx
    }

    /// The context a handler sees: the event's, plus [`CONTEXT_KEY`].
    pub fn handler_context(&self, delivered: i64, stream_seq: u64) -> Value {
        let mut ctx = self.context.clone();
        if let Value::Object(m) = &mut ctx {
            m.insert(
                CONTEXT_KEY.into(),
                serde_json::json!({"event_id": self.id, "gateway_id": self.gateway, "delivered": delivered, "stream_seq": stream_seq}),
            );
        }
        ctx
    }
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

    #[test]
    fn ids_are_unique_and_context_gets_the_delivery() {
        let g = IdGen::default();
        assert_ne!(g.next(), g.next());
        let e = Envelope {
            v: VERSION,
            id: "x-1".into(),
            gateway: "gw".into(),
            event: "agent:start".into(),
            context: serde_json::json!({"a": 1}),
            time: String::new(),
            hook: None,
            client_id: false,
        };
        assert_eq!(e.msg_id(), "gw:x-1");
        let c = e.handler_context(2, 9);
        assert_eq!(c["a"], 1);
        assert_eq!(c["_fleet"]["delivered"], 2);
        assert_eq!(c["_fleet"]["gateway_id"], "gw");
        let back: Envelope = serde_json::from_slice(&serde_json::to_vec(&e).unwrap()).unwrap();
        assert_eq!(back.hook, None);
    }
}
