//! `list` (scan the roots here) and `list --live` (ask the running service).

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::args::RootArgs;
use crate::cli::common::{default_address, describe_roots, fail, with_loaded_hooks};
use crate::discovery::Skipped;

fn skipped_json(s: &Skipped) -> Value {
    json!({"dir": s.dir, "name": s.name, "file": s.file, "code": s.code, "reason": s.reason})
}

/// `list`: load the hooks here and print them with what did not load.
pub async fn list(roots: RootArgs, as_json: bool) -> i32 {
    with_loaded_hooks(roots, async |host, report| {
        let hooks: Vec<Value> = host.hooks().iter().map(|h| json!(h)).collect();
        let skipped: Vec<Value> = report.skipped.iter().map(skipped_json).collect();
        print_list(
            &hooks,
            &skipped,
            as_json,
            &describe_roots(&host.config().roots),
        );
        0
    })
    .await
}

/// `list --live`: the running service's view, with live status and counters.
pub async fn list_live(address: &str, as_json: bool) -> i32 {
    use crate::client::{Address, request};
    let address = if address.is_empty() {
        default_address()
    } else {
        Address::parse(address)
    };
    let token = std::env::var("HERMES_HOOKS_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    match request(
        &address,
        "GET",
        "/v1/hooks",
        token.as_deref(),
        None,
        Duration::from_secs(10),
    )
    .await
    {
        Ok((200, body)) => {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let hooks = v["hooks"].as_array().cloned().unwrap_or_default();
            let skipped = v["skipped"].as_array().cloned().unwrap_or_default();
            print_list(&hooks, &skipped, as_json, &address.to_string());
            0
        }
        Ok((status, body)) => fail(format!("HTTP {status}: {}", String::from_utf8_lossy(&body))),
        Err(e) => fail(e),
    }
}

/// Prints hooks (as `/v1/hooks` shows them) and the directories that did not load.
fn print_list(hooks: &[Value], skipped: &[Value], as_json: bool, source: &str) {
    let mut out = std::io::stdout().lock();
    if as_json {
        let _ = writeln!(out, "{}", json!({"hooks": hooks, "skipped": skipped}));
        return;
    }
    if hooks.is_empty() {
        let _ = writeln!(out, "no hooks loaded ({source})");
    } else {
        let _ = writeln!(
            out,
            "{:<24} {:<8} {:<10} {:<34} {:>7} {:>7} {:>7}  ROOT",
            "NAME", "KIND", "STATUS", "EVENTS", "OK", "FAILED", "DROPPED"
        );
    }
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    for h in hooks {
        let events: Vec<String> = h["events"]
            .as_array()
            .map(|a| a.iter().map(s).collect())
            .unwrap_or_default();
        let c = &h["counters"];
        let _ = writeln!(
            out,
            "{:<24} {:<8} {:<10} {:<34} {:>7} {:>7} {:>7}  {}{}",
            s(&h["name"]),
            s(&h["kind"]),
            s(&h["status"]),
            events.join(","),
            c["ok"].as_u64().unwrap_or(0),
            c["failed"].as_u64().unwrap_or(0),
            c["dropped"].as_u64().unwrap_or(0),
            s(&h["root"]),
            if h["signed"] == json!(false) {
                "  UNSIGNED"
            } else {
                ""
            }
        );
        if let Some(workers) = h["workers"].as_array() {
            let names: Vec<String> = workers.iter().map(s).collect();
            let lag = h["lag"]
                .as_u64()
                .map(|l| l.to_string())
                .unwrap_or("?".into());
            let _ = writeln!(out, "    workers: {}; lag {lag}", names.join(", "));
        }
        if let Some(start) = h["worker"]["start"].as_str() {
            let _ = writeln!(out, "    worker: {start} ({})", s(&h["worker"]["reason"]));
        }
        if let Some(e) = h["last_error"]["message"].as_str() {
            let _ = writeln!(out, "    last error: {e}");
        }
        for line in crate::ingateway::list_lines(h) {
            let _ = writeln!(out, "    {line}");
        }
    }
    if !skipped.is_empty() {
        let _ = writeln!(out, "\nnot loaded:");
        for k in skipped {
            let _ = writeln!(
                out,
                "  {:<22} {}: {}",
                s(&k["name"]),
                s(&k["file"]),
                s(&k["reason"])
            );
        }
    }
}
