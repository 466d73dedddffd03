//! Retries through a delayed subject: a failed event is published again to its hook's retry
//! subject `<prefix>.ev.r.<hook>` (in the event stream, its envelope naming the hook) with its
//! delivery count, its original stream sequence and the time before which it must not run; then
//! the original is finished. So a failing event never holds the hook's place in the stream (on an
//! ordered hook's `AckPolicy::All` consumer a handed-back event would stop every later
//! acknowledgement), and the hook goes on with the next events while it waits.
//!
//! Each hook has a second durable consumer on its retry subject (`retry_<consumer>`, explicit
//! acknowledgements, pulled by the same worker as the hook's events). A retry that arrives before
//! its time is held (with progress signals) until then, then enters the hook's local queue; it
//! runs after the events that came after it (order is kept for the events that do not fail).
//! The delivery count goes on from the header (`retries: N` = N + 1 deliveries in all), and
//! the last failure goes to the dead letters as before. Only JetStream 2.9 features are used.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer::pull};

use super::envelope::Envelope;
use super::{FleetConfig, consumer_name, token};

/// Header: deliveries made so far (the next is this plus one).
pub const DELIVERED: &str = "Hermes-Delivered";
/// Header: Unix time in milliseconds before which the retry must not run.
pub const NOT_BEFORE: &str = "Hermes-Not-Before";
/// Header: the event's sequence in the stream when it was first published.
pub const SEQ: &str = "Hermes-Stream-Seq";

/// Retries of one hook held at once by a worker (the retry consumer's `max_ack_pending`).
pub const WINDOW: i64 = 256;

/// The subject of a hook's retries.
pub fn subject(cfg: &FleetConfig, hook: &str) -> String {
    format!("{}.ev.r.{}", cfg.prefix, token(hook))
}

/// Whether `subject` is a retry subject (a consumer on every event skips those: each goes to
/// its hook's retry consumer).
pub fn is_retry(cfg: &FleetConfig, subject: &str) -> bool {
    subject
        .strip_prefix(cfg.prefix.as_str())
        .is_some_and(|s| s.starts_with(".ev.r."))
}

/// The durable name of a hook's retry consumer (`retry_` before the hook consumer's name, which
/// starts with `hook_`: the two never clash).
pub fn consumer(hook: &str) -> String {
    format!("retry_{}", consumer_name(hook))
}

/// What a retry message says about its event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    /// Deliveries made before this one.
    pub delivered: i64,
    /// Not to run before (Unix ms).
    pub not_before_ms: u64,
    /// The event's first stream sequence.
    pub seq: u64,
}

impl Retry {
    /// Read from a retry message's headers; `None` when they are missing or unreadable.
    pub fn read(msg: &async_nats::Message) -> Option<Self> {
        let h = msg.headers.as_ref()?;
        let get = |k: &str| h.get(k).and_then(|v| v.as_str().parse::<u64>().ok());
        Some(Self {
            delivered: get(DELIVERED)? as i64,
            not_before_ms: get(NOT_BEFORE)?,
            seq: get(SEQ).unwrap_or(0),
        })
    }

    /// How long until it may run (zero when due).
    pub fn wait(&self) -> Duration {
        Duration::from_millis(self.not_before_ms).saturating_sub(now_since_epoch())
    }
}

fn now_since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Publishes a retry of `env` for `hook` after `delivered` deliveries, due in `delay`, and
/// waits for the stream to store it.
pub async fn publish(
    js: &jetstream::Context,
    cfg: &FleetConfig,
    hook: &str,
    env: &Envelope,
    retry: Retry,
) -> Result<(), String> {
    let mut env = env.clone();
    env.hook = Some(hook.to_string());
    let payload = serde_json::to_vec(&env).map_err(|e| e.to_string())?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(DELIVERED, retry.delivered.to_string().as_str());
    headers.insert(NOT_BEFORE, retry.not_before_ms.to_string().as_str());
    headers.insert(SEQ, retry.seq.to_string().as_str());
    // The same retry published twice (a worker killed between publishing and finishing the
    // original) is stored once.
    let id = format!("r:{}:{hook}:{}", env.msg_id(), retry.delivered);
    headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    let ack = js
        .publish_with_headers(subject(cfg, hook), headers, payload.into())
        .await
        .map_err(|e| e.to_string())?;
    ack.await.map(|_| ()).map_err(|e| e.to_string())
}

/// The retry due `delay` from now.
pub fn due_in(delivered: i64, seq: u64, delay: Duration) -> Retry {
    Retry {
        delivered,
        not_before_ms: (now_since_epoch() + delay).as_millis() as u64,
        seq,
    }
}

/// The hook's retry consumer, created when missing (explicit acknowledgements; the delivery
/// count is the header's, so the broker's own limit is off).
pub async fn ensure_consumer(
    stream: &jetstream::stream::Stream,
    cfg: &FleetConfig,
    hook: &str,
    ack_wait: Duration,
    since: SystemTime,
) -> Result<jetstream::consumer::PullConsumer, String> {
    let name = consumer(hook);
    if let Ok(c) = stream.get_consumer::<pull::Config>(&name).await {
        return Ok(c);
    }
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some(format!("hermes-hooks retries of hook {hook}")),
        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::from(since),
        },
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait,
        max_deliver: -1,
        max_ack_pending: WINDOW,
        filter_subject: subject(cfg, hook),
        ..Default::default()
    };
    stream
        .create_consumer(config)
        .await
        .map_err(|e| format!("cannot create consumer {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_subjects_are_per_hook_and_recognised() {
        let c = FleetConfig::new("nats://h:1");
        assert_eq!(subject(&c, "my.hook"), "hermes.ev.r.my_2ehook");
        assert!(is_retry(&c, &subject(&c, "x")));
        assert!(!is_retry(&c, &c.event_subject("r:x")));
        assert!(!is_retry(&c, "hermes.ev.e.r"));
        assert_eq!(consumer("logger"), "retry_hook_logger");
        let r = due_in(2, 9, Duration::from_secs(60));
        assert!(r.wait() > Duration::from_secs(58) && r.wait() <= Duration::from_secs(60));
        assert_eq!(due_in(1, 1, Duration::ZERO).wait(), Duration::ZERO);
    }
}
