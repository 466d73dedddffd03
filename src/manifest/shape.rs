//! The shape of each HOOK.yaml key, checked on the generic YAML value before the typed pass, so
//! that a wrong value is reported with its key, its line and what to write instead
//! (`timeout: soon` -> "`timeout`: line 3: \"soon\" is not a number of seconds; write e.g.
//! `timeout: 30`"), rather than as the parser's "invalid floating point". Also finds the line of
//! a key and the line where a flow `[`/`{` was left open, for syntax errors.

use serde_json::{Map, Value};

/// A key whose value does not fit: the key and what to say.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Misfit {
    /// The HOOK.yaml key.
    pub field: &'static str,
    /// Line, what is wrong and what to write.
    pub reason: String,
}

/// The 1-based lines where `key:` starts a top-level entry.
pub(super) fn key_lines(text: &str, key: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// The line (1-based) and bracket of a flow list or mapping that is still open when the next
/// top-level key starts (or the file ends): where the parser reports an error later on.
pub(super) fn unclosed_bracket(text: &str) -> Option<(usize, char)> {
    let mut open: Vec<(usize, char)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let starts_entry = line
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if starts_entry && let Some(first) = open.first() {
            return Some(*first);
        }
        let mut quote: Option<char> = None;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') => break,
                (None, '[' | '{') => open.push((i + 1, c)),
                (None, ']' | '}') => {
                    open.pop();
                }
                _ => {}
            }
        }
    }
    open.first().copied()
}

/// What a key's value must look like.
enum Shape {
    Str,
    Bool,
    Number,
    Integer,
    StrList,
    Map,
    OneOf(&'static [&'static str]),
    Queue,
    Requires,
}

/// Each known key (as a `'static` name), its shape and an example of a good value.
fn shape(key: &str) -> Option<(&'static str, Shape, &'static str)> {
    let (shape, example) = match key {
        "name" => (Shape::Str, "name: my-hook"),
        "description" => (Shape::Str, "description: Log slash commands"),
        "events" => (Shape::StrList, "events: [\"agent:start\", \"command:*\"]"),
        "enabled" => (Shape::Bool, "enabled: true"),
        "handler" => (Shape::Str, "handler: handler.py"),
        "timeout" => (Shape::Number, "timeout: 30"),
        "queue" => (
            Shape::Queue,
            "queue: {capacity: 1024, overflow: drop_oldest}",
        ),
        "python" => (Shape::Str, "python: /opt/venv/bin/python"),
        "env" => (Shape::Map, "env: {KEY: value}"),
        "requires" => (
            Shape::Requires,
            "requires: {bins: [jq], env: [TOKEN], os: [linux]}",
        ),
        "url" => (Shape::Str, "url: https://example.org/hook"),
        "secret_env" => (Shape::Str, "secret_env: HOOK_SECRET"),
        "runs" => (Shape::OneOf(&["auto", "service", "gateway"]), "runs: auto"),
        "retries" => (Shape::Integer, "retries: 3"),
        "concurrency" => (Shape::Integer, "concurrency: 1"),
        "id" => (Shape::Str, "id: mailer-1"),
        "ca_file" => (Shape::Str, "ca_file: ca.pem"),
        _ => return None,
    };
    // The key as written in the example, `'static`.
    let field = example.split(':').next().unwrap_or("");
    Some((field, shape, example))
}

/// How a value reads in a message: `"soon"`, `a list`, `5`.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "nothing".into(),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

/// Why `v` does not fit `shape`, or `None` when it does.
fn misfit(key: &str, shape: &Shape, v: &Value) -> Option<String> {
    let strings = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
    match shape {
        Shape::Str => (!v.is_string()).then(|| format!("{} is not a string", shown(v))),
        Shape::Bool => (!v.is_boolean()).then(|| format!("{} is not true or false", shown(v))),
        Shape::Number => {
            (!v.is_number()).then(|| format!("{} is not a number of seconds", shown(v)))
        }
        Shape::Integer => {
            (!(v.is_i64() || v.is_u64())).then(|| format!("{} is not a whole number", shown(v)))
        }
        Shape::StrList => match v {
            Value::String(s) => Some(format!(
                "{s:?} is a single string, not a list: write `{key}: [\"{s}\"]`"
            )),
            _ if !strings(v) => Some(format!("{} is not a list of strings", shown(v))),
            _ => None,
        },
        Shape::Map => (!v.is_object()).then(|| format!("{} is not a mapping", shown(v))),
        Shape::OneOf(allowed) => match v.as_str() {
            Some(s) if allowed.contains(&s) => None,
            _ => Some(format!("{} is not one of {}", shown(v), allowed.join(", "))),
        },
        Shape::Queue => sub_fields(
            v,
            &[
                ("capacity", &Shape::Integer),
                ("overflow", &Shape::OneOf(&["drop_oldest", "drop_newest"])),
            ],
        ),
        Shape::Requires => sub_fields(
            v,
            &[
                ("bins", &Shape::StrList),
                ("env", &Shape::StrList),
                ("os", &Shape::StrList),
            ],
        ),
    }
}

/// Why a mapping with these fields does not fit.
fn sub_fields(v: &Value, fields: &[(&str, &Shape)]) -> Option<String> {
    let Some(map) = v.as_object() else {
        return Some(format!("{} is not a mapping", shown(v)));
    };
    for (k, sub) in map {
        let Some((_, shape)) = fields.iter().find(|(name, _)| name == k) else {
            let known: Vec<&str> = fields.iter().map(|(n, _)| *n).collect();
            return Some(match crate::text::closest(k, &known) {
                Some(meant) => format!("unknown field `{k}`; did you mean `{meant}`?"),
                None => format!("unknown field `{k}` (known: {})", known.join(", ")),
            });
        };
        if let Some(why) = misfit(k, shape, sub) {
            return Some(format!("`{k}`: {why}"));
        }
    }
    None
}

/// Checks every known key of the parsed mapping; the first misfit is the error.
pub(super) fn check(map: &Map<String, Value>, text: &str) -> Result<(), Misfit> {
    for (key, value) in map {
        let Some((field, shape, example)) = shape(key) else {
            continue;
        };
        // An empty value (`name:`) is left to the typed pass and the semantic checks.
        if value.is_null() {
            continue;
        }
        if let Some(why) = misfit(key, &shape, value) {
            let at = key_lines(text, key)
                .first()
                .map(|l| format!("line {l}: "))
                .unwrap_or_default();
            return Err(Misfit {
                field,
                reason: if why.contains("write `") {
                    format!("{at}{why}")
                } else {
                    format!("{at}{why}; write e.g. `{example}`")
                },
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_and_lines() {
        assert_eq!(unclosed_bracket("events: [a\ntimeout: 5\n"), Some((1, '[')));
        assert_eq!(unclosed_bracket("events: [a,\n  b]\ntimeout: 5\n"), None);
        assert_eq!(unclosed_bracket("name: \"[x\"\nevents: [a] # [\n"), None);
        assert_eq!(key_lines("a: 1\nab: 2\na : 3\n", "a"), vec![1, 3]);
    }
}
