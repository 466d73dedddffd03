//! `emit`: send one event to the running service and print its answer.

use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::args::EmitArgs;
use crate::cli::common::{default_address, fail, read_context, usage};

/// Runs `emit`; returns the exit code.
pub async fn emit(args: EmitArgs) -> i32 {
    use crate::client::{Address, request};
    let context = match read_context(args.context.as_deref(), args.context_file.as_deref()) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let address = match (&args.listen, &args.socket) {
        (Some(l), _) => Address::Tcp(l.clone()),
        (None, Some(p)) => Address::Unix(p.clone()),
        (None, None) => default_address(),
    };
    let token = match &args.token_file {
        Some(f) => match std::fs::read_to_string(f) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) => return fail(format!("cannot read --token-file {}: {e}", f.display())),
        },
        None => std::env::var("HERMES_HOOKS_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
    };
    let (path, body) = if args.collect {
        (
            "/v1/collect",
            json!({"event": args.event, "context": context, "timeout_ms": args.timeout_ms}),
        )
    } else {
        (
            "/v1/events",
            json!({"event": args.event, "context": context}),
        )
    };
    let wait = args
        .timeout_ms
        .map_or(crate::decision::MAX_WAIT + Duration::from_secs(5), |ms| {
            Duration::from_millis(ms.saturating_add(5000))
        });
    let body = body.to_string();
    // A collect sent while the service still loads its hooks (503 `not_ready`) is sent again
    // until they are loaded, within the wait, as the Python client does (issue 47): a decision
    // is not given up because the service started a moment ago.
    let until = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(20);
    let answer = loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let answer = request(
            &address,
            "POST",
            path,
            token.as_deref(),
            Some(body.as_bytes()),
            left,
        )
        .await;
        let loading = matches!(&answer, Ok((503, raw)) if args.collect
            && String::from_utf8_lossy(raw).contains("\"not_ready\""));
        if !loading || tokio::time::Instant::now() + pause >= until {
            break answer;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    };
    match answer {
        Ok((status, answer)) if (200..300).contains(&status) => {
            println!("{}", String::from_utf8_lossy(&answer).trim());
            0
        }
        Ok((status, answer)) => {
            let v: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
            let msg = v["error"]["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&answer).into_owned());
            fail(format!("HTTP {status}: {msg}"))
        }
        Err(e) => fail(e),
    }
}
