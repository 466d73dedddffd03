//! A hook's last hour, minute by minute (issue 50): what the Hooks tab needs to say whether a
//! hook is healthy now, not since the service started. Bounded: 60 one-minute slots, each
//! holding the hook's counters as last seen in that minute (taken by the host's ticker every
//! [`TICK`], so nothing is added to the emit path) and at most [`SAMPLES_PER_MINUTE`] handler
//! durations (recorded by the worker with each call), from which percentiles are computed.
//! A hook's history lives in its [`super::HookStats`], so it survives reloads and a
//! disable/enable like the counters.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// How often the host's ticker records every hook's counters.
pub const TICK: Duration = Duration::from_secs(10);
/// Minutes kept.
const MINUTES: usize = 60;
/// Durations kept per minute (the first ones, then one in every few: see [`Slot::sample`]).
const SAMPLES_PER_MINUTE: usize = 256;
/// The window the health and the rates look at.
pub const WINDOW_MINUTES: u64 = 5;

/// Cumulative counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Events offered to the hook.
    pub accepted: u64,
    /// Calls that returned.
    pub ok: u64,
    /// Calls that failed (timeouts included).
    pub failed: u64,
    /// Calls that timed out.
    pub timeouts: u64,
    /// Events dropped.
    pub dropped: u64,
    /// Events the whole host received (to tell "never matched" from "nothing happened").
    pub received: u64,
}

impl Totals {
    fn since(self, earlier: Totals) -> Totals {
        Totals {
            accepted: self.accepted.saturating_sub(earlier.accepted),
            ok: self.ok.saturating_sub(earlier.ok),
            failed: self.failed.saturating_sub(earlier.failed),
            timeouts: self.timeouts.saturating_sub(earlier.timeouts),
            dropped: self.dropped.saturating_sub(earlier.dropped),
            received: self.received.saturating_sub(earlier.received),
        }
    }
}

#[derive(Debug, Clone)]
struct Slot {
    /// Minutes since the Unix epoch.
    minute: u64,
    /// Counters at the start of the minute (the last ones seen before it), and at its latest
    /// tick.
    first: Totals,
    last: Totals,
    /// Handler durations in microseconds.
    durations: Vec<u32>,
    /// Calls timed in the minute (more than `durations` holds when it overflowed).
    timed: u64,
}

impl Slot {
    /// Keeps the first [`SAMPLES_PER_MINUTE`] durations, then replaces one slot in a rotating
    /// order, so a busy minute's samples still span the whole minute.
    fn sample(&mut self, us: u32) {
        self.timed += 1;
        if self.durations.len() < SAMPLES_PER_MINUTE {
            self.durations.push(us);
        } else {
            let i = (self.timed as usize * 7919) % SAMPLES_PER_MINUTE;
            self.durations[i] = us;
        }
    }
}

/// The last hour of one hook.
#[derive(Debug, Default)]
pub struct History {
    slots: VecDeque<Slot>,
    /// The first tick: the window never reaches back before it.
    since: Option<SystemTime>,
}

/// How long from `now` until the host's next tick: [`TICK`] marks of the wall clock less
/// [`TICK_EARLY`] (…:09.9, …:19.9, …, …:59.9), so a minute's last tick falls inside it and
/// what the minute saw is not split with the next.
pub fn to_next_tick(now: SystemTime) -> Duration {
    let tick = TICK.as_millis() as u64;
    let early = TICK_EARLY.as_millis() as u64;
    let ms = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let into = (ms + early) % tick;
    Duration::from_millis(if into == 0 { tick } else { tick - into })
}

/// How far before each mark of the wall clock the host ticks ([`to_next_tick`]).
pub const TICK_EARLY: Duration = Duration::from_millis(100);

fn minute_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 60)
}

impl History {
    fn slot(&mut self, minute: u64, now: Totals) -> &mut Slot {
        let last = self.slots.back().map(|s| s.last);
        if self.slots.back().is_none_or(|s| s.minute != minute) {
            self.slots.push_back(Slot {
                minute,
                first: last.unwrap_or(now),
                last: now,
                durations: Vec::new(),
                timed: 0,
            });
            while self.slots.len() > MINUTES {
                self.slots.pop_front();
            }
        }
        let n = self.slots.len() - 1;
        &mut self.slots[n]
    }

    /// Records the counters as they are at `at`.
    pub fn tick(&mut self, at: SystemTime, now: Totals) {
        self.since.get_or_insert(at);
        self.slot(minute_of(at), now).last = now;
    }

    /// Records one handler duration at `at`.
    pub fn duration(&mut self, at: SystemTime, d: Duration) {
        let us = u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        let minute = minute_of(at);
        match self.slots.back_mut() {
            Some(s) if s.minute == minute => s.sample(us),
            _ => {
                let now = self.slots.back().map(|s| s.last).unwrap_or_default();
                self.slot(minute, now).sample(us);
            }
        }
    }

    /// The view at `at` with the counters `now`: the last hour by minute, the last
    /// [`WINDOW_MINUTES`] summed, and percentiles of the durations in that window.
    pub fn view(&self, at: SystemTime, now: Totals) -> HistoryView {
        let current = minute_of(at);
        let from = current.saturating_sub(WINDOW_MINUTES - 1);
        let start = self
            .slots
            .iter()
            .find(|s| s.minute >= from)
            .map_or(now, |s| s.first);
        let mut window_samples = Vec::new();
        let trend: Vec<Minute> = self
            .slots
            .iter()
            .filter(|s| s.minute + MINUTES as u64 > current)
            .map(|s| {
                let end = if s.minute == current { now } else { s.last };
                if s.minute >= from {
                    window_samples.extend_from_slice(&s.durations);
                }
                let mut d = s.durations.clone();
                d.sort_unstable();
                Minute {
                    at: crate::time::rfc3339(UNIX_EPOCH + Duration::from_secs(s.minute * 60)),
                    counts: end.since(s.first),
                    p50_ms: percentile(&d, 0.50),
                    p95_ms: percentile(&d, 0.95),
                }
            })
            .collect();
        window_samples.sort_unstable();
        let from_time = UNIX_EPOCH + Duration::from_secs(from * 60);
        let covered_from = self.since.map_or(at, |s| s.max(from_time));
        HistoryView {
            window: now.since(start),
            window_minutes: WINDOW_MINUTES,
            window_s: at
                .duration_since(covered_from)
                .map_or(0.0, |d| (d.as_secs_f64() * 10.0).round() / 10.0),
            p50_ms: percentile(&window_samples, 0.50),
            p95_ms: percentile(&window_samples, 0.95),
            p99_ms: percentile(&window_samples, 0.99),
            trend,
        }
    }
}

/// The `q` quantile of sorted microsecond samples, in milliseconds (nearest rank).
fn percentile(sorted: &[u32], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    Some(f64::from(sorted[rank - 1]) / 1000.0)
}

/// One minute of a hook's trend.
#[derive(Debug, Clone, Serialize)]
pub struct Minute {
    /// The minute's start (RFC 3339).
    pub at: String,
    /// What happened in it.
    #[serde(flatten)]
    pub counts: Totals,
    /// Median handler duration in it, milliseconds (from the calls themselves).
    pub p50_ms: Option<f64>,
    /// 95th percentile, milliseconds.
    pub p95_ms: Option<f64>,
}

/// What `/v1/hooks` shows of a hook's recent past.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryView {
    /// What happened in the last `window_minutes` minutes (the current one included).
    pub window: Totals,
    /// The window's length.
    pub window_minutes: u64,
    /// Seconds the window actually covers (less than `window_minutes` for a hook loaded since
    /// then): what rates divide by.
    pub window_s: f64,
    /// Handler durations in the window: median, 95th and 99th percentile, milliseconds.
    pub p50_ms: Option<f64>,
    /// See `p50_ms`.
    pub p95_ms: Option<f64>,
    /// See `p50_ms`.
    pub p99_ms: Option<f64>,
    /// The last hour, one entry per minute that saw the hook loaded, oldest first.
    pub trend: Vec<Minute>,
}

/// A hook's health now, from its window: the worst that applies.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Health {
    /// `ok`, `idle` (nothing offered in the window), `degraded` (some calls failed or timed
    /// out, or the worker is restarting), `failing` (half or more of the calls failed, or the
    /// last call failed and none has succeeded since, however long ago: issue 60), `dropping`
    /// (events were dropped), `slow` (the window's p95 is half the hook's timeout or more),
    /// `never_matched` (events came, none ever matched).
    pub state: &'static str,
    /// Why, in a sentence (empty for `ok`).
    pub reason: String,
    /// Since when the trouble lasts (RFC 3339): the first of the failed calls none has
    /// succeeded after, or the first minute of the last hour's latest run of minutes with
    /// that trouble (minutes without calls neither end nor start it). Absent for `ok`, `idle`
    /// and `never_matched` (issue 60).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// What a hook's worker is doing, as [`health`] needs it.
pub struct Now<'a> {
    /// Worker state (`ready`, `restarting`, `stuck`...).
    pub status: &'a str,
    /// Events offered since the hook was first loaded.
    pub accepted_ever: u64,
    /// Its queue's bound and overflow policy, for a drop's reason.
    pub capacity: usize,
    /// See `capacity`.
    pub overflow: &'a str,
    /// The hook's timeout: a call this long fails.
    pub timeout: Duration,
    /// When its current run of failed calls began, if its last call failed.
    pub failing_since: Option<SystemTime>,
}

/// The start of the trend's latest run of minutes for which `trouble` holds, skipping minutes
/// in which nothing happened.
fn trouble_start(trend: &[Minute], trouble: impl Fn(&Minute) -> bool) -> Option<String> {
    let mut start = None;
    for m in trend.iter().rev() {
        let c = &m.counts;
        if c.accepted == 0 && c.ok == 0 && c.failed == 0 && c.dropped == 0 {
            continue;
        }
        if !trouble(m) {
            break;
        }
        start = Some(m.at.clone());
    }
    start
}

/// The health of a hook whose window is `w`.
pub fn health(w: &HistoryView, now: &Now<'_>) -> Health {
    let t = &w.window;
    let calls = t.ok + t.failed;
    let mins = w.window_minutes;
    let failed_text = || {
        let timeouts = if t.timeouts > 0 {
            format!(" ({} timed out)", t.timeouts)
        } else {
            String::new()
        };
        format!(
            "{} of {calls} calls failed in the last {mins} min{timeouts}",
            t.failed
        )
    };
    let say = |state, reason, since| Health {
        state,
        reason,
        since,
    };
    let failing_since = now.failing_since.map(crate::time::rfc3339);
    let failures_since = || {
        failing_since
            .clone()
            .or_else(|| trouble_start(&w.trend, |m| m.counts.failed > 0))
    };
    if calls >= 2 && t.failed * 2 >= calls {
        return say("failing", failed_text(), failures_since());
    }
    // The last call failed and none succeeded in the window (or there was none): failing
    // until a call succeeds, however long ago that failure was.
    if failing_since.is_some() && t.ok == 0 {
        let reason = if t.failed > 0 {
            format!("{}; none has succeeded since", failed_text())
        } else {
            "its last call failed and none has succeeded since".to_string()
        };
        return say("failing", reason, failing_since);
    }
    if t.dropped > 0 {
        return say(
            "dropping",
            format!(
                "{} of {} events dropped in the last {mins} min (queue of {}, {}): the handler \
                 does not keep up",
                t.dropped, t.accepted, now.capacity, now.overflow
            ),
            trouble_start(&w.trend, |m| m.counts.dropped > 0),
        );
    }
    if matches!(now.status, "restarting" | "stuck") {
        return say(
            "degraded",
            format!("the worker is {}", now.status),
            failures_since(),
        );
    }
    if t.failed > 0 {
        return say("degraded", failed_text(), failures_since());
    }
    let timeout_ms = now.timeout.as_secs_f64() * 1000.0;
    let slow = |p: f64| timeout_ms > 0.0 && p * 2.0 >= timeout_ms;
    if let Some(p95) = w.p95_ms.filter(|p| slow(*p)) {
        return say(
            "slow",
            format!(
                "p95 {p95:.0} ms in the last {mins} min, half its {} timeout or more",
                crate::time::fmt_duration(now.timeout)
            ),
            trouble_start(&w.trend, |m| m.p95_ms.is_some_and(slow)),
        );
    }
    if now.accepted_ever == 0 && t.received >= 10 {
        return say(
            "never_matched",
            format!(
                "none of the {} events received in the last {mins} min matched its `events:`",
                t.received
            ),
            None,
        );
    }
    if t.accepted == 0 {
        return say("idle", format!("no event in the last {mins} min"), None);
    }
    say("ok", String::new(), None)
}

#[cfg(test)]
mod tests {

    /// Issue 60 row 6: the host's ticks fall just before each ten seconds of the wall clock, so
    /// a minute's last tick is inside it (a burst at :55 was split over two minutes).
    #[test]
    fn the_ticker_ticks_just_before_each_ten_seconds() {
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(to_next_tick(at(60_000)), Duration::from_millis(9_900));
        assert_eq!(to_next_tick(at(69_850)), Duration::from_millis(50));
        assert_eq!(to_next_tick(at(69_900)), Duration::from_millis(10_000));
        assert_eq!(to_next_tick(at(69_950)), Duration::from_millis(9_950));
    }

    use super::*;

    fn at(min: u64, sec: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000 * 60 + min * 60 + sec)
    }

    fn totals(accepted: u64, ok: u64, failed: u64, dropped: u64) -> Totals {
        Totals {
            accepted,
            ok,
            failed,
            timeouts: 0,
            dropped,
            received: accepted,
        }
    }

    #[test]
    fn the_window_counts_only_its_minutes_and_percentiles_come_from_the_calls() {
        let mut h = History::default();
        h.tick(at(0, 0), totals(0, 0, 0, 0));
        h.tick(at(0, 50), totals(100, 90, 10, 0));
        for m in 1..10 {
            h.tick(at(m, 5), totals(100 + m * 10, 90 + m * 10, 10, 0));
        }
        for ms in 1..=100 {
            h.duration(at(9, 30), Duration::from_millis(ms));
        }
        let v = h.view(at(9, 40), totals(190, 180, 10, 0));
        // Minutes 5..=9: from minute 5's start (140 accepted at minute 4's tick) to now.
        assert_eq!(v.window.accepted, 50);
        assert_eq!(v.window.failed, 0);
        assert_eq!(v.p50_ms, Some(50.0));
        assert_eq!(v.p95_ms, Some(95.0));
        assert_eq!(v.trend.len(), 10);
        assert_eq!(v.trend[0].counts.failed, 10);
        let now = Now {
            status: "ready",
            accepted_ever: 190,
            capacity: 1000,
            overflow: "drop_oldest",
            timeout: Duration::from_secs(60),
            failing_since: None,
        };
        assert_eq!(health(&v, &now).state, "ok");
    }

    #[test]
    fn health_names_the_worst_that_applies() {
        let view = |t: Totals| HistoryView {
            window: t,
            window_minutes: 5,
            window_s: 300.0,
            p50_ms: None,
            p95_ms: None,
            p99_ms: None,
            trend: Vec::new(),
        };
        let now = Now {
            status: "ready",
            accepted_ever: 1,
            capacity: 10,
            overflow: "drop_oldest",
            timeout: Duration::from_secs(60),
            failing_since: None,
        };
        assert_eq!(health(&view(totals(12, 9, 3, 0)), &now).state, "degraded");
        assert_eq!(health(&view(totals(12, 3, 9, 0)), &now).state, "failing");
        assert_eq!(
            health(&view(totals(11000, 1000, 0, 9928)), &now).state,
            "dropping"
        );
        let never = Now {
            accepted_ever: 0,
            ..now
        };
        let mut t = totals(0, 0, 0, 0);
        t.received = 50;
        assert_eq!(health(&view(t), &never).state, "never_matched");
        assert_eq!(health(&view(totals(0, 0, 0, 0)), &now).state, "idle");
        // Issue 60 row 5: a failure no call has redeemed stays failing once the window
        // passed; a p95 at half the timeout is slow.
        let unredeemed = Now {
            failing_since: Some(at(3, 0)),
            ..now
        };
        let h = health(&view(totals(0, 0, 0, 0)), &unredeemed);
        assert_eq!(h.state, "failing", "{}", h.reason);
        assert_eq!(h.since, Some(crate::time::rfc3339(at(3, 0))));
        let h = health(&view(totals(1, 0, 1, 0)), &unredeemed);
        assert_eq!(h.state, "failing", "{}", h.reason);
        assert!(
            h.reason.ends_with("none has succeeded since"),
            "{}",
            h.reason
        );
        assert_eq!(
            health(&view(totals(10, 9, 1, 0)), &unredeemed).state,
            "degraded"
        );
        let slow = HistoryView {
            p95_ms: Some(30_000.0),
            ..view(totals(4, 4, 0, 0))
        };
        let h = health(&slow, &now);
        assert_eq!(h.state, "slow", "{}", h.reason);
        assert!(h.reason.contains("p95 30000 ms"), "{}", h.reason);
        let quick = HistoryView {
            p95_ms: Some(29_000.0),
            ..view(totals(4, 4, 0, 0))
        };
        assert_eq!(health(&quick, &now).state, "ok");
    }

    #[test]
    fn the_trouble_starts_at_the_latest_run_of_minutes_with_it() {
        let minute = |m: u64, t: Totals| Minute {
            at: crate::time::rfc3339(at(m, 0)),
            counts: t,
            p50_ms: None,
            p95_ms: None,
        };
        // Failed at 1, recovered at 2, failed again from 4 on (5 was quiet: no call).
        let trend = vec![
            minute(1, totals(2, 0, 2, 0)),
            minute(2, totals(3, 3, 0, 0)),
            minute(4, totals(2, 1, 1, 0)),
            minute(5, totals(0, 0, 0, 0)),
            minute(6, totals(4, 3, 1, 0)),
        ];
        let v = HistoryView {
            window: totals(6, 4, 2, 0),
            window_minutes: 5,
            window_s: 300.0,
            p50_ms: None,
            p95_ms: None,
            p99_ms: None,
            trend,
        };
        let now = Now {
            status: "ready",
            accepted_ever: 9,
            capacity: 10,
            overflow: "drop_oldest",
            timeout: Duration::from_secs(60),
            failing_since: None,
        };
        let h = health(&v, &now);
        assert_eq!(h.state, "degraded", "{}", h.reason);
        assert_eq!(h.since, Some(crate::time::rfc3339(at(4, 0))));
        assert_eq!(health(&view_ok(), &now).since, None);
    }

    fn view_ok() -> HistoryView {
        HistoryView {
            window: totals(3, 3, 0, 0),
            window_minutes: 5,
            window_s: 300.0,
            p50_ms: Some(1.0),
            p95_ms: Some(2.0),
            p99_ms: Some(2.0),
            trend: Vec::new(),
        }
    }
}
