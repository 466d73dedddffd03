//! Event patterns from HOOK.yaml, compiled once per hook with `globset`.
//!
//! A pattern without glob metacharacters matches exactly that name (`agent` does not match
//! `agent:start`); anything else is a glob (`command:*`, `{agent,session}:*`, `*`). For one event,
//! hooks matched by an exact pattern come before hooks matched only by a wildcard.

use globset::{Glob, GlobSet, GlobSetBuilder};
use thiserror::Error;

/// How a hook's pattern set matched an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MatchKind {
    /// One of the hook's patterns is exactly the event name.
    Exact,
    /// Only a wildcard pattern matched.
    Wildcard,
}

/// A pattern that could not be compiled.
#[derive(Debug, Clone, Error)]
#[error("bad event pattern {pattern:?}: {reason}")]
pub struct PatternError {
    /// The pattern as written in HOOK.yaml.
    pub pattern: String,
    /// Why it was refused.
    pub reason: String,
}

/// The compiled event patterns of one hook.
#[derive(Debug, Clone)]
pub struct PatternSet {
    /// Patterns without metacharacters, compared by string equality (the common case, and the
    /// one that decides match order).
    exact: Vec<String>,
    /// `ns:*` patterns (no other metacharacter), kept as the prefix `ns:`: the common wildcard,
    /// matched without a regex.
    prefixes: Vec<String>,
    /// A bare `*`: matches every event.
    match_all: bool,
    /// The wildcard patterns, compiled together; `None` when the hook has none.
    globs: Option<GlobSet>,
    /// The patterns as written, for display.
    source: Vec<String>,
}

fn is_glob(p: &str) -> bool {
    p.contains(['*', '?', '[', ']', '{', '}'])
}

impl PatternSet {
    /// Compiles `patterns`; fails on the first pattern that is empty, contains whitespace or
    /// control characters, or is not valid glob syntax.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        let mut exact = Vec::new();
        let mut prefixes = Vec::new();
        let mut match_all = false;
        let mut builder = GlobSetBuilder::new();
        let mut any_glob = false;
        let mut source = Vec::new();
        for p in patterns {
            let p = p.as_ref();
            let err = |reason: &str| PatternError {
                pattern: p.to_string(),
                reason: reason.to_string(),
            };
            if p.is_empty() {
                return Err(err("empty pattern"));
            }
            if p.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(err("contains whitespace or a control character"));
            }
            if p.chars().count() > crate::events::MAX_EVENT_NAME_LEN {
                return Err(err("longer than 256 characters"));
            }
            source.push(p.to_string());
            if p == "*" {
                match_all = true;
            } else if let Some(prefix) = p
                .strip_suffix('*')
                .filter(|pre| pre.ends_with(':') && !is_glob(pre))
            {
                prefixes.push(prefix.to_string());
            } else if is_glob(p) {
                let glob = Glob::new(p).map_err(|e| err(&glob_reason(&e)))?;
                builder.add(glob);
                any_glob = true;
            } else if !exact.iter().any(|e| e == p) {
                exact.push(p.to_string());
            }
        }
        let globs = if any_glob {
            Some(builder.build().map_err(|e| PatternError {
                pattern: source.join(", "),
                reason: glob_reason(&e),
            })?)
        } else {
            None
        };
        Ok(Self {
            exact,
            prefixes,
            match_all,
            globs,
            source,
        })
    }

    /// How this set matches `event`, or `None` when it does not.
    pub fn matches(&self, event: &str) -> Option<MatchKind> {
        if self.exact.iter().any(|e| e == event) {
            return Some(MatchKind::Exact);
        }
        if self.match_all || self.prefixes.iter().any(|p| event.starts_with(p.as_str())) {
            return Some(MatchKind::Wildcard);
        }
        match &self.globs {
            Some(g) if g.is_match(event) => Some(MatchKind::Wildcard),
            _ => None,
        }
    }

    /// The patterns as written in HOOK.yaml.
    pub fn patterns(&self) -> &[String] {
        &self.source
    }
}

/// globset's message without its "error parsing glob '...': " prefix (we name the pattern).
fn glob_reason(e: &globset::Error) -> String {
    e.kind().to_string()
}

/// True when `pattern` matches at least one event the gateway is known to emit.
pub fn matches_known_event(pattern: &str) -> bool {
    match PatternSet::new(&[pattern]) {
        Ok(set) => crate::events::known_event_samples().any(|e| set.matches(e).is_some()),
        Err(_) => false,
    }
}

/// The warning for a pattern that matches no known event but is close to one, so probably
/// misspelt (`agent:started`, `sesion:*`, `agent.end`): what `check`, the service's log and
/// `/v1/hooks` say. `None` for a pattern that matches a known event or is no near miss (a
/// custom event: only `check` mentions those).
pub fn misspelt_warning(pattern: &str) -> Option<String> {
    // A command's name: a plugin's command, or said by `check` (`events::command_note`).
    if matches_known_event(pattern) || crate::events::command_note(pattern).is_some() {
        return None;
    }
    crate::events::suggest(pattern)
        .map(|s| format!("pattern {pattern:?} matches no known gateway event; did you mean {s:?}?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspelt_patterns_get_a_did_you_mean_and_custom_ones_nothing() {
        for (p, meant) in [
            ("agent:started", "agent:start"),
            ("sesion:*", "session:*"),
            ("agent.end", "agent:end"),
        ] {
            let w = misspelt_warning(p).unwrap_or_else(|| panic!("no warning for {p}"));
            assert!(w.ends_with(&format!("did you mean {meant:?}?")), "{w}");
        }
        // The agent's events (issue 49): known, and near misses get the Hermes name.
        let w = misspelt_warning("pre_tool_cal").unwrap_or_default();
        assert!(w.ends_with("did you mean \"pre_tool_call\"?"), "{w}");
        for p in [
            "agent:start",
            "session:*",
            "myapp:deployed",
            "*",
            "pre_tool_call",
            "pre_*",
            "*_tool_call",
        ] {
            assert_eq!(misspelt_warning(p), None, "{p}");
        }
    }

    fn set(p: &[&str]) -> PatternSet {
        PatternSet::new(p).unwrap()
    }

    #[test]
    fn exact_and_wildcards() {
        assert_eq!(
            set(&["agent:start"]).matches("agent:start"),
            Some(MatchKind::Exact)
        );
        assert_eq!(set(&["agent"]).matches("agent:start"), None);
        assert_eq!(
            set(&["command:*"]).matches("command:reset"),
            Some(MatchKind::Wildcard)
        );
        assert_eq!(set(&["command:*"]).matches("commands:reset"), None);
        assert_eq!(
            set(&["*"]).matches("anything:at:all"),
            Some(MatchKind::Wildcard)
        );
        let brace = set(&["{agent,session}:*"]);
        assert_eq!(brace.matches("session:end"), Some(MatchKind::Wildcard));
        assert_eq!(brace.matches("command:x"), None);
        assert_eq!(
            set(&["agent:st?rt"]).matches("agent:start"),
            Some(MatchKind::Wildcard)
        );
        // Exact wins when both kinds match.
        assert_eq!(
            set(&["agent:*", "agent:end"]).matches("agent:end"),
            Some(MatchKind::Exact)
        );
    }

    #[test]
    fn rejects_bad_patterns() {
        assert!(PatternSet::new(&["a["]).is_err());
        assert!(PatternSet::new(&[""]).is_err());
        assert!(PatternSet::new(&["agent: start"]).is_err());
        assert!(PatternSet::new(&["{agent"]).is_err());
    }

    #[test]
    fn known_event_check() {
        assert!(matches_known_event("command:*"));
        assert!(matches_known_event("agent:start"));
        assert!(!matches_known_event("sesion:start"));
    }

    // Moved from tests/it/fuzz.rs (same case count): any pattern list compiles or names the
    // pattern it refuses, with a reason; matching never panics.
    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 384,
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        #[test]
        fn patterns_compile_or_name_the_bad_one(
            patterns in proptest::collection::vec(proptest::prop_oneof!["[a-z:*?._\\[\\]{}!,-]{0,24}", "\\PC{0,24}"], 0..5),
            events in proptest::collection::vec("[a-z:._-]{0,24}", 0..5),
        ) {
            match PatternSet::new(&patterns) {
                Ok(set) => {
                    for e in &events {
                        let _ = set.matches(e);
                    }
                    for p in &patterns {
                        let _ = matches_known_event(p);
                    }
                }
                Err(e) => {
                    proptest::prop_assert!(patterns.contains(&e.pattern), "the error names a given pattern: {e:?}");
                    proptest::prop_assert!(!e.reason.is_empty());
                }
            }
        }
    }
}
