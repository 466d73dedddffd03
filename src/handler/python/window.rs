//! A Python worker's calls as a sliding window (issue 37): up to [`PIPELINE_DEPTH`] requests are
//! written at once, and once half of them are answered, the calls still waiting and what the
//! hook's queue holds (the [`Feed`]) are written behind the rest, so the worker never waits for
//! the service to report a batch and encode the next one, and the service reports answers while
//! the worker runs. Request ids stay consecutive across the refills, so everything the module
//! comment of `python/mod.rs` promises holds over the whole window: answers in order, the timeout
//! of a call counted from the answer before it, and after a crash or a kill the calls behind the
//! one running are provably never started ([`HandlerError::NotStarted`]).

use std::collections::VecDeque;
use std::time::Instant;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::protocol::{PIPELINE_DEPTH, answer_result, encode_requests};
use super::{
    Aborted, DRAIN_AFTER_KILL, FIRST_BACKOFF, MAX_BACKOFF, MAX_RESPONSE, Proc, PythonHandler,
    Writer, pipelining_enabled,
};
use crate::handler::api::{Call, Feed, HandlerError, Report};
use crate::handler::process::read_line_limited;

/// Calls waiting to be written, with the index each is reported at.
type Todo = VecDeque<(usize, Call)>;

/// Request bytes written behind a window at most: the writer holds one more while it writes.
const WRITES_QUEUED: usize = 2;

impl PythonHandler {
    /// Runs `calls` (reported at `0..`), then what `feed` brings while they run, until nothing
    /// more is queued.
    pub(super) async fn run_calls(
        &mut self,
        calls: Vec<Call>,
        feed: &mut dyn Feed,
        report: &mut Report<'_>,
    ) {
        let mut todo: Todo = calls.into_iter().enumerate().collect();
        let mut first = true;
        self.expired = false;
        while !todo.is_empty() {
            // A newer version is ready: the rest is its. Or the worker died in an earlier
            // window: the rest waits for the restart (and its backoff) in the queue. Or it
            // refused a call past its start-by bound: the rest goes back behind that call.
            if !first && (self.ctx.signals.superseded() || self.worker.is_none() || self.expired) {
                for (i, _) in todo.drain(..) {
                    report(i, Err(HandlerError::NotStarted));
                }
                return;
            }
            first = false;
            self.run_window(&mut todo, feed, report).await;
        }
    }

    /// Encodes up to `limit` calls from the front of `todo` (as many as fit in one write, at
    /// least one), numbered after the last id sent, and takes them off it: the request bytes,
    /// the calls' report indices, the first id.
    fn take_encoded(
        &mut self,
        todo: &mut Todo,
        limit: usize,
    ) -> Result<(Vec<u8>, Vec<usize>, u64), HandlerError> {
        let calls: Vec<Call> = todo.iter().take(limit).map(|(_, c)| c.clone()).collect();
        let first_id = self.next_id + 1;
        let (buf, n) = encode_requests(&calls, first_id)?;
        self.next_id += n as u64;
        Ok((buf, todo.drain(..n).map(|(i, _)| i).collect(), first_id))
    }

    /// Writes more calls behind the `idx.len() - k` unanswered ones (up to `depth` in all):
    /// first those left in `todo`, then what `feed` has queued. False when the writer is gone
    /// (the worker closed its stdin): nothing more is written to it.
    fn refill(
        &mut self,
        todo: &mut Todo,
        feed: &mut dyn Feed,
        room: usize,
        idx: &mut Vec<usize>,
        more: &mpsc::Sender<Vec<u8>>,
    ) -> bool {
        if more.is_closed() {
            return false;
        }
        if more.capacity() == 0 {
            return true; // the writer is behind: the pipe is full anyway
        }
        while todo.len() < room {
            match feed.try_next() {
                Some(call) => todo.push_back(call),
                None => break,
            }
        }
        let room = self.gated_room(todo, room, idx.len());
        if todo.is_empty() || room == 0 {
            return true;
        }
        // A call that cannot be encoded stays first in `todo`: the next window reports it.
        if let Ok((buf, written, _)) = self.take_encoded(todo, room) {
            idx.extend(written);
            // The only sender, with room checked above: this cannot fail but for a writer
            // that just stopped, whose calls then come back as never started (EOF below).
            let _ = more.try_send(buf);
        }
        true
    }

    /// How many of `room` calls may be written behind `outstanding` unanswered ones when the
    /// first of `todo` carries a fleet lease's start-by bound (issue 48): as many as will
    /// surely start within a third of the time left to it at this worker's average pace (at
    /// least one when none is outstanding), so a holder's bound is not missed by calls that
    /// only waited in the pipe (the worker refuses those, and the holder stands down).
    fn gated_room(&self, todo: &Todo, room: usize, outstanding: usize) -> usize {
        let Some(gate) = todo.front().and_then(|(_, c)| c.gate.as_ref()) else {
            return room;
        };
        let left = gate
            .start_by()
            .saturating_sub(crate::start_gate::monotonic_ns());
        let fit = (left / 3 / self.call_ns.max(50_000)) as usize;
        let floor = usize::from(outstanding == 0);
        room.min(fit.saturating_sub(outstanding).max(floor))
    }

    /// Runs one window: the first calls of `todo`, and more as answers come (see the module
    /// comment). Every call taken off `todo` is reported.
    async fn run_window(&mut self, todo: &mut Todo, feed: &mut dyn Feed, report: &mut Report<'_>) {
        let depth = if pipelining_enabled() {
            PIPELINE_DEPTH
        } else {
            1
        };
        let first = self.gated_room(todo, depth, 0);
        let (request, mut idx, first_id) = match self.take_encoded(todo, first) {
            Ok(r) => r,
            Err(e) => {
                if let Some((i, _)) = todo.pop_front() {
                    report(i, Err(e));
                }
                return;
            }
        };
        if self.worker.is_none() {
            for i in idx {
                report(
                    i,
                    Err(HandlerError::Crashed("python worker is not running".into())),
                );
            }
            return;
        }
        let mut answered_at = Instant::now();
        let stdin = self.worker.as_mut().and_then(|w| w.stdin.take());
        let (tx, writer) = spawn_writer(stdin, request);
        let mut more = Some(tx);
        let mut k = 0;
        while k < idx.len() {
            if let Some(tx) = &more
                && !self.expired
                && idx.len() - k <= depth / 2
                && !self.refill(todo, feed, depth - (idx.len() - k), &mut idx, tx)
            {
                more = None;
            }
            let deadline = answered_at + self.ctx.timeout;
            let id = first_id + k as u64;
            let read = tokio::time::timeout_at(deadline.into(), self.read_answer(id)).await;
            match read {
                Ok(Ok(result)) => {
                    self.expired |= result == Err(HandlerError::Expired);
                    report(idx[k], result);
                    self.backoff = FIRST_BACKOFF;
                    let now = Instant::now();
                    // An average over about the last 16 calls.
                    // Up at once, down slowly: the pipe is sized for the slow calls.
                    let took = (now - answered_at).as_nanos().min(u64::MAX as u128) as u64;
                    self.call_ns = if took > self.call_ns {
                        took
                    } else {
                        self.call_ns - self.call_ns / 16 + took / 16
                    };
                    answered_at = now;
                    k += 1;
                }
                Ok(Err(None)) => {
                    // EOF: every answer the worker wrote has been read; call k was running.
                    writer.abort();
                    let err = self.crashed("while handling the event").await;
                    report(idx[k], Err(err));
                    for &i in &idx[k + 1..] {
                        report(i, Err(HandlerError::NotStarted));
                    }
                    return;
                }
                Ok(Err(Some(why))) => {
                    writer.abort();
                    report(idx[k], Err(HandlerError::Crashed(why)));
                    self.abort_window(&idx, k, first_id, report).await;
                    self.worker = None;
                    self.restart_at = Some(Instant::now() + self.backoff);
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    return;
                }
                Err(_) => {
                    writer.abort();
                    report(idx[k], Err(HandlerError::TimedOut(self.ctx.timeout)));
                    self.abort_window(&idx, k, first_id, report).await;
                    self.replace_after_timeout().await;
                    return;
                }
            }
        }
        // Every answer came, so every request was read: the writer is done; its pipe goes back.
        drop(more);
        match writer.await {
            Ok(Some(stdin)) => {
                if let Some(w) = self.worker.as_mut() {
                    w.stdin = Some(stdin);
                }
            }
            _ => {
                // The write failed although every call answered: the worker is going away.
                let err = self.crashed("after answering (its stdin is closed)").await;
                tracing::debug!(hook = %self.ctx.name, "{err}");
            }
        }
    }

    /// Kills the worker while call `k` of the window `idx` (request ids from `first_id`) is
    /// unfinished (`k` is already reported), reads what it had written, reports the calls that
    /// did finish, the one that may have started as failed, and the rest as never started.
    async fn abort_window(
        &mut self,
        idx: &[usize],
        k: usize,
        first_id: u64,
        report: &mut Report<'_>,
    ) {
        let Some(mut w) = self.worker.take() else {
            return;
        };
        w.group.kill();
        if let Proc::Fresh(child) = &mut w.proc {
            let _ = child.start_kill();
        }
        let mut answered = Vec::new();
        let drained = tokio::time::timeout(DRAIN_AFTER_KILL, async {
            loop {
                let mut line = Vec::new();
                match read_line_limited(&mut w.stdout, &mut line, MAX_RESPONSE).await {
                    Ok(Some(_)) => {
                        if let Ok(v) = serde_json::from_slice::<Value>(&line)
                            && let Some(id) = v.get("id").and_then(Value::as_u64)
                        {
                            answered.push((id, v));
                        }
                    }
                    Ok(None) | Err(_) => return,
                }
            }
        })
        .await;
        w.kill().await;
        let state = if drained.is_ok() {
            Aborted::Clean
        } else {
            Aborted::Unknown
        };
        settle_aborted(idx, k, first_id, answered, state, report);
    }
}

/// After a kill: reports what the worker answered behind call `k` of window `idx`, the call
/// that may have started when it was killed as failed, and the rest as never started (or, when
/// its output could not be read to the end, as possibly started).
fn settle_aborted(
    idx: &[usize],
    k: usize,
    first_id: u64,
    answered: Vec<(u64, Value)>,
    state: Aborted,
    report: &mut Report<'_>,
) {
    let n = idx.len();
    // The last call whose answer was written (call k's own answer counts: written just after
    // its deadline, it means the call after it was started).
    let mut last_answered: Option<usize> = None;
    for (id, v) in answered {
        let Some(i) = id.checked_sub(first_id).map(|i| i as usize) else {
            continue;
        };
        if i < k || i >= n {
            continue;
        }
        if i > k {
            report(idx[i], answer_result(&v));
        }
        last_answered = Some(i);
    }
    let first_open = last_answered.map_or(k + 1, |i| i + 1);
    for (i, &at) in idx.iter().enumerate().skip(first_open) {
        let maybe_started = i == first_open && last_answered.is_some();
        let err = match state {
            Aborted::Clean if !maybe_started => HandlerError::NotStarted,
            _ => HandlerError::Crashed(
                "the python worker was killed while this event may have been running".into(),
            ),
        };
        report(at, Err(err));
    }
}

/// Writes `first` to the worker's stdin, then each request buffer sent on the returned channel
/// until it closes; returns the pipe, or `None` once a write failed (the worker is gone). A task
/// of its own, so a worker answering early never waits on a service that is still writing.
fn spawn_writer(
    stdin: Option<Writer>,
    first: Vec<u8>,
) -> (mpsc::Sender<Vec<u8>>, JoinHandle<Option<Writer>>) {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(WRITES_QUEUED);
    let writer = tokio::spawn(async move {
        let mut s = stdin?;
        if s.write_all(&first).await.is_err() || s.flush().await.is_err() {
            return None;
        }
        while let Some(buf) = rx.recv().await {
            if s.write_all(&buf).await.is_err() || s.flush().await.is_err() {
                return None;
            }
        }
        Some(s)
    });
    (tx, writer)
}
