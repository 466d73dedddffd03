//! Which paths of a hook's tree are data, not code: the defaults ([`DEFAULT_DATA`], and
//! [`DEFAULT_STATE`] for files that cannot run) plus what HOOK.yaml's `data:` declares. An approval covers every other file of the tree, whatever its
//! name or mode, so a sourced `lib.bash` or an `fmt.awk` is covered without guessing what runs.
//!
//! Pattern syntax (a small part of gitignore's): a pattern ending in `/` names directories (and
//! everything under them); a pattern containing another `/` is anchored at the hook directory;
//! any other pattern matches a file or directory name at any depth. `*` matches any run of
//! characters within one path component, `?` one character. A leaf.

/// Data by default: bytecode caches (Python never reads a hook's own: [`crate::handler`] points
/// it at a cache the service owns) and log files.
pub const DEFAULT_DATA: &[&str] = &["__pycache__/", "*.log"];

/// Data by its type unless it can run (a file with a run bit is code whatever its name): what
/// handlers write beside themselves at run time (state, databases, caches). Not part of a hook's
/// version nor of what an approval covers, so a hook that writes `state.json` into its own
/// directory keeps its worker across reloads (issue 59); a file a handler sources or imports is
/// named otherwise (`.py`, `.sh`, `.bash`, any other name) and stays covered.
pub const DEFAULT_STATE: &[&str] = &[
    "*.json",
    "*.jsonl",
    "*.db",
    "*.sqlite",
    "*.sqlite3",
    "*.db-journal",
    "*.db-wal",
    "*.db-shm",
    "*.pid",
    "*.tmp",
    "*.state",
    "*.csv",
];

pub use crate::manifest::invalid_data_pattern as invalid;

/// The data rules of one hook.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataRules {
    patterns: Vec<String>,
}

impl DataRules {
    /// The defaults plus `declared` (HOOK.yaml's `data:`).
    pub fn new(declared: &[String]) -> Self {
        let mut patterns: Vec<String> = DEFAULT_DATA.iter().map(|s| s.to_string()).collect();
        patterns.extend(declared.iter().filter(|p| invalid(p).is_none()).cloned());
        Self { patterns }
    }

    /// Whether `rel` (relative to the hook directory, `/`-separated) is data; `is_dir` for a
    /// directory (then nothing under it is looked at).
    pub fn is_data(&self, rel: &str, is_dir: bool) -> bool {
        self.patterns.iter().any(|p| matches(p, rel, is_dir))
    }

    /// Whether the file `rel` is data: [`DataRules::is_data`], or named as data by its type
    /// ([`DEFAULT_STATE`]) and not `executable`. The one rule for which files make a hook's
    /// version (its fingerprint, the record checked before each start, an approval's cover).
    pub fn is_data_file(&self, rel: &str, executable: bool) -> bool {
        self.is_data(rel, false)
            || (!executable && DEFAULT_STATE.iter().any(|p| matches(p, rel, false)))
    }

    /// The patterns, defaults first (for `check`).
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

fn matches(pattern: &str, rel: &str, is_dir: bool) -> bool {
    let dir_only = pattern.ends_with('/');
    let body = pattern.trim_end_matches('/');
    if dir_only && !is_dir {
        return false;
    }
    if body.contains('/') {
        let p: Vec<&str> = body.split('/').collect();
        let r: Vec<&str> = rel.split('/').collect();
        return p.len() == r.len() && p.iter().zip(&r).all(|(p, r)| glob(p, r));
    }
    let name = rel.rsplit('/').next().unwrap_or(rel);
    glob(body, name)
}

/// `*` and `?` glob over one path component.
fn glob(p: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (p.chars().collect(), s.chars().collect());
    let (mut pi, mut si) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_declared_patterns() {
        let r = DataRules::new(&["state/".into(), "cache/*.json".into(), "*.db".into()]);
        assert!(r.is_data("__pycache__", true));
        assert!(r.is_data("pkg/__pycache__", true));
        assert!(!r.is_data("__pycache__", false));
        assert!(r.is_data("hook.log", false));
        assert!(r.is_data("a/b/x.log", false));
        assert!(r.is_data("state", true));
        assert!(!r.is_data("state", false));
        assert!(r.is_data("cache/a.json", false));
        assert!(!r.is_data("other/cache/a.json", false));
        assert!(r.is_data_file("other/cache/a.json", false));
        assert!(r.is_data_file("state.json", false));
        assert!(!r.is_data_file("state.json", true), "what can run is code");
        assert!(!r.is_data_file("lib.bash", false));
        assert!(!r.is_data_file("helper.py", false));
        assert!(r.is_data("x.db", false));
        assert!(!r.is_data("lib.bash", false));
        assert!(!r.is_data("helper.pyc", false));
        assert!(invalid("/").is_some());
        assert!(invalid("../x").is_some());
        assert!(invalid("*").is_some());
        assert!(invalid("**/").is_some());
        assert!(invalid("state/").is_none());
    }
}
