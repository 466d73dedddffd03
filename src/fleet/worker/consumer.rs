//! A hook's consumer on the broker: created or updated to the hook's settings, and deleted
//! after the grace once the hook left every worker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};

use crate::fleet::consumer_name;

use super::state::*;

/// A hook left this worker: after the grace, its consumer is deleted unless this worker has the
/// hook again or another worker still pulls from it (checked three times, a second apart: a
/// serving worker always has a pull request waiting, renewed every few seconds).
pub(super) async fn remove_after_grace(
    sh: Arc<Shared>,
    stream: jetstream::stream::Stream,
    hook: String,
) {
    tokio::time::sleep(sh.opts.consumer_grace).await;
    if sh
        .host
        .snapshot()
        .hooks
        .iter()
        .any(|h| crate::fleet::identity::of(&h.spec) == hook)
    {
        return;
    }
    let name = consumer_name(&hook);
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        match stream.get_consumer::<pull::Config>(&name).await {
            Ok(mut c) => match c.info().await {
                Ok(info) if info.num_waiting == 0 && info.num_ack_pending == 0 => {}
                _ => return,
            },
            Err(_) => return,
        }
    }
    let _ = stream
        .delete_consumer(&crate::fleet::retry::consumer(&hook))
        .await;
    match stream.delete_consumer(&name).await {
        Ok(_) => {
            tracing::info!(hook = %hook, "fleet: removed hook: consumer {name} deleted after the grace")
        }
        Err(e) => tracing::debug!(hook = %hook, "fleet: consumer {name} not deleted: {e}"),
    }
}

/// The ack wait of hook `s`'s consumer, which has `have` now (`None`: being made): the longest
/// of the live workers' that have the hook, this one's included (issue 56 row 2: one rule, so
/// workers with different `--ack-wait` never rewrite it back and forth). Raised at once; lowered
/// only once this worker has listened long enough to know every live worker. Each worker bounds
/// what it starts by the shorter of its own and the consumer's ([`super::pull`]). A worker whose
/// own differs says so once per hook.
fn consumer_wait(sh: &Shared, s: &Settings, have: Option<Duration>) -> Duration {
    let own = sh.opts.broker_wait();
    let longest = sh
        .versions
        .longest_ack_wait(&s.key)
        .map(crate::fleet::lease::broker_wait)
        .map_or(own, |w| w.max(own));
    let wait = match have {
        Some(have) if longest < have && !sh.versions.settled(sh.opts.status_interval) => have,
        _ => longest,
    };
    say_ack_wait(sh, &s.key, &s.name);
    wait
}

/// Says once per hook when another live worker that has hook `key` (named `name` here) waits
/// longer than this one: the consumer waits that long ([`consumer_wait`]).
pub(super) fn say_ack_wait(sh: &Shared, key: &str, name: &str) {
    let Some(longest) = sh.versions.longest_ack_wait(key) else {
        return;
    };
    if longest > sh.opts.ack_wait
        && let Ok(mut said) = sh.said_ack_wait.lock()
        && said.insert(key.to_string())
    {
        tracing::warn!(hook = %name, "fleet: this worker's --ack-wait ({}) differs from another live worker's: the hook's consumer waits the longest of theirs ({} before a redelivery or a failover), and this worker starts nothing past its own", crate::time::fmt_duration(sh.opts.ack_wait), crate::time::fmt_duration(longest));
    }
}

pub(super) async fn ensure_consumer(
    sh: &Shared,
    stream: &jetstream::stream::Stream,
    s: &Settings,
) -> Result<jetstream::consumer::PullConsumer, String> {
    let name = consumer_name(&s.key);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some(crate::fleet::identity::description(&s.name)),
        // From the time the hook appeared (not "new": events published while the consumer was
        // being created would be missed); a stream recreated since is read from its start.
        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::from(s.since),
        },
        // An ordered hook's events finish in stream order: one acknowledgement of the highest
        // finished sequence acknowledges a batch (held.rs).
        ack_policy: if s.ordered() {
            jetstream::consumer::AckPolicy::All
        } else {
            jetstream::consumer::AckPolicy::Explicit
        },
        ack_wait: consumer_wait(sh, s, None),
        // No limit at the broker: the worker decides what a delivery past the allowed ones
        // becomes (a dead letter with its reason, before it runs: [`super::feed`]), so an event
        // leaves the stream only by running or as a dead letter. A limit at the broker counted
        // deliveries that were no attempt (a worker frozen past the ack wait or cut off from
        // the broker leaves what its pulls had buffered unstarted; a hand-over to another
        // version gives messages back) and then stopped delivering the event for good: never
        // run, never dead-lettered (issue 56, the nemesis's seed 3128294535162591552 on 2.15).
        // An ordered hook's worker also counts the attempts itself ([`super::handover`]).
        max_deliver: -1,
        max_ack_pending: s.window as i64,
        ..Default::default()
    };
    match stream.get_consumer::<pull::Config>(&name).await {
        Ok(c) => {
            let have = &c.cached_info().config;
            let filters = crate::fleet::versions::update_filters(
                &sh.cfg,
                &s.filters,
                have,
                sh.multi.load(Ordering::Relaxed),
                // Never narrowed during a rolling update (a version of the hook changed within
                // the grace): a worker that has not heard of the newest version yet would take
                // its patterns away, and a cumulative acknowledgement would then pass its
                // events for good.
                sh.versions.settled(sh.opts.status_interval)
                    && sh
                        .versions
                        .recently_retired(&s.key, sh.opts.consumer_grace)
                        .is_empty(),
            );
            let config = pull::Config {
                ack_wait: consumer_wait(sh, s, Some(have.ack_wait)),
                ..crate::fleet::versions::with_filters(config, &filters)
            };
            if have.ack_wait != config.ack_wait
                || have.max_deliver != config.max_deliver
                || have.max_ack_pending != config.max_ack_pending
                || crate::fleet::repeats::unmarked(have.description.as_deref())
                    != config.description.as_deref()
                || crate::fleet::identity::of_config(have) != filters
            {
                tracing::info!(hook = %s.name, "fleet: updating consumer {name} (ack wait, retries, concurrency, name or patterns changed)");
                // The server's own config with the changed fields: its start time sent back
                // through a typed config is refused as a change ("start time can not be
                // updated", 2.9 and 2.15 alike).
                let changes = serde_json::json!({
                    "ack_wait": config.ack_wait.as_nanos() as u64,
                    "max_deliver": config.max_deliver,
                    "max_ack_pending": config.max_ack_pending,
                    // The mark of a consumer made again before stays ([`crate::fleet::repeats`]).
                    "description": config.description.as_deref().map(|d| {
                        crate::fleet::repeats::marked(d, have.description.as_deref(), 0)
                    }),
                });
                match crate::fleet::versions::update_consumer(
                    &sh.js,
                    &sh.cfg.events_stream(),
                    &name,
                    changes,
                    &filters,
                )
                .await
                {
                    Ok(()) => Ok(stream
                        .get_consumer::<pull::Config>(&name)
                        .await
                        .unwrap_or(c)),
                    Err(e) => {
                        tracing::warn!(hook = %s.name, "fleet: cannot update consumer {name} ({e}); using it as it is");
                        Ok(c)
                    }
                }
            } else {
                Ok(c)
            }
        }
        Err(_) => stream
            .create_consumer(crate::fleet::versions::with_filters(config, &s.filters))
            .await
            .map_err(|e| format!("cannot create consumer {name}: {e}")),
    }
}
