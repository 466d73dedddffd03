//! An event's context as the handlers get it, shared (`Arc`) by the jobs of every hook the event
//! was queued to.
//!
//! Every handler kind passes the context on as JSON text (a Python worker's request line, a
//! library's argument, an executable's stdin, a webhook's body), so the text is what a context
//! holds: made once, by the first handler that needs it, when the event arrived as a JSON object
//! (local mode: ten Python hooks on one event share one encoding), or given as it came when the
//! event arrived as text (a fleet worker passes the stream's bytes on without building an object).

use std::sync::OnceLock;

use serde_json::Value;
use serde_json::value::RawValue;

/// A context: a JSON object, or its text.
#[derive(Debug)]
pub struct Context {
    /// The object, when the context was given as one (`None` when given as text).
    value: Option<Value>,
    /// Its JSON text, made at most once.
    json: OnceLock<Box<str>>,
}

impl Context {
    /// A context given as a JSON object (the caller checked it is one).
    pub fn new(value: Value) -> Self {
        Self {
            value: Some(value),
            json: OnceLock::new(),
        }
    }

    /// A context given as the JSON text of an object; `text` must be valid JSON (a fleet worker
    /// builds it from the stream's text, which the envelope's parse checked). Line breaks
    /// between tokens are taken out: a Python worker reads one request per line.
    pub fn from_object_text(text: String) -> Self {
        let text = if text.contains(['\n', '\r']) {
            compact(&text)
        } else {
            text
        };
        Self {
            value: None,
            json: OnceLock::from(text.into_boxed_str()),
        }
    }

    /// A context given as JSON text (an HTTP batch's), refused where parsing it into an object
    /// would fail (a lone surrogate escape, a number out of range, nesting past 128 levels: the
    /// raw parse lets those through), kept as it came but for the whitespace between tokens,
    /// which is taken out (the text must fit on one line, and counts against the broker's
    /// limit as it would compact). Checked to be an object by [`Context::checked`] before any
    /// hook gets it.
    pub fn from_raw(raw: Box<RawValue>) -> Result<Self, serde_json::Error> {
        serde_json::from_str::<Strict>(raw.get())?;
        let text = Box::<str>::from(raw);
        let text = if text.contains([' ', '\n', '\r', '\t']) {
            compact(&text).into_boxed_str()
        } else {
            text
        };
        Ok(Self {
            value: None,
            json: OnceLock::from(text),
        })
    }

    /// The context if it is an object (`null` becomes `{}`), else what it is instead ("a
    /// list", "a string", "a number", "a boolean").
    pub fn checked(self) -> Result<Self, &'static str> {
        let first = match (&self.value, self.json.get()) {
            (Some(Value::Null), _) => b'n',
            (Some(Value::Object(_)), _) => b'{',
            (Some(Value::Array(_)), _) => b'[',
            (Some(Value::String(_)), _) => b'"',
            (Some(Value::Bool(_)), _) => b't',
            (Some(Value::Number(_)), _) => b'0',
            (None, Some(text)) => text.trim_ascii_start().bytes().next().unwrap_or(b'n'),
            (None, None) => b'n',
        };
        match first {
            b'{' => Ok(self),
            b'n' => Ok(Self::new(Value::Object(Default::default()))),
            b'[' => Err("a list"),
            b'"' => Err("a string"),
            b't' | b'f' => Err("a boolean"),
            _ => Err("a number"),
        }
    }

    /// The JSON text as a value of its own (to embed in a message), without parsing it into
    /// an object when it was given as text.
    pub fn into_raw(self) -> Result<Box<RawValue>, serde_json::Error> {
        match (self.json.into_inner(), self.value) {
            (Some(text), _) => RawValue::from_string(text.into()),
            (None, value) => serde_json::value::to_raw_value(&value.unwrap_or_default()),
        }
    }

    /// The JSON text.
    pub fn json(&self) -> Result<&str, serde_json::Error> {
        if let Some(text) = self.json.get() {
            return Ok(text);
        }
        let text = serde_json::to_string(self.value.as_ref().unwrap_or(&Value::Null))?;
        // Another handler may have encoded it meanwhile: either encoding is the same text.
        Ok(self.json.get_or_init(|| text.into_boxed_str()))
    }

    /// The JSON text as a value to embed in a larger JSON document (an executable's input, a
    /// webhook's body) without parsing it into an object.
    pub fn raw(&self) -> Result<&RawValue, serde_json::Error> {
        serde_json::from_str(self.json()?)
    }
}

/// `text` (valid JSON) without the whitespace between its tokens; whitespace inside strings is
/// kept (a line break there is always escaped).
fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if matches!(c, ' ' | '\n' | '\r' | '\t') {
            continue;
        }
        out.push(c);
    }
    out
}

/// Reads any JSON value as strictly as parsing it into a [`Value`] does (the same parser calls),
/// keeping nothing.
struct Strict;

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_str<E>(self, _: &str) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_none<E>(self) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Strict, A::Error> {
        while a.next_element::<Strict>()?.is_some() {}
        Ok(Strict)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Strict, A::Error> {
        while a.next_key::<Strict>()?.is_some() {
            a.next_value::<Strict>()?;
        }
        Ok(Strict)
    }
}

impl From<Value> for Context {
    fn from(value: Value) -> Self {
        Self::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_once_and_text_passed_as_it_came() {
        let c = Context::new(serde_json::json!({"a": 1, "b": [true]}));
        let first = c.json().unwrap().as_ptr();
        assert_eq!(c.json().unwrap(), r#"{"a":1,"b":[true]}"#);
        assert_eq!(c.json().unwrap().as_ptr(), first, "encoded once");
        let t = Context::from_object_text(r#"{ "x" : 2 }"#.into());
        assert_eq!(t.json().unwrap(), r#"{ "x" : 2 }"#);
        let doc = serde_json::json!({"context": t.raw().unwrap()});
        assert_eq!(doc["context"]["x"], 2);
        assert_eq!(t.into_raw().unwrap().get(), r#"{ "x" : 2 }"#);
    }

    #[test]
    fn raw_text_is_refused_where_an_object_parse_fails_and_comes_out_on_one_line() {
        let raw = |t: &str| Context::from_raw(RawValue::from_string(t.into()).unwrap());
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        for bad in [r#"{"s":"\ud800"}"#, r#"{"n":1e400}"#, deep.as_str()] {
            assert!(serde_json::from_str::<Value>(bad).is_err(), "{bad}");
            assert!(raw(bad).is_err(), "{bad}");
        }
        let c = raw("{\n  \"a b\" : [1, 2],\r\n\t\"s\": \"x \\\" }\\\\\"\n}").unwrap();
        assert_eq!(c.json().unwrap(), r#"{"a b":[1,2],"s":"x \" }\\"}"#);
        assert_eq!(
            serde_json::from_str::<Value>(c.json().unwrap()).unwrap()["s"],
            "x \" }\\"
        );
        let t = Context::from_object_text("{\"a\":\n1}".into());
        assert_eq!(t.json().unwrap(), r#"{"a":1}"#);
    }

    #[test]
    fn only_objects_pass_and_null_is_empty() {
        let raw = |t: &str| Context::from_raw(RawValue::from_string(t.into()).unwrap()).unwrap();
        for (text, kind) in [
            ("[1]", "a list"),
            ("\"s\"", "a string"),
            ("-1", "a number"),
            ("2.5", "a number"),
            ("false", "a boolean"),
            ("true", "a boolean"),
        ] {
            assert_eq!(raw(text).checked().err(), Some(kind), "{text}");
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(Context::new(value).checked().err(), Some(kind), "{text}");
        }
        assert_eq!(raw("null").checked().unwrap().json().unwrap(), "{}");
        assert_eq!(
            Context::new(Value::Null).checked().unwrap().json().unwrap(),
            "{}"
        );
        assert_eq!(
            raw(r#"{"a":[1]}"#).checked().unwrap().json().unwrap(),
            r#"{"a":[1]}"#
        );
    }
}
