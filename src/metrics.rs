//! OpenMetrics exposition of the host's counters via `prometheus-client`; every metric is named
//! `hermes_hooks_*`. A fresh [`Registry`] per request holds one collector that reads the counters
//! the host and the dispatcher keep at encode time, so there is no second source of truth.
//!
//! Counters are registered without `_total`: the encoder appends it, so the samples keep the names
//! the dashboards use (`hermes_hooks_dispatched_total{hook="..."}`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use crate::hook::{DURATION_BUCKETS, LoadedHook, Status};
use crate::host::Host;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition text, ending with `# EOF`.
pub fn render(host: &Host) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("hermes_hooks");
    registry.register_collector(Box::new(HostCollector(host.clone())));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// Reads the host's counters when the registry is encoded.
struct HostCollector(Host);

impl std::fmt::Debug for HostCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostCollector")
    }
}

/// One metric family with a value per loaded hook, labelled `hook`.
fn per_hook<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    hooks: &[std::sync::Arc<LoadedHook>],
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric_type: MetricType,
    value: impl Fn(&LoadedHook) -> M,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, unit, metric_type)?;
    for h in hooks {
        value(h).encode(family.encode_family(&[("hook", h.spec.name.as_str())])?)?;
    }
    Ok(())
}

fn load(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Collector for HostCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let host = &self.0;
        let reg = host.snapshot();
        let hooks = &reg.hooks;
        let e = &mut encoder;

        let single = |e: &mut DescriptorEncoder,
                      name: &str,
                      help: &str,
                      metric: &dyn EncodeMetric|
         -> Result<(), std::fmt::Error> {
            metric.encode(e.encode_descriptor(name, help, None, metric.metric_type())?)
        };
        single(
            e,
            "events_received",
            "Events accepted by emit and collect.",
            &ConstCounter::new(host.events_received()),
        )?;
        single(
            e,
            "reloads",
            "Reloads of the hook set after the first load.",
            &ConstCounter::new(host.reloads()),
        )?;
        single(
            e,
            "ready",
            "1 once the first load is done and the host is not shutting down (what /readyz says).",
            &ConstGauge::new(i64::from(host.is_ready() && !host.is_draining())),
        )?;
        single(
            e,
            "hooks_loaded",
            "Hooks loaded.",
            &ConstGauge::new(hooks.len() as i64),
        )?;
        single(
            e,
            "hooks_skipped",
            "Hook directories that did not load.",
            &ConstGauge::new(reg.skipped.len() as i64),
        )?;

        per_hook_families(e, hooks)?;
        single(
            e,
            "dylibs_retained",
            "Dynamic libraries no longer called but kept mapped (never unloaded), process-wide.",
            &ConstGauge::new(crate::handler::dylib::retained_libraries() as i64),
        )?;

        duration_histogram(e, hooks)?;
        if let Some(st) = host.worker_status() {
            encode_worker(e, &st)?;
        }
        if let Some(st) = host.sink_status() {
            encode_fleet(e, &st)?;
        }
        Ok(())
    }
}

/// A fleet worker's counters per hook (`worker --fleet`): `{"hooks": {NAME: {COUNTER: n}}}`.
fn encode_worker(e: &mut DescriptorEncoder, st: &serde_json::Value) -> Result<(), std::fmt::Error> {
    let Some(hooks) = st["hooks"].as_object() else {
        return Ok(());
    };
    for (key, help) in [
        (
            "delivered",
            "Deliveries from the stream to this worker, per hook.",
        ),
        (
            "redelivered",
            "Deliveries that were redeliveries (a worker died, an ack was lost).",
        ),
        ("acked", "Events handled and acknowledged."),
        ("retried", "Failed events handed back for a retry."),
        (
            "dead",
            "Events this worker moved to the dead-letter stream.",
        ),
        (
            "skipped",
            "Deliveries no pattern of the hook matches (acknowledged).",
        ),
        (
            "mismatched",
            "Routed by another version's filter and handed back (rolling update).",
        ),
        (
            "already_done",
            "Redeliveries of events this worker had finished (acknowledged again).",
        ),
        (
            "duplicate",
            "First deliveries replayed by a broker that lost consumer state (crash); those not in already_done ran again.",
        ),
    ] {
        let name = format!("fleet_worker_{key}");
        let mut family = e.encode_descriptor(&name, help, None, MetricType::Counter)?;
        for (name, c) in hooks {
            let v = c[key].as_u64().unwrap_or(0);
            ConstCounter::new(v).encode(family.encode_family(&[("hook", name.as_str())])?)?;
        }
    }
    Ok(())
}

/// The fleet edge's state (`serve --fleet`): only when a fleet sink is installed.
fn encode_fleet(e: &mut DescriptorEncoder, st: &serde_json::Value) -> Result<(), std::fmt::Error> {
    let f = &st["fleet"];
    let num = |k: &str| f[k].as_u64().unwrap_or(0);
    let gauge = |e: &mut DescriptorEncoder, name: &str, help: &str, v: i64| {
        ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
    };
    let counter = |e: &mut DescriptorEncoder, name: &str, help: &str, v: u64| {
        ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
    };
    gauge(
        e,
        "fleet_degraded",
        "1 while the broker is unreachable and events wait in the edge's buffer.",
        i64::from(f["state"] == "degraded"),
    )?;
    gauge(
        e,
        "fleet_buffered",
        "Events in the edge's buffer, not yet stored by the stream.",
        num("buffered") as i64,
    )?;
    counter(
        e,
        "fleet_published",
        "Events the stream acknowledged.",
        num("published"),
    )?;
    counter(
        e,
        "fleet_buffer_full",
        "Events refused with 503 because the edge's buffer was full (none accepted is dropped).",
        num("buffer_full"),
    )?;
    counter(
        e,
        "fleet_refused",
        "Accepted events the broker refused for good (over a limit), taken off the buffer.",
        num("refused"),
    )?;
    counter(
        e,
        "fleet_stream_discarded",
        "Events the event stream discarded at its limits (max bytes, age), handled or not, seen by this edge.",
        num("stream_discarded"),
    )?;
    let mut family = e.encode_descriptor(
        "fleet_hook_discarded",
        "Events the event stream discarded at its limits before this hook handled them (lost to it).",
        None,
        MetricType::Counter,
    )?;
    // Every fleet hook (0 until it loses one), and any other the counts name.
    let lost = f["discarded_unhandled"].as_object();
    let mut names: std::collections::BTreeSet<&str> = st["hooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["name"].as_str())
        .collect();
    names.extend(lost.into_iter().flat_map(|m| m.keys().map(String::as_str)));
    for hook in names {
        let n = lost.and_then(|m| m.get(hook)).and_then(|v| v.as_u64());
        ConstCounter::new(n.unwrap_or(0)).encode(family.encode_family(&[("hook", hook)])?)?;
    }
    if let Some(n) = f["dead_letters"].as_u64() {
        gauge(
            e,
            "fleet_dead_letters",
            "Events in the fleet's dead-letter stream (`hermes-hooks dead list`).",
            n as i64,
        )?;
    }
    gauge(
        e,
        "fleet_workers",
        "Workers in the fleet view.",
        f["workers"].as_array().map_or(0, Vec::len) as i64,
    )?;
    let mut family = e.encode_descriptor(
        "fleet_hook_lag",
        "Events in the stream a fleet hook has not finished.",
        None,
        MetricType::Gauge,
    )?;
    for h in st["hooks"].as_array().into_iter().flatten() {
        if let (Some(name), Some(lag)) = (h["name"].as_str(), h["lag"].as_i64()) {
            ConstGauge::new(lag).encode(family.encode_family(&[("hook", name)])?)?;
        }
    }
    Ok(())
}

/// The per-hook counter and gauge families (one sample per hook in each).
fn per_hook_families(
    e: &mut DescriptorEncoder,
    hooks: &[Arc<LoadedHook>],
) -> Result<(), std::fmt::Error> {
    let counter = MetricType::Counter;
    per_hook(
        e,
        hooks,
        "dispatched",
        "Events queued to a hook.",
        None,
        counter,
        |h| ConstCounter::new(load(&h.stats.queued)),
    )?;
    per_hook(
        e,
        hooks,
        "handler_ok",
        "Invocations that succeeded.",
        None,
        counter,
        |h| ConstCounter::new(load(&h.stats.ok)),
    )?;
    per_hook(
        e,
        hooks,
        "handler_errors",
        "Invocations that failed (errors, crashes, timeouts).",
        None,
        counter,
        |h| ConstCounter::new(load(&h.stats.failed)),
    )?;
    per_hook(
        e,
        hooks,
        "handler_timeouts",
        "Invocations that exceeded the hook's timeout.",
        None,
        counter,
        |h| ConstCounter::new(load(&h.stats.timeouts)),
    )?;
    per_hook(
        e,
        hooks,
        "dropped",
        "Events dropped by a full queue, or collects dropped unstarted because their caller gave up.",
        None,
        counter,
        |h| ConstCounter::new(load(&h.stats.dropped)),
    )?;
    per_hook(
        e,
        hooks,
        "worker_restarts",
        "Worker process restarts.",
        None,
        counter,
        |h| ConstCounter::new(load(&h.stats.restarts)),
    )?;
    per_hook(
        e,
        hooks,
        "handler",
        "Time spent in handlers.",
        Some(&Unit::Seconds),
        counter,
        |h| ConstCounter::new(load(&h.stats.busy_us) as f64 / 1e6),
    )?;
    let gauge = MetricType::Gauge;
    per_hook(
        e,
        hooks,
        "queue_depth",
        "Events waiting in a hook's queue.",
        None,
        gauge,
        |h| ConstGauge::new(h.waiting() as i64),
    )?;
    per_hook(
        e,
        hooks,
        "hook_stuck",
        "1 while a hook is stuck in a call past its timeout that cannot be interrupted (dynamic library).",
        None,
        gauge,
        |h| ConstGauge::new(i64::from(h.status() == Status::Stuck)),
    )?;
    Ok(())
}

/// The per-hook handler duration histogram.
fn duration_histogram(
    e: &mut DescriptorEncoder,
    hooks: &[Arc<LoadedHook>],
) -> Result<(), std::fmt::Error> {
    let mut family = e.encode_descriptor(
        "handler_duration",
        "Time per handler invocation.",
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    for h in hooks {
        // Per-bucket counts, not cumulative: the encoder sums them; the last is +Inf.
        let buckets: Vec<(f64, u64)> = DURATION_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(h.stats.duration_buckets.iter().map(load))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = load(&h.stats.busy_us) as f64 / 1e6;
        family
            .encode_family(&[("hook", h.spec.name.as_str())])?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    Ok(())
}
