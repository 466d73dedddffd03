//! Prometheus text exposition of the host's counters; every metric is named `hermes_hooks_*`.
//! Rendered on request from the counters the dispatcher keeps, so there is no second source of
//! truth.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::host::Host;

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition text.
pub fn render(host: &Host) -> String {
    let reg = host.snapshot();
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP hermes_hooks_{name} {help}");
        let _ = writeln!(out, "# TYPE hermes_hooks_{name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(out, "hermes_hooks_{name}{labels} {v}");
        }
    };
    family(
        "events_received_total",
        "counter",
        "Events accepted by emit and collect.",
        vec![(String::new(), host.events_received() as f64)],
    );
    family(
        "reloads_total",
        "counter",
        "Reloads of the hook set after the first load.",
        vec![(String::new(), host.reloads() as f64)],
    );
    family(
        "hooks_loaded",
        "gauge",
        "Hooks loaded.",
        vec![(String::new(), reg.hooks.len() as f64)],
    );
    family(
        "hooks_skipped",
        "gauge",
        "Hook directories that did not load.",
        vec![(String::new(), reg.skipped.len() as f64)],
    );
    let per_hook = |f: &dyn Fn(&crate::dispatch::LoadedHook) -> f64| -> Vec<(String, f64)> {
        reg.hooks
            .iter()
            .map(|h| (format!("{{hook=\"{}\"}}", escape(&h.spec.name)), f(h)))
            .collect()
    };
    family(
        "dispatched_total",
        "counter",
        "Events queued to a hook.",
        per_hook(&|h| h.stats.queued.load(Ordering::Relaxed) as f64),
    );
    family(
        "handler_ok_total",
        "counter",
        "Invocations that succeeded.",
        per_hook(&|h| h.stats.ok.load(Ordering::Relaxed) as f64),
    );
    family(
        "handler_errors_total",
        "counter",
        "Invocations that failed (errors, crashes, timeouts).",
        per_hook(&|h| h.stats.failed.load(Ordering::Relaxed) as f64),
    );
    family(
        "handler_timeouts_total",
        "counter",
        "Invocations that exceeded the hook's timeout.",
        per_hook(&|h| h.stats.timeouts.load(Ordering::Relaxed) as f64),
    );
    family(
        "dropped_total",
        "counter",
        "Events dropped by a full queue.",
        per_hook(&|h| h.stats.dropped.load(Ordering::Relaxed) as f64),
    );
    family(
        "worker_restarts_total",
        "counter",
        "Worker process restarts.",
        per_hook(&|h| h.stats.restarts.load(Ordering::Relaxed) as f64),
    );
    family(
        "handler_seconds_total",
        "counter",
        "Time spent in handlers.",
        per_hook(&|h| h.stats.busy_us.load(Ordering::Relaxed) as f64 / 1e6),
    );
    family(
        "queue_depth",
        "gauge",
        "Events waiting in a hook's queue.",
        per_hook(&|h| h.queue.len() as f64),
    );
    family(
        "hook_stuck",
        "gauge",
        "1 while a hook is stuck in a call past its timeout that cannot be interrupted (dynamic library).",
        per_hook(&|h| f64::from(u8::from(h.stats.status() == crate::dispatch::Status::Stuck))),
    );
    family(
        "dylibs_retained",
        "gauge",
        "Dynamic libraries no longer called but kept mapped (never unloaded), process-wide.",
        vec![(
            String::new(),
            crate::handler::dylib::retained_libraries() as f64,
        )],
    );
    // Fleet edge: the sink's state (serve --fleet).
    if let Some(st) = host.sink_status() {
        let f = &st["fleet"];
        let num = |k: &str| f[k].as_f64().unwrap_or(0.0);
        let one = |v: f64| vec![(String::new(), v)];
        family(
            "fleet_degraded",
            "gauge",
            "1 while the broker is unreachable and events wait in the edge's buffer.",
            one(f64::from(u8::from(f["state"] == "degraded"))),
        );
        family(
            "fleet_buffered",
            "gauge",
            "Events in the edge's buffer, not yet stored by the stream.",
            one(num("buffered")),
        );
        family(
            "fleet_published_total",
            "counter",
            "Events the stream acknowledged.",
            one(num("published")),
        );
        family(
            "fleet_dropped_total",
            "counter",
            "Events dropped because the edge's buffer was full.",
            one(num("dropped")),
        );
        family(
            "fleet_workers",
            "gauge",
            "Workers in the fleet view.",
            one(f["workers"].as_array().map_or(0, Vec::len) as f64),
        );
        let lag = st["hooks"]
            .as_array()
            .map(|hooks| {
                hooks
                    .iter()
                    .filter_map(|h| {
                        let name = h["name"].as_str()?;
                        Some((format!("{{hook=\"{}\"}}", escape(name)), h["lag"].as_f64()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        family(
            "fleet_hook_lag",
            "gauge",
            "Events in the stream a fleet hook has not finished.",
            lag,
        );
    }
    {
        let _ = writeln!(
            out,
            "# HELP hermes_hooks_handler_duration_seconds Time per handler invocation."
        );
        let _ = writeln!(
            out,
            "# TYPE hermes_hooks_handler_duration_seconds histogram"
        );
        for h in &reg.hooks {
            let name = escape(&h.spec.name);
            let mut cumulative = 0u64;
            for (i, bound) in crate::dispatch::DURATION_BUCKETS.iter().enumerate() {
                cumulative += h.stats.duration_buckets[i].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "hermes_hooks_handler_duration_seconds_bucket{{hook=\"{name}\",le=\"{bound}\"}} {cumulative}"
                );
            }
            cumulative += h.stats.duration_buckets[crate::dispatch::DURATION_BUCKETS.len()]
                .load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "hermes_hooks_handler_duration_seconds_bucket{{hook=\"{name}\",le=\"+Inf\"}} {cumulative}"
            );
            let sum = h.stats.busy_us.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(
                out,
                "hermes_hooks_handler_duration_seconds_sum{{hook=\"{name}\"}} {sum}"
            );
            let _ = writeln!(
                out,
                "hermes_hooks_handler_duration_seconds_count{{hook=\"{name}\"}} {cumulative}"
            );
        }
    }
    out
}
