//! Webhook handlers against a local HTTP endpoint that records every request: signatures,
//! retries, redirects, timeouts, unsigned delivery, results for emit_collect, and isolation of a
//! hanging endpoint. Secrets are passed to the real binary's environment (never set in this
//! process). The `bench_*` tests are the BENCHMARKS.md "Webhooks" measurements (`--ignored`).

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hermes_hooks::Host;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::util::{Hooks, Serve, bin, config, poll, poll_async};

const T: Duration = Duration::from_secs(20);

/// What the endpoint answers.
#[derive(Clone, Debug)]
enum Reply {
    /// Status and a text body.
    Status(u16, &'static str),
    /// 200 with a JSON body.
    Json(Value),
    /// A redirect to the given location.
    Redirect(u16, String),
    /// Never answers.
    Hang,
}

/// One recorded request.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
    peer: SocketAddr,
}

impl Seen {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

struct EndpointState {
    seen: Mutex<Vec<Seen>>,
    script: Mutex<VecDeque<Reply>>,
    default: Reply,
}

/// A local HTTP server on 127.0.0.1:0, on its own thread and runtime, recording requests.
struct Endpoint {
    addr: SocketAddr,
    state: Arc<EndpointState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn answer(
    State(st): State<Arc<EndpointState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    st.seen.lock().unwrap().push(Seen {
        path: uri.path().to_string(),
        headers,
        body: body.to_vec(),
        peer,
    });
    let reply = st
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| st.default.clone());
    match reply {
        Reply::Status(code, text) => (StatusCode::from_u16(code).unwrap(), text).into_response(),
        Reply::Json(v) => axum::Json(v).into_response(),
        Reply::Redirect(code, to) => (
            StatusCode::from_u16(code).unwrap(),
            [(axum::http::header::LOCATION, to)],
        )
            .into_response(),
        Reply::Hang => {
            std::future::pending::<()>().await;
            StatusCode::OK.into_response()
        }
    }
}

impl Endpoint {
    fn start(default: Reply) -> Self {
        let state = Arc::new(EndpointState {
            seen: Mutex::new(Vec::new()),
            script: Mutex::new(VecDeque::new()),
            default,
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = axum::Router::new().fallback(answer).with_state(st);
                let serve = axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<SocketAddr>(),
                );
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime aborts hanging handlers.
        });
        Self {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Replies used (in order) before the default one.
    fn script(&self, replies: Vec<Reply>) {
        self.state.script.lock().unwrap().extend(replies);
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A webhook hook directory (`extra` is appended to HOOK.yaml).
fn webhook(hooks: &Hooks, name: &str, events: &str, url: &str, extra: &str) {
    hooks.add(
        name,
        &[(
            "HOOK.yaml",
            &format!("name: {name}\nevents: {events}\nurl: {url}\n{extra}"),
        )],
    );
}

fn verify(secret: &[u8], body: &[u8], header: &str) -> bool {
    let Some(hex) = header.strip_prefix("sha256=") else {
        return false;
    };
    let Some(sig) = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
    else {
        return false;
    };
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).unwrap();
    mac.update(body);
    mac.verify_slice(&sig).is_ok()
}

/// Runs `hermes-hooks <args> --hooks-dir ROOT` with HERMES_HOME and extra environment.
fn run(hooks: &Hooks, args: &[&str], env: &[(&str, Option<&str>)]) -> (i32, String, String) {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .arg("--hooks-dir")
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn collect_one(host: &Host, event: &str, ctx: Value) -> Result<Option<Value>, String> {
    let mut out = host.emit_collect(event, ctx, T).await.unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    out.remove(0).result
}

// --- end to end through the binary ---

#[test]
fn signed_delivery_verifies_and_2xx_json_is_the_result() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Json(json!({"allow": true, "n": 1})));
    webhook(
        &hooks,
        "signed",
        "[\"agent:start\"]",
        &ep.url("/hook"),
        "secret_env: HERMES_TEST_WEBHOOK_SECRET\n",
    );
    let secret = "s3cr3t-\u{e9}-value";
    let (code, out, err) = run(
        &hooks,
        &[
            "test",
            "agent:start",
            "--json",
            "--context",
            r#"{"user_id": "42", "message": "hi"}"#,
        ],
        &[("HERMES_TEST_WEBHOOK_SECRET", Some(secret))],
    );
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let line: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(line["hook"], "signed");
    assert_eq!(line["result"], json!({"allow": true, "n": 1}));

    let seen = ep.seen();
    assert_eq!(seen.len(), 1);
    let req = &seen[0];
    assert_eq!(req.path, "/hook");
    assert_eq!(
        req.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(req.header("x-hermes-event").as_deref(), Some("agent:start"));
    let sig = req
        .header("x-hermes-signature-256")
        .expect("signature header");
    assert!(
        verify(secret.as_bytes(), &req.body, &sig),
        "signature {sig} does not verify"
    );
    assert!(!verify(b"wrong", &req.body, &sig));
    let body = req.json();
    assert_eq!(body["hook_event_name"], "agent:start");
    assert_eq!(body["event"], "agent:start");
    assert_eq!(body["context"], json!({"user_id": "42", "message": "hi"}));
    let id = body["delivery_id"].as_str().unwrap();
    assert!(id.len() >= 16, "{id}");
    assert_eq!(req.header("x-hermes-delivery").as_deref(), Some(id));
    let ts = body["timestamp"].as_str().unwrap();
    assert!(ts.ends_with('Z') && ts.contains('T'), "{ts}");
}

#[test]
fn unsigned_when_the_secret_variable_is_unset() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Status(204, ""));
    webhook(
        &hooks,
        "unsigned",
        "[\"agent:start\"]",
        &ep.url("/u"),
        "secret_env: HERMES_TEST_UNSET_SECRET_VAR\n",
    );
    let unset = [("HERMES_TEST_UNSET_SECRET_VAR", None)];
    let (code, out, err) = run(&hooks, &["test", "agent:start", "--json"], &unset);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let line: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(line["ok"], true);
    assert_eq!(line["result"], Value::Null, "204 = no result");
    let seen = ep.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-hermes-signature-256"), None);
    assert!(seen[0].header("x-hermes-delivery").is_some());

    // list shows it as UNSIGNED (text) / signed: false (JSON); check warns.
    let (code, out, _) = run(&hooks, &["list"], &unset);
    assert_eq!(code, 0);
    let row = out.lines().find(|l| l.starts_with("unsigned")).unwrap();
    assert!(row.contains("UNSIGNED"), "{out}");
    let (_, out, _) = run(&hooks, &["list", "--json"], &unset);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["hooks"][0]["signed"], false);
    assert!(
        v["hooks"][0]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("HERMES_TEST_UNSET_SECRET_VAR is not set"),
        "{v}"
    );
    let (code, out, _) = run(&hooks, &["check"], &unset);
    assert_eq!(code, 0, "a warning is not a problem: {out}");
    assert!(out.contains("UNSIGNED"), "{out}");
    // With the variable set, list says signed.
    let (_, out, _) = run(
        &hooks,
        &["list", "--json"],
        &[("HERMES_TEST_UNSET_SECRET_VAR", Some("x"))],
    );
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["hooks"][0]["signed"], true);
}

#[test]
fn hanging_endpoint_delays_neither_emit_nor_another_hook() {
    let hooks = Hooks::new();
    let hang = Endpoint::start(Reply::Hang);
    let fast = Endpoint::start(Reply::Status(200, ""));
    webhook(
        &hooks,
        "a-hangs",
        "[\"agent:start\"]",
        &hang.url("/"),
        "timeout: 30\n",
    );
    webhook(&hooks, "b-fast", "[\"agent:start\"]", &fast.url("/"), "");
    let serve = Serve::start(&hooks, &["--drain-timeout", "0.5"]);
    let n = 20;
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let t = Instant::now();
        let (status, body) = serve.post(
            "/v1/events",
            &json!({"event": "agent:start", "context": {"i": i}}),
        );
        slowest = slowest.max(t.elapsed());
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["queued"], 2);
    }
    // Every event reaches the fast hook while the other one is still stuck on its first.
    poll(
        Duration::from_secs(10),
        "the fast hook's deliveries",
        || (fast.count() == n).then_some(()),
    );
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert!(slowest < Duration::from_secs(1), "slowest emit {slowest:?}");
    // Its first request may still be on its way under load: wait for it, then check there is
    // no second.
    poll(
        Duration::from_secs(10),
        "the hanging hook's first delivery",
        || (hang.count() >= 1).then_some(()),
    );
    assert_eq!(
        hang.count(),
        1,
        "the hanging hook is still on its first event"
    );
    let order: Vec<i64> = fast
        .seen()
        .iter()
        .map(|s| s.json()["context"]["i"].as_i64().unwrap())
        .collect();
    assert_eq!(order, (0..n as i64).collect::<Vec<_>>());
    let (_, info) = serve.get("/v1/hooks/a-hangs");
    assert_eq!(info["status"], "busy", "{info}");
}

// --- behaviour through the library (no secrets involved) ---

#[tokio::test]
async fn retries_a_500_once_with_the_same_delivery() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Json(json!({"second": true})));
    ep.script(vec![Reply::Status(500, "try again")]);
    webhook(&hooks, "r", "[\"agent:end\"]", &ep.url("/r"), "");
    let (host, report) = Host::start(config(&hooks)).await;
    assert_eq!(report.loaded, vec!["r"], "{:?}", report.skipped);
    let result = collect_one(&host, "agent:end", json!({"x": 1})).await;
    assert_eq!(result, Ok(Some(json!({"second": true}))));
    let seen = ep.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, seen[1].body, "the same bytes are re-sent");
    assert_eq!(
        seen[0].header("x-hermes-delivery"),
        seen[1].header("x-hermes-delivery")
    );
    // A second event gets a new delivery id.
    let _ = collect_one(&host, "agent:end", json!({})).await;
    let seen = ep.seen();
    assert_ne!(
        seen[2].header("x-hermes-delivery"),
        seen[0].header("x-hermes-delivery")
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn two_500s_fail_after_two_attempts() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Status(503, "down for maintenance"));
    webhook(&hooks, "r", "[\"agent:end\"]", &ep.url("/"), "");
    let (host, _) = Host::start(config(&hooks)).await;
    let err = collect_one(&host, "agent:end", json!({}))
        .await
        .unwrap_err();
    assert!(
        err.contains("503") && err.contains("after 2 attempts"),
        "{err}"
    );
    assert!(err.contains("down for maintenance"), "snippet: {err}");
    assert_eq!(ep.count(), 2);
    host.shutdown(T).await;
}

#[tokio::test]
async fn a_400_is_not_retried() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Status(400, "bad payload: missing field"));
    webhook(&hooks, "r", "[\"agent:end\"]", &ep.url("/"), "");
    let (host, _) = Host::start(config(&hooks)).await;
    let err = collect_one(&host, "agent:end", json!({}))
        .await
        .unwrap_err();
    assert!(err.contains("HTTP 400"), "{err}");
    assert!(err.contains("bad payload: missing field"), "{err}");
    assert_eq!(ep.count(), 1, "no retry on 4xx");
    let info = host.hook("r").unwrap();
    assert_eq!(info.counters.failed, 1);
    host.shutdown(T).await;
}

#[tokio::test]
async fn a_302_is_an_error_and_not_followed() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Status(200, ""));
    ep.script(vec![Reply::Redirect(302, ep.url("/elsewhere"))]);
    webhook(&hooks, "r", "[\"agent:end\"]", &ep.url("/start"), "");
    let (host, _) = Host::start(config(&hooks)).await;
    let err = collect_one(&host, "agent:end", json!({}))
        .await
        .unwrap_err();
    assert!(err.contains("302") && err.contains("not followed"), "{err}");
    assert!(err.contains("/elsewhere"), "{err}");
    let paths: Vec<String> = ep.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, vec!["/start"]);
    host.shutdown(T).await;
}

#[tokio::test]
async fn an_attempt_times_out_at_the_hook_timeout() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Hang);
    webhook(
        &hooks,
        "slow",
        "[\"agent:end\"]",
        &ep.url("/"),
        "timeout: 1\n",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let started = Instant::now();
    let err = collect_one(&host, "agent:end", json!({}))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(err.contains("did not answer within 1s"), "{err}");
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(ep.count(), 1, "a timed-out attempt is not retried");
    // The hook keeps working: the next event is delivered (and times out) on its own.
    let info = host.hook("slow").unwrap();
    assert_eq!(info.counters.failed, 1);
    host.shutdown(T).await;
}

#[tokio::test]
async fn connection_refused_is_retried_once_then_reported() {
    let hooks = Hooks::new();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    webhook(
        &hooks,
        "gone",
        "[\"agent:end\"]",
        &format!("http://127.0.0.1:{port}/x"),
        "",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    let err = collect_one(&host, "agent:end", json!({}))
        .await
        .unwrap_err();
    assert!(
        err.contains("cannot connect") && err.contains("after 2 attempts"),
        "{err}"
    );
    host.shutdown(T).await;
}

#[tokio::test]
async fn empty_and_non_json_2xx_bodies_give_no_result() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Status(200, ""));
    ep.script(vec![Reply::Status(200, "ok"), Reply::Status(202, "")]);
    webhook(&hooks, "r", "[\"agent:end\"]", &ep.url("/"), "");
    let (host, _) = Host::start(config(&hooks)).await;
    assert_eq!(collect_one(&host, "agent:end", json!({})).await, Ok(None));
    assert_eq!(collect_one(&host, "agent:end", json!({})).await, Ok(None));
    host.shutdown(T).await;
}

#[tokio::test]
async fn non_http_urls_are_refused() {
    let hooks = Hooks::new();
    webhook(&hooks, "ftp", "[\"agent:end\"]", "ftp://example.org/x", "");
    let (host, report) = Host::start(config(&hooks)).await;
    assert!(report.loaded.is_empty());
    assert!(
        report.skipped[0].reason.contains("http"),
        "{:?}",
        report.skipped
    );
    host.shutdown(T).await;
}

// --- measurements (BENCHMARKS.md "Webhooks"); run with --ignored --nocapture ---

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Deliveries per second from one hook to a local endpoint over keep-alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement"]
async fn bench_webhook_deliveries_per_second() {
    let n = 5_000usize;
    let mut rates = Vec::new();
    for run in 0..5 {
        let hooks = Hooks::new();
        let ep = Endpoint::start(Reply::Status(204, ""));
        webhook(
            &hooks,
            "bench",
            "[\"agent:step\"]",
            &ep.url("/"),
            "queue: {capacity: 100000}\n",
        );
        let (host, _) = Host::start(config(&hooks)).await;
        let started = Instant::now();
        for i in 0..n {
            host.emit("agent:step", json!({"iteration": i})).unwrap();
        }
        poll_async(Duration::from_secs(120), "all deliveries", || {
            (host.hook("bench").unwrap().counters.ok as usize == n).then_some(())
        })
        .await;
        let secs = started.elapsed().as_secs_f64();
        let conns: HashSet<SocketAddr> = ep.seen().iter().map(|s| s.peer).collect();
        let rate = n as f64 / secs;
        println!(
            "run {run}: {n} deliveries in {secs:.3}s = {rate:.0}/s over {} connection(s)",
            conns.len()
        );
        rates.push(rate);
        host.shutdown(T).await;
    }
    rates.sort_by(f64::total_cmp);
    println!("median deliveries/s: {:.0}", rates[rates.len() / 2]);
}

/// p50/p99 of `emit` with one webhook hook whose endpoint answers at once vs one that hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement"]
async fn bench_emit_latency_with_hanging_endpoint() {
    let n = 20_000usize;
    let mut summary: Vec<(&str, Vec<(Duration, Duration)>)> = Vec::new();
    for (label, reply) in [("normal", Reply::Status(204, "")), ("hanging", Reply::Hang)] {
        let mut runs = Vec::new();
        for _ in 0..5 {
            let hooks = Hooks::new();
            let ep = Endpoint::start(reply.clone());
            webhook(
                &hooks,
                "w",
                "[\"agent:step\"]",
                &ep.url("/"),
                "timeout: 30\n",
            );
            let (host, _) = Host::start(config(&hooks)).await;
            let mut lat = Vec::with_capacity(n);
            for i in 0..n {
                let ctx = json!({"iteration": i});
                let t = Instant::now();
                host.emit("agent:step", ctx).unwrap();
                lat.push(t.elapsed());
            }
            lat.sort();
            runs.push((percentile(&lat, 0.5), percentile(&lat, 0.99)));
            let info = host.hook("w").unwrap();
            println!(
                "{label}: p50 {:?} p99 {:?} (delivered {}, dropped {}, endpoint saw {})",
                percentile(&lat, 0.5),
                percentile(&lat, 0.99),
                info.counters.ok,
                info.counters.dropped,
                ep.count()
            );
            host.shutdown(Duration::from_millis(100)).await;
        }
        summary.push((label, runs));
    }
    for (label, mut runs) in summary {
        runs.sort_by_key(|r| r.1);
        let p99 = runs[runs.len() / 2].1;
        runs.sort_by_key(|r| r.0);
        let p50 = runs[runs.len() / 2].0;
        println!("{label}: median p50 {p50:?}, median p99 {p99:?}");
    }
}

/// Issue 12: `concurrency: 3` keeps three deliveries of one hook in flight at once, no more.
#[tokio::test]
async fn concurrency_keeps_n_deliveries_in_flight() {
    let hooks = Hooks::new();
    let ep = Endpoint::start(Reply::Hang);
    webhook(
        &hooks,
        "fan",
        "[\"agent:end\"]",
        &ep.url("/"),
        "timeout: 2\nconcurrency: 3\n",
    );
    let (host, _) = Host::start(config(&hooks)).await;
    for _ in 0..5 {
        host.emit("agent:end", json!({})).unwrap();
    }
    crate::util::poll_async(T, "three requests at the endpoint", || {
        (ep.count() >= 3).then_some(())
    })
    .await;
    // Every request hangs for 2 s: while none has failed, none has finished.
    let info = host.hook("fan").unwrap();
    if info.counters.failed == 0 {
        assert_eq!(ep.count(), 3, "3 in flight at once, not more");
    }
    assert_eq!(info.concurrency, 3);
    host.shutdown(Duration::from_millis(100)).await;
}
