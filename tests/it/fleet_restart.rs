//! Issue 48, the 2.9 restart stall: the broker down for longer than the lease lives (the lease
//! bucket is kept in memory, so any restart empties it; down this long, the lease would run out
//! even in a bucket on disk); the holder's renewal fails, it stands down and takes the lease
//! again. On
//! nats-server 2.9 the first try after the restart took 10 s to fail (11.15 s without a start
//! here before the fix, 0.6 s on 2.15), and then what the holder had been delivered waited for
//! its ack wait (2.3 s here): the lease's writes are now bounded and the bucket made again,
//! and after a restart what was delivered and not run is handed back at once. An ordered hook
//! runs again within about 0.6 s of the broker being back, on either server (rarely, on 2.9,
//! after the broker's wait: see the bound below).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::fleet::{
    NatsServer, edge_serving, nats_servers, post_batch, recording_hook, records, wait_for_all,
    wait_records, worker,
};
use crate::util::{Hooks, epoch_secs, poll};

#[testenv::needs(nats)]
#[test]
fn an_ordered_hook_runs_again_within_2s_of_a_broker_restart() {
    for bin in nats_servers() {
        restart_on(bin);
    }
}

fn restart_on(bin: PathBuf) {
    let what = bin.display().to_string();
    let mut nats = NatsServer::start_bin(bin, &[], "");
    let hooks = Hooks::new();
    recording_hook(&hooks, "back", r#"["agent:step"]"#, "");
    let w = worker(&hooks, &nats, "wa");
    let edge = edge_serving(&hooks, &nats.url(), &[], &["back"], &["wa"]);
    let (status, v) = post_batch(&edge, 0..300, json!({"pause": 0.01}));
    assert_eq!(status, 202, "{v}");
    wait_records(&hooks, "back", 30, 60);
    // Killed for longer than the lease lives: it has run out when the broker is back.
    nats.kill();
    std::thread::sleep(Duration::from_secs(3));
    nats.restart();
    let back = epoch_secs();
    let (status, v) = post_batch(&edge, 300..600, json!({"pause": 0.01}));
    assert_eq!(status, 202, "{v}");
    let first = poll(Duration::from_secs(60), "a start after the restart", || {
        records(&hooks, "back")
            .into_iter()
            .filter_map(|r| r["t"].as_f64())
            .filter(|t| *t > back)
            .reduce(f64::min)
    });
    let stall = first - back;
    eprintln!("{what}: the ordered hook ran again {stall:.2} s after the broker was back");
    wait_for_all(&hooks, "back", 600, Duration::from_secs(120));
    assert!(
        w.log().contains("the broker restarted"),
        "{what}: the worker says what it handed back"
    );
    // 0.5-0.65 s most times; in 5 of 32 runs on 2.9, 2.14-2.15 s: the new holding waited the
    // broker's wait (1.8 s here), likely for messages the broker delivered to the pull request
    // the kill cut off (not verified). Bounded here by that wait and a margin.
    assert!(
        stall < 2.5,
        "{what}: the ordered hook stalled {stall:.2} s after the broker restart"
    );
}
