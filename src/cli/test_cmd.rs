//! `test EVENT`: run the matching handlers here and print each result, error and duration.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cli::args::TestArgs;
use crate::cli::common::{describe_roots, fail, read_context, usage, with_loaded_hooks};

/// The context of a sample call of the agent event `event` (issue 49): a tool call of
/// `terminal` (`echo hello`) for the tool events, a session's id for the others; `for_tool`
/// names the tool, and `payload_file` (a JSON object of Hermes's call arguments, or of the
/// context's keys: [`call_arguments`]) is merged over it. Made as the Hermes plugin makes it ([`crate::events::agent_context`]).
fn agent_call(
    event: &str,
    for_tool: Option<&str>,
    payload_file: Option<&std::path::Path>,
) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    let Some(known) = crate::events::agent_event(event) else {
        return Err(format!(
            "--for-tool and --payload-file are for the agent's events (pre_tool_call, \
             pre_llm_call, ...); {event:?} is not one: give its context with --context"
        ));
    };
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("session_id".into(), json!("test-session"));
    if known.name.ends_with("_tool_call") || known.name == "transform_tool_result" {
        kwargs.insert("tool_name".into(), json!("terminal"));
        kwargs.insert("args".into(), json!({"command": "echo hello"}));
        kwargs.insert("tool_call_id".into(), json!("test-call"));
    }
    if let Some(tool) = for_tool {
        kwargs.insert("tool_name".into(), json!(tool));
    }
    let mut cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    if let Some(path) = payload_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let payload = match serde_json::from_str(&text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(format!("{} is not a JSON object", path.display())),
            Err(e) => return Err(format!("{} is not valid JSON: {e}", path.display())),
        };
        let payload = call_arguments(event, payload, &mut cwd)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        kwargs.extend(payload);
    }
    Ok(crate::events::agent_context(event, &kwargs, &cwd))
}

/// A payload file's object as the call's arguments (issue 58 row 11). Besides Hermes's own
/// names (`args`, `task_id`, ...), the keys of the context a hook receives are read for what
/// they are: `tool_input` is the call's `args`, `extra`'s keys are arguments, `cwd` is the
/// working directory, `hook_event_name` must be `event`; so a context copied from a hook's
/// stdin tests as it ran. Refused, naming the key to write: both `args` and `tool_input`, or
/// either not an object (the hook would see `tool_input: null`).
fn call_arguments(
    event: &str,
    mut payload: serde_json::Map<String, serde_json::Value>,
    cwd: &mut String,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    use serde_json::Value;
    if let Some(input) = payload.remove("tool_input") {
        if payload.contains_key("args") {
            return Err(
                "both \"args\" and \"tool_input\": the tool call's arguments are \
                        \"args\" (Hermes's name) or \"tool_input\" (the context's), one of them"
                    .into(),
            );
        }
        payload.insert("args".into(), input);
    }
    if let Some(args) = payload.get("args").filter(|a| !a.is_object()) {
        return Err(format!(
            "\"args\" (or \"tool_input\") is the tool call's arguments, a JSON object such as \
             {{\"command\": \"ls\"}}; not {args}"
        ));
    }
    match payload.remove("hook_event_name") {
        Some(Value::String(e)) if e == event => {}
        Some(other) => {
            return Err(format!(
                "\"hook_event_name\" is {other}, but the event tested is {event:?}"
            ));
        }
        None => {}
    }
    match payload.remove("cwd") {
        Some(Value::String(dir)) => *cwd = dir,
        Some(other) => return Err(format!("\"cwd\" is a directory's path, not {other}")),
        None => {}
    }
    match payload.remove("extra") {
        Some(Value::Object(extra)) => {
            for (k, v) in extra {
                payload.entry(k).or_insert(v);
            }
        }
        Some(other) => {
            return Err(format!(
                "\"extra\" holds the call's other arguments by name, a JSON object; not {other}"
            ));
        }
        None => {}
    }
    Ok(payload)
}

/// Runs `test`; returns the exit code.
pub async fn test(args: TestArgs) -> i32 {
    if let Err(e) = crate::events::validate_event_name(&args.event) {
        return usage(format!("{e}"));
    }
    let context = if args.for_tool.is_some() || args.payload_file.is_some() {
        agent_call(
            &args.event,
            args.for_tool.as_deref(),
            args.payload_file.as_deref(),
        )
    } else {
        read_context(args.context.as_deref(), args.context_file.as_deref())
    };
    let context = match context {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let context = match crate::host::normalize_context(context) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let event = args.event.clone();
    let only = args.hook.clone();
    let as_json = args.json;
    with_loaded_hooks(args.roots, async move |host, report| {
        for s in report.skipped.iter().filter(|s| s.is_problem()) {
            eprintln!("not loaded: {s}");
        }
        let snapshot = host.snapshot();
        let in_gateway: Vec<String> = snapshot
            .hooks
            .iter()
            .filter(|h| h.spec.placement.in_gateway() && h.spec.patterns.matches(&event).is_some())
            .filter(|h| only.as_ref().is_none_or(|o| *o == h.spec.name))
            .map(|h| crate::ingateway::not_run_by_test(&h.spec))
            .collect();
        for line in &in_gateway {
            println!("{line}");
        }
        let matching: Vec<String> = snapshot
            .matching(&event)
            .into_iter()
            .map(|h| h.spec.name.clone())
            .filter(|n| only.as_ref().is_none_or(|o| o == n))
            .collect();
        if matching.is_empty() {
            let roots = describe_roots(&host.config().roots);
            let gateway = !in_gateway.is_empty();
            return fail(no_match(
                &snapshot,
                only.as_deref(),
                &event,
                gateway,
                &roots,
            ));
        }
        let timeout = snapshot
            .hooks
            .iter()
            .filter(|h| matching.contains(&h.spec.name))
            .map(|h| h.spec.manifest.timeout)
            .max()
            .unwrap_or(Duration::from_secs(30))
            + Duration::from_secs(1);
        let started = Instant::now();
        let outcomes = match host
            .emit_collect_only(&event, context, timeout, only.as_deref())
            .await
        {
            Ok(o) => o,
            Err(e) => return fail(e),
        };
        let mut out = std::io::stdout().lock();
        let mut errors = 0;
        let w = outcomes.iter().map(|o| o.hook.len()).fold(24, usize::max);
        for o in &outcomes {
            // Milliseconds to 0.1 ms, as the text shows them (not 0.6214770000000001).
            let ms = o
                .duration
                .map(|d| (d.as_secs_f64() * 10_000.0).round() / 10.0);
            if o.result.is_err() {
                errors += 1;
            }
            if as_json {
                let line = match &o.result {
                    Ok(r) => json!({"hook": o.hook, "ok": true, "result": r, "duration_ms": ms}),
                    Err(e) => json!({"hook": o.hook, "ok": false, "error": e, "duration_ms": ms}),
                };
                let _ = writeln!(out, "{line}");
            } else {
                let dur = ms
                    .map(|m| format!("{m:.1} ms"))
                    .unwrap_or_else(|| "-".into());
                match &o.result {
                    Ok(Some(v)) => {
                        let _ = writeln!(out, "{:<w$} ok     {dur:>10}  result: {v}", o.hook);
                    }
                    Ok(None) => {
                        let _ = writeln!(out, "{:<w$} ok     {dur:>10}  (no result)", o.hook);
                    }
                    Err(e) => {
                        let _ = writeln!(out, "{:<w$} error  {dur:>10}  {e}", o.hook);
                    }
                }
            }
        }
        if !as_json {
            let _ = writeln!(
                out,
                "{} hook(s) ran for {event} in {:.1} ms, {errors} error(s)",
                outcomes.len(),
                started.elapsed().as_secs_f64() * 1000.0
            );
        }
        i32::from(errors > 0)
    })
    .await
}

/// Why a loaded hook named by `--hook` does not run for `event`: its patterns, and the near
/// misses among them.
fn not_matching(spec: &crate::discovery::HookSpec, event: &str) -> String {
    let mut why = format!(
        "hook {:?} is loaded, but its events ({}) do not match {event:?}",
        spec.name,
        spec.manifest.events.join(", ")
    );
    for w in spec
        .manifest
        .events
        .iter()
        .filter_map(|p| crate::pattern::misspelt_warning(p))
    {
        why.push_str("; ");
        why.push_str(&w);
    }
    why
}

/// Why nothing runs for `event` (`only`: the `--hook` asked for; `gateway`: a hook that matched
/// runs inside the gateway, said above).
fn no_match(
    snapshot: &crate::registry::Registry,
    only: Option<&str>,
    event: &str,
    gateway: bool,
    roots: &str,
) -> String {
    let loaded: Vec<&str> = snapshot
        .hooks
        .iter()
        .map(|h| h.spec.name.as_str())
        .collect();
    let loaded = if loaded.is_empty() {
        "no hook loaded there".to_string()
    } else {
        format!("loaded there: {}", loaded.join(", "))
    };
    match only {
        Some(o) if gateway => format!(
            "hook {o:?} runs inside the gateway (see above): `test` runs only the hooks that run \
             in the service"
        ),
        Some(o) => match snapshot.hooks.iter().find(|h| h.spec.name == o) {
            Some(h) => not_matching(&h.spec, event),
            None => format!("hook {o:?} is not loaded (searched {roots}; {loaded})"),
        },
        None if gateway => {
            format!("no hook that runs here matches {event:?} (see above; searched {roots})")
        }
        None => format!("no loaded hook matches {event:?} (searched {roots}; {loaded})"),
    }
}
