//! `sandbox:` in HOOK.yaml as written: a preset (`none`, `strict`) or a mapping of grants on top
//! of `strict` (`read`, `write`, `connect`, `env`, `exec`, `best_effort`). Only the shape is
//! checked here; paths are expanded when a hook starts ([`super::policy`]).

use serde_json::Value;

/// A `connect:` entry: a TCP port, and the host it was written with (recorded and shown; the
/// kernel rules hold ports only).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Connect {
    /// `api.example.org` of `api.example.org:443`, if given.
    pub host: Option<String>,
    /// The port.
    pub port: u16,
}

/// What a confined hook is granted beyond `strict`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Paths it may read, as written (`~`, `$HERMES_HOME`, `{hook_dir}`, `{state_dir}`).
    pub read: Vec<String>,
    /// Paths it may read and write.
    pub write: Vec<String>,
    /// TCP ports it may connect to.
    pub connect: Vec<Connect>,
    /// Variables of the service's environment and `.env` it may see (`NAME` or `PREFIX_*`).
    pub env: Vec<String>,
    /// Whether it may start programs.
    pub exec: bool,
    /// Run with what the kernel can enforce when it cannot enforce everything.
    pub best_effort: bool,
}

/// A hook's `sandbox:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// `None`: `sandbox: none` (nothing confined, today's behaviour); else the grants over
    /// `strict` (empty for `sandbox: strict`).
    pub grants: Option<Grants>,
    /// The line of the `sandbox:` key in HOOK.yaml, named in denial messages.
    pub line: Option<usize>,
}

impl Sandbox {
    /// `sandbox: none`.
    pub fn none() -> Self {
        Self {
            grants: None,
            line: None,
        }
    }

    /// `sandbox: strict`.
    pub fn strict() -> Self {
        Self {
            grants: Some(Grants::default()),
            line: None,
        }
    }

    /// How it is written: `none`, `strict` or `custom`.
    pub fn mode(&self) -> &'static str {
        match &self.grants {
            None => "none",
            Some(g) if *g == Grants::default() => "strict",
            Some(_) => "custom",
        }
    }
}

const KEYS: &[&str] = &["read", "write", "connect", "env", "exec", "best_effort"];
/// Each piece of code in its own backticks (issue 50: one pair around the prose as well).
const EXAMPLE: &str = "`sandbox: strict`, or `sandbox: {read: [\"~/.config/x\"], write: [\"{state_dir}\"], connect: [\"api.example.org:443\"], env: [TOKEN], exec: false}`";

/// Parses the value of `sandbox:`; the error says what to write.
pub fn parse(v: &Value, line: Option<usize>) -> Result<Sandbox, String> {
    let grants = match v {
        Value::String(s) if s == "none" => None,
        Value::String(s) if s == "strict" => Some(Grants::default()),
        Value::Object(m) => {
            let mut g = Grants::default();
            for (k, v) in m {
                match k.as_str() {
                    "read" => g.read = paths(k, v)?,
                    "write" => g.write = paths(k, v)?,
                    "connect" => g.connect = connects(v)?,
                    "env" => g.env = names(v)?,
                    "exec" => g.exec = flag(k, v)?,
                    "best_effort" => g.best_effort = flag(k, v)?,
                    _ => {
                        return Err(format!(
                            "unknown key `{k}` (known: {}); write e.g. {EXAMPLE}",
                            KEYS.join(", ")
                        ));
                    }
                }
            }
            Some(g)
        }
        other => {
            let meant = other
                .as_str()
                .and_then(|s| crate::text::closest(s, &["none", "strict"]))
                .map(|m| format!("; did you mean `sandbox: {m}`?"))
                .unwrap_or_default();
            return Err(format!(
                "{} is not a sandbox{meant}; write e.g. {EXAMPLE}",
                value_kind(other)
            ));
        }
    };
    Ok(Sandbox { grants, line })
}

fn list(key: &str, v: &Value) -> Result<Vec<Value>, String> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => Ok(a.clone()),
        Value::String(_) | Value::Number(_) => Ok(vec![v.clone()]),
        other => Err(format!(
            "`{key}:` is {}, expected a list; write e.g. {EXAMPLE}",
            value_kind(other)
        )),
    }
}

fn paths(key: &str, v: &Value) -> Result<Vec<String>, String> {
    list(key, v)?
        .into_iter()
        .map(|p| match p {
            Value::String(s) if is_anchored(&s) => Ok(s),
            Value::String(s) => Err(format!(
                "`{key}:` path {s:?} is relative: start it with /, ~, $HERMES_HOME, {{hook_dir}} or {{state_dir}}"
            )),
            other => Err(format!("`{key}:` holds {}, expected paths", value_kind(&other))),
        })
        .collect()
}

fn connects(v: &Value) -> Result<Vec<Connect>, String> {
    list("connect", v)?
        .into_iter()
        .map(|c| {
            let bad = |what: String| {
                format!("`connect:` {what}: write a TCP port or host:port, e.g. `connect: [\"api.example.org:443\", 8080]`")
            };
            match c {
                Value::Number(n) => n
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p > 0)
                    .map(|port| Connect { host: None, port })
                    .ok_or_else(|| bad(format!("{n} is not a port"))),
                Value::String(s) => {
                    let (host, port) = match s.rsplit_once(':') {
                        Some((h, p)) => (Some(h.trim_matches(['[', ']']).to_string()), p),
                        None => (None, s.as_str()),
                    };
                    let port = port
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| bad(format!("{s:?} has no port")))?;
                    Ok(Connect {
                        host: host.filter(|h| !h.is_empty()),
                        port,
                    })
                }
                other => Err(bad(value_kind(&other))),
            }
        })
        .collect()
}

fn names(v: &Value) -> Result<Vec<String>, String> {
    list("env", v)?
        .into_iter()
        .map(|n| match n {
            Value::String(s)
                if !s.is_empty()
                    && s.trim_end_matches('*')
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && s.matches('*').count() <= 1 =>
            {
                Ok(s)
            }
            other => Err(format!(
                "`env:` {} is not a variable name (NAME, or PREFIX_* for all that start so)",
                value_kind(&other)
            )),
        })
        .collect()
}

fn flag(key: &str, v: &Value) -> Result<bool, String> {
    v.as_bool()
        .ok_or_else(|| format!("`{key}:` is {}, expected true or false", value_kind(v)))
}

/// Whether a path as written is absolute once expanded.
pub fn is_anchored(p: &str) -> bool {
    p.starts_with('/')
        || p == "~"
        || p.starts_with("~/")
        || p.starts_with("$HERMES_HOME")
        || p.starts_with("{hook_dir}")
        || p.starts_with("{state_dir}")
}

/// How a value reads in a message.
fn value_kind(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => format!("{s:?}"),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Null => "nothing".into(),
        serde_json::Value::Array(_) => "a list".into(),
        serde_json::Value::Object(_) => "a mapping".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn presets_and_grants_parse() {
        assert_eq!(parse(&json!("none"), None).unwrap().mode(), "none");
        assert_eq!(parse(&json!("strict"), None).unwrap().mode(), "strict");
        let s = parse(
            &json!({"read": "~/.config/x", "connect": ["api.example.org:443", 8080], "env": ["TOKEN", "SLACK_*"], "exec": true}),
            Some(4),
        )
        .unwrap();
        let g = s.grants.unwrap();
        assert_eq!(g.read, vec!["~/.config/x"]);
        assert_eq!(
            g.connect,
            vec![
                Connect {
                    host: Some("api.example.org".into()),
                    port: 443
                },
                Connect {
                    host: None,
                    port: 8080
                }
            ]
        );
        assert!(g.exec && !g.best_effort);
        assert_eq!(s.line, Some(4));
    }

    #[test]
    fn bad_values_say_what_to_write() {
        for (v, want) in [
            (json!("loose"), "is not a sandbox"),
            (json!({"read": ["relative/x"]}), "is relative"),
            (json!({"connect": ["host"]}), "has no port"),
            (json!({"connect": [70000]}), "is not a port"),
            (json!({"env": ["A-B"]}), "is not a variable name"),
            (json!({"exec": "yes"}), "expected true or false"),
            (json!({"net": []}), "unknown key `net`"),
        ] {
            let e = parse(&v, None).unwrap_err();
            assert!(e.contains(want), "{v}: {e}");
        }
    }
}
