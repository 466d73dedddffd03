//! A hook's worker task: pops jobs in order, gets the handler ready, calls it under the hook's
//! timeout and settles each outcome (counters, notices, whoever waits).

use super::LoadedHook;
use super::handover::{self, HANDOVER_WAIT, Waited};
use super::queue::{CallOutcome, Job};
use super::stats::Status;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::handler::{BoxFuture, Call, Feed, Handler, HandlerError, HandlerResult};

impl LoadedHook {
    /// Starts the worker; when `after` is given, it first waits for that hook's worker to finish
    /// (a reloaded hook keeps its per-hook order across versions).
    pub fn start_worker(
        self: &Arc<Self>,
        handler: Box<dyn Handler>,
        after: Option<Arc<LoadedHook>>,
    ) {
        if after.is_some() {
            self.stats.set_status(Status::Pending);
        }
        let task = tokio::spawn(run_worker(self.clone(), handler, after));
        *self.worker.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }
}

async fn run_worker(
    hook: Arc<LoadedHook>,
    mut handler: Box<dyn Handler>,
    after: Option<Arc<LoadedHook>>,
) {
    if let Some(prev) = after {
        prev.finished().await;
        if hook.stats.status() == Status::Pending {
            hook.stats.set_status(Status::Idle);
        }
    }
    let max_calls = handler.max_calls().max(1);
    while let Some(first) = next_job(&hook).await {
        let mut jobs = vec![first];
        if max_calls > 1 {
            jobs.extend(hook.queue.try_pop_many(max_calls - 1, &hook.version()));
        }
        run_jobs(&hook, handler.as_mut(), jobs).await;
    }
    handler.shutdown().await;
    if !hook.signals.superseded() {
        hook.stats.set_status(Status::Stopped);
    }
    hook.finished.send_replace(true);
}

/// Sets the worker state unless the hook was stopped meanwhile.
fn set_running(hook: &LoadedHook, s: Status) {
    if hook.stats.status() != Status::Stopped {
        hook.stats.set_status(s);
    }
}

/// The next job, or `None` when the queue is closed or the hook was superseded.
async fn next_job(hook: &LoadedHook) -> Option<Job> {
    let version = hook.version();
    tokio::select! {
        biased;
        _ = hook.signals.wait_superseded() => None,
        job = hook.queue.pop(&version) => job,
    }
}

/// Gets the handler ready, hands it `jobs` and settles each as the handler reports it; jobs the
/// handler did not start go back to the front of the queue (for the hook's next version).
async fn run_jobs(hook: &LoadedHook, handler: &mut dyn Handler, jobs: Vec<Job>) {
    hook.set_in_flight(jobs.len());
    set_running(hook, Status::Restarting);
    let ready = handler.ready().await;
    note_restarts(hook);
    if let Err(HandlerError::Changed(why)) = ready {
        return await_next_version(hook, jobs, &why).await;
    }
    if let Err(e) = ready {
        for job in jobs {
            finish(hook, job, Err(e.clone()), Duration::ZERO);
        }
        hook.set_in_flight(0);
        set_running(hook, Status::Idle);
        return;
    }
    set_running(hook, Status::Busy);
    let calls: Vec<Call> = jobs
        .iter()
        .map(|j| Call {
            event: j.event.clone(),
            context: j.context.clone(),
            gate: j.gate.clone(),
        })
        .collect();
    // Shared between the report and the feed (a handler with slots takes further jobs).
    let slots: Mutex<Vec<Option<Job>>> = Mutex::new(jobs.into_iter().map(Some).collect());
    let mut not_started = Vec::new();
    let mut changed = None;
    let mut last = Instant::now();
    {
        let mut report = |i: usize, result: HandlerResult| {
            let job = slots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(i)
                .and_then(Option::take);
            let Some(job) = job else {
                tracing::error!(hook = %hook.spec.name, "handler reported call {i} twice or out of range");
                return;
            };
            match &result {
                Err(HandlerError::NotStarted) => return not_started.push(job),
                // The Python worker found the call's start-by bound passed (told when it was
                // written): refused for good when the lease's bound passed here too; else it
                // only waited in the pipe too long, and goes back in order, to be written
                // again under a new epoch (the worker refuses the rest of the old one).
                Err(HandlerError::Expired) => {
                    if job.gate_shut() {
                        return job.refuse();
                    }
                    if let Some(g) = &job.gate {
                        g.next_epoch();
                    }
                    return not_started.push(job);
                }
                Err(HandlerError::Changed(why)) => {
                    changed = Some(why.clone());
                    return not_started.push(job);
                }
                _ => {}
            }
            let now = Instant::now();
            finish(hook, job, result, now - last);
            hook.settled_one();
            last = now;
        };
        let mut feed = QueueFeed {
            hook,
            slots: &slots,
        };
        handler.call_fed(calls, &mut feed, &mut report).await;
    }
    let slots = slots.into_inner().unwrap_or_else(|p| p.into_inner());
    for job in slots.into_iter().flatten() {
        finish(
            hook,
            job,
            Err(HandlerError::Crashed(
                "the handler returned without an outcome for this event".into(),
            )),
            Duration::ZERO,
        );
    }
    if let Some(why) = changed {
        return await_next_version(hook, not_started, &why).await;
    }
    if !not_started.is_empty() {
        tracing::info!(
            hook = %hook.spec.name,
            events = not_started.len(),
            "events the handler never started go back to the front of the queue"
        );
        hook.queue.push_front_many(not_started);
    }
    hook.set_in_flight(0);
    set_running(hook, Status::Idle);
    // A worker replaced at once after a timeout counts (and is announced) now.
    note_restarts(hook);
    hook.report_drops(false);
}

/// The hook's queue as a [`Feed`]: further jobs for a handler whose slots free up, numbered
/// after the jobs it was given, until the hook is superseded (the new version takes the rest).
struct QueueFeed<'a> {
    hook: &'a LoadedHook,
    slots: &'a Mutex<Vec<Option<Job>>>,
}

impl QueueFeed<'_> {
    fn adopt(&self, job: Job) -> (usize, Call) {
        let call = Call {
            event: job.event.clone(),
            context: job.context.clone(),
            gate: job.gate.clone(),
        };
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.push(Some(job));
        self.hook.took_one();
        (slots.len() - 1, call)
    }
}

impl Feed for QueueFeed<'_> {
    fn try_next(&mut self) -> Option<(usize, Call)> {
        if self.hook.signals.superseded() {
            return None;
        }
        let job = self.hook.queue.try_pop(&self.hook.version())?;
        Some(self.adopt(job))
    }

    fn next(&mut self) -> BoxFuture<'_, Option<(usize, Call)>> {
        Box::pin(async move {
            let job = next_job(self.hook).await?;
            Some(self.adopt(job))
        })
    }
}

/// The worker could not start `jobs` (or a process for them) because the hook's files changed
/// since this version was loaded: they go back to the front of the queue and wait for the version
/// loaded from the new files ([`handover`]). When none takes over (a broken or unapproved edit,
/// the hook removed), everything waiting is failed, logged once.
async fn await_next_version(hook: &LoadedHook, jobs: Vec<Job>, why: &str) {
    if !jobs.is_empty() {
        hook.queue.push_front_many(jobs);
    }
    hook.set_in_flight(0);
    set_running(hook, Status::Pending);
    tracing::info!(
        hook = %hook.spec.name,
        waiting = hook.queue.len(),
        "the hook's files changed since this version was loaded; its events wait for the new version"
    );
    let started = Instant::now();
    let ask = || {
        if !hook.newer_failed.load(Ordering::Relaxed)
            && let Some(r) = hook.reloader.get()
        {
            r.request();
        }
    };
    let stopped = || hook.stats.status() == Status::Stopped;
    let reason = match handover::wait_for_next_version(&hook.signals, ask, stopped).await {
        Waited::Superseded => {
            tracing::info!(
                hook = %hook.spec.name,
                waited_ms = started.elapsed().as_millis() as u64,
                "the new version takes the waiting events over"
            );
            return;
        }
        Waited::Stopped => {
            format!("{why} (the hook was removed or stopped before a new version loaded)")
        }
        Waited::TimedOut => format!(
            "{why} (no new version loaded within {})",
            crate::time::fmt_duration(HANDOVER_WAIT)
        ),
    };
    fail_waiting(hook, hook.queue.take_all(), &reason);
    set_running(hook, Status::Idle);
}

/// Fails `jobs` that never started: each counted and answered; one log line and one
/// `handler_error` notice for all of them.
fn fail_waiting(hook: &LoadedHook, jobs: Vec<Job>, why: &str) {
    let Some(first) = jobs.first().map(|j| j.event.clone()) else {
        return;
    };
    let n = jobs.len();
    let msg = crate::text::cap(why.to_string());
    for job in jobs {
        hook.stats.observe(Duration::ZERO);
        hook.stats.call_failed();
        job.fail(&msg);
    }
    tracing::warn!(hook = %hook.spec.name, events = n, "{n} waiting event(s) failed: {msg}");
    hook.stats.set_last_error(format!("{first}: {msg}"));
    hook.notices.send(
        "handler_error",
        serde_json::json!({"hook": hook.spec.name, "event": &*first, "error": msg, "events": n}),
    );
}

/// Counts an outcome, logs and announces failures, and answers whoever waits for it.
fn finish(hook: &LoadedHook, job: Job, result: HandlerResult, duration: Duration) {
    hook.stats.observe(duration);
    let timeout = hook.spec.manifest.timeout;
    let result = match result {
        Ok(v) => {
            hook.stats.call_ok();
            Ok(v)
        }
        Err(e) => {
            let timed_out = matches!(e, HandlerError::TimedOut(_));
            hook.stats.call_failed();
            if timed_out {
                hook.stats.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            // Capped: a handler's error text (a traceback, a response body) can be any size.
            let msg = crate::text::cap(e.to_string());
            tracing::warn!(hook = %hook.spec.name, event = %job.event, "handler failed: {msg}");
            hook.stats.set_last_error(format!("{}: {msg}", job.event));
            if timed_out {
                hook.notices.send(
                    "handler_timeout",
                    serde_json::json!({
                        "hook": hook.spec.name,
                        "event": &*job.event,
                        "timeout_s": timeout.as_secs_f64(),
                    }),
                );
            } else {
                hook.notices.send(
                    "handler_error",
                    serde_json::json!({"hook": hook.spec.name, "event": &*job.event, "error": msg}),
                );
            }
            Err(msg)
        }
    };
    if let Some(reply) = job.reply {
        let _ = reply.send(CallOutcome {
            result,
            duration,
            not_run: None,
        });
    }
}

/// Adds the restarts the handler made since the last look to the hook's count (shared across
/// versions, so it never goes backwards) and announces them (`worker_restart`).
fn note_restarts(hook: &LoadedHook) {
    let now = hook.signals.restarts();
    let seen = hook.restarts_seen.swap(now, Ordering::Relaxed);
    if now > seen {
        let total = hook.stats.restarts.fetch_add(now - seen, Ordering::Relaxed) + (now - seen);
        hook.notices.send(
            "worker_restart",
            serde_json::json!({"hook": hook.spec.name, "restarts": total}),
        );
    }
}
