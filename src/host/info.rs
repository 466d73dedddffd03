//! The view of a loaded hook that `/v1/hooks` and `list` show ([`HookInfo`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::hook::LoadedHook;

/// A hook as shown by `/v1/hooks` and `list`.
#[derive(Debug, Clone, Serialize)]
pub struct HookInfo {
    /// Hook name.
    pub name: String,
    /// `description:`.
    pub description: String,
    /// `events:` patterns.
    pub events: Vec<String>,
    /// Handler kind; `shell` for a command of config.yaml's `hooks:` block ([`Self::config_entries`]).
    pub kind: &'static str,
    /// An entry of config.yaml's `hooks:` block: the event, matcher and command as written there
    /// (issue 58 row 8; its hook directory is made by the service, not to be edited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_entry: Option<crate::config_hooks::WrittenEntry>,
    /// Every entry of config.yaml's `hooks:` block with its command that the hook runs, in file
    /// order (issue 58 row 1: one hook per command); `config_entry` is the first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub config_entries: Vec<crate::config_hooks::WrittenEntry>,
    /// Hook directory.
    pub path: PathBuf,
    /// Handler file or URL.
    pub handler: String,
    /// Root the hook came from.
    pub root: PathBuf,
    /// Worker state.
    pub status: &'static str,
    /// Timeout per invocation, seconds.
    pub timeout_s: f64,
    /// Queue state.
    pub queue: QueueInfo,
    /// Counters.
    pub counters: Counters,
    /// Last error, if any.
    pub last_error: Option<LastError>,
    /// Warnings from HOOK.yaml.
    pub warnings: Vec<String>,
    /// Webhooks only: false when deliveries go out UNSIGNED (`secret_env` unset or absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed: Option<bool>,
    /// Where it runs (`runs`, `why`), its interpreter, the handler's SHA-256.
    #[serde(flatten)]
    pub placement: crate::ingateway::HookPlacement,
    /// Python only: how the worker process was started (`forked` from the fork server, or
    /// `fresh`) and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerStart>,
    /// Calls in flight at once (`concurrency:`; locally for executable and webhook hooks, across
    /// the fleet for every kind in fleet mode).
    pub concurrency: usize,
    /// How long its handler calls took.
    pub durations: Durations,
    /// What the hook's `sandbox:` (or the service's default) confines, and what the kernel
    /// enforces of it.
    pub sandbox: crate::sandbox::view::Shown,
    /// Its health now, from the last minutes (issue 50): `ok`, `idle`, `degraded`, `failing`,
    /// `dropping`, `slow`, `never_matched`, and why.
    pub health: crate::hook::history::Health,
    /// Its last minutes and hour: the window's counts and percentiles, the trend by minute.
    pub recent: crate::hook::history::HistoryView,
}

/// Handler call durations of a hook: the count and mean of every call, the percentiles of the
/// calls of the last minutes (from the calls themselves, not a histogram's bounds).
#[derive(Debug, Clone, Serialize)]
pub struct Durations {
    /// Calls timed.
    pub calls: u64,
    /// Mean, milliseconds (0 without calls).
    pub mean_ms: f64,
    /// Half of the recent calls took at most this long, milliseconds (None without a call in
    /// the window of `recent`).
    pub p50_ms: Option<f64>,
    /// 95 % of the recent calls took at most this long, milliseconds (as `p50_ms`).
    pub p95_ms: Option<f64>,
}

impl Durations {
    fn of(s: &crate::hook::HookStats, recent: &crate::hook::history::HistoryView) -> Self {
        let calls: u64 = s
            .duration_buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum();
        let busy_ms = s.busy_us.load(Ordering::Relaxed) as f64 / 1000.0;
        Self {
            calls,
            mean_ms: if calls == 0 {
                0.0
            } else {
                busy_ms / calls as f64
            },
            p50_ms: recent.p50_ms,
            p95_ms: recent.p95_ms,
        }
    }
}

/// How a hook's worker process was started, as shown by `/v1/hooks`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStart {
    /// `forked` or `fresh`.
    pub start: String,
    /// Why.
    pub reason: String,
}

/// Queue part of [`HookInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct QueueInfo {
    /// Events waiting to run: queued, plus those a worker took ahead of the calls running (a
    /// Python worker's window).
    pub depth: usize,
    /// Events the worker has taken and not settled: running, or written ahead to its window.
    pub in_flight: usize,
    /// Bound.
    pub capacity: usize,
    /// Policy.
    pub overflow: &'static str,
}

/// Counter part of [`HookInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct Counters {
    /// Events accepted.
    pub queued: u64,
    /// Successful invocations.
    pub ok: u64,
    /// Failed invocations.
    pub failed: u64,
    /// Timed-out invocations.
    pub timeouts: u64,
    /// Dropped by the overflow policy.
    pub dropped: u64,
    /// Worker restarts.
    pub restarts: u64,
    /// Events offered and not refused for a stopping hook (`queued` plus `drop_newest` drops).
    pub accepted: u64,
    /// Events still queued or running when the host stopped.
    pub undelivered: u64,
}

/// Last error part of [`HookInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct LastError {
    /// RFC 3339 time.
    pub time: String,
    /// Message.
    pub message: String,
    /// Invocations that succeeded since: more than 0 means the error is no longer current.
    pub ok_since: u64,
}

impl HookInfo {
    pub(crate) fn of(
        h: &LoadedHook,
        python: &str,
        hermes_home: &Path,
        sandbox_default: crate::sandbox::DefaultSandbox,
        received: u64,
    ) -> Self {
        let s = &h.stats;
        let spec = &h.spec;
        let recent = s
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .view(std::time::SystemTime::now(), s.totals(received));
        let health = crate::hook::history::health(
            &recent,
            &crate::hook::history::Now {
                status: s.status().as_str(),
                accepted_ever: s.accepted.load(Ordering::Relaxed),
                capacity: h.queue.capacity(),
                overflow: spec.manifest.overflow.as_str(),
                timeout: spec.manifest.timeout,
                failing_since: s.failing_since(),
            },
        );
        Self {
            name: spec.name.clone(),
            description: spec.manifest.description.clone(),
            events: spec.manifest.events.clone(),
            kind: match spec.config_entries.is_empty() {
                false => "shell",
                true => spec.kind.as_str(),
            },
            config_entry: spec.config_entries.first().cloned(),
            config_entries: spec.config_entries.clone(),
            path: spec.dir.clone(),
            handler: match (&spec.handler_path, &spec.manifest.url) {
                (Some(p), _) => p.display().to_string(),
                // Path and query may carry a token: scheme, host and port only.
                (None, Some(u)) => crate::text::redact_url(u),
                _ => String::new(),
            },
            root: spec.root.clone(),
            status: if spec.placement.in_gateway() {
                "in_gateway"
            } else {
                h.status().as_str()
            },
            timeout_s: spec.manifest.timeout.as_secs_f64(),
            queue: QueueInfo {
                depth: h.waiting(),
                in_flight: h.stats.in_flight(),
                capacity: h.queue.capacity(),
                overflow: h.queue.overflow().as_str(),
            },
            counters: Counters {
                queued: s.queued.load(Ordering::Relaxed),
                ok: s.ok.load(Ordering::Relaxed),
                failed: s.failed.load(Ordering::Relaxed),
                timeouts: s.timeouts.load(Ordering::Relaxed),
                dropped: s.dropped.load(Ordering::Relaxed),
                restarts: s.restarts.load(Ordering::Relaxed),
                accepted: s.accepted.load(Ordering::Relaxed),
                undelivered: s.undelivered.load(Ordering::Relaxed),
            },
            last_error: s.last_error().map(|(t, m)| LastError {
                time: crate::time::rfc3339(t),
                message: m,
                ok_since: s.ok_since_last_error(),
            }),
            warnings: spec.manifest.warnings.clone(),
            signed: crate::handler::signed(spec),
            placement: crate::ingateway::HookPlacement::of(spec, python, hermes_home),
            // A config.yaml entry's worker and interpreter are the service's own machinery,
            // set in the directory it makes: nothing the operator could change there.
            worker: h
                .signals()
                .start()
                .filter(|_| spec.config_entries.is_empty())
                .map(|(start, reason)| WorkerStart { start, reason }),
            concurrency: spec.manifest.concurrency,
            durations: Durations::of(s, &recent),
            sandbox: sandbox_view(spec, sandbox_default, hermes_home),
            health,
            recent,
        }
    }
}

/// The sandbox of `spec` as `check` and `/v1/hooks` show it.
pub fn sandbox_view(
    spec: &crate::discovery::HookSpec,
    default: crate::sandbox::DefaultSandbox,
    hermes_home: &Path,
) -> crate::sandbox::view::Shown {
    crate::handler::hook_sandbox::view_of(spec, default, hermes_home)
}
