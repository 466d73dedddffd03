//! `list` (scan the roots here) and `list --live` (ask the running service).

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::args::RootArgs;
use crate::cli::common::{common_python, default_address, describe_roots, fail, with_loaded_hooks};
use crate::discovery::Skipped;

fn skipped_json(s: &Skipped) -> Value {
    json!({"dir": s.dir, "name": s.name, "file": s.file, "code": s.code, "reason": s.reason})
}

/// `list`: load the hooks here and print them with what did not load.
pub async fn list(roots: RootArgs, as_json: bool) -> i32 {
    with_loaded_hooks(roots, async |host, report| {
        let lock =
            crate::package::LockFile::load(&crate::package::lock_file(&host.config().hermes_home))
                .unwrap_or_default();
        let hooks: Vec<Value> = host
            .hooks()
            .iter()
            .map(|h| {
                let mut v = json!(h);
                if let Some(e) = lock.hooks.get(&h.name) {
                    v["package"] = json!({
                        "source": e.source, "version": e.version(), "ref": e.reference,
                        "commit": e.commit, "tree": e.tree, "installed_at": e.installed_at,
                    });
                }
                v
            })
            .collect();
        let skipped: Vec<Value> = report.skipped.iter().map(skipped_json).collect();
        print_list(
            &hooks,
            &skipped,
            as_json,
            View::OnDisk(&describe_roots(&host.config().roots)),
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
    } else if is_host_port(address) {
        // HOST:PORT as `serve --listen` and `emit --listen` take it.
        Address::Tcp(address.to_string())
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
            print_list(&hooks, &skipped, as_json, View::Live(&address.to_string()));
            0
        }
        Ok((status, body)) => fail(format!("HTTP {status}: {}", String::from_utf8_lossy(&body))),
        Err(e) => fail(e),
    }
}

/// `127.0.0.1:8787`, `localhost:8787`, `[::1]:8787`: a TCP address, not a socket path.
fn is_host_port(text: &str) -> bool {
    !text.contains('/')
        && text
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// A string field of a hook as `/v1/hooks` shows it ("" when absent).
fn field(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

/// A Python hook's interpreter as `(path, why)`.
fn python_of(h: &Value) -> Option<(String, String)> {
    h["python"]["path"]
        .as_str()
        .map(|p| (p.to_string(), field(&h["python"]["why"])))
}

/// Whose hooks a list shows: the roots read here (no service asked: no status, no counters), or
/// the running service's at an address.
#[derive(Clone, Copy)]
enum View<'a> {
    /// Plain `list`: the roots, as described.
    OnDisk(&'a str),
    /// `list --live`: the service's address.
    Live(&'a str),
}

/// Prints hooks (as `/v1/hooks` shows them) and the directories that did not load. The plain
/// list says it is the view from disk and has no counter columns: with zeros in them it read
/// as a running service's hooks that never ran (issue 50).
fn print_list(hooks: &[Value], skipped: &[Value], as_json: bool, view: View) {
    let mut out = std::io::stdout().lock();
    if as_json {
        let _ = writeln!(out, "{}", json!({"hooks": hooks, "skipped": skipped}));
        return;
    }
    let (source, live) = match view {
        View::OnDisk(roots) => (roots, false),
        View::Live(address) => (address, true),
    };
    if !live {
        let _ = writeln!(
            out,
            "on disk in {source} (not the running service: no status or counters; \
             `hermes-hooks list --live` asks it)"
        );
    }
    let events_of = |h: &Value| -> String {
        h["events"]
            .as_array()
            .map(|a| a.iter().map(field).collect::<Vec<_>>().join(","))
            .unwrap_or_default()
    };
    // Columns as wide as their longest entry, so long names do not shift the rest of a row.
    let name_w = hooks
        .iter()
        .map(|h| field(&h["name"]).len())
        .fold(24, usize::max);
    let events_w = hooks
        .iter()
        .map(|h| events_of(h).len())
        .fold(34, usize::max);
    if hooks.is_empty() {
        let _ = writeln!(out, "no hooks loaded ({source})");
    } else if live {
        let _ = writeln!(
            out,
            "{:<name_w$} {:<8} {:<10} {:<13} {:<events_w$} {:>7} {:>7} {:>7}  ROOT",
            "NAME", "KIND", "STATUS", "HEALTH", "EVENTS", "OK", "FAILED", "DROPPED"
        );
    } else {
        let _ = writeln!(
            out,
            "{:<name_w$} {:<8} {:<events_w$}  ROOT",
            "NAME", "KIND", "EVENTS"
        );
    }
    let common = common_python(hooks.iter().filter_map(python_of));
    for h in hooks {
        let c = &h["counters"];
        let unsigned = if h["signed"] == json!(false) {
            "  UNSIGNED"
        } else {
            ""
        };
        let _ = if live {
            writeln!(
                out,
                "{:<name_w$} {:<8} {:<10} {:<13} {:<events_w$} {:>7} {:>7} {:>7}  {}{unsigned}",
                field(&h["name"]),
                field(&h["kind"]),
                field(&h["status"]),
                field(&h["health"]["state"]),
                events_of(h),
                c["ok"].as_u64().unwrap_or(0),
                c["failed"].as_u64().unwrap_or(0),
                c["dropped"].as_u64().unwrap_or(0),
                field(&h["root"]),
            )
        } else {
            writeln!(
                out,
                "{:<name_w$} {:<8} {:<events_w$}  {}{unsigned}",
                field(&h["name"]),
                field(&h["kind"]),
                events_of(h),
                field(&h["root"]),
            )
        };
        for line in detail_lines(h, common.as_ref()) {
            let _ = writeln!(out, "    {line}");
        }
    }
    if let Some((path, why)) = &common {
        let _ = writeln!(out, "python hooks: interpreter {path} ({why})");
    }
    if !skipped.is_empty() {
        let _ = writeln!(out, "\nnot loaded:");
        for k in skipped {
            let _ = writeln!(
                out,
                "  {:<22} {}: {}",
                field(&k["name"]),
                field(&k["file"]),
                field(&k["reason"])
            );
        }
    }
}

/// The last error with its time; one that later successes superseded says so.
fn last_error_line(last: &Value, message: &str) -> String {
    let time = last["time"].as_str().unwrap_or("?");
    match last["ok_since"].as_u64().unwrap_or(0) {
        0 => format!("last error ({time}): {message}"),
        n => format!("earlier error ({time}; {n} call(s) succeeded since): {message}"),
    }
}

/// The lines under a hook's row: what is out of the ordinary (fleet workers, a worker started
/// from scratch, the last error, where it runs when that is not the service with the common
/// interpreter, a gateway restart needed).
fn detail_lines(h: &Value, common: Option<&(String, String)>) -> Vec<String> {
    let mut lines = Vec::new();
    // A config.yaml entry: what it runs, as written there (issue 58 row 8).
    if let Ok(entries) = serde_json::from_value::<Vec<crate::config_hooks::WrittenEntry>>(
        h["config_entries"].clone(),
    ) {
        lines.extend(entries.iter().map(|e| e.summary()));
    } else if let Ok(entry) =
        serde_json::from_value::<crate::config_hooks::WrittenEntry>(h["config_entry"].clone())
    {
        // A service of an older release lists one entry per hook.
        lines.push(entry.summary());
    }
    if let Some(workers) = h["workers"].as_array() {
        let names: Vec<String> = workers.iter().map(field).collect();
        let lag = h["lag"]
            .as_u64()
            .map(|l| l.to_string())
            .unwrap_or("?".into());
        lines.push(format!("workers: {}; lag {lag}", names.join(", ")));
    }
    // A forked worker is the usual case; one started from scratch says why.
    if let Some(start) = h["worker"]["start"].as_str()
        && start != "forked"
    {
        lines.push(format!(
            "worker: {start} ({})",
            field(&h["worker"]["reason"])
        ));
    }
    if let Some(source) = h["package"]["source"].as_str() {
        lines.push(format!(
            "installed from {source} ({})",
            field(&h["package"]["version"])
        ));
    }
    // Why the HEALTH column says what it says, when that is trouble (issue 60 row 10).
    let health = field(&h["health"]["state"]);
    if !matches!(health.as_str(), "" | "ok" | "idle") {
        let since = h["health"]["since"]
            .as_str()
            .map(|t| format!(" (since {t})"))
            .unwrap_or_default();
        lines.push(format!(
            "health {health}: {}{since}",
            field(&h["health"]["reason"])
        ));
    }
    if let Some(e) = h["last_error"]["message"].as_str() {
        lines.push(last_error_line(&h["last_error"], e));
    }
    // A misspelt event name (a hook that will never run), said where the operator looks.
    for w in h["warnings"].as_array().into_iter().flatten() {
        lines.push(format!("warning: {}", field(w)));
    }
    let python = python_of(h);
    for line in crate::ingateway::list_lines(h) {
        if line.starts_with("runs in the service:")
            && (python.is_none() || python.as_ref() == common)
        {
            continue;
        }
        lines.push(line);
    }
    lines
}
