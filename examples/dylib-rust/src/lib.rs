//! rust-pre-route: the pre-route-policy example as a Rust dynamic library.
//!
//! `message:pre_route` with the message `/switch abc123` returns
//! `{"decision": "switch_session", "session_id": "abc123", "handled_by": "rust"}`; any other
//! message returns no result. `command:*` events are counted and the count is returned, to show
//! that state persists between calls of one loaded library.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hermes_hooks_sdk::serde_json::{Value, json};

const PREFIX: &str = "/switch ";

static COMMANDS: AtomicU64 = AtomicU64::new(0);
static HOOK_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

fn handle(event: &str, context: &Value) -> Result<Option<Value>, String> {
    if event == "message:pre_route" {
        let message = context
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim();
        let Some(target) = message.strip_prefix(PREFIX).map(str::trim) else {
            return Ok(None);
        };
        if target.is_empty() {
            return Ok(None);
        }
        return Ok(Some(json!({
            "decision": "switch_session",
            "session_id": target,
            "handled_by": "rust",
        })));
    }
    if let Some(command) = event.strip_prefix("command:") {
        let n = COMMANDS.fetch_add(1, Ordering::Relaxed) + 1;
        let dir = HOOK_DIR
            .lock()
            .map_err(|_| "state lock poisoned".to_string())?
            .clone();
        return Ok(Some(json!({
            "command": command,
            "commands_seen": n,
            "hook_dir": dir,
        })));
    }
    Ok(None)
}

fn init(hook_dir: &Path) -> Result<(), String> {
    let mut dir = HOOK_DIR
        .lock()
        .map_err(|_| "state lock poisoned".to_string())?;
    *dir = Some(hook_dir.to_path_buf());
    Ok(())
}

fn shutdown() {
    eprintln!(
        "rust-pre-route: shutting down after {} command(s)",
        COMMANDS.load(Ordering::Relaxed)
    );
}

hermes_hooks_sdk::export_hook!(handle, init = init, shutdown = shutdown);
