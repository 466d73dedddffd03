//! The dead-letter routes of a fleet edge (issue 39: the dashboard's Fleet section replays dead
//! letters through them): `GET /v1/dead` lists what `dead list` shows, `POST /v1/dead/replay`
//! does what `dead replay` does, on a real broker; without fleet mode both answer `not_fleet`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::fleet::{NatsServer, edge, recording_hook, records, wait_for_fleet, worker};
use crate::util::{Hooks, Serve, poll};

/// The letters of a `GET /v1/dead` answer (after checking it succeeded).
fn letters(edge: &Serve, query: &str) -> (Vec<Value>, bool) {
    let (status, body) = edge.get(&format!("/v1/dead{query}"));
    assert_eq!(status, 200, "GET /v1/dead{query}: {body}");
    let list = body["letters"].as_array().expect("letters").clone();
    (list, body["more"].as_bool().expect("more"))
}

fn seqs(list: &[Value]) -> Vec<u64> {
    list.iter().filter_map(|l| l["seq"].as_u64()).collect()
}

fn handled(hooks: &Hooks, name: &str) -> Vec<u64> {
    let mut ns: Vec<u64> = records(hooks, name)
        .iter()
        .filter_map(|r| r["n"].as_u64())
        .collect();
    ns.sort_unstable();
    ns
}

#[testenv::needs(nats)]
#[test]
fn the_edge_lists_and_replays_dead_letters_through_its_api() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let hooks = Hooks::new();
    recording_hook(&hooks, "fragile", r#"["agent:*"]"#, "retries: 0\n");
    recording_hook(&hooks, "brittle", r#"["agent:*"]"#, "retries: 0\n");
    let _w = worker(&hooks, &nats, "wa");
    let edge = edge(&hooks, &nats.url(), &[]);
    wait_for_fleet(&edge, "fragile", &["wa"]);
    wait_for_fleet(&edge, "brittle", &["wa"]);
    for n in 1..=3 {
        let (status, body) = edge.post(
            "/v1/events",
            &json!({"event": "agent:start", "context": {"n": n, "poison": true}}),
        );
        assert_eq!(status, 202, "{body}");
    }
    let all = poll(Duration::from_secs(30), "six dead letters", || {
        let (list, _) = letters(&edge, "");
        (list.len() == 6).then_some(list)
    });
    for l in &all {
        assert_eq!(l["event"], "agent:start", "{l}");
        assert_eq!(l["deliveries"], 1, "retries: 0 is one delivery: {l}");
        assert_eq!(l["worker"], "wa", "{l}");
        assert!(
            l["error"].as_str().unwrap().contains("poison event n="),
            "the handler's error: {l}"
        );
        assert!(!l["time"].as_str().unwrap().is_empty(), "{l}");
        assert!(!l["event_id"].as_str().unwrap().is_empty(), "{l}");
        assert!(l.get("envelope").is_none(), "no context in the list: {l}");
    }

    // One hook's, bounded.
    let (two, more) = letters(&edge, "?hook=fragile&limit=2");
    assert_eq!(two.len(), 2, "{two:?}");
    assert!(more, "a third of fragile's follows");
    assert!(two.iter().all(|l| l["hook"] == "fragile"), "{two:?}");
    let (fragile, more) = letters(&edge, "?hook=fragile");
    assert_eq!((fragile.len(), more), (3, false), "{fragile:?}");

    // Fixed: one letter replayed by its sequence runs again and leaves the list.
    std::fs::write(hooks.out().join("fragile.fixed"), "").unwrap();
    let first = &fragile[0];
    let (status, body) = edge.post("/v1/dead/replay", &json!({"seqs": [first["seq"]]}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        seqs(body["replayed"].as_array().unwrap()),
        seqs(&fragile[..1])
    );
    let n = first["error"]
        .as_str()
        .and_then(|e| e.rsplit("n=").next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .expect("the event's n in its error");
    poll(
        Duration::from_secs(30),
        "the replayed letter handled",
        || (handled(&hooks, "fragile") == vec![n]).then_some(()),
    );
    let (left, _) = letters(&edge, "?hook=fragile");
    assert_eq!(seqs(&left), seqs(&fragile[1..]), "the replayed one is gone");

    // All of one hook's: the other hook's stay.
    let (status, body) = edge.post("/v1/dead/replay", &json!({"hook": "fragile", "all": true}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        seqs(body["replayed"].as_array().unwrap()),
        seqs(&fragile[1..])
    );
    poll(
        Duration::from_secs(30),
        "every fragile event handled",
        || (handled(&hooks, "fragile") == vec![1, 2, 3]).then_some(()),
    );
    assert!(letters(&edge, "?hook=fragile").0.is_empty());
    let (rest, _) = letters(&edge, "");
    assert_eq!(rest.len(), 3, "brittle's letters stay: {rest:?}");
    assert!(rest.iter().all(|l| l["hook"] == "brittle"), "{rest:?}");
    assert!(
        handled(&hooks, "brittle").is_empty(),
        "brittle never ran one"
    );

    // What the CLI refuses, the API refuses too.
    for bad in [
        json!({}),
        json!({"all": true, "seqs": [1]}),
        json!({"seqs": "1"}),
    ] {
        let (status, body) = edge.post("/v1/dead/replay", &bad);
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
    }
    let (status, body) = edge.get("/v1/dead?limit=0");
    assert_eq!(status, 400, "{body}");
}

#[test]
fn without_fleet_the_dead_letter_routes_answer_not_fleet() {
    let hooks = Hooks::new();
    hooks.recorder("rec", r#"["agent:*"]"#, "None");
    let serve = Serve::start(&hooks, &[]);
    let (status, body) = serve.get("/v1/dead");
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_fleet", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--fleet"),
        "says how to get dead letters: {body}"
    );
    let (status, body) = serve.post("/v1/dead/replay", &json!({"all": true}));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_fleet", "{body}");
}
