//! The HTTP API of the real `serve` binary over real sockets: routes, status codes, errors.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::util::{Hooks, Serve, http, poll, signal};

const T: Duration = Duration::from_secs(20);

#[test]
fn events_collect_and_hooks_routes() {
    let hooks = Hooks::new();
    hooks.recorder("rec", "[\"agent:*\"]", "None");
    hooks.python("decide", "[message:pre_route]", "def handle(e, c):\n    return {'decision': 'switch_session', 'session_id': c['message']}\n");
    hooks.python(
        "broken",
        "[message:pre_route]",
        "def handle(e, c):\n    raise KeyError('x')\n",
    );
    hooks.add("bad", &[("HOOK.yaml", "events: [\n")]);
    let serve = Serve::start(&hooks, &[]);

    assert_eq!(serve.get("/healthz").0, 200);
    assert_eq!(serve.get("/readyz").0, 200);
    let (s, v) = serve.post(
        "/v1/events",
        &json!({"event": "agent:start", "context": {"user_id": "u"}}),
    );
    assert_eq!((s, v), (202, json!({"queued": 1})));
    let (s, v) = serve.post("/v1/events", &json!({"event": "agent:end"}));
    assert_eq!(
        (s, v),
        (202, json!({"queued": 1})),
        "context may be omitted"
    );
    poll(T, "both events recorded", || {
        (hooks.recorded("rec").len() == 2).then_some(())
    });
    assert_eq!(hooks.recorded("rec")[1]["context"], json!({}));

    let (s, v) = serve.post(
        "/v1/collect",
        &json!({"event": "message:pre_route", "context": {"message": "s2"}, "timeout_ms": 5000}),
    );
    assert_eq!(s, 200);
    assert_eq!(
        v["results"],
        json!([{"hook": "decide", "result": {"decision": "switch_session", "session_id": "s2"}}])
    );
    assert_eq!(
        v["errors"],
        json!([{"hook": "broken", "error": "KeyError: 'x'"}])
    );

    let (s, v) = serve.post(
        "/v1/events/batch",
        &json!({"events": [{"event": "agent:step"}, {"event": "session:start", "context": {}}]}),
    );
    assert_eq!((s, v), (202, json!({"queued": [1, 0]})));

    let (s, v) = serve.get("/v1/hooks");
    assert_eq!(s, 200);
    let names: Vec<&str> = v["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["broken", "decide", "rec"]);
    assert_eq!(v["skipped"][0]["name"], "bad");
    assert_eq!(v["skipped"][0]["code"], "yaml_error");
    let (s, h) = serve.get("/v1/hooks/decide");
    assert_eq!(s, 200);
    assert_eq!(h["kind"], "python");
    assert_eq!(h["events"], json!(["message:pre_route"]));
    assert_eq!(h["counters"]["ok"], 1);
    let (s, h) = serve.get("/v1/hooks/broken");
    assert_eq!(s, 200);
    assert!(
        h["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("KeyError")
    );
    let (s, e) = serve.get("/v1/hooks/nope");
    assert_eq!(s, 404);
    assert_eq!(e["error"]["code"], "not_found");

    let (s, headers, text) = {
        let (s, h, b) = http(&serve.addr, "GET", "/metrics", &[], b"");
        (s, h, String::from_utf8(b).unwrap())
    };
    assert_eq!(s, 200);
    let content_type = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_str());
    assert_eq!(
        content_type,
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "/metrics should be served as OpenMetrics"
    );
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text must end with # EOF:\n{text}"
    );
    assert!(
        text.contains("hermes_hooks_events_received_total"),
        "{text}"
    );
    assert!(
        text.contains("hermes_hooks_handler_errors_total{hook=\"broken\"} 1"),
        "{text}"
    );
    for needle in [
        "hermes_hooks_handler_duration_seconds_count{hook=\"decide\"} 1",
        "hermes_hooks_handler_duration_seconds_bucket{le=\"+Inf\",hook=\"decide\"} 1",
        "# TYPE hermes_hooks_handler_duration_seconds histogram",
        "hermes_hooks_queue_depth{hook=\"rec\"}",
        "hermes_hooks_dispatched_total{hook=\"rec\"} 3",
        "hermes_hooks_dropped_total{hook=\"rec\"} 0",
        "hermes_hooks_worker_restarts_total{hook=\"rec\"} 0",
        "hermes_hooks_reloads_total 0",
        // Every other sample name the dashboards use, unchanged by the OpenMetrics encoder.
        "hermes_hooks_hooks_loaded 3",
        "hermes_hooks_hooks_skipped ",
        "hermes_hooks_handler_ok_total{hook=\"decide\"} 1",
        "hermes_hooks_handler_timeouts_total{hook=\"decide\"} 0",
        "hermes_hooks_handler_seconds_total{hook=\"decide\"} ",
        "hermes_hooks_handler_duration_seconds_sum{hook=\"decide\"} ",
        "hermes_hooks_hook_stuck{hook=\"decide\"} 0",
        "hermes_hooks_dylibs_retained ",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}

#[test]
fn every_error_status_is_json_with_a_message() {
    let hooks = Hooks::new();
    hooks.recorder("rec", "[agent:start]", "None");
    let serve = Serve::start(&hooks, &[]);
    let json_ct = [("Content-Type", "application/json")];
    type Case<'a> = (
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<u8>,
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/events",
            json_ct.to_vec(),
            b"{not json".to_vec(),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/events",
            json_ct.to_vec(),
            b"[1,2]".to_vec(),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/events",
            json_ct.to_vec(),
            b"{}".to_vec(),
            400,
            "invalid_event",
        ),
        (
            "POST",
            "/v1/events",
            json_ct.to_vec(),
            br#"{"event": 5}"#.to_vec(),
            400,
            "invalid_event",
        ),
        (
            "POST",
            "/v1/events",
            json_ct.to_vec(),
            br#"{"event": "bad name"}"#.to_vec(),
            400,
            "invalid_event",
        ),
        (
            "POST",
            "/v1/events",
            json_ct.to_vec(),
            br#"{"event": "agent:start", "context": [1]}"#.to_vec(),
            400,
            "invalid_context",
        ),
        (
            "POST",
            "/v1/events",
            vec![("Content-Type", "text/plain")],
            b"{}".to_vec(),
            415,
            "unsupported_media_type",
        ),
        (
            "POST",
            "/v1/events",
            json_ct.to_vec(),
            vec![b' '; 1024 * 1024 + 10],
            413,
            "payload_too_large",
        ),
        (
            "POST",
            "/v1/collect",
            json_ct.to_vec(),
            br#"{"event": "agent:start", "timeout_ms": -1}"#.to_vec(),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/events/batch",
            json_ct.to_vec(),
            br#"{"events": [{"event": "ok:x"}, {"event": ""}]}"#.to_vec(),
            400,
            "invalid_event",
        ),
        ("GET", "/v1/nothing", vec![], vec![], 404, "not_found"),
        (
            "GET",
            "/v1/events",
            vec![],
            vec![],
            405,
            "method_not_allowed",
        ),
        (
            "DELETE",
            "/v1/hooks",
            vec![],
            vec![],
            405,
            "method_not_allowed",
        ),
    ];
    for (method, path, headers, body, status, code) in cases {
        let (s, hs, b) = http(&serve.addr, method, path, &headers, &body);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_else(|_| {
            panic!(
                "{method} {path}: non-JSON body {:?}",
                String::from_utf8_lossy(&b)
            )
        });
        assert_eq!(s, status, "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], code, "{method} {path}: {v}");
        assert!(
            v["error"]["message"].as_str().is_some_and(|m| m.len() > 10),
            "{v}"
        );
        assert!(
            hs.iter()
                .any(|(k, v)| k == "content-type" && v.contains("json"))
        );
    }
    // Batch limits: 10,000 events, 16 MiB; a bad item is named by its index.
    let many: Vec<serde_json::Value> = (0..10_001).map(|_| json!({"event": "a:b"})).collect();
    let (s, v) = serve.post("/v1/events/batch", &json!({"events": many}));
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (413, Some("payload_too_large")),
        "{v}"
    );
    let big = vec![b' '; 16 * 1024 * 1024 + 1];
    let (s, _, _) = http(&serve.addr, "POST", "/v1/events/batch", &json_ct, &big);
    assert_eq!(s, 413);
    let (s, v) = serve.post(
        "/v1/events/batch",
        &json!({"events": [{"event": "a:b"}, {"event": "a:b", "context": 3}]}),
    );
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("events[1]: context must be a JSON object"),
        "{v}"
    );
    let (s, _) = serve.post("/v1/events/batch", &json!({"events": [{"event": "agent:start", "context": {"k": 1}}, {"event": "agent:start"}]}));
    assert_eq!(s, 202);
    poll(T, "the batch's two events", || {
        let (_, v) = serve.get("/v1/hooks/rec");
        (v["counters"]["queued"] == 2).then_some(())
    });
    // A bad batch delivers nothing (validated whole before queuing).
    let (s, v) = serve.get("/v1/hooks/rec");
    assert_eq!(s, 200);
    assert_eq!(v["counters"]["queued"], 2, "only the good batch was queued");
    // Raw garbage on the socket does not hurt the service.
    {
        use std::io::Write;
        let mut sock = std::net::TcpStream::connect(&serve.addr).unwrap();
        let _ = sock.write_all(b"\x00\x01GARBAGE\r\n\r\n");
    }
    assert_eq!(serve.get("/healthz").0, 200);
}

#[test]
fn http_emit_returns_fast_while_hooks_are_slow() {
    let hooks = Hooks::new();
    for i in 0..10 {
        hooks.python(
            &format!("slow{i}"),
            "[agent:start]",
            "import time\ndef handle(e, c):\n    time.sleep(0.5)\n",
        );
    }
    let serve = Serve::start(&hooks, &["--drain-timeout", "0.1"]);
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t0 = Instant::now();
        let (s, v) = serve.post("/v1/events", &json!({"event": "agent:start"}));
        worst = worst.max(t0.elapsed());
        assert_eq!((s, v), (202, json!({"queued": 10})));
    }
    // Each emit fans out to ten 500 ms handlers; the original host would block 5 s per emit.
    assert!(
        worst < Duration::from_millis(1500),
        "slowest emit took {worst:?}"
    );
}

#[test]
fn sigterm_drains_the_queues_and_exits_cleanly() {
    let hooks = Hooks::new();
    let out = hooks.out().join("drained.txt");
    hooks.python(
        "slowish",
        "[agent:step]",
        &format!(
            "import os, time\nopen({pid:?}, 'w').write(str(os.getpid()))\ndef handle(e, c):\n    time.sleep(0.2)\n    open({out:?}, 'a').write('x')\n",
            out = out.display().to_string(),
            pid = hooks.out().join("worker.pid").display().to_string()
        ),
    );
    let mut serve = Serve::start(&hooks, &["--drain-timeout", "10"]);
    for _ in 0..5 {
        assert_eq!(
            serve.post("/v1/events", &json!({"event": "agent:step"})).0,
            202
        );
    }
    assert_eq!(serve.terminate(), Some(0));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "xxxxx",
        "every queued event delivered before exit"
    );
    // The stderr reader thread may still be catching up with the last lines after the exit.
    poll(T, "the drain report (undelivered=0) in the log", || {
        serve.log().contains("undelivered=0").then_some(())
    });
    // No Python worker survives the service.
    let pid = std::fs::read_to_string(hooks.out().join("worker.pid")).unwrap();
    poll(T, "the worker to be gone", || {
        crate::util::is_dead(pid.trim()).then_some(())
    });
}

#[test]
fn sigkill_of_a_python_worker_is_recovered_over_http() {
    let hooks = Hooks::new();
    hooks.python(
        "pid",
        "[command:pid]",
        "import os\ndef handle(e, c):\n    return os.getpid()\n",
    );
    let serve = Serve::start(&hooks, &[]);
    let ask = || {
        serve
            .post("/v1/collect", &json!({"event": "command:pid"}))
            .1["results"][0]["result"]
            .as_i64()
    };
    let first = ask().expect("a pid");
    signal(first as u32, 9);
    let second = poll(T, "a new worker", || {
        let (_, v) = serve.post("/v1/collect", &json!({"event": "command:pid"}));
        v["results"][0]["result"].as_i64()
    });
    assert_ne!(first, second);
    assert_eq!(serve.get("/v1/hooks/pid").1["counters"]["restarts"], 1);
}

#[test]
fn a_handler_flooding_its_output_is_rate_limited_and_keeps_working() {
    let hooks = Hooks::new();
    hooks.python(
        "noisy",
        "[command:x]",
        "import sys\nsys.stdout.write('x' * 100000 + '\\n')\ndef handle(e, c):\n    for i in range(50000):\n        print('line', i)\n    return 'still fine'\n",
    );
    let serve = Serve::start(&hooks, &[]);
    for _ in 0..2 {
        let (s, v) = serve.post(
            "/v1/collect",
            &json!({"event": "command:x", "timeout_ms": 20000}),
        );
        assert_eq!(s, 200);
        assert_eq!(v["results"][0]["result"], "still fine", "{v}");
    }
    poll(T, "the suppressed-lines summary", || {
        serve
            .log()
            .contains("output lines not logged")
            .then_some(())
    });
    let log = serve.log();
    assert!(
        log.contains("[line cut at 4096 bytes]"),
        "a 100 KB line is cut"
    );
    assert!(
        log.lines().count() < 5000,
        "the log was flooded: {} lines",
        log.lines().count()
    );
}

#[test]
fn a_batchs_contexts_reach_the_hook_as_the_client_wrote_them() {
    // The batch endpoint passes each context's text on (no object is built in between): an
    // integer past 64 bits arrives exact, `null` is an empty context, line breaks inside a
    // context do not break the Python worker's one-request-per-line protocol.
    let hooks = Hooks::new();
    let out = hooks.out().join("seen.jsonl");
    let code = format!(
        "import json\n\ndef handle(event, context):\n    with open({out:?}, 'a') as f:\n        f.write(json.dumps({{'event': event, 'n': str(context.get('n')), 'keys': sorted(context)}}) + '\\n')\n",
        out = out.display().to_string()
    );
    hooks.python("seen", "[\"big:*\"]", &code);
    let serve = Serve::start(&hooks, &[]);
    let body = br#"{"events": [
        {"event": "big:int", "context": {
            "n" : 12345678901234567890123 ,
            "m": [1, {"x": null}] }},
        {"event": "big:null", "context": null},
        {"event": "big:none"}
    ]}"#;
    let ct = [("Content-Type", "application/json")];
    let (s, _, answer) = http(&serve.addr, "POST", "/v1/events/batch", &ct, body);
    assert_eq!(s, 202, "{}", String::from_utf8_lossy(&answer));
    let seen = poll(T, "three events seen", || {
        let v = crate::util::read_jsonl(&out);
        (v.len() == 3).then_some(v)
    });
    assert_eq!(seen[0]["n"], "12345678901234567890123");
    assert_eq!(seen[0]["keys"], json!(["m", "n"]));
    for s in &seen[1..] {
        assert_eq!((&s["n"], &s["keys"]), (&json!("None"), &json!([])), "{s}");
    }
    // What a JSON object cannot hold is refused as from `POST /v1/events`: a lone surrogate, a
    // number out of range.
    for bad in [r#"{"s": "\ud800"}"#, r#"{"n": 1e400}"#] {
        let one = format!(r#"{{"event": "big:bad", "context": {bad}}}"#);
        let (s1, _, _) = http(&serve.addr, "POST", "/v1/events", &ct, one.as_bytes());
        let batch = format!(r#"{{"events": [{one}]}}"#);
        let (s2, _, a) = http(
            &serve.addr,
            "POST",
            "/v1/events/batch",
            &ct,
            batch.as_bytes(),
        );
        assert_eq!(
            (s1, s2),
            (400, 400),
            "{bad}: {}",
            String::from_utf8_lossy(&a)
        );
    }
}

/// `POST /v1/proof` takes only `nonce`: a body the schema allowed with other fields could pass
/// the route's 1 KiB limit (the API fuzz sent one and got 413 for schema-valid data); another
/// field is now refused with 400, and the schema says so (`additionalProperties: false`).
#[test]
fn the_proof_request_refuses_fields_other_than_the_nonce() {
    let hooks = Hooks::new();
    let serve = Serve::start(&hooks, &[]);
    let nonce = "000102030405060708090a0b0c0d0e0f";
    let (s, v) = serve.post("/v1/proof", &json!({"nonce": nonce, "extra": 1}));
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "bad_request", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"extra\""),
        "names the field: {v}"
    );
    // The nonce alone passes the checks (this service has no token to prove).
    let (s, v) = serve.post("/v1/proof", &json!({"nonce": nonce}));
    assert_eq!((s, &v["error"]["code"]), (404, &json!("no_token")), "{v}");
}
