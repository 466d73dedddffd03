//! The pipe protocol between the service and a Python worker (`runner.py`), as pure functions:
//! requests are JSON lines `{"id", "event", "context"}` (a fleet lease holder's calls also carry
//! `"start_by"` and `"epoch"`, [`crate::start_gate`]) written in pipelined batches; the worker
//! first sends a handshake line (`{"ready": true}` or `{"error": ...}`), then one answer line per
//! request, in order (`{"id", "ok": true, "result"}` or `{"id", "ok": false, "error"}`, or
//! `{"id", "ok": false, "skipped": true}` once a newer version took over, with `"expired": true`
//! for a call past its `start_by`). Pure, so
//! the protocol is unit-tested here and fuzzed (`tests/it/fuzz.rs`).

use serde_json::Value;

use crate::handler::api::{Call, HandlerError, HandlerResult};

/// Most calls written to a worker before their answers are read.
pub const PIPELINE_DEPTH: usize = 256;
/// Most bytes of requests written at once (at least one request always goes).
pub const PIPELINE_BYTES: usize = 1024 * 1024;

/// Encodes as many of `calls` as fit in one pipelined write (at most [`PIPELINE_DEPTH`] calls,
/// and no more once [`PIPELINE_BYTES`] are reached; at least one), numbered from `first_id`.
/// Returns the bytes and how many calls they hold; a first call that cannot be encoded fails.
pub fn encode_requests(calls: &[Call], first_id: u64) -> Result<(Vec<u8>, usize), HandlerError> {
    let mut buf = Vec::new();
    let mut n = 0;
    for call in calls.iter().take(PIPELINE_DEPTH) {
        if n > 0 && buf.len() >= PIPELINE_BYTES {
            break;
        }
        let id = first_id + n as u64;
        // `{"id":N,"event":"...","context":{...}}`: the context's encoding is shared with the
        // other hooks of the event (and no JSON value is built per request).
        let context = match call.context.json() {
            Ok(c) => c,
            Err(e) if n == 0 => {
                return Err(HandlerError::Failed(format!(
                    "cannot encode the event: {e}"
                )));
            }
            Err(_) => break,
        };
        {
            use std::io::Write;
            let _ = write!(buf, "{{\"id\":{id},\"event\":");
        }
        // A `str` always encodes.
        let _ = serde_json::to_writer(&mut buf, &*call.event);
        buf.extend_from_slice(b",\"context\":");
        buf.extend_from_slice(context.as_bytes());
        if let Some(g) = &call.gate {
            // A fleet lease holder's bound (issue 48): the worker starts the call only before
            // it, and once it refused one, no later call of the epoch.
            use std::io::Write;
            let _ = write!(
                buf,
                ",\"start_by\":{},\"epoch\":{}",
                g.start_by(),
                g.epoch()
            );
        }
        buf.extend_from_slice(b"}\n");
        n += 1;
    }
    Ok((buf, n))
}

/// What one line from a worker means for the request with id `id`.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// Not a JSON value: the worker broke the protocol (it is restarted).
    Broken,
    /// An answer to an earlier, abandoned request.
    Stale,
    /// An answer to a later request, or one without an id: the worker broke the order.
    OutOfOrder,
    /// The request's outcome.
    Outcome(HandlerResult),
}

/// Reads one protocol line a worker sent in answer to request `id` (a pure function, so the
/// protocol can be fuzzed).
pub fn parse_answer(line: &[u8], id: u64) -> Answer {
    if let Some(got) = null_answer_id(line) {
        return match got {
            got if got == id => Answer::Outcome(Ok(None)),
            got if got < id => Answer::Stale,
            _ => Answer::OutOfOrder,
        };
    }
    let Ok(answer) = serde_json::from_slice::<Value>(line) else {
        return Answer::Broken;
    };
    match answer.get("id").and_then(Value::as_u64) {
        Some(got) if got == id => Answer::Outcome(answer_result(&answer)),
        Some(got) if got < id => Answer::Stale,
        _ => Answer::OutOfOrder,
    }
}

/// The id of the runner's most common answer, `{"id":N,"ok":true,"result":null}` exactly as it
/// writes it, read without a JSON parse; `None` for any other line.
fn null_answer_id(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let digits = line
        .strip_prefix(b"{\"id\":")?
        .strip_suffix(b",\"ok\":true,\"result\":null}")?;
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The outcome an answer line carries (`"skipped"`: a newer version of the hook took over before
/// the call started, so it goes to that version).
pub(super) fn answer_result(answer: &Value) -> HandlerResult {
    if answer.get("skipped") == Some(&Value::Bool(true)) {
        if answer.get("expired") == Some(&Value::Bool(true)) {
            return Err(HandlerError::Expired);
        }
        return Err(HandlerError::NotStarted);
    }
    if answer.get("ok") == Some(&Value::Bool(true)) {
        match answer.get("result") {
            None | Some(Value::Null) => Ok(None),
            Some(v) => Ok(Some(v.clone())),
        }
    } else {
        let msg = answer
            .get("error")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or("handler failed without a message");
        Err(HandlerError::Failed(msg.to_string()))
    }
}

/// Reads a worker's handshake line: ready, or why it refused to start (a pure function, so the
/// protocol can be fuzzed).
pub fn parse_handshake(line: &[u8]) -> Result<(), HandlerError> {
    let answer: Value = serde_json::from_slice(line)
        .map_err(|e| HandlerError::Load(format!("python worker sent an invalid handshake: {e}")))?;
    if answer.get("ready") == Some(&Value::Bool(true)) {
        return Ok(());
    }
    let why = answer
        .get("error")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .unwrap_or("python worker refused to start")
        .to_string();
    // The runner's import check found a file of the hook's tree changed since this version was
    // loaded: the events wait for the version loaded from the new files, as when the host's own
    // check before the start finds it.
    if answer.get("changed") == Some(&Value::Bool(true)) {
        return Err(HandlerError::Changed(why));
    }
    Err(HandlerError::Load(why))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::testing::any_json;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn call(event: &str) -> Call {
        Call {
            event: Arc::from(event),
            context: Arc::new(json!({"k": 1}).into()),
            gate: None,
        }
    }

    #[test]
    fn a_gated_call_carries_its_bound_and_an_expired_skip_is_told_apart() {
        let gate = Arc::new(crate::start_gate::StartGate::new(123));
        let mut c = call("a:b");
        c.gate = Some(gate.clone());
        let (buf, _) = encode_requests(&[c], 1).unwrap();
        let v: serde_json::Value = serde_json::from_slice(buf.trim_ascii_end()).unwrap();
        assert_eq!(v["start_by"], 123);
        assert_eq!(v["epoch"], gate.epoch());
        let expired = json!({"id": 1, "ok": false, "skipped": true, "expired": true});
        assert_eq!(answer_result(&expired), Err(HandlerError::Expired));
        let skipped = json!({"id": 1, "ok": false, "skipped": true});
        assert_eq!(answer_result(&skipped), Err(HandlerError::NotStarted));
    }

    #[test]
    fn requests_are_numbered_json_lines() {
        let (buf, n) = encode_requests(&[call("a:b"), call("c:d")], 7).unwrap();
        assert_eq!(n, 2);
        let lines: Vec<Value> = buf
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            json!({"id": 7, "event": "a:b", "context": {"k": 1}})
        );
        assert_eq!(lines[1]["id"], 8);
    }

    #[test]
    fn a_batch_stops_at_the_pipeline_depth() {
        let calls: Vec<Call> = (0..PIPELINE_DEPTH + 5).map(|_| call("e")).collect();
        let (_, n) = encode_requests(&calls, 1).unwrap();
        assert_eq!(n, PIPELINE_DEPTH);
    }

    #[test]
    fn answers_are_matched_to_their_request() {
        assert_eq!(
            parse_answer(br#"{"id": 3, "ok": true, "result": 5}"#, 3),
            Answer::Outcome(Ok(Some(json!(5))))
        );
        assert_eq!(
            parse_answer(br#"{"id": 3, "ok": true}"#, 3),
            Answer::Outcome(Ok(None))
        );
        assert_eq!(parse_answer(br#"{"id": 2, "ok": true}"#, 3), Answer::Stale);
        assert_eq!(
            parse_answer(br#"{"id": 4, "ok": true}"#, 3),
            Answer::OutOfOrder
        );
        assert_eq!(parse_answer(br#"{"ok": true}"#, 3), Answer::OutOfOrder);
        assert_eq!(parse_answer(b"not json", 3), Answer::Broken);
        match parse_answer(br#"{"id": 1, "ok": false, "error": " boom "}"#, 1) {
            Answer::Outcome(Err(e)) => assert!(e.to_string().contains("boom")),
            other => panic!("expected an error outcome, got {other:?}"),
        }
    }

    #[test]
    fn the_handshake_is_ready_or_says_why_not() {
        assert!(parse_handshake(br#"{"ready": true}"#).is_ok());
        let e = parse_handshake(br#"{"error": "no handle()"}"#).unwrap_err();
        assert!(e.to_string().contains("no handle()"));
        assert!(parse_handshake(b"{").is_err());
        assert!(matches!(
            parse_handshake(br#"{"ready": false, "error": "x changed", "changed": true}"#),
            Err(HandlerError::Changed(m)) if m == "x changed"
        ));
    }

    #[test]
    fn the_common_answer_is_read_without_a_parse_and_means_the_same() {
        let line = b"{\"id\":42,\"ok\":true,\"result\":null}\n";
        assert_eq!(null_answer_id(line), Some(42));
        assert_eq!(parse_answer(line, 42), Answer::Outcome(Ok(None)));
        assert_eq!(parse_answer(line, 43), Answer::Stale);
        assert_eq!(parse_answer(line, 41), Answer::OutOfOrder);
        for other in [
            &b"{\"id\":42,\"ok\":true,\"result\":1}"[..],
            b"{\"id\":,\"ok\":true,\"result\":null}",
            b"{\"id\":-1,\"ok\":true,\"result\":null}",
            b"{\"id\": 42,\"ok\":true,\"result\":null}",
        ] {
            assert_eq!(
                null_answer_id(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    // Moved from tests/it/fuzz.rs (same case count): any line the runner might write is an
    // outcome, a stale or out-of-order answer, or broken; never a panic.
    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 384,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn runner_answer_lines_are_an_outcome_a_stale_answer_or_broken(
            line in prop_oneof![
                any::<Vec<u8>>(),
                (any::<u64>(), any::<bool>(), any_json(), "\\PC{0,30}").prop_map(|(id, ok, result, error)| {
                    serde_json::to_vec(&json!({"id": id, "ok": ok, "result": result, "error": error})).unwrap()
                }),
                (0u64..3, any::<Option<bool>>()).prop_map(|(id, ok)| {
                    serde_json::to_vec(&json!({"id": id, "ok": ok})).unwrap()
                }),
            ],
            id in 0u64..3,
        ) {
            match parse_answer(&line, id) {
                Answer::Broken => prop_assert!(serde_json::from_slice::<Value>(&line).is_err()),
                Answer::Stale | Answer::OutOfOrder => {}
                Answer::Outcome(Ok(_)) => {}
                Answer::Outcome(Err(HandlerError::Failed(msg))) => prop_assert!(!msg.is_empty()),
                Answer::Outcome(Err(other)) => prop_assert!(false, "unexpected error kind {other:?}"),
            }
            if let Err(e) = parse_handshake(&line) {
                prop_assert!(matches!(e, HandlerError::Load(ref m) if !m.is_empty()), "{e:?}");
            }
        }
    }
}
