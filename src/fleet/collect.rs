//! Collect across the fleet: the edge sends one NATS request per matching hook to
//! `<prefix>.collect.<hook>` (a queue group, so one worker that serves the hook answers), all at
//! once, each bounded by the collect deadline, and returns the outcomes in match order. The
//! worker side runs the hook on its host and replies with the result or the error.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::FleetConfig;
use super::envelope::{Envelope, IdGen, VERSION};
use crate::host::Host;
use crate::sink::HookOutcome;

/// Queue group of the collect responders.
pub const QUEUE_GROUP: &str = "hermes-hooks-workers";

/// A collect request as sent to a hook's workers.
#[derive(Debug, Serialize, Deserialize)]
pub struct CollectRequest {
    /// The event.
    pub envelope: Envelope,
    /// Time the worker may take, ms.
    pub timeout_ms: u64,
}

/// A worker's reply.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CollectReply {
    /// The handler's result (`null` when it returned nothing).
    #[serde(default)]
    pub result: Option<Value>,
    /// The handler's error.
    #[serde(default)]
    pub error: Option<String>,
    /// Time in the handler, ms.
    #[serde(default)]
    pub duration_ms: Option<f64>,
    /// The worker that answered.
    #[serde(default)]
    pub worker: String,
}

/// Edge side: asks the workers of each hook in `hooks` (already in match order).
#[allow(clippy::too_many_arguments)]
pub async fn request(
    client: &async_nats::Client,
    cfg: &FleetConfig,
    gateway: &str,
    ids: &IdGen,
    hooks: &[String],
    event: String,
    context: Value,
    timeout: Duration,
) -> Vec<HookOutcome> {
    let envelope = Envelope {
        v: VERSION,
        id: ids.next(),
        gateway: gateway.to_string(),
        event,
        context,
        time: crate::time::now(),
        hook: None,
        client_id: false,
    };
    let started = Instant::now();
    let asks = hooks.iter().map(|hook| {
        let mut env = envelope.clone();
        env.hook = Some(hook.clone());
        let body = CollectRequest {
            envelope: env,
            timeout_ms: timeout.as_millis() as u64,
        };
        let payload = serde_json::to_vec(&body).unwrap_or_default();
        let subject = cfg.collect_subject(hook);
        let hook = hook.clone();
        async move {
            let req = async_nats::Request::new()
                .payload(payload.into())
                .timeout(Some(timeout));
            let result = match client.send_request(subject, req).await {
                Ok(msg) => match serde_json::from_slice::<CollectReply>(&msg.payload) {
                    Ok(r) => match r.error {
                        Some(e) => Err(e),
                        None => Ok(r.result.filter(|v| !v.is_null())),
                    },
                    Err(e) => Err(format!("unreadable reply from a worker: {e}")),
                },
                Err(e) => Err(match e.kind() {
                    async_nats::RequestErrorKind::TimedOut => format!(
                        "no result within the deadline of {}",
                        crate::time::fmt_duration(timeout)
                    ),
                    async_nats::RequestErrorKind::NoResponders => {
                        "no worker of the fleet serves this hook right now".to_string()
                    }
                    _ => format!("fleet request failed: {e}"),
                }),
            };
            HookOutcome {
                hook,
                result,
                duration: Some(started.elapsed()),
            }
        }
    });
    futures_util::future::join_all(asks).await
}

/// Worker side: answers collect requests for `hook` until the subscription ends.
pub async fn serve(
    client: async_nats::Client,
    subject: String,
    host: Host,
    hook: String,
    worker: String,
) {
    let mut sub = match client
        .queue_subscribe(subject.clone(), QUEUE_GROUP.into())
        .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(hook = %hook, "fleet: cannot subscribe to {subject}: {e}; collect will not reach this worker");
            return;
        }
    };
    while let Some(msg) = sub.next().await {
        let Some(reply_to) = msg.reply.clone() else {
            continue;
        };
        let (client, host, hook, worker) =
            (client.clone(), host.clone(), hook.clone(), worker.clone());
        tokio::spawn(async move {
            let reply = match serde_json::from_slice::<CollectRequest>(&msg.payload) {
                Ok(req) => run(&host, &hook, req).await,
                Err(e) => CollectReply {
                    error: Some(format!("unreadable collect request: {e}")),
                    ..Default::default()
                },
            };
            let reply = CollectReply { worker, ..reply };
            let body = serde_json::to_vec(&reply).unwrap_or_default();
            if let Err(e) = client.publish(reply_to, body.into()).await {
                tracing::warn!(hook = %hook, "fleet: cannot answer a collect request: {e}");
            }
        });
    }
}

async fn run(host: &Host, hook: &str, req: CollectRequest) -> CollectReply {
    let env = req.envelope;
    let timeout = Duration::from_millis(req.timeout_ms.clamp(1, 300_000));
    let ctx = env.handler_context(1, 0);
    match host
        .emit_collect_only(&env.event, ctx, timeout, Some(hook))
        .await
    {
        Ok(outcomes) => match outcomes.into_iter().next() {
            Some(o) => CollectReply {
                duration_ms: o.duration.map(|d| d.as_secs_f64() * 1000.0),
                result: o.result.clone().ok().flatten(),
                error: o.result.err(),
                worker: String::new(),
            },
            None => CollectReply::default(),
        },
        Err(e) => CollectReply {
            error: Some(e.to_string()),
            ..Default::default()
        },
    }
}
