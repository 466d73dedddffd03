//! Property tests ("fuzzing" on the stable toolchain, with `proptest`) of what reads input from
//! outside and is reached through the public API: event names and the HTTP request bodies of
//! every route. HOOK.yaml parsing and hook names, patterns, the Python runner's protocol lines,
//! a dynamic library's answer and the line reader are fuzzed next to their code (manifest.rs,
//! pattern.rs, handler/python/protocol.rs, handler/dylib.rs, handler/process.rs). The
//! properties: no panic, no hang, every failure a typed error with a message. Case counts are
//! bounded so the suite stays fast.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use hermes_hooks::Host;
use hermes_hooks::events::validate_event_name;
use hermes_hooks::server::{ApiConfig, app};
use proptest::prelude::*;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::util::Hooks;

// The crate's own JSON generator for property tests (a `cfg(test)` module, so included here by
// path rather than copied).
#[path = "../../src/testing.rs"]
mod testing;
use testing::any_json;

fn cases(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cases(384))]

    #[test]
    fn event_names_are_accepted_or_refused_with_a_reason(name in prop_oneof!["\\PC{0,80}", "[a-z:._*-]{0,40}"]) {
        match validate_event_name(&name) {
            Ok(()) => prop_assert!(!name.is_empty()),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

/// A host on `hooks`, started on `rt`.
fn start(rt: &tokio::runtime::Runtime, hooks: &Hooks) -> Host {
    rt.block_on(async {
        let (host, _) = Host::start(crate::util::config(hooks)).await;
        host
    })
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A request to one of the routes (and some that are not routes) with an arbitrary body.
fn request() -> impl Strategy<Value = (String, String, Option<String>, Vec<u8>)> {
    let path = prop_oneof![
        Just("/v1/events"),
        Just("/v1/events/batch"),
        Just("/v1/collect"),
        Just("/v1/hooks"),
        Just("/v1/hooks/fuzzy"),
        Just("/v1/hooks/%00%ff"),
        Just("/v1/reload"),
        Just("/healthz"),
        Just("/readyz"),
        Just("/metrics"),
        Just("/v1/nope"),
    ];
    let method = prop_oneof![Just("POST"), Just("GET"), Just("PUT")];
    let ctype = prop_oneof![
        Just(Some("application/json".to_string())),
        Just(None),
        Just(Some("text/plain".to_string())),
        Just(Some("application/json; charset=utf-8".to_string())),
    ];
    let body = prop_oneof![
        any::<Vec<u8>>(),
        any_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        (
            prop_oneof!["fuzz:[a-z]{1,6}", "\\PC{0,20}"],
            any_json(),
            0u64..3000
        )
            .prop_map(|(event, context, timeout_ms)| serde_json::to_vec(
                &json!({"event": event, "context": context, "timeout_ms": timeout_ms})
            )
            .unwrap()),
        prop::collection::vec(
            (prop_oneof!["fuzz:[a-z]{1,6}", "\\PC{0,12}"], any_json()),
            0..6
        )
        .prop_map(|evs| {
            let events: Vec<Value> = evs
                .into_iter()
                .map(|(e, c)| json!({"event": e, "context": c}))
                .collect();
            serde_json::to_vec(&json!({"events": events})).unwrap()
        }),
    ];
    (method, path, ctype, body).prop_map(|(m, p, c, b)| (m.to_string(), p.to_string(), c, b))
}

#[test]
fn every_route_answers_any_body_with_a_status_and_a_typed_error() {
    let hooks = Hooks::new();
    hooks.exec(
        "fuzzy",
        "[\"fuzz:*\"]",
        "#!/bin/sh\ncat >/dev/null\necho '{\"seen\": true}'\n",
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let host = start(&rt, &hooks);
    let router = app(host.clone(), ApiConfig { token: None });
    let mut runner = proptest::test_runner::TestRunner::new(cases(160));
    runner
        .run(&request(), |(method, path, ctype, body)| {
            let mut req = Request::builder()
                .method(method.as_str())
                .uri(path.as_str());
            if let Some(c) = &ctype {
                req = req.header("content-type", c.as_str());
            }
            let req = req.body(Body::from(body.clone())).unwrap();
            let router = router.clone();
            let (status, bytes) = rt.block_on(async move {
                let resp = tokio::time::timeout(Duration::from_secs(10), router.oneshot(req))
                    .await
                    .expect("the request hung")
                    .expect("the router is infallible");
                let status = resp.status();
                let bytes = axum::body::to_bytes(resp.into_body(), 64 * 1024 * 1024)
                    .await
                    .expect("the response body");
                (status, bytes)
            });
            prop_assert!(
                !status.is_server_error() || status == StatusCode::SERVICE_UNAVAILABLE,
                "{method} {path} answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
            if status.is_client_error() {
                let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                prop_assert!(
                    v["error"]["code"].is_string() && v["error"]["message"].is_string(),
                    "{method} {path} -> {status}: the error is typed: {}",
                    String::from_utf8_lossy(&bytes)
                );
            }
            Ok(())
        })
        .unwrap();
    // The service still works after the fuzzing.
    let out = rt.block_on(host.emit_collect("fuzz:after", json!({}), Duration::from_secs(10)));
    assert_eq!(out.unwrap()[0].result, Ok(Some(json!({"seen": true}))));
    rt.block_on(host.shutdown(Duration::from_secs(5)));
}

#[test]
fn any_authorization_header_is_let_in_only_with_the_token() {
    let hooks = Hooks::new();
    let rt = current_thread();
    let host = start(&rt, &hooks);
    let token = "s3cret-token";
    let router = app(
        host.clone(),
        ApiConfig {
            token: Some(token.into()),
        },
    );
    let header = prop_oneof![
        "\\PC{0,40}",
        "[Bb]earer [a-z0-9-]{0,14}",
        Just(format!("Bearer {token}")),
        Just(format!("Bearer {token}x")),
        Just(format!("Bearer  {token}")),
    ];
    let mut runner = proptest::test_runner::TestRunner::new(cases(128));
    runner
        .run(&header, |h| {
            let Ok(req) = Request::builder()
                .method("GET")
                .uri("/v1/hooks")
                .header("authorization", h.as_str())
                .body(Body::empty())
            else {
                return Ok(()); // not a valid header value: no request to send
            };
            let status = rt.block_on(router.clone().oneshot(req)).unwrap().status();
            let exact = h == format!("Bearer {token}");
            if exact {
                prop_assert_eq!(status, StatusCode::OK, "{:?}", h);
            } else if status == StatusCode::OK {
                // Accepted only if it carries exactly the token after a case-insensitive scheme.
                let (scheme, rest) = h.split_once(' ').unwrap_or(("", ""));
                prop_assert!(
                    scheme.eq_ignore_ascii_case("bearer") && rest.trim() == token,
                    "{:?} was let in",
                    h
                );
            } else {
                prop_assert_eq!(status, StatusCode::UNAUTHORIZED, "{:?}", h);
            }
            Ok(())
        })
        .unwrap();
    rt.block_on(host.shutdown(Duration::from_secs(5)));
}

/// The CI's schema fuzzer (seed 26875) posted a body of one newline to `POST /v1/reload`, and
/// it was taken as "empty" (200). Whitespace alone is not JSON: the routes whose body may be
/// empty take no bytes at all or a JSON object, and refuse anything else with 400.
#[test]
fn a_body_of_only_whitespace_is_refused_where_an_empty_one_is_taken() {
    let hooks = Hooks::new();
    hooks.exec("quiet", "[\"fuzz:*\"]", "#!/bin/sh\ncat >/dev/null\n");
    let rt = current_thread();
    let host = start(&rt, &hooks);
    let router = app(host.clone(), ApiConfig { token: None });
    let post = |path: &str, body: &'static [u8]| {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let resp = rt.block_on(router.clone().oneshot(req)).unwrap();
        let status = resp.status();
        let bytes = rt
            .block_on(axum::body::to_bytes(resp.into_body(), 1 << 20))
            .unwrap();
        (
            status,
            serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
        )
    };
    for path in [
        "/v1/reload",
        "/v1/hooks/quiet/disable",
        "/v1/hooks/quiet/enable",
    ] {
        for body in [&b"\n"[..], b" ", b"\r\n\t "] {
            let (status, v) = post(path, body);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body:?}: {v}");
            assert_eq!(v["error"]["code"], "bad_request", "{path}: {v}");
        }
    }
    assert_eq!(post("/v1/reload", b"").0, StatusCode::OK);
    assert_eq!(post("/v1/reload", b"{}").0, StatusCode::OK);
    assert_eq!(post("/v1/reload", b" {} \n").0, StatusCode::OK);
    rt.block_on(host.shutdown(Duration::from_secs(5)));
}
