//! Fleet throughput path (issue 21) against a real nats-server: retries through the hook's
//! retry subject (a failing event does not hold up the next ones, comes back after its delay,
//! and goes to the dead letters after `retries:`), and the cumulative acknowledgements of an
//! ordered hook across a killed worker (nothing acknowledged that did not run).

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::fleet::{
    NatsServer, assert_duplicates_are_redeliveries, dead_cmd, edge_serving, fleet_hook, handled_ns,
    post_batch, post_one, recording_hook, records, wait_dead_letter, wait_distinct, wait_for_fleet,
    wait_records, worker_with,
};
use crate::util::{Hooks, Serve, poll, read_jsonl};

/// A worker whose first retry waits `backoff_ms` (the second twice that).
fn slow_retry_worker(hooks: &Hooks, nats: &NatsServer, id: &str, backoff_ms: u64) -> Serve {
    let backoff = backoff_ms.to_string();
    let opts = ["--ack-wait", "2", "--status-interval-ms", "100"];
    let opts = [&opts[..], &["--retry-backoff-ms", &backoff]].concat();
    worker_with(hooks, nats, id, &opts)
}

#[testenv::needs(nats)]
#[test]
fn a_failing_event_does_not_hold_up_the_next_ones_is_retried_after_its_delay_then_dead() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    // Ordered (concurrency 1): its consumer acknowledges cumulatively, so a failed event handed
    // back to the broker would be acknowledged by the next one's acknowledgement.
    recording_hook(&hooks, "fragile", r#"["agent:*"]"#, "retries: 2\n");
    let _w = slow_retry_worker(&hooks, &nats, "wa", 1500);
    let edge = edge_serving(&hooks, &nats.url(), &[], &["fragile"], &["wa"]);
    post_one(&edge, "agent:start", json!({"n": 0, "poison": true}));
    let (status, body) = post_batch(&edge, 1..21, json!({}));
    assert_eq!(status, 202, "{body}");

    let letter = wait_dead_letter(&nats, "fragile", 60);
    assert_eq!(
        letter["deliveries"], 3,
        "retries: 2 = three deliveries: {letter}"
    );
    assert_eq!(letter["envelope"]["context"]["n"], 0, "{letter}");

    let failed = read_jsonl(&hooks.out().join("fragile.jsonl.failed"));
    let d: Vec<i64> = failed.iter().map(|r| r["d"].as_i64().unwrap()).collect();
    assert_eq!(d, vec![1, 2, 3], "three attempts, counted on: {failed:?}");
    let seqs: HashSet<u64> = failed.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs.len(),
        1,
        "a retry keeps the event's stream sequence: {failed:?}"
    );
    let t = |r: &Value| r["t"].as_f64().unwrap();
    assert!(
        t(&failed[1]) - t(&failed[0]) >= 1.4,
        "the first retry waited for its delay (1.5 s): {failed:?}"
    );
    assert!(
        t(&failed[2]) - t(&failed[1]) >= 2.9,
        "the second retry waited twice as long: {failed:?}"
    );

    // The next events did not wait for the failing one's retries, and kept their order.
    let ok = records(&hooks, "fragile");
    assert_eq!(handled_ns(&ok), (1..21).collect::<Vec<_>>(), "{ok:?}");
    let last_ok = ok.iter().map(t).fold(0.0, f64::max);
    assert!(
        last_ok < t(&failed[1]),
        "every later event ran before the first retry ({last_ok} vs {})",
        t(&failed[1])
    );
    assert!(
        ok.iter().all(|r| r["d"] == 1),
        "no later event was redelivered: {ok:?}"
    );

    let fragile = poll(Duration::from_secs(10), "the counters", || {
        let h = fleet_hook(&edge, "fragile")?;
        (h["fleet"]["dead"] == 1).then_some(h)
    });
    assert_eq!(fragile["fleet"]["retried"], 2, "{fragile}");
    assert_eq!(fragile["fleet"]["acked"], 20, "{fragile}");
}

/// The acknowledgement policy of the consumer of the hook whose filter is `filter`.
pub(crate) fn ack_policy(
    nats: &NatsServer,
    filter: &str,
) -> async_nats::jetstream::consumer::AckPolicy {
    use futures_util::StreamExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = async_nats::connect(nats.url()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        let stream = js.get_stream("HERMES_EVENTS").await.expect("the stream");
        let mut list = stream.consumers();
        while let Some(info) = list.next().await {
            let info = info.expect("consumer info");
            if info.config.filter_subject == filter {
                return info.config.ack_policy;
            }
        }
        panic!("no consumer on {filter}");
    })
}

#[testenv::needs(nats)]
#[test]
fn a_concurrent_hooks_failing_event_is_retried_through_its_retry_subject_too() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    // concurrency: 4 = explicit acknowledgements, every worker pulls.
    recording_hook(
        &hooks,
        "wide",
        r#"["agent:*"]"#,
        "retries: 1\nconcurrency: 4\n",
    );
    let _a = slow_retry_worker(&hooks, &nats, "wa", 300);
    let _b = slow_retry_worker(&hooks, &nats, "wb", 300);
    let edge = edge_serving(&hooks, &nats.url(), &[], &["wide"], &["wa", "wb"]);
    post_one(&edge, "agent:start", json!({"n": 0, "poison": true}));
    let (status, body) = post_batch(&edge, 1..41, json!({}));
    assert_eq!(status, 202, "{body}");
    let letter = wait_dead_letter(&nats, "wide", 60);
    assert_eq!(
        letter["deliveries"], 2,
        "retries: 1 = two deliveries: {letter}"
    );
    let failed = read_jsonl(&hooks.out().join("wide.jsonl.failed"));
    let d: Vec<i64> = failed.iter().map(|r| r["d"].as_i64().unwrap()).collect();
    assert_eq!(d, vec![1, 2], "{failed:?}");
    let t = |r: &Value| r["t"].as_f64().unwrap();
    assert!(t(&failed[1]) - t(&failed[0]) >= 0.25, "{failed:?}");
    let ok = wait_distinct(&hooks, "wide", 40, 30);
    assert_duplicates_are_redeliveries(&ok);
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Messages in the event stream.
fn stream_messages(nats: &NatsServer) -> u64 {
    block_on(async {
        let client = async_nats::connect(nats.url()).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        let mut stream = js.get_stream("HERMES_EVENTS").await.expect("the stream");
        stream.info().await.expect("stream info").state.messages
    })
}

/// The events of `recs`, per stream message.
fn per_message(recs: &[Value]) -> std::collections::BTreeMap<u64, Vec<u64>> {
    let mut per = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    for r in recs {
        per.entry(r["seq"].as_u64().unwrap())
            .or_default()
            .push(r["n"].as_u64().unwrap());
    }
    per
}

/// Events of one name in one request go to the stream as bundles (up to 128 events or 64 KiB
/// each) and run one by one, in order, once each; while a worker that does not read bundles is
/// live (its status has no `bundles`), every event goes alone.
#[testenv::needs(nats)]
#[test]
fn a_requests_events_share_stream_messages_unless_a_worker_cannot_read_them() {
    let Some((nats, hooks, [_w], edge)) =
        crate::fleet::fleet_of("bundled", r#"["agent:step"]"#, "", ["wa"])
    else {
        return;
    };
    let before = stream_messages(&nats);
    let (status, body) = post_batch(&edge, 0..300, json!({}));
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["state"], "stored", "{body}");
    let recs = wait_records(&hooks, "bundled", 300, 30);
    assert_eq!(
        handled_ns(&recs),
        (0..300).collect::<Vec<_>>(),
        "in order, once each"
    );
    assert!(recs.iter().all(|r| r["d"] == 1), "no redelivery");
    let per = per_message(&recs);
    let sizes: Vec<usize> = per.values().map(Vec::len).collect();
    assert_eq!(sizes, [128, 128, 44], "bundles of at most 128: {per:?}");
    assert_eq!(stream_messages(&nats) - before, 3, "three messages stored");
    let ids: HashSet<&str> = recs.iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(ids.len(), 300, "each event keeps its own id");

    // Contexts of 40 KB: two do not fit in one bundle's 64 KiB, so each goes alone.
    let before = stream_messages(&nats);
    let big = "x".repeat(40_000);
    let (status, body) = post_batch(&edge, 300..303, json!({"big": big}));
    assert_eq!(status, 202, "{body}");
    wait_records(&hooks, "bundled", 303, 30);
    assert_eq!(stream_messages(&nats) - before, 3, "one message each");

    // An edge told `--fleet-bundle 1` sends each event alone.
    let single = edge_serving(
        &hooks,
        &nats.url(),
        &["--fleet-bundle", "1"],
        &["bundled"],
        &["wa"],
    );
    let before = stream_messages(&nats);
    let (status, body) = post_batch(&single, 303..308, json!({}));
    assert_eq!(status, 202, "{body}");
    wait_records(&hooks, "bundled", 308, 30);
    assert_eq!(stream_messages(&nats) - before, 5, "one message each");

    // A worker of an older version says nothing of bundles: events go alone again.
    let old = json!({"worker": "old", "host": "h", "pid": 1, "interval_ms": 600_000,
        "time": "", "running": true, "hooks": []});
    block_on(async {
        let client = async_nats::connect(nats.url()).await.expect("connect");
        let body = serde_json::to_vec(&old).unwrap();
        client
            .publish("hermes.status.old", body.into())
            .await
            .expect("publish");
        client.flush().await.expect("flush");
    });
    poll(
        Duration::from_secs(30),
        "the edge to see the old worker",
        || {
            let (_, v) = edge.get("/v1/hooks");
            let workers = v["fleet"]["workers"].as_array()?.clone();
            workers
                .iter()
                .any(|w| w["worker"] == "old" || w == "old")
                .then_some(())
        },
    );
    let before = stream_messages(&nats);
    let (status, body) = post_batch(&edge, 308..318, json!({}));
    assert_eq!(status, 202, "{body}");
    let recs = wait_records(&hooks, "bundled", 318, 30);
    assert_eq!(stream_messages(&nats) - before, 10, "ten messages");
    let last: Vec<Value> = recs.into_iter().skip(303).collect();
    assert!(
        per_message(&last).values().all(|v| v.len() == 1),
        "{last:?}"
    );
}

/// A worker stopped (SIGTERM) in the middle of bundles runs what it was delivered before it
/// goes, the events it had not started included: nothing is handed back to burn a delivery
/// (with `retries: 0` that was a dead letter for events that never ran) or to come back out of
/// order. The next worker goes on from there, in order.
#[testenv::needs(nats)]
#[test]
fn a_worker_stopped_mid_bundle_runs_what_it_was_delivered_and_order_holds() {
    let Some((nats, hooks, [mut wa], edge)) = crate::fleet::fleet_of(
        "steady",
        r#"["agent:step"]"#,
        "retries: 0\nqueue: {capacity: 8}\n",
        ["wa"],
    ) else {
        return;
    };
    // Three bundles; at most four events in the hook's local queue at once, the rest waits.
    let (status, body) = post_batch(&edge, 0..300, json!({"pause": 0.005}));
    assert_eq!(status, 202, "{body}");
    wait_records(&hooks, "steady", 5, 30);
    wa.terminate();
    let by_a = records(&hooks, "steady").len();
    let _wb = crate::fleet::worker(&hooks, &nats, "wb");
    wait_for_fleet(&edge, "steady", &["wb"]);
    let (status, body) = post_batch(&edge, 300..400, json!({}));
    assert_eq!(status, 202, "{body}");
    let recs = wait_distinct(&hooks, "steady", 400, 60);
    assert_eq!(
        handled_ns(&recs),
        (0..400).collect::<Vec<_>>(),
        "each once, in order (the stopped worker ran {by_a} of its 300)"
    );
    assert!(recs.iter().all(|r| r["d"] == 1), "no redelivery");
    let (code, out) = dead_cmd(&nats, &["list", "--json"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        !out.lines().any(|l| l.trim_start().starts_with('{')),
        "no dead letter: {out}"
    );
}
