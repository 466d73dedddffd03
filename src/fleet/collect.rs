//! Collect across the fleet: the edge sends one NATS request per matching hook to
//! `<prefix>.collect.<hook>` (a queue group, so one worker that serves the hook answers), all at
//! once, each bounded by the collect deadline, and returns the outcomes in match order. The
//! worker side runs the hook on its host and replies with the result or the error.
//!
//! An abandoned collect is cancelled on the worker: when the deadline passes (the worker's own
//! clock, from the request's arrival) or the edge gives up early (its caller went away, or its
//! deadline passed first), the edge publishes the event id on `<prefix>.cancel.<hook>`; the worker
//! stops waiting for the call, and a call that has not started yet is dropped from the hook's
//! queue (never run). A call already running in a handler process finishes (bounded by the
//! hook's `timeout:`) and its result is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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
        context: super::envelope::raw_context(&context),
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
        let mut guard = Cancel {
            client: client.clone(),
            subject: cfg.cancel_subject(hook),
            id: envelope.id.clone(),
            done: false,
        };
        let hook = hook.clone();
        async move {
            let req = async_nats::Request::new()
                .payload(payload.into())
                .timeout(Some(timeout));
            let answer = client.send_request(subject, req).await;
            let timed_out = answer
                .as_ref()
                .is_err_and(|e| e.kind() == async_nats::RequestErrorKind::TimedOut);
            let result = match answer {
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
            guard.done = true;
            if timed_out {
                guard.cancel();
            }
            HookOutcome {
                hook,
                result,
                duration: Some(started.elapsed()),
            }
        }
    });
    futures_util::future::join_all(asks).await
}

/// Edge side: tells the hook's workers that a request was given up (dropped before its answer,
/// or timed out), so the worker drops the call.
struct Cancel {
    client: async_nats::Client,
    subject: String,
    id: String,
    done: bool,
}

impl Cancel {
    fn cancel(&self) {
        let (client, subject, id) = (self.client.clone(), self.subject.clone(), self.id.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = client.publish(subject, id.into()).await;
            });
        }
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.done {
            self.cancel();
        }
    }
}

/// Collect calls a worker is running, by event id, so that a cancel can abort them.
type Running = Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>>;

/// Worker side: answers collect requests for `hook` until the subscription ends, and drops
/// those the edge cancels (`cancel_subject`).
pub async fn serve(
    client: async_nats::Client,
    subjects: (String, String),
    host: Host,
    hook: String,
    worker: String,
) {
    let (subject, cancel_subject) = subjects;
    let subs = async {
        let sub = client
            .queue_subscribe(subject.clone(), QUEUE_GROUP.into())
            .await?;
        let cancels = client.subscribe(cancel_subject.clone()).await?;
        Ok::<_, async_nats::SubscribeError>((sub, cancels))
    };
    let (mut sub, mut cancels) = match subs.await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(hook = %hook, "fleet: cannot subscribe to {subject}: {e}; collect will not reach this worker");
            return;
        }
    };
    let running: Running = Arc::default();
    loop {
        let msg = tokio::select! {
            m = sub.next() => m,
            c = cancels.next() => {
                if let Some(c) = c {
                    let id = String::from_utf8_lossy(&c.payload).into_owned();
                    if let Some(task) = running.lock().ok().and_then(|mut r| r.remove(&id)) {
                        tracing::debug!(hook = %hook, id, "fleet: collect cancelled by the edge; its call is dropped");
                        task.abort();
                    }
                }
                continue;
            }
        };
        let Some(msg) = msg else { break };
        let Some(reply_to) = msg.reply.clone() else {
            continue;
        };
        let req = serde_json::from_slice::<CollectRequest>(&msg.payload);
        let id = req.as_ref().map(|r| r.envelope.id.clone()).ok();
        let (client, host, hook, worker, reg) = (
            client.clone(),
            host.clone(),
            hook.clone(),
            worker.clone(),
            running.clone(),
        );
        let gone = id.clone();
        let task = tokio::spawn(async move {
            let reply = match req {
                Ok(req) => run(&host, &hook, req).await,
                Err(e) => CollectReply {
                    error: Some(format!("unreadable collect request: {e}")),
                    ..Default::default()
                },
            };
            if let (Some(id), Ok(mut r)) = (gone, reg.lock()) {
                r.remove(&id);
            }
            let reply = CollectReply { worker, ..reply };
            let body = serde_json::to_vec(&reply).unwrap_or_default();
            if let Err(e) = client.publish(reply_to, body.into()).await {
                tracing::warn!(hook = %hook, "fleet: cannot answer a collect request: {e}");
            }
        });
        if let (Some(id), Ok(mut r)) = (id, running.lock()) {
            // Registered under the lock the task takes to leave: either it is still running
            // here or it has already gone (and must not stay registered).
            if task.is_finished() {
                r.remove(&id);
            } else {
                r.insert(id, task.abort_handle());
            }
        }
    }
    for (_, t) in running
        .lock()
        .map(|mut r| r.drain().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        t.abort();
    }
}

async fn run(host: &Host, hook: &str, req: CollectRequest) -> CollectReply {
    let env = req.envelope;
    let timeout = Duration::from_millis(req.timeout_ms.clamp(1, 300_000));
    let Some(ctx) = env.handler_context(1, 0) else {
        return CollectReply {
            error: Some("context must be a JSON object".into()),
            ..Default::default()
        };
    };
    match host.call_one(&env.event, ctx, timeout, hook, None).await {
        Ok(Some(o)) => CollectReply {
            duration_ms: (!o.duration.is_zero()).then_some(o.duration.as_secs_f64() * 1000.0),
            result: o.result.clone().ok().flatten(),
            error: o.result.err(),
            worker: String::new(),
        },
        Ok(None) => CollectReply::default(),
        Err(e) => CollectReply {
            error: Some(e.to_string()),
            ..Default::default()
        },
    }
}
