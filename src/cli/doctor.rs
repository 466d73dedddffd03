//! `doctor`: what stands between Hermes's agent events and the hooks here (issue 49), covering
//! what `hermes hooks doctor` (hermes-agent 0.19.0) checks of the shell hooks of config.yaml,
//! and the parts this service adds.
//!
//! For the whole: the Hermes plugin is in `plugins.enabled`; the Python that runs `hermes`
//! imports it, has its entry point and lists it enabled by Hermes's own reader
//! (`hermes_python.rs`, issue 58 row 9); the service answers. For each entry
//! of the `hooks:` block: the script it runs exists and can run (executable when it is the
//! command itself, readable when an interpreter runs it); consent (the allowlist's record, or
//! `hooks_auto_accept` / `HERMES_ACCEPT_HOOKS`); the script not changed since it was approved;
//! the running service hosts it (or why not: under `--trust explicit`, what to run to approve
//! it); and, only for an entry with consent (so that no script runs before anybody approved
//! it), one run on a sample call of its event whose stdout must be empty or JSON, said before it
//! runs (a hook that posts somewhere posts), skipped with `--no-run` (issue 60). Exit 1 when
//! anything needs fixing.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::cli::common::default_address;

/// A line on stdout; a closed stdout (`doctor | head`) ends nothing.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
use crate::config_hooks::{ShellEntry, plan};

/// What the running service lists: the names of its hooks, and of what it skipped with the
/// code and reason (`/v1/hooks`).
struct Listed {
    hooks: Vec<String>,
    skipped: Vec<(String, String, String)>,
}

/// Runs `doctor`; returns the exit code. `no_run`: no entry is run on a sample call.
pub async fn doctor(no_run: bool) -> i32 {
    let home = crate::layout::hermes_home();
    let config = home.join("config.yaml");
    let mut problems = 0;
    let enabled = crate::cli::dashboard::read_config(&config)
        .and_then(|t| crate::cli::dashboard::parse(&config, &t))
        .map(|v| crate::cli::dashboard::list_of(&v, "enabled"))
        .unwrap_or_default();
    let enabled_here = enabled.iter().any(|p| p == crate::cli::dashboard::PLUGIN);
    if enabled_here {
        say!(
            "ok      the Hermes plugin is in plugins.enabled of {}",
            config.display()
        );
    } else {
        problems += 1;
        say!(
            "problem the Hermes plugin is not in plugins.enabled of {}: the agent's events do not \
             reach the hooks here; run `hermes-hooks plugin install`",
            config.display()
        );
    }
    for said in crate::cli::hermes_python::check(&home, enabled_here).await {
        use crate::cli::hermes_python::Said;
        match said {
            Said::Problem(line) => {
                problems += 1;
                say!("problem {line}");
            }
            Said::Warning(line) => say!("warning {line}"),
            Said::Ok(line) => say!("ok      {line}"),
        }
    }
    let hosted = hosted_names().await;
    let plan = match plan(&home) {
        Ok(p) => p,
        Err(e) => {
            say!("problem {e}");
            return 1;
        }
    };
    for w in &plan.warnings {
        say!("warning {}: {w}", config.display());
    }
    let allowlist = allowlist_records(&home);
    let accepted = plan.hosted.iter().map(|e| (e, true));
    let others = plan.unconsented.iter().map(|e| (e, false));
    for (entry, consented) in accepted.chain(others) {
        say!("[{}] {}", entry.event, entry.command);
        let (checked, runnable) = entry_checks(entry, consented, &allowlist, hosted.as_ref());
        problems += checked;
        if consented && runnable {
            problems += if no_run {
                say!("      skip    not run on a sample call (--no-run)");
                0
            } else {
                say!(
                    "      running it once on a sample call of {} (what it does, it does: \
                     --no-run skips this)",
                    entry.event
                );
                smoke(entry).await
            };
        }
    }
    if plan.hosted.is_empty() && plan.unconsented.is_empty() {
        say!("no shell hooks in the hooks: block of {}", config.display());
    }
    say!("{problems} problem(s)");
    i32::from(problems > 0)
}

/// What the running service lists; `None` (said) when it does not answer.
async fn hosted_names() -> Option<Listed> {
    let address = default_address();
    let token = std::env::var("HERMES_HOOKS_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    let got = crate::client::request(
        &address,
        "GET",
        "/v1/hooks",
        token.as_deref(),
        None,
        Duration::from_secs(5),
    )
    .await;
    match got {
        Ok((200, body)) => {
            say!("ok      the service answers at {address}");
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let items = |key: &str| v[key].as_array().cloned().unwrap_or_default();
            let text = |h: &Value, key: &str| h[key].as_str().unwrap_or_default().to_string();
            Some(Listed {
                hooks: items("hooks").iter().map(|h| text(h, "name")).collect(),
                skipped: items("skipped")
                    .iter()
                    .map(|h| (text(h, "name"), text(h, "code"), text(h, "reason")))
                    .collect(),
            })
        }
        Ok((status, _)) => {
            say!("warning the service at {address} answered {status} to GET /v1/hooks");
            None
        }
        Err(e) => {
            say!("warning {e}: the plugin starts it when Hermes starts (autostart)");
            None
        }
    }
}

/// The allowlist's approvals, as JSON records.
fn allowlist_records(home: &Path) -> Vec<Value> {
    std::fs::read_to_string(home.join("shell-hooks-allowlist.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.get("approvals").and_then(Value::as_array).cloned())
        .unwrap_or_default()
}

/// The checks of one entry but its run, printed; returns the number of problems and whether its
/// script can run.
fn entry_checks(
    entry: &ShellEntry,
    consented: bool,
    allowlist: &[Value],
    hosted: Option<&Listed>,
) -> (u32, bool) {
    let mut problems = 0;
    let (script, runnable) = script_state(&entry.command);
    if runnable {
        say!("      ok      {} can run", script.display());
    } else {
        problems += 1;
        say!(
            "      problem {} is missing or cannot run (chmod +x it, or fix the path)",
            script.display()
        );
    }
    let record = allowlist.iter().find(|r| {
        r["event"].as_str() == Some(entry.event.as_str())
            && r["command"].as_str() == Some(entry.command.as_str())
    });
    match (record, consented) {
        (Some(r), _) => say!(
            "      ok      approved {}",
            r["approved_at"].as_str().unwrap_or("(no date)")
        ),
        (None, true) => say!("      ok      accepted by hooks_auto_accept / HERMES_ACCEPT_HOOKS"),
        (None, false) => {
            problems += 1;
            say!(
                "      problem no consent: not hosted here; Hermes asks at its terminal (run \
                 `hermes --accept-hooks chat` once, or set hooks_auto_accept: true)"
            );
        }
    }
    if let Some(approved) = record
        .and_then(|r| r["script_mtime_at_approval"].as_str())
        .and_then(|t| humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok())
    {
        let now = std::fs::metadata(&script).and_then(|m| m.modified()).ok();
        if now.is_some_and(|n| newer(n, approved)) {
            problems += 1;
            say!(
                "      problem {} changed since it was approved: review it, then `hermes hooks \
                 revoke` and approve it again",
                script.display()
            );
        } else if now.is_some() {
            say!("      ok      unchanged since it was approved");
        }
    }
    if let Some(listed) = hosted
        && consented
    {
        problems += hosting(&entry.hook_name(), listed, record.is_some());
    }
    (problems, runnable)
}

/// Whether the service hosts the hook `name` made from a consented entry, and if not why and
/// what to do, printed; returns the number of problems. `allowlisted`: the entry's consent is
/// in shell-hooks-allowlist.json.
fn hosting(name: &str, listed: &Listed, allowlisted: bool) -> u32 {
    if listed.hooks.iter().any(|h| h == name) {
        say!("      ok      hosted as {name}");
        return 0;
    }
    let Some((_, code, reason)) = listed.skipped.iter().find(|(n, _, _)| n == name) else {
        say!(
            "      problem the service does not list {name}: reload it (`kill -HUP`, or \
             POST /v1/reload) to read config.yaml again"
        );
        return 1;
    };
    match code.as_str() {
        "revoked" => {
            say!(
                "      ok      disabled: its approval was revoked; `hermes-hooks enable {name} \
                 --trust explicit` switches it back on"
            );
            return 0;
        }
        "not_approved" => say!(
            "      problem not approved (the service runs with --trust explicit): run \
             `hermes-hooks enable {name} --trust explicit`"
        ),
        _ => say!("      problem the service skipped {name} ({code}): {reason}"),
    }
    if code == "not_approved" && allowlisted {
        say!(
            "              (its consent in shell-hooks-allowlist.json approves it only when the \
             service first writes its hook under --trust explicit; this one was written before, \
             under --trust all)"
        );
    }
    1
}

/// Whether `now` is later than `approved` by more than the second the record may round away.
fn newer(now: SystemTime, approved: SystemTime) -> bool {
    now.duration_since(approved)
        .is_ok_and(|d| d > Duration::from_secs(1))
}

/// The script a command runs (0.19.0's rule: the first word with a script's extension, else the
/// first with a `/` or a leading `~`, else the first) and whether it can run.
fn script_state(command: &str) -> (PathBuf, bool) {
    const EXTENSIONS: &[&str] = &[
        ".sh", ".bash", ".zsh", ".fish", ".py", ".pyw", ".rb", ".pl", ".lua", ".js", ".mjs",
        ".cjs", ".ts",
    ];
    let words: Vec<&str> = command.split_whitespace().collect();
    let pick = words
        .iter()
        .find(|w| EXTENSIONS.iter().any(|x| w.to_lowercase().ends_with(x)))
        .or_else(|| words.iter().find(|w| w.contains('/') || w.starts_with('~')))
        .or(words.first())
        .copied()
        .unwrap_or("");
    let path = match pick.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(rest),
        None => PathBuf::from(pick),
    };
    let bare = words.first() == Some(&pick);
    let ok = std::fs::metadata(&path).is_ok_and(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.is_file() && (!bare || m.permissions().mode() & 0o111 != 0)
    });
    (path, ok)
}

/// One run of the entry's command on a sample call; stdout must be empty or JSON.
async fn smoke(entry: &ShellEntry) -> u32 {
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("session_id".into(), json!("doctor-session"));
    if entry.event.ends_with("_tool_call") {
        kwargs.insert("tool_name".into(), json!("terminal"));
        kwargs.insert("args".into(), json!({"command": "echo hello"}));
    }
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let stdin = crate::events::agent_context(&entry.event, &kwargs, &cwd).to_string();
    let words: Vec<String> = entry.command.split_whitespace().map(expand_home).collect();
    let Some((program, args)) = words.split_first() else {
        return 0;
    };
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            say!("      problem cannot start it: {e}");
            return 1;
        }
    };
    if let Some(mut pipe) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        let _ = pipe.write_all(stdin.as_bytes()).await;
    }
    let limit = Duration::from_secs(entry.timeout);
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => {
            say!("      problem it failed: {e}");
            return 1;
        }
        Err(_) => {
            say!(
                "      problem timed out after {}s on a sample call",
                entry.timeout
            );
            return 1;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let code = out
        .status
        .code()
        .map_or("a signal".to_string(), |c| c.to_string());
    if text.trim().is_empty() {
        say!("      ok      ran on a sample call (exit {code}), answered nothing");
        0
    } else if serde_json::from_str::<Value>(text.trim()).is_ok() {
        say!("      ok      answered JSON on a sample call (exit {code})");
        0
    } else {
        say!(
            "      problem its stdout on a sample call is not JSON (exit {code}): {}",
            crate::text::cap(text.trim().chars().take(120).collect())
        );
        1
    }
}

fn expand_home(word: &str) -> String {
    match (word.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) => format!("{home}/{rest}"),
        _ => word.to_string(),
    }
}
