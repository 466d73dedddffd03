//! HOOK.yaml: the schema, its defaults and its validation.
//!
//! Parsing is two passes over the same text: a generic one (syntax errors with their line, "not a
//! mapping", unknown keys, which are warned about) and a typed one (type errors with their line).
//! Semantic checks (events present, timeout range, queue size) follow. Nothing here touches the
//! file system; [`crate::discovery`] reads the file and resolves the handler.

mod shape;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

/// Default seconds per handler invocation.
pub const DEFAULT_TIMEOUT_SECS: f64 = 30.0;
/// Largest accepted `timeout`.
pub const MAX_TIMEOUT_SECS: f64 = 300.0;
/// Default per-hook queue capacity.
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;
/// Largest accepted queue capacity.
pub const MAX_QUEUE_CAPACITY: usize = 1_000_000;
/// Fleet mode: default retries after the first delivery before the dead-letter subject.
pub const DEFAULT_RETRIES: u32 = 3;
/// Largest accepted `retries`.
pub const MAX_RETRIES: u32 = 100;
/// Largest accepted `concurrency`.
pub const MAX_CONCURRENCY: usize = 64;

const KNOWN_KEYS: &[&str] = &[
    "name",
    "id",
    "description",
    "events",
    "enabled",
    "handler",
    "timeout",
    "queue",
    "python",
    "env",
    "requires",
    "url",
    "secret_env",
    "runs",
    "retries",
    "concurrency",
    "ca_file",
    "nice",
    "sched",
    "data",
    "cwd",
    "sandbox",
];

/// Keys that published hooks carry for their own use: accepted with an informational note.
const TOLERATED_KEYS: &[&str] = &["version", "platforms", "author"];

/// `cwd:`: the working directory of a hook's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cwd {
    /// The service's own working directory (the default): started alongside the gateway, the
    /// gateway's, as a hook inside the original host had.
    #[default]
    Service,
    /// The hook's own directory.
    Hook,
}

/// `runs:`: where a Python hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runs {
    /// Decide from the hook's Python source (the default): see [`crate::placement`].
    Auto,
    /// In a worker of the service.
    Service,
    /// Inside the gateway process, imported by the gateway's client.
    Gateway,
}

impl Runs {
    /// The name used in HOOK.yaml.
    pub fn as_str(self) -> &'static str {
        match self {
            Runs::Auto => "auto",
            Runs::Service => "service",
            Runs::Gateway => "gateway",
        }
    }
}

/// What a full queue does with a new event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Drop the oldest queued event to make room (the default: fresh events matter more).
    DropOldest,
    /// Refuse the new event.
    DropNewest,
}

impl Overflow {
    /// The name used in HOOK.yaml.
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::DropOldest => "drop_oldest",
            Overflow::DropNewest => "drop_newest",
        }
    }
}

/// `requires:` - conditions that must hold for the hook to load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requires {
    /// Programs that must be on `PATH`.
    #[serde(default)]
    pub bins: Vec<String>,
    /// Environment variables that must be set and non-empty.
    #[serde(default)]
    pub env: Vec<String>,
    /// Operating systems the hook runs on (`linux`, `macos`/`darwin`, `windows`).
    #[serde(default)]
    pub os: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    capacity: Option<i64>,
    overflow: Option<Overflow>,
}

/// The typed view of HOOK.yaml; every field optional so that missing ones get clear messages.
#[derive(Debug, Default, Deserialize)]
struct RawManifest {
    name: Option<String>,
    id: Option<String>,
    description: Option<String>,
    events: Option<Vec<String>>,
    enabled: Option<bool>,
    handler: Option<String>,
    timeout: Option<f64>,
    queue: Option<RawQueue>,
    python: Option<String>,
    env: Option<BTreeMap<String, serde_json::Value>>,
    requires: Option<Requires>,
    url: Option<String>,
    secret_env: Option<String>,
    runs: Option<Runs>,
    retries: Option<i64>,
    concurrency: Option<i64>,
    ca_file: Option<String>,
    nice: Option<i64>,
    sched: Option<crate::priority::Sched>,
    data: Option<Vec<String>>,
    cwd: Option<Cwd>,
}

/// A validated HOOK.yaml with defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// `name:`; `None` means "use the directory name".
    pub name: Option<String>,
    /// `id:`: the hook's identity in a fleet (its consumer, its place in the stream, its dead
    /// letters), kept when the hook is renamed; `None`: the name is the identity.
    pub id: Option<String>,
    /// `description:`, empty when absent.
    pub description: String,
    /// `events:` patterns, at least one.
    pub events: Vec<String>,
    /// `enabled:`; a disabled hook is skipped and reported as disabled.
    pub enabled: bool,
    /// `handler:` as written (relative to the hook directory).
    pub handler: Option<String>,
    /// Time allowed per invocation.
    pub timeout: Duration,
    /// `timeout:` as written; `None` when HOOK.yaml has none (webhooks then default to 10 s).
    pub explicit_timeout: Option<Duration>,
    /// Bound of the hook's queue.
    pub queue_capacity: usize,
    /// What a full queue does.
    pub overflow: Overflow,
    /// Interpreter for handler.py.
    pub python: Option<String>,
    /// Extra environment for the handler process.
    pub env: BTreeMap<String, String>,
    /// Load conditions.
    pub requires: Requires,
    /// Webhook URL (webhook kind).
    pub url: Option<String>,
    /// Environment variable holding the webhook HMAC secret.
    pub secret_env: Option<String>,
    /// `runs:` (default `auto`).
    pub runs: Runs,
    /// Fleet mode: retries after the first delivery before the dead-letter subject.
    pub retries: u32,
    /// Calls of the hook in flight at once (`concurrency:`, 1..=64, default 1 = in order):
    /// locally for executable and webhook hooks (a Python or library hook takes its events one
    /// at a time), and in fleet mode across the whole fleet for every kind.
    pub concurrency: usize,
    /// PEM file of extra certificate authorities a webhook's `https://` endpoint may be signed
    /// by (relative to the hook directory), trusted in addition to the system's.
    pub ca_file: Option<String>,
    /// `nice:`: the CPU priority of the hook's processes as an increment over the service's
    /// (-20..=19); `None`: the service's default (`serve --worker-nice`, +10).
    pub nice: Option<i32>,
    /// `sched:` (`normal` or `idle`); `None`: the service's default (`serve --worker-sched`).
    pub sched: Option<crate::priority::Sched>,
    /// `data:`: paths of the hook's tree that are data, not code (`state/`, `*.json`), in
    /// addition to the defaults of [`crate::trust::data`]; an approval covers every other file.
    pub data: Vec<String>,
    /// `cwd:` (default `service`): where the hook's processes start.
    pub cwd: Cwd,
    /// `sandbox:`; `None` when HOOK.yaml has none (the service's `--sandbox-default` applies).
    pub sandbox: Option<crate::sandbox::Sandbox>,
    /// Non-fatal remarks (unknown keys), shown by `check` and logged by `serve`.
    pub warnings: Vec<String>,
    /// Informational remarks (keys published hooks carry for their own use), shown by `check`.
    pub notes: Vec<String>,
}

/// Why a HOOK.yaml was refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ManifestError {
    /// Not valid YAML, or a field of the wrong type; the message names line and column.
    #[error("YAML error: {0}")]
    Yaml(String),
    /// The document is not a mapping of keys to values.
    #[error("not a mapping: the file holds {0}, expected `key: value` lines (name, events, ...)")]
    NotMapping(&'static str),
    /// `events:` missing or empty.
    #[error("no events: `events:` must be a non-empty list of patterns such as [\"agent:start\"]")]
    NoEvents,
    /// A field has a value outside what it accepts.
    #[error("`{field}`: {reason}")]
    BadField {
        /// The HOOK.yaml key.
        field: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
}

/// A YAML syntax error as one line that points at the cause: a bracket left open is reported on
/// the line that opened it (the parser only notices on a later line), a duplicate key names both
/// lines, and serde-saphyr's advice about its own options is left out.
fn syntax_error(text: &str, e: &impl std::fmt::Display) -> String {
    let msg = first_line(e);
    if let Some((line, open)) = shape::unclosed_bracket(text) {
        let close = if open == '[' { ']' } else { '}' };
        return format!(
            "line {line}: `{open}` is not closed: a flow list or mapping ends on the line it starts, with `{close}` (e.g. `events: [\"agent:start\"]`)"
        );
    }
    if let Some(rest) = msg.split("duplicate mapping key: ").nth(1) {
        let key = rest.split([',', ' ']).next().unwrap_or("").to_string();
        let lines = shape::key_lines(text, &key);
        let at = lines
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(" and ");
        return format!("key `{key}` is given twice (lines {at}): keep one");
    }
    msg.split(", set DuplicateKeyPolicy")
        .next()
        .unwrap_or("")
        .to_string()
}

/// First line of a serde-saphyr error (it appends a source snippet we do not want in one-line
/// reports).
fn first_line(e: impl std::fmt::Display) -> String {
    let s = e.to_string();
    let line = s.lines().next().unwrap_or("").trim();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

fn describe(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "nothing (the file is empty)",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a single string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

/// Parses and validates the text of a HOOK.yaml.
pub fn parse_manifest(text: &str) -> Result<Manifest, ManifestError> {
    let generic: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| ManifestError::Yaml(syntax_error(text, &e)))?;
    let map = match &generic {
        serde_json::Value::Object(m) => m,
        other => return Err(ManifestError::NotMapping(describe(other))),
    };
    shape::check(map, text).map_err(|m| ManifestError::BadField {
        field: m.field,
        reason: m.reason,
    })?;
    let (mut warnings, notes) = key_remarks(map);
    warnings.extend(webhook_timeout_remark(map));
    let raw: RawManifest =
        serde_saphyr::from_str(text).map_err(|e| ManifestError::Yaml(first_line(e)))?;

    let events = raw.events.unwrap_or_default();
    if events.is_empty() {
        // A misspelt `events:` shows up as an unknown key: say so, it is the likely fix.
        if let Some(typo) = map
            .keys()
            .find(|k| !KNOWN_KEYS.contains(&k.as_str()) && !TOLERATED_KEYS.contains(&k.as_str()))
        {
            return Err(ManifestError::BadField {
                field: "events",
                reason: format!(
                    "no events: `events:` must be a non-empty list of patterns (is the unknown key `{typo}` a misspelling of `events`?)"
                ),
            });
        }
        return Err(ManifestError::NoEvents);
    }
    if let Some(name) = &raw.name {
        validate_name(name).map_err(|reason| ManifestError::BadField {
            field: "name",
            reason,
        })?;
    }
    if let Some(id) = &raw.id {
        validate_name(id).map_err(|reason| ManifestError::BadField {
            field: "id",
            reason,
        })?;
    }
    let timeout = raw.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if !(timeout > 0.0 && timeout <= MAX_TIMEOUT_SECS) {
        return Err(ManifestError::BadField {
            field: "timeout",
            reason: format!("{timeout} is out of range: give seconds, more than 0 and at most 300"),
        });
    }
    let queue = raw.queue.unwrap_or_default();
    let capacity = queue.capacity.unwrap_or(DEFAULT_QUEUE_CAPACITY as i64);
    if capacity < 1 || capacity > MAX_QUEUE_CAPACITY as i64 {
        return Err(ManifestError::BadField {
            field: "queue",
            reason: format!("capacity {capacity} is out of range 1..={MAX_QUEUE_CAPACITY}"),
        });
    }
    let env = env_of(raw.env.unwrap_or_default())?;
    if let Some(h) = &raw.handler
        && h.trim().is_empty()
    {
        return Err(ManifestError::BadField {
            field: "handler",
            reason: "is empty".into(),
        });
    }
    if raw.handler.is_some() && raw.url.is_some() {
        return Err(ManifestError::BadField {
            field: "url",
            reason: "a hook has either `handler:` or `url:`, not both".into(),
        });
    }
    let retries = in_range(
        "retries",
        raw.retries.unwrap_or(DEFAULT_RETRIES as i64),
        0..=MAX_RETRIES as i64,
    )?;
    let concurrency = in_range(
        "concurrency",
        raw.concurrency.unwrap_or(1),
        1..=MAX_CONCURRENCY as i64,
    )?;
    check_ca_file(raw.ca_file.as_deref(), raw.url.is_some())?;
    let sandbox = sandbox_of(map, text)?;
    Ok(Manifest {
        name: raw.name,
        id: raw.id,
        description: raw.description.unwrap_or_default(),
        events,
        enabled: raw.enabled.unwrap_or(true),
        handler: raw.handler,
        timeout: Duration::from_secs_f64(timeout),
        explicit_timeout: raw.timeout.map(|_| Duration::from_secs_f64(timeout)),
        queue_capacity: capacity as usize,
        overflow: queue.overflow.unwrap_or(Overflow::DropOldest),
        python: raw.python,
        env,
        requires: raw.requires.unwrap_or_default(),
        url: raw.url,
        secret_env: raw.secret_env,
        runs: raw.runs.unwrap_or(Runs::Auto),
        cwd: raw.cwd.unwrap_or_default(),
        sandbox,
        retries: retries as u32,
        concurrency: concurrency as usize,
        ca_file: raw.ca_file,
        nice: raw
            .nice
            .map(|n| in_range("nice", n, -20..=19))
            .transpose()?
            .map(|n| n as i32),
        sched: raw.sched,
        data: data_patterns(raw.data)?,
        warnings,
        notes,
    })
}

/// `sandbox:` (absent or empty: `None`), its line kept for the messages that name it.
fn sandbox_of(
    map: &serde_json::Map<String, serde_json::Value>,
    text: &str,
) -> Result<Option<crate::sandbox::Sandbox>, ManifestError> {
    let Some(v) = map.get("sandbox").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let line = shape::key_lines(text, "sandbox").first().copied();
    crate::sandbox::decl::parse(v, line)
        .map(Some)
        .map_err(|why| ManifestError::BadField {
            field: "sandbox",
            reason: match line {
                Some(l) => format!("line {l}: {why}"),
                None => why,
            },
        })
}

/// A webhook's `timeout:` outside 1..=60 s is clamped: say so rather than silently.
fn webhook_timeout_remark(map: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    let t = map.get("timeout")?.as_f64()?;
    (map.contains_key("url") && !(1.0..=60.0).contains(&t)).then(|| {
        format!(
            "`timeout: {t}` is per delivery attempt for a webhook and is clamped to 1..60 s (here {} s)",
            t.clamp(1.0, 60.0)
        )
    })
}

/// Remarks on the top-level keys: warnings for unknown ones, notes for those kept for the hook.
fn key_remarks(map: &serde_json::Map<String, serde_json::Value>) -> (Vec<String>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    for key in map.keys() {
        if TOLERATED_KEYS.contains(&key.as_str()) {
            notes.push(format!(
                "`{key}` is kept for the hook's own use; hermes-hooks does not read it"
            ));
        } else if !KNOWN_KEYS.contains(&key.as_str()) {
            warnings.push(match crate::text::closest(key, KNOWN_KEYS) {
                Some(meant) => format!(
                    "unknown key `{key}` ignored (the default applies); did you mean `{meant}`?"
                ),
                None => format!(
                    "unknown key `{key}` ignored (known keys: {})",
                    KNOWN_KEYS.join(", ")
                ),
            });
        }
    }
    (warnings, notes)
}

/// The `env:` mapping as strings (numbers and booleans spelt out, null empty).
fn env_of(
    raw: BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, String>, ManifestError> {
    let mut env = BTreeMap::new();
    for (k, v) in raw {
        let value = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            serde_json::Value::Null => String::new(),
            _ => {
                return Err(ManifestError::BadField {
                    field: "env",
                    reason: format!("value of {k} must be a string, number or boolean"),
                });
            }
        };
        if k.is_empty() || k.contains(['=', '\0']) {
            return Err(ManifestError::BadField {
                field: "env",
                reason: format!("{k:?} is not a valid environment variable name"),
            });
        }
        env.insert(k, value);
    }
    Ok(env)
}

/// `ca_file:` belongs to a webhook and names a file.
fn check_ca_file(ca_file: Option<&str>, webhook: bool) -> Result<(), ManifestError> {
    let Some(c) = ca_file else {
        return Ok(());
    };
    if !webhook {
        return Err(ManifestError::BadField {
            field: "ca_file",
            reason: "only a webhook (`url:`) has a certificate authority file".into(),
        });
    }
    if c.trim().is_empty() {
        return Err(ManifestError::BadField {
            field: "ca_file",
            reason: "is empty".into(),
        });
    }
    Ok(())
}

/// `value` of `field` when it lies in `range`.
fn in_range(
    field: &'static str,
    value: i64,
    range: std::ops::RangeInclusive<i64>,
) -> Result<i64, ManifestError> {
    if range.contains(&value) {
        return Ok(value);
    }
    Err(ManifestError::BadField {
        field,
        reason: format!(
            "{value} is out of range {}..={}",
            range.start(),
            range.end()
        ),
    })
}

/// `data:` patterns, each checked by [`invalid_data_pattern`].
fn data_patterns(raw: Option<Vec<String>>) -> Result<Vec<String>, ManifestError> {
    let data = raw.unwrap_or_default();
    match data.iter().find_map(|p| invalid_data_pattern(p)) {
        Some(reason) => Err(ManifestError::BadField {
            field: "data",
            reason,
        }),
        None => Ok(data),
    }
}

/// Why a `data:` pattern is refused (syntax: [`crate::trust::data`]), or `None` when it is fine.
pub fn invalid_data_pattern(pattern: &str) -> Option<String> {
    let body = pattern.trim_end_matches('/');
    if body.is_empty() {
        return Some(format!(
            "{pattern:?} would make the whole tree data: nothing would be approved"
        ));
    }
    if body.starts_with('/') || body.split('/').any(|c| c == ".." || c.is_empty()) {
        return Some(format!(
            "{pattern:?}: give a path inside the hook directory, without `..` or empty components"
        ));
    }
    if body.split('/').all(|c| c.chars().all(|ch| ch == '*')) {
        return Some(format!(
            "{pattern:?} matches everything: nothing would be approved"
        ));
    }
    None
}

/// A hook name must be usable in URLs, log lines and Python module names.
pub fn validate_name(name: &str) -> Result<(), String> {
    crate::hook_name::validate(name)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn full_manifest() {
        let m = parse_manifest(
            "name: x\ndescription: d\nevents: [\"command:*\", agent:end]\nenabled: false\n\
             handler: run.py\ntimeout: 2.5\nqueue: {capacity: 8, overflow: drop_newest}\n\
             python: /usr/bin/python3\nenv: {A: 1, B: b}\nrequires: {bins: [sh], env: [HOME], os: [linux]}\n",
        )
        .unwrap();
        assert_eq!(m.name.as_deref(), Some("x"));
        assert_eq!(m.events, vec!["command:*", "agent:end"]);
        assert!(!m.enabled);
        assert_eq!(m.timeout, Duration::from_millis(2500));
        assert_eq!(m.queue_capacity, 8);
        assert_eq!(m.overflow, Overflow::DropNewest);
        assert_eq!(m.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(m.requires.bins, vec!["sh"]);
        assert!(m.warnings.is_empty());
    }

    #[test]
    fn errors_are_specific() {
        match parse_manifest("events: [x\n") {
            Err(ManifestError::Yaml(m)) => assert!(m.contains("line 1"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_manifest("- a\n"),
            Err(ManifestError::NotMapping("a list"))
        );
        assert!(matches!(
            parse_manifest(""),
            Err(ManifestError::NotMapping(_))
        ));
        assert_eq!(parse_manifest("name: x\n"), Err(ManifestError::NoEvents));
        assert_eq!(parse_manifest("events: []\n"), Err(ManifestError::NoEvents));
        assert!(matches!(
            parse_manifest("events: [a]\ntimeout: 301\n"),
            Err(ManifestError::BadField {
                field: "timeout",
                ..
            })
        ));
        match parse_manifest("events: 5\n") {
            Err(ManifestError::BadField {
                field: "events",
                reason,
            }) => assert!(reason.contains("line 1"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fleet_keys() {
        let m = parse_manifest("events: [a]\nretries: 0\nconcurrency: 4\n").unwrap();
        assert_eq!((m.retries, m.concurrency), (0, 4));
        let m = parse_manifest("events: [a]\n").unwrap();
        assert_eq!((m.retries, m.concurrency), (DEFAULT_RETRIES, 1));
        for bad in [
            "retries: -1",
            "retries: 101",
            "concurrency: 0",
            "concurrency: 65",
        ] {
            assert!(
                matches!(
                    parse_manifest(&format!("events: [a]\n{bad}\n")),
                    Err(ManifestError::BadField { .. })
                ),
                "{bad} should be refused"
            );
        }
    }

    #[test]
    fn unknown_keys_warn() {
        match parse_manifest("evnts: [b]\n") {
            Err(ManifestError::BadField {
                field: "events",
                reason,
            }) => {
                assert!(reason.contains("`evnts`"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let m = parse_manifest("events: [a]\nevnts: [b]\n").unwrap();
        assert_eq!(m.warnings.len(), 1);
        assert!(m.warnings[0].contains("evnts"));
        // Every misspelt key gets its did-you-mean (issue 38), not only `events`.
        let m = parse_manifest("events: [a]\ntimout: 5\nhandeler: h.py\nsche: idle\n").unwrap();
        for (typo, meant) in [
            ("timout", "timeout"),
            ("handeler", "handler"),
            ("sche", "sched"),
        ] {
            let said = format!(
                "unknown key `{typo}` ignored (the default applies); did you mean `{meant}`?"
            );
            assert!(m.warnings.contains(&said), "{:?}", m.warnings);
        }
        let e = parse_manifest("events: [a]\nqueue: {capacty: 5}\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown field `capacty`; did you mean `capacity`?"),
            "{e}"
        );
        let m = parse_manifest("events: [a]\nflavour: x\n").unwrap();
        assert!(
            m.warnings[0].contains("known keys: name, id"),
            "{:?}",
            m.warnings
        );
    }

    #[test]
    fn published_keys_are_only_noted() {
        let m = parse_manifest(
            "events: [a]\nversion: 1.2.0\nplatforms: [telegram]\nauthor: someone\nruns: gateway\n",
        )
        .unwrap();
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        assert_eq!(m.notes.len(), 3, "{:?}", m.notes);
        assert_eq!(m.runs, Runs::Gateway);
        assert_eq!(parse_manifest("events: [a]\n").unwrap().runs, Runs::Auto);
        assert!(matches!(
            parse_manifest("events: [a]\nruns: elsewhere\n"),
            Err(ManifestError::BadField { field: "runs", .. })
        ));
    }

    #[test]
    fn a_webhook_timeout_past_60_s_is_warned_about() {
        let m = parse_manifest("events: [a]\nurl: http://127.0.0.1:9/\ntimeout: 300\n").unwrap();
        assert!(
            m.warnings.iter().any(|w| w.contains("clamped to 1..60 s")),
            "{:?}",
            m.warnings
        );
        let m = parse_manifest("events: [a]\ntimeout: 300\n").unwrap();
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    }

    // Moved from tests/it/fuzz.rs (same case counts): HOOK.yaml from real keys or any text,
    // and hook names, parse or say why; an alias bomb is refused quickly.
    /// A scalar, list or mapping as YAML text, including the edge values HOOK.yaml fields see.
    fn yaml_value() -> impl Strategy<Value = String> {
        let scalar = prop_oneof![
            Just("".to_string()),
            Just("~".to_string()),
            Just("true".to_string()),
            Just("no".to_string()),
            Just("0".to_string()),
            Just("-1".to_string()),
            Just("1e309".to_string()),
            Just(".nan".to_string()),
            Just("18446744073709551616".to_string()),
            Just("0.001".to_string()),
            Just("\"agent:*\"".to_string()),
            Just("drop_oldest".to_string()),
            Just("drop_newest".to_string()),
            Just("handler.py".to_string()),
            Just("../../etc/passwd".to_string()),
            Just("http://127.0.0.1:1/x".to_string()),
            "[a-z:*?._\\[\\]{}!-]{0,16}",
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|n| n.to_string()),
            "\\PC{0,24}".prop_map(|s| format!("{s:?}")),
        ];
        scalar.prop_recursive(2, 12, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(", "))),
                prop::collection::vec(("[a-z_]{1,8}", inner), 0..4).prop_map(|kv| {
                    let body: Vec<String> =
                        kv.into_iter().map(|(k, v)| format!("{k}: {v}")).collect();
                    format!("{{{}}}", body.join(", "))
                }),
            ]
        })
    }

    /// A HOOK.yaml built from the real keys (and some unknown ones) with arbitrary values.
    fn manifest_text() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just("name"),
            Just("description"),
            Just("events"),
            Just("enabled"),
            Just("handler"),
            Just("timeout"),
            Just("queue"),
            Just("python"),
            Just("env"),
            Just("requires"),
            Just("url"),
            Just("secret_env"),
            Just("runs"),
            Just("metadata"),
            Just("x-unknown"),
        ];
        prop::collection::vec((key, yaml_value()), 0..8).prop_map(|kv| {
            kv.into_iter()
                .map(|(k, v)| format!("{k}: {v}\n"))
                .collect::<String>()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 384,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn hook_yaml_from_real_keys_parses_or_says_why(text in manifest_text()) {
            check_manifest(&text);
        }

        #[test]
        fn hook_yaml_from_any_text_parses_or_says_why(text in "\\PC{0,200}") {
            check_manifest(&text);
        }

        #[test]
        fn hook_names_are_accepted_or_refused_with_a_reason(name in "\\PC{0,40}") {
            if let Err(why) = validate_name(&name) {
                prop_assert!(!why.is_empty());
            }
        }
    }

    fn check_manifest(text: &str) {
        let t0 = Instant::now();
        match parse_manifest(text) {
            Ok(m) => {
                assert!(
                    !m.events.is_empty(),
                    "a valid manifest has events: {text:?}"
                );
                assert!(m.queue_capacity >= 1, "{text:?}");
                assert!(!m.timeout.is_zero(), "{text:?}");
            }
            Err(e) => assert!(!e.to_string().is_empty(), "{text:?}"),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "parsing hung: {text:?}"
        );
    }

    #[test]
    fn an_alias_bomb_in_hook_yaml_is_refused_quickly() {
        let mut text =
            String::from("a: &a [\"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\", \"x\"]\n");
        for i in 0..12 {
            let prev = if i == 0 {
                "a".to_string()
            } else {
                format!("l{}", i - 1)
            };
            text.push_str(&format!(
                "l{i}: &l{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
        }
        text.push_str("events: *l11\n");
        let t0 = Instant::now();
        let _ = parse_manifest(&text);
        // About 0.5 s alone in a debug build; the bound is "no hang", roomy enough for a machine
        // busy with the rest of the suite (measured over 5 s with two CPU hogs running).
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "an alias bomb took {:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn nice_out_of_range_is_refused() {
        let m = parse_manifest("events: [a:b]\nnice: 25\n");
        assert!(
            m.as_ref()
                .is_err_and(|e| e.to_string().contains("`nice`: 25 is out of range")),
            "{m:?}"
        );
    }
}
