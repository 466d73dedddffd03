//! Hooks that run inside the gateway: what the service says about them.
//!
//! The service runs no worker for a hook placed in the gateway ([`crate::placement`]); the
//! gateway's Python client imports it. This module owns what `list`, `check` and `/v1/hooks`
//! add to every hook (where it runs and why, its interpreter, the handler's SHA-256) and the
//! record the client writes when it imports in-gateway hooks (`$HERMES_HOME/hooks-in-gateway.json`:
//! the gateway's pid and the SHA-256 of each hook it imported). A hook whose file changed since a
//! still-running gateway imported it is reported as needing a gateway restart: re-importing code
//! that patched the gateway's classes is not safe, so nobody does it behind the operator's back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::discovery::HookSpec;
use crate::interpreter::{self, Interpreter};

/// Name of the record the gateway's client writes in `$HERMES_HOME`.
pub const RECORD_FILE: &str = "hooks-in-gateway.json";

/// What every hook shows besides its counters: placement, interpreter, handler digest.
#[derive(Debug, Clone, Serialize)]
pub struct HookPlacement {
    /// `service` or `gateway`.
    pub runs: &'static str,
    /// Why it runs there.
    pub why: String,
    /// SHA-256 (hex) of the handler file as discovered (absent for webhooks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Python hooks: the interpreter and why (in-gateway hooks run in the gateway's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<Interpreter>,
    /// In-gateway hooks: every file of the hook's tree but its data, with its SHA-256 (relative
    /// path -> hex), which the gateway's client checks each module against as it imports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, String>>,
    /// In-gateway hooks changed (or added) since the running gateway imported its hooks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_needed: Option<String>,
}

impl HookPlacement {
    /// The view of `spec` on a host whose default interpreter is `default_python`.
    pub fn of(spec: &HookSpec, default_python: &str, hermes_home: &Path) -> Self {
        // A config.yaml entry runs its command; the interpreter of the service's runner for it
        // is nothing its author chose (issue 58 row 8).
        let own_python = spec.kind.spec().python && spec.config_entries.is_empty();
        let python = (own_python && !spec.placement.in_gateway()).then(|| {
            interpreter::for_hook(spec.manifest.python.as_deref(), default_python, hermes_home)
        });
        let why = if spec.config_entries.is_empty() {
            spec.placement.why.clone()
        } else {
            "config.yaml's `hooks:` block: the service runs the command once per entry that \
             matches an event, its events one at a time in the order they came"
                .to_string()
        };
        Self {
            runs: spec.placement.runs.as_str(),
            why,
            sha256: spec.sha256.clone(),
            files: spec
                .placement
                .in_gateway()
                .then(|| spec.files.files.clone()),
            python,
            restart_needed: spec
                .placement
                .in_gateway()
                .then(|| restart_needed(spec, hermes_home))
                .flatten(),
        }
    }

    /// One line for `check` and `list`: "runs in the gateway: imports ... at line 3".
    pub fn summary(&self) -> String {
        let mut s = format!("runs in the {}: {}", self.runs, self.why);
        if let Some(p) = &self.python {
            s.push_str(&format!("; interpreter {} ({})", p.path, p.why));
        }
        if self.runs == "gateway" {
            s.push_str("; the gateway's client imports it (not import-checked here)");
        }
        s
    }
}

/// The extra lines `list` prints under a hook shown as `/v1/hooks` shows it.
pub fn list_lines(hook: &serde_json::Value) -> Vec<String> {
    let s = |k: &str| hook[k].as_str().unwrap_or("").to_string();
    let mut lines = Vec::new();
    if !s("runs").is_empty() {
        let mut line = format!("runs in the {}: {}", s("runs"), s("why"));
        if let Some(p) = hook["python"]["path"].as_str() {
            line.push_str(&format!(
                "; interpreter {p} ({})",
                hook["python"]["why"].as_str().unwrap_or("")
            ));
        }
        lines.push(line);
    }
    if let Some(r) = hook["restart_needed"].as_str() {
        lines.push(format!("GATEWAY RESTART NEEDED: {r}"));
    }
    lines
}

/// What `test EVENT` says about an in-gateway hook that matches the event instead of running it.
pub fn not_run_by_test(spec: &HookSpec) -> String {
    format!(
        "{:<24} not run  runs inside the gateway ({}); `test` does not run in-gateway hooks: \
         the gateway's client does, when the gateway emits the event",
        spec.name, spec.placement.why
    )
}

/// The record the gateway's client writes after importing its in-gateway hooks.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ImportRecord {
    /// The gateway's process id.
    pub pid: u32,
    /// Hook name -> what was imported.
    #[serde(default)]
    pub hooks: BTreeMap<String, ImportedHook>,
}

/// One imported hook in [`ImportRecord`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ImportedHook {
    /// SHA-256 (hex) of the handler file the gateway imported.
    #[serde(default)]
    pub sha256: String,
}

/// Where the client records its imports for `hermes_home`.
pub fn record_path(hermes_home: &Path) -> PathBuf {
    hermes_home.join(RECORD_FILE)
}

/// The record of a gateway that is still running, if any.
pub fn live_record(hermes_home: &Path) -> Option<ImportRecord> {
    let text = std::fs::read_to_string(record_path(hermes_home)).ok()?;
    let record: ImportRecord = serde_json::from_str(&text).ok()?;
    process_alive(record.pid).then_some(record)
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks that the process exists; no memory is involved.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Why the running gateway must be restarted for `spec` (an in-gateway hook), if it must.
pub fn restart_needed(spec: &HookSpec, hermes_home: &Path) -> Option<String> {
    let record = live_record(hermes_home)?;
    match record.hooks.get(&spec.name) {
        Some(imported) if Some(&imported.sha256) == spec.sha256.as_ref() => None,
        Some(_) => Some(format!(
            "changed since the gateway (pid {}) imported it: restart the gateway to run the new \
             version (code that patched the gateway is not re-imported in place)",
            record.pid
        )),
        None => Some(format!(
            "added after the gateway (pid {}) imported its hooks: restart the gateway to load it",
            record.pid
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_gateway_needs_no_restart() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            record_path(tmp.path()),
            r#"{"pid": 999999999, "hooks": {"x": {"sha256": "00"}}}"#,
        )
        .unwrap();
        assert!(live_record(tmp.path()).is_none());
        std::fs::write(
            record_path(tmp.path()),
            format!(r#"{{"pid": {}, "hooks": {{}}}}"#, std::process::id()),
        )
        .unwrap();
        assert!(live_record(tmp.path()).is_some());
    }
}
