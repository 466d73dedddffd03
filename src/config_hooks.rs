//! Shell hooks from the `hooks:` block of `$HERMES_HOME/config.yaml` (issue 49), hosted as
//! hooks of this service.
//!
//! hermes-agent 0.19.0 runs each entry of that block (`hooks: {EVENT: [{command, matcher,
//! timeout}]}`) itself, inside the agent's call. Here each entry with consent becomes a hook
//! directory under `$HERMES_HOME/config-hooks/` (written before every scan: [`sync`]): a
//! `HOOK.yaml` for the entry's event, a Python handler (`config_hooks/handler.py`, a persistent
//! worker that applies the matcher and runs the command per event, reading its stdout as 0.19.0
//! does) and `entry.py` (the entry, as Python: code, so the approval and the version cover the
//! command; a `.json` beside a handler is data, issue 59). The entries of one command are one
//! hook (issue 58 row 1: [`group`]): its `events:` are all of theirs and its one queue and
//! worker take them in the order the service received them, as 0.19.0 runs them inline in the
//! agent's order, so a script's own state (a cooldown file, a counter) sees what it sees under
//! Hermes; two commands are two hooks. From there it is a hook like any other: its queue,
//! worker, timeout, trust, sandbox (`sandbox:` of the entry, else none: a shell hook runs
//! programs), metrics, `/v1/hooks` and the dashboard. The Hermes plugin
//! (`hermes_hooks.agent_plugin`) keeps Hermes's own runner off the entries hosted here, so a
//! command runs once per event.
//!
//! What 0.19.0 does with the block, followed here: event names outside its `VALID_HOOKS` are
//! skipped with a warning (`output_spill` is a sub-section, not an event); an entry needs a
//! non-empty `command`; `matcher` counts for `pre_tool_call` and `post_tool_call` only;
//! `timeout` defaults to 60 s, below 1 is the default, above 300 is 300. Consent: an entry runs
//! when the pair (event, command) is in `shell-hooks-allowlist.json`, or when
//! `HERMES_ACCEPT_HOOKS` (in the service's environment) or `hooks_auto_accept: true` says to
//! accept hooks; others are left to Hermes, which asks at its terminal.
//!
//! A running service sees an edit of config.yaml or of the allowlist by itself (`watch.rs`:
//! [`is_config_file`]).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The directory under `$HERMES_HOME` holding the hooks made from config.yaml.
pub const ROOT_DIR: &str = crate::hook_name::CONFIG_ROOT_DIR;
/// 0.19.0's default `timeout`, in seconds.
pub const DEFAULT_TIMEOUT: u64 = 60;
/// 0.19.0's largest `timeout`, in seconds.
pub const MAX_TIMEOUT: u64 = 300;
/// Seconds a hosted hook's `timeout:` adds to its entry's, so that the command's own timeout
/// (which gives no answer, as upstream) fires before the service stops the worker.
const TIMEOUT_GRACE: u64 = 5;
/// The handler every hosted entry runs.
const HANDLER: &str = include_str!("config_hooks/handler.py");
/// How the handler runs the command: a Python script from a warm fork server (issue 58).
const SCRIPT_RUNNER: &str = include_str!("config_hooks/script_runner.py");
/// That fork server, started by the runner with the script's own interpreter.
const SCRIPT_SERVER: &str = include_str!("config_hooks/script_server.py");
/// The events whose entries may have a `matcher`.
const TOOL_EVENTS: &[&str] = &["pre_tool_call", "post_tool_call"];

/// One entry of the `hooks:` block, as 0.19.0 normalises it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShellEntry {
    /// The event (a name of [`crate::events::AGENT_EVENTS`]).
    pub event: String,
    /// The command line, trimmed.
    pub command: String,
    /// The tool-name regular expression, for tool events only.
    pub matcher: Option<String>,
    /// Seconds, 1..=300.
    pub timeout: u64,
    /// Its place under its event (`hooks.EVENT[index]`), for messages.
    pub index: usize,
    /// This project's `sandbox:` for it, as written (none when absent).
    pub sandbox: Option<Value>,
}

impl ShellEntry {
    /// The name of the hook that runs this entry: the one of every entry of its command
    /// ([`hook_name_of`]).
    pub fn hook_name(&self) -> String {
        hook_name_of(&self.command)
    }

    /// The name a release before issue 58 gave this entry's own hook (`shell-EVENT-DIGEST`, the
    /// digest of the triple): read once, when the hook of its command is first made, so that an
    /// entry an operator had turned off stays off.
    pub fn old_hook_name(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.event.as_bytes());
        h.update([0]);
        h.update(self.matcher.as_deref().unwrap_or("").as_bytes());
        h.update([0]);
        h.update(self.command.as_bytes());
        format!(
            "{}{}-{}",
            crate::hook_name::CONFIG_PREFIX,
            self.event,
            &hex::encode(h.finalize())[..10]
        )
    }
}

/// The name of the hook made from config.yaml's entries that run `command` (trimmed):
/// `shell-` and ten hex digits of its SHA-256, so a name stays with its command wherever its
/// entries move in the file and whichever events they are on (issue 58 row 1). The client's
/// plugin computes the same (`agent_plugin.shell_hook_name`).
pub fn hook_name_of(command: &str) -> String {
    let digest = Sha256::digest(command.as_bytes());
    format!(
        "{}{}",
        crate::hook_name::CONFIG_PREFIX,
        &hex::encode(digest)[..10]
    )
}

/// One hosted hook: every hosted entry of one command, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct HostedHook {
    /// [`hook_name_of`] the command.
    pub name: String,
    /// The command line, trimmed.
    pub command: String,
    /// Its entries with consent, in file order (each event's in its index order).
    pub entries: Vec<ShellEntry>,
}

impl HostedHook {
    /// Its events, each once, in the order of its entries.
    pub fn events(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for e in &self.entries {
            if !out.contains(&e.event.as_str()) {
                out.push(&e.event);
            }
        }
        out
    }

    /// The hook's `timeout:`: the longest one event can take, its entries run one after the
    /// other (as 0.19.0 calls an event's callbacks in turn), plus the grace that lets the
    /// command's own timeout fire first; at most what HOOK.yaml accepts.
    pub fn timeout(&self) -> u64 {
        let longest = self
            .events()
            .iter()
            .map(|ev| {
                self.entries
                    .iter()
                    .filter(|e| e.event == *ev)
                    .map(|e| e.timeout)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(DEFAULT_TIMEOUT);
        (longest + TIMEOUT_GRACE).min(crate::manifest::MAX_TIMEOUT_SECS as u64)
    }
}

/// The hosted entries as hooks, one per command (in the order each command first appears),
/// each with its entries in file order. The `sandbox:` of a command's first entry is its
/// hook's; another entry of it that says otherwise is named in `warnings`.
pub fn group(hosted: &[ShellEntry], warnings: &mut Vec<String>) -> Vec<HostedHook> {
    let mut hooks: Vec<HostedHook> = Vec::new();
    for e in hosted {
        match hooks.iter_mut().find(|h| h.command == e.command) {
            Some(h) => {
                if h.entries[0].sandbox != e.sandbox {
                    warnings.push(format!(
                        "hooks.{}[{}].sandbox differs from hooks.{}[{}]'s, which runs the same \
                         command as the same hook: that one applies",
                        e.event, e.index, h.entries[0].event, h.entries[0].index
                    ));
                }
                h.entries.push(e.clone());
            }
            None => hooks.push(HostedHook {
                name: e.hook_name(),
                command: e.command.clone(),
                entries: vec![e.clone()],
            }),
        }
    }
    hooks
}

/// `roots` and, when it exists, the folder of the hooks made from config.yaml: where `enable`,
/// `disable` and the review look a hook up by name, from the CLI and the API alike (issue 57
/// row 11: the API looked in `roots` only). Blocking: one `stat`.
pub fn roots_with_made(hermes_home: &Path, roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = roots.to_vec();
    let made = hermes_home.join(ROOT_DIR);
    if !out.contains(&made) && made.is_dir() {
        out.push(made);
    }
    out
}

/// The `hooks:` block of a config.yaml, read.
#[derive(Debug, Default)]
pub struct ConfigHooks {
    /// The usable entries, in file order.
    pub entries: Vec<ShellEntry>,
    /// What was skipped and why, a sentence each.
    pub warnings: Vec<String>,
    /// `hooks_auto_accept: true` (or a true-ish string).
    pub auto_accept: bool,
}

/// Reads the `hooks:` block of `config` (a missing file, or one without the block, has none).
pub fn read(config: &Path) -> Result<ConfigHooks, String> {
    let text = match std::fs::read_to_string(config) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ConfigHooks::default()),
        Err(e) => return Err(format!("cannot read {}: {e}", config.display())),
    };
    let doc: Value = serde_saphyr::from_str(&text)
        .map_err(|e| format!("{} is not YAML: {e}", config.display()))?;
    Ok(parse(&doc))
}

/// [`read`] on a parsed document.
pub fn parse(doc: &Value) -> ConfigHooks {
    let mut out = ConfigHooks {
        auto_accept: truthy(doc.get("hooks_auto_accept")),
        ..ConfigHooks::default()
    };
    let Some(block) = doc.get("hooks").and_then(Value::as_object) else {
        return out;
    };
    for (event, entries) in block {
        if event == "output_spill" {
            continue;
        }
        if crate::events::agent_event(event).is_none() {
            let hint = crate::events::suggest(event)
                .map(|s| format!("; did you mean {s:?}?"))
                .unwrap_or_default();
            out.warnings.push(format!(
                "hooks.{event}: not an event of Hermes's agent, skipped{hint}"
            ));
            continue;
        }
        let list = match entries {
            Value::Null => continue,
            Value::Array(list) => list,
            _ => {
                out.warnings
                    .push(format!("hooks.{event} must be a list of hooks; skipped"));
                continue;
            }
        };
        for (index, raw) in list.iter().enumerate() {
            match entry(event, index, raw, &mut out.warnings) {
                Some(e) => out.entries.push(e),
                None => continue,
            }
        }
    }
    out
}

fn entry(event: &str, index: usize, raw: &Value, warnings: &mut Vec<String>) -> Option<ShellEntry> {
    let at = format!("hooks.{event}[{index}]");
    let Some(map) = raw.as_object() else {
        warnings.push(format!("{at} must be a mapping with a command; skipped"));
        return None;
    };
    let command = map.get("command").and_then(Value::as_str).map(str::trim);
    let Some(command) = command.filter(|c| !c.is_empty()) else {
        warnings.push(format!("{at} has no command; skipped"));
        return None;
    };
    let mut matcher = match map.get("matcher") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.trim().to_string()).filter(|m| !m.is_empty()),
        Some(_) => {
            warnings.push(format!("{at}.matcher must be a string; ignored"));
            None
        }
    };
    if matcher.is_some() && !TOOL_EVENTS.contains(&event) {
        warnings.push(format!(
            "{at}.matcher counts only for pre_tool_call and post_tool_call; ignored"
        ));
        matcher = None;
    }
    let timeout = match map.get("timeout") {
        None => DEFAULT_TIMEOUT,
        Some(v) => match v
            .as_i64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        {
            Some(t) if t < 1 => DEFAULT_TIMEOUT,
            Some(t) => u64::try_from(t).unwrap_or(MAX_TIMEOUT).min(MAX_TIMEOUT),
            None => {
                warnings.push(format!("{at}.timeout must be a whole number; using 60"));
                DEFAULT_TIMEOUT
            }
        },
    };
    Some(ShellEntry {
        event: event.to_string(),
        command: command.to_string(),
        matcher,
        timeout,
        index,
        sandbox: map.get("sandbox").cloned(),
    })
}

fn truthy(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => matches!(
            s.trim().to_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        ),
        _ => false,
    }
}

/// Whether `HERMES_ACCEPT_HOOKS` in this process's environment accepts every entry.
pub fn env_accepts() -> bool {
    std::env::var("HERMES_ACCEPT_HOOKS").is_ok_and(|v| {
        matches!(
            v.trim().to_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// Whether `path` is one of the files of `$HERMES_HOME` (`home`) this module reads: an edit of
/// it is a reason to reload.
pub fn is_config_file(path: &Path, home: &Path) -> bool {
    path.parent() == Some(home)
        && path
            .file_name()
            .is_some_and(|n| n == "config.yaml" || n == "shell-hooks-allowlist.json")
}

/// The (event, command) pairs approved in `$HERMES_HOME/shell-hooks-allowlist.json`.
pub fn allowlist(home: &Path) -> Vec<(String, String)> {
    let path = home.join("shell-hooks-allowlist.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    let Ok(doc) = serde_json::from_str::<Value>(&text) else {
        tracing::warn!(path = %path.display(), "the shell-hook allowlist is not JSON: no consent read from it");
        return Vec::new();
    };
    doc.get("approvals")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e.get("event")?.as_str()?.to_string(),
                e.get("command")?.as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Where each entry stands: hosted here, or left to Hermes for want of consent.
#[derive(Debug)]
pub struct Plan {
    /// Entries with consent, hosted as hooks.
    pub hosted: Vec<ShellEntry>,
    /// Those entries as hooks, one per command ([`group`]).
    pub hooks: Vec<HostedHook>,
    /// Entries without consent (Hermes asks at its terminal, or skips them).
    pub unconsented: Vec<ShellEntry>,
    /// From [`ConfigHooks::warnings`], and [`group`]'s.
    pub warnings: Vec<String>,
}

/// Reads `$HERMES_HOME/config.yaml` and the allowlist: what is hosted. Consent is each entry's
/// own, by its (event, command): a command with consent on some of its events only is hosted
/// for those, and Hermes's runner keeps the others.
pub fn plan(home: &Path) -> Result<Plan, String> {
    let found = read(&home.join("config.yaml"))?;
    let accept = found.auto_accept || env_accepts();
    let approved = allowlist(home);
    let (hosted, unconsented): (Vec<ShellEntry>, Vec<ShellEntry>) =
        found.entries.into_iter().partition(|e| {
            accept
                || approved
                    .iter()
                    .any(|(ev, c)| *ev == e.event && *c == e.command)
        });
    let mut warnings = found.warnings;
    let hooks = group(&hosted, &mut warnings);
    Ok(Plan {
        hosted,
        hooks,
        unconsented,
        warnings,
    })
}

/// The files of one hosted hook's directory.
fn files(hook: &HostedHook) -> [(&'static str, String); 5] {
    let first = &hook.entries[0];
    let sandbox = first.sandbox.clone().unwrap_or_else(|| json!("none"));
    let events = hook.events();
    let deciding = events
        .iter()
        .any(|ev| crate::events::agent_event(ev).is_some_and(|a| a.decides));
    let places: Vec<String> = hook
        .entries
        .iter()
        .map(|e| format!("hooks.{}[{}]", e.event, e.index))
        .collect();
    let manifest = format!(
        "# Made by hermes-hooks from {places} of config.yaml: edit that file, not this.\n\
         # One hook for the command: its events in one queue, one at a time, in the order they came.\n\
         name: {name}\n\
         description: {description}\n\
         events: {events_json}\n\
         timeout: {timeout}\n\
         runs: service\n\
         sandbox: {sandbox}\n{priority}",
        places = places.join(", "),
        name = hook.name,
        description = json!(format!(
            "config.yaml hooks.{}: {}",
            events.join(", hooks."),
            hook.command
        )),
        events_json = json!(events),
        timeout = hook.timeout(),
        priority = if deciding {
            // The agent waits for it: the command it starts runs in the normal class, at the
            // service's priority (an idle-class worker's children are idle too).
            "sched: normal\nnice: 0\n"
        } else {
            ""
        },
    );
    let entries: Vec<Value> = hook
        .entries
        .iter()
        .map(|e| {
            json!({
                "event": e.event,
                "matcher": e.matcher,
                "timeout": e.timeout,
                "index": e.index,
            })
        })
        .collect();
    let written = json!({"command": hook.command, "entries": entries});
    [
        ("HOOK.yaml", manifest),
        ("handler.py", HANDLER.to_string()),
        ("script_runner.py", SCRIPT_RUNNER.to_string()),
        ("script_server.py", SCRIPT_SERVER.to_string()),
        (ENTRY_FILE, entry_module(&written)),
    ]
}

/// Writes the hook directories of the hosted entries of `$HERMES_HOME/config.yaml` under
/// `$HERMES_HOME/config-hooks/` (a file only when its content changed) and removes the ones
/// of commands gone or without consent. Returns that root when it exists (so it is scanned), or
/// `None` when there is nothing to host and never was. Never fails: what went wrong is logged.
///
/// Under `--trust explicit` (`explicit`), a hook all of whose entries' (event, command) pairs
/// are in `shell-hooks-allowlist.json` is approved when its directory is first written, or
/// when it takes an event it did not have (a pair consented since): that consent is the
/// operator's approval of exactly this command for these events, and it carries over (issue
/// 49). Entries accepted only by `hooks_auto_accept` or `HERMES_ACCEPT_HOOKS` follow the trust
/// mode (`hermes-hooks enable NAME --trust explicit`), and an approval revoked later
/// (`disable`) is not given again (nor one revoked under a name of an older release). A hook
/// whose entries were all approved under an older release's names (one hook per entry) is
/// approved when first written (`approve_new`).
pub fn sync(home: &Path, explicit: bool) -> Option<PathBuf> {
    let root = home.join(ROOT_DIR);
    let plan = match plan(home) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("shell hooks of config.yaml not read: {e}");
            return root.is_dir().then_some(root);
        }
    };
    for w in &plan.warnings {
        tracing::warn!("config.yaml: {w}");
    }
    if plan.hooks.is_empty() && !root.is_dir() {
        return None;
    }
    match write_all(&root, &plan.hooks) {
        Err(e) => {
            tracing::warn!(root = %root.display(), "shell hooks of config.yaml not written: {e}");
        }
        Ok(new) if explicit => approve_new(home, &root, &plan.hooks, &new),
        Ok(_) => {}
    }
    Some(root)
}

/// Under `--trust explicit`, approves the hooks of `new` (made, or taking a new event) whose
/// entries all have their consent in the allowlist, or were all approved (and none revoked)
/// under the names of an older release, one hook per entry: what the operator approved is
/// what runs (issue 58 row 1, an upgrade needs no `enable` again).
fn approve_new(home: &Path, root: &Path, hooks: &[HostedHook], new: &[String]) {
    let listed = allowlist(home);
    let trust =
        crate::trust::approvals::TrustFile::load(&crate::trust::approvals::trust_file(home))
            .unwrap_or_default();
    for hook in hooks.iter().filter(|h| new.contains(&h.name)) {
        let old: Vec<String> = hook.entries.iter().map(ShellEntry::old_hook_name).collect();
        let why = if hook.entries.iter().all(|e| {
            listed
                .iter()
                .any(|(ev, c)| *ev == e.event && *c == e.command)
        }) {
            "from shell-hooks-allowlist.json"
        } else if old.iter().all(|n| trust.hooks.contains_key(n)) {
            "as its entries were, one by one, before"
        } else {
            continue;
        };
        match approve_consented(home, &root.join(&hook.name), &old) {
            Ok(()) => tracing::info!(
                hook = %hook.name,
                "approved {why}: {} on {}",
                hook.command,
                hook.events().join(", ")
            ),
            Err(e) => tracing::warn!(hook = %hook.name, "not approved: {e}"),
        }
    }
}

/// Records the approval of the hook made from a consented entry, as `enable --trust explicit`
/// would (its handler, settings and every file that can run), unless it was revoked, under its
/// name or one of the names its entries had before (`old`).
fn approve_consented(home: &Path, dir: &Path, old: &[String]) -> Result<(), String> {
    use crate::trust::approvals as a;
    let manifest_path = dir.join("HOOK.yaml");
    let text = std::fs::read_to_string(&manifest_path)
        .map_err(|e| format!("cannot read {}: {e}", manifest_path.display()))?;
    let manifest = crate::manifest::parse_manifest(&text).map_err(|e| e.to_string())?;
    let kind = crate::layout::HandlerKind::Python;
    let handler = dir.join("handler.py");
    let files = crate::trust::files::RunFiles::scan(dir, kind, Some(&handler), &manifest, true)
        .map_err(|e| e.to_string())?;
    let sha256 = a::approval_hash(kind, Some(&handler), &manifest).map_err(|e| e.to_string())?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let approval = a::Approval {
        sha256,
        settings_sha256: Some(a::settings_hash(&manifest)),
        settings: Some(a::covered_settings(&manifest)),
        files: Some(files.files),
        kind: kind.as_str().to_string(),
        handler: handler.display().to_string(),
        events: Some(manifest.events.clone()),
        dir: dir.to_path_buf(),
        approved_at: crate::time::now(),
    };
    let given = a::TrustFile::update(&a::trust_file(home), |t| {
        if t.revoked.contains_key(&name) || old.iter().any(|n| t.revoked.contains_key(n)) {
            return Ok(false);
        }
        t.hooks.insert(name.clone(), approval);
        Ok(true)
    })
    .map_err(|e| e.to_string())?;
    if given {
        Ok(())
    } else {
        Err(format!(
            "its approval was revoked (`disable {name}`): the allowlist does not give it again; \
             `hermes-hooks enable {name} --trust explicit` does"
        ))
    }
}

/// The file holding a hosted entry, beside `handler.py`.
const ENTRY_FILE: &str = "entry.py";
/// What an older release wrote instead (data by issue 59's rule, so not covered: removed).
const OLD_ENTRY_FILE: &str = "entry.json";

/// `entry.py`: the command and its entries as a Python module (`HOOK`). The command is what the
/// hook runs, so it must be code (covered by the approval, the version and the check before
/// each start), never data. A JSON string literal is a Python string literal.
fn entry_module(written: &Value) -> String {
    let text = serde_json::to_string(&written.to_string()).unwrap_or_else(|_| "\"{}\"".into());
    format!(
        "\"\"\"The config.yaml entries this hook runs, one command: written by hermes-hooks from \
         config.yaml (do not edit).\"\"\"\n\nimport json\n\nHOOK = json.loads({text})\n"
    )
}

/// A hosted entry as `list`, `/v1/hooks` and the dashboard show it (issue 58 row 8): what the
/// operator wrote in config.yaml, not the hook directory made from it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WrittenEntry {
    /// The event (`hooks.EVENT`).
    pub event: String,
    /// The tool-name regular expression (tool events only).
    pub matcher: Option<String>,
    /// The command line it runs.
    pub command: String,
    /// Seconds.
    pub timeout: u64,
    /// Its place under its event (`hooks.EVENT[index]`) when last written.
    pub index: usize,
}

impl WrittenEntry {
    /// One line: `hooks.pre_tool_call[0] of config.yaml (matcher "terminal"): runs CMD`.
    pub fn summary(&self) -> String {
        let matcher = self
            .matcher
            .as_ref()
            .map(|m| format!(" (matcher {m:?})"))
            .unwrap_or_default();
        format!(
            "hooks.{}[{}] of config.yaml{matcher}: runs {}",
            self.event, self.index, self.command
        )
    }
}

/// What `entry.py` holds: the command and its entries.
#[derive(serde::Deserialize)]
struct WrittenHook {
    command: String,
    entries: Vec<WrittenPlace>,
}

/// One entry in `entry.py`.
#[derive(serde::Deserialize)]
struct WrittenPlace {
    event: String,
    matcher: Option<String>,
    timeout: u64,
    index: usize,
}

/// The entries a hook directory made from config.yaml runs (read from its `entry.py`), in file
/// order, when the hook at `dir` under `root` is one: empty for any other hook (a name of the
/// reserved shape under another root is refused elsewhere, `hook_name::borrowed`).
pub fn written_entries(root: &Path, dir: &Path, name: &str) -> Vec<WrittenEntry> {
    if !crate::hook_name::config_shaped(name)
        || root.file_name() != Some(std::ffi::OsStr::new(ROOT_DIR))
    {
        return Vec::new();
    }
    read_written(dir)
}

/// [`written_entries`] of the directory `dir`, whatever its place (empty when it holds none).
fn read_written(dir: &Path) -> Vec<WrittenEntry> {
    let Ok(text) = std::fs::read_to_string(dir.join(ENTRY_FILE)) else {
        return Vec::new();
    };
    let parsed = text
        .lines()
        .find_map(|l| l.strip_prefix("HOOK = json.loads("))
        .and_then(|rest| rest.strip_suffix(')'))
        .and_then(|literal| serde_json::from_str::<String>(literal).ok())
        .and_then(|json| serde_json::from_str::<WrittenHook>(&json).ok());
    let Some(hook) = parsed else {
        return Vec::new();
    };
    hook.entries
        .into_iter()
        .map(|p| WrittenEntry {
            event: p.event,
            matcher: p.matcher,
            command: hook.command.clone(),
            timeout: p.timeout,
            index: p.index,
        })
        .collect()
}

/// Writes the hook directories; returns the names of those it made (not there before) or that
/// take an event they did not (a pair consented since they were written).
fn write_all(root: &Path, hooks: &[HostedHook]) -> std::io::Result<Vec<String>> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(root)?;
    // Made before issue 58, one per entry: an entry an operator disabled stays disabled in the
    // hook of its command (read before those directories go).
    let carried_off: Vec<&str> = hooks
        .iter()
        .filter(|h| {
            !root.join(&h.name).exists()
                && h.entries
                    .iter()
                    .any(|e| disabled_here(&root.join(e.old_hook_name()).join("HOOK.yaml")))
        })
        .map(|h| h.name.as_str())
        .collect();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("shell-") && !hooks.iter().any(|h| h.name == name) {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    let mut made = Vec::new();
    for hook in hooks {
        let dir = root.join(&hook.name);
        let before: Vec<String> = read_written(&dir).into_iter().map(|w| w.event).collect();
        if !dir.exists()
            || hook
                .events()
                .iter()
                .any(|ev| !before.iter().any(|b| b == ev))
        {
            made.push(hook.name.clone());
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)?;
        let _ = std::fs::remove_file(dir.join(OLD_ENTRY_FILE));
        for (file, mut content) in files(hook) {
            let path = dir.join(file);
            if file == "HOOK.yaml" && (disabled_here(&path) || carried_off.contains(&&*hook.name)) {
                // Disabled by an operator (`disable`, the dashboard): it stays disabled.
                content.push_str("enabled: false\n");
            }
            if std::fs::read_to_string(&path).is_ok_and(|old| old == content) {
                continue;
            }
            crate::atomic::write(&path, content.as_bytes(), 0o644)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
    }
    Ok(made)
}

/// Whether the hook made at `manifest` was disabled since (its `enabled: false`).
fn disabled_here(manifest: &Path) -> bool {
    std::fs::read_to_string(manifest).is_ok_and(|t| {
        t.lines()
            .any(|l| l.split('#').next().unwrap_or("").trim() == "enabled: false")
    })
}

/// The entries of `$HERMES_HOME/config.yaml` the hook `name` is made from (those of its command,
/// with consent or not), in file order, as far as config.yaml still has them: what a review
/// shows instead of the handler written for them.
pub fn entries_named(home: &Path, name: &str) -> Vec<ShellEntry> {
    let Ok(found) = read(&home.join("config.yaml")) else {
        return Vec::new();
    };
    found
        .entries
        .into_iter()
        .filter(|e| e.hook_name() == name)
        .collect()
}

/// The arguments `config_hooks/handler.py` runs `command` with: `shlex.split` (POSIX rules:
/// quotes, backslashes; no comments) of the command after `os.path.expanduser` (a leading `~`
/// only). `None` when it cannot be split (an unclosed quote), as the handler then runs nothing.
pub fn command_argv(command: &str) -> Option<Vec<String>> {
    let expanded = match command.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            let home = std::env::var("HOME").ok().filter(|h| !h.is_empty())?;
            format!("{}{rest}", home.trim_end_matches('/'))
        }
        _ => command.to_string(),
    };
    let (mut out, mut word, mut in_word) = (Vec::new(), String::new(), false);
    let mut chars = expanded.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\\' => {
                word.push(chars.next()?);
                in_word = true;
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\') => word.push(c),
                            c => {
                                word.push('\\');
                                word.push(c);
                            }
                        },
                        c => word.push(c),
                    }
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(yaml: &str) -> Value {
        serde_saphyr::from_str(yaml).unwrap()
    }

    /// Issue 49: the block read as 0.19.0 reads it (unknown events skipped, matchers only for
    /// tool events, the timeout's default, floor and cap).
    #[test]
    fn reads_the_block_as_upstream() {
        let found = parse(&doc("hooks_auto_accept: true\n\
             hooks:\n\
             \x20 output_spill: {max_chars: 10}\n\
             \x20 pre_tool_cal: [{command: x}]\n\
             \x20 pre_tool_call:\n\
             \x20   - {command: ' ~/gate.sh ', matcher: ' terminal ', timeout: 900}\n\
             \x20   - {matcher: x}\n\
             \x20 pre_llm_call:\n\
             \x20   - {command: ctx.py, matcher: terminal, timeout: 0}\n\
             \x20 post_tool_call:\n\
             \x20   - {command: fmt.sh, timeout: '7'}\n"));
        assert!(found.auto_accept);
        let got: Vec<_> = found
            .entries
            .iter()
            .map(|e| {
                (
                    e.event.as_str(),
                    e.command.as_str(),
                    e.matcher.as_deref(),
                    e.timeout,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("pre_tool_call", "~/gate.sh", Some("terminal"), 300),
                ("pre_llm_call", "ctx.py", None, 60),
                ("post_tool_call", "fmt.sh", None, 7),
            ]
        );
        assert_eq!(found.warnings.len(), 3, "{:?}", found.warnings);
        assert!(found.warnings[0].contains("did you mean \"pre_tool_call\""));
    }

    #[test]
    fn names_follow_the_command() {
        let e = |event: &str, m: Option<&str>| ShellEntry {
            event: event.into(),
            command: "gate.sh".into(),
            matcher: m.map(str::to_string),
            timeout: 60,
            index: 0,
            sandbox: None,
        };
        let one = e("pre_tool_call", None).hook_name();
        assert_eq!(one, e("pre_tool_call", Some("terminal")).hook_name());
        assert_eq!(one, e("on_session_end", None).hook_name());
        let other = ShellEntry {
            command: "other.sh".into(),
            ..e("pre_tool_call", None)
        };
        assert_ne!(one, other.hook_name());
        // The client's plugin computes the same names (test_agent_plugin.py pins these too).
        assert_eq!(one, "shell-514cad42d2");
        assert!(crate::hook_name::config_shaped(&one));
        // The older names stay reserved (and are read once, to carry a disabled entry over).
        assert_eq!(
            e("pre_tool_call", None).old_hook_name(),
            "shell-pre_tool_call-866f3f28b5"
        );
        assert!(crate::hook_name::config_shaped(
            &e("pre_tool_call", None).old_hook_name()
        ));
    }

    /// Issue 58 row 1: the entries of one command are one hook, its events in the order of
    /// its entries, each event's entries in file order; two commands are two hooks; the
    /// timeout covers an event's entries run one after the other; consent stays each
    /// (event, command)'s own.
    #[test]
    fn one_hook_per_command() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("config.yaml"),
            "hooks:\n\
             \x20 on_session_start: [{command: pet.sh, timeout: 10}]\n\
             \x20 pre_tool_call:\n\
             \x20   - {command: pet.sh, matcher: terminal, timeout: 20}\n\
             \x20   - {command: gate.sh}\n\
             \x20   - {command: ' pet.sh ', matcher: 'write_.*', timeout: 30}\n\
             \x20 post_llm_call: [{command: pet.sh, timeout: 5}]\n\
             \x20 on_session_end: [{command: pet.sh}]\n",
        )
        .unwrap();
        let pairs = ["on_session_start", "pre_tool_call", "post_llm_call"]
            .iter()
            .map(|e| json!({"event": e, "command": "pet.sh"}))
            .chain([json!({"event": "pre_tool_call", "command": "gate.sh"})])
            .collect::<Vec<_>>();
        std::fs::write(
            home.path().join("shell-hooks-allowlist.json"),
            json!({ "approvals": pairs }).to_string(),
        )
        .unwrap();
        let p = plan(home.path()).unwrap();
        assert_eq!(p.hooks.len(), 2, "{:?}", p.hooks);
        let pet = p.hooks.iter().find(|h| h.command == "pet.sh").unwrap();
        let gate = p.hooks.iter().find(|h| h.command == "gate.sh").unwrap();
        assert_eq!(pet.name, hook_name_of("pet.sh"));
        assert_ne!(pet.name, gate.name);
        let mut events = pet.events();
        events.sort_unstable();
        assert_eq!(
            events,
            ["on_session_start", "post_llm_call", "pre_tool_call"],
            "on_session_end has no consent: Hermes keeps it"
        );
        assert_eq!(p.unconsented.len(), 1);
        assert_eq!(p.unconsented[0].event, "on_session_end");
        let tool: Vec<_> = pet
            .entries
            .iter()
            .filter(|e| e.event == "pre_tool_call")
            .map(|e| (e.index, e.matcher.as_deref()))
            .collect();
        assert_eq!(tool, [(0, Some("terminal")), (2, Some("write_.*"))]);
        assert_eq!(pet.timeout(), 20 + 30 + TIMEOUT_GRACE);
        assert_eq!(gate.timeout(), DEFAULT_TIMEOUT + TIMEOUT_GRACE);

        let root = sync(home.path(), false).unwrap();
        let made: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(made.len(), 2, "{made:?}");
        let manifest = std::fs::read_to_string(root.join(&pet.name).join("HOOK.yaml")).unwrap();
        let parsed = crate::manifest::parse_manifest(&manifest).unwrap();
        let mut listed = parsed.events.clone();
        listed.sort_unstable();
        assert_eq!(listed, events);
        assert_eq!(parsed.concurrency, 1);
        assert!(manifest.contains("sched: normal"), "{manifest}");
        let written = written_entries(&root, &root.join(&pet.name), &pet.name);
        assert_eq!(written.len(), 4);
        assert!(written.iter().all(|w| w.command == "pet.sh"));
        assert_eq!(
            written
                .iter()
                .map(|w| (w.event.as_str(), w.index))
                .collect::<Vec<_>>(),
            pet.entries
                .iter()
                .map(|e| (e.event.as_str(), e.index))
                .collect::<Vec<_>>()
        );
    }

    /// A hook at most HOOK.yaml's largest timeout, however long its entries.
    #[test]
    fn the_timeout_is_capped() {
        let e = |index| ShellEntry {
            event: "pre_tool_call".into(),
            command: "x".into(),
            matcher: None,
            timeout: MAX_TIMEOUT,
            index,
            sandbox: None,
        };
        let hooks = group(&[e(0), e(1)], &mut Vec::new());
        assert_eq!(hooks[0].timeout(), 300);
    }

    /// A home whose config.yaml runs `a.sh` on two events (accepted by `hooks_auto_accept`),
    /// and its plan.
    fn one_command_on_two_events() -> (tempfile::TempDir, Plan) {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("config.yaml"),
            "hooks_auto_accept: true\nhooks:\n  pre_llm_call: [{command: a.sh}]\n  \
             post_llm_call: [{command: a.sh}]\n",
        )
        .unwrap();
        let p = plan(home.path()).unwrap();
        (home, p)
    }

    /// Under `--trust explicit`, entries approved one by one under an older release's names
    /// are approved as their command's hook; not when one of them was revoked.
    #[test]
    fn approvals_of_an_older_release_carry_over() {
        use crate::trust::approvals as a;
        let (home, p) = one_command_on_two_events();
        let old: Vec<String> = p.hosted.iter().map(ShellEntry::old_hook_name).collect();
        let approval: a::Approval =
            serde_json::from_value(json!({"sha256": "0".repeat(64)})).unwrap();
        let file = a::trust_file(home.path());
        let mut trust = a::TrustFile::load(&file).unwrap();
        trust.hooks.insert(old[0].clone(), approval.clone());
        trust
            .revoked
            .insert(old[1].clone(), "2026-01-01T00:00:00Z".into());
        trust.save(&file).unwrap();
        let root = sync(home.path(), true).unwrap();
        let name = &p.hooks[0].name;
        assert!(!a::TrustFile::load(&file).unwrap().hooks.contains_key(name));
        std::fs::remove_dir_all(&root).unwrap();
        trust.revoked.clear();
        trust.hooks.insert(old[1].clone(), approval);
        trust.save(&file).unwrap();
        sync(home.path(), true);
        let approved = a::TrustFile::load(&file).unwrap();
        assert_eq!(
            approved.hooks.get(name).map(|h| h.dir.clone()),
            Some(root.join(name))
        );
    }

    /// An entry disabled under an older release's name (one hook per entry) stays disabled in
    /// the hook of its command; the older directory goes.
    #[test]
    fn a_disabled_entry_of_an_older_release_stays_off() {
        let (home, p) = one_command_on_two_events();
        let old = home.path().join(ROOT_DIR).join(p.hosted[1].old_hook_name());
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("HOOK.yaml"), "name: x\nenabled: false\n").unwrap();
        let root = sync(home.path(), false).unwrap();
        assert!(!old.exists());
        assert!(disabled_here(
            &root.join(&p.hooks[0].name).join("HOOK.yaml")
        ));
    }

    /// Issue 58 row 8: what a made hook runs is read back from its directory as written.
    #[test]
    fn the_written_entry_is_read_back() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("config.yaml"),
            "hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - command: a.sh \"x y\"\n      matcher: 'terminal|write_file'\n",
        )
        .unwrap();
        let root = sync(home.path(), false).unwrap();
        let entry = &plan(home.path()).unwrap().hosted[0];
        let name = entry.hook_name();
        let got = written_entries(&root, &root.join(&name), &name).remove(0);
        assert_eq!(got.command, "a.sh \"x y\"");
        assert_eq!(got.matcher.as_deref(), Some("terminal|write_file"));
        assert_eq!(
            got.summary(),
            "hooks.pre_tool_call[0] of config.yaml (matcher \"terminal|write_file\"): runs a.sh \"x y\""
        );
        assert_eq!(written_entries(home.path(), &root.join(&name), &name), []);
    }

    #[test]
    fn consent_from_the_allowlist() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("config.yaml"),
            "hooks:\n  pre_tool_call:\n    - command: a.sh\n    - command: b.sh\n",
        )
        .unwrap();
        std::fs::write(
            home.path().join("shell-hooks-allowlist.json"),
            r#"{"approvals": [{"event": "pre_tool_call", "command": "b.sh"}]}"#,
        )
        .unwrap();
        let p = plan(home.path()).unwrap();
        assert_eq!(p.hosted.len(), 1);
        assert_eq!(p.hosted[0].command, "b.sh");
        assert_eq!(p.unconsented[0].command, "a.sh");
        let root = sync(home.path(), false).unwrap();
        let dir = root.join(p.hosted[0].hook_name());
        assert!(dir.join("HOOK.yaml").is_file() && dir.join(ENTRY_FILE).is_file());
        // Disabled by an operator: it stays disabled when written again.
        let manifest = dir.join("HOOK.yaml");
        let text = std::fs::read_to_string(&manifest).unwrap();
        std::fs::write(&manifest, format!("{text}enabled: false\n")).unwrap();
        sync(home.path(), false);
        assert!(disabled_here(&manifest));
        // Consent withdrawn: the directory goes.
        std::fs::write(home.path().join("shell-hooks-allowlist.json"), "{}").unwrap();
        assert_eq!(sync(home.path(), false), Some(root.clone()));
        assert!(!dir.exists());
    }

    #[test]
    fn a_command_is_split_as_shlex_splits_it() {
        let argv = |c: &str| command_argv(c).unwrap_or_default();
        assert_eq!(
            argv(r#"bash  "/a b/gate.sh" 'x y' z\ w "q\"r\n""#),
            ["bash", "/a b/gate.sh", "x y", "z w", "q\"r\\n"]
        );
        assert_eq!(argv(""), Vec::<String>::new());
        assert_eq!(command_argv("echo 'unclosed"), None);
    }
}
