//! Issue 48 row 3: a repeat says it is one. nats-server cannot update a consumer that starts at
//! a time, so a change of it (a rename that keeps `id:`, a widened filter on 2.9) makes it
//! again from its ack floor, and what the old consumer had delivered above that floor comes
//! again as first deliveries. On d69d285 a worker killed after a rename, then restarted, ran
//! 4-107 events a second time, each with `delivered` = 1. Now such an event is shown to its
//! handler as delivered at least twice. On nats-server 2.9 and 2.10+.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::fleet::{
    NatsServer, assert_duplicates_are_redeliveries, edge_serving, nats_servers, post_batch,
    recording_hook, records, rename_hook, wait_for_all, wait_for_fleet, wait_records, worker,
};
use crate::util::{Hooks, poll};

#[testenv::needs(nats)]
#[test]
fn events_delivered_again_after_a_rename_and_a_kill_are_shown_as_repeats() {
    for bin in nats_servers() {
        rename_then_kill_on(bin);
    }
}

fn rename_then_kill_on(bin: PathBuf) {
    let what = bin.display().to_string();
    let nats = NatsServer::start_bin(bin, &[], "");
    let hooks = Hooks::new();
    // The handler keeps writing to rep-v1.jsonl after the rename (the file is in its code).
    recording_hook(&hooks, "rep-v1", r#"["agent:step"]"#, "id: rep\n");
    let mut w = worker(&hooks, &nats, "wa");
    let edge = edge_serving(&hooks, &nats.url(), &[], &["rep-v1"], &["wa"]);
    let n = 600u64;
    let (status, v) = post_batch(&edge, 0..n, json!({"pause": 0.01}));
    assert_eq!(status, 202, "{v}");
    let before = wait_records(&hooks, "rep-v1", 60, 60).len();
    rename_hook(&hooks, "rep-v1", "rep-v2");
    wait_for_fleet(&edge, "rep-v2", &["wa"]);
    // Killed while the renamed hook runs, with events delivered and not yet acknowledged.
    poll(Duration::from_secs(60), "the renamed hook to run", || {
        (records(&hooks, "rep-v1").len() >= before + 60).then_some(())
    });
    w.sigkill();
    let w = worker(&hooks, &nats, "wa");
    let recs = wait_for_all(&hooks, "rep-v1", n, Duration::from_secs(120));
    let repeats = assert_duplicates_are_redeliveries(&recs);
    eprintln!(
        "{what}: {} handlings of {n} events, {repeats} repeats, each shown as delivered > 1; consumer made again: {}",
        recs.len(),
        w.log().contains("made again")
    );
}
