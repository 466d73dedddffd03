//! What several commands share: the exit-code helpers, reading `--context`, loading the hooks
//! in this process, where the running service is.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::cli::args::RootArgs;
use crate::host::{Host, HostConfig, LoadReport};

pub use crate::cli::exit::{fail, usage};

/// Loads the hooks of `roots` in this process (Python handlers are import-checked), runs `f`,
/// stops them. A `--hooks-dir` that is not a directory is a usage error (exit 2), naming it.
pub async fn with_loaded_hooks(
    roots: RootArgs,
    f: impl AsyncFnOnce(&Host, &LoadReport) -> i32,
) -> i32 {
    with_host(roots.checked_config(), f).await
}

/// [`with_loaded_hooks`] on settings made by the caller (or the usage error to say).
pub async fn with_host(
    config: Result<HostConfig, String>,
    f: impl AsyncFnOnce(&Host, &LoadReport) -> i32,
) -> i32 {
    let config = match config {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    // The runner is written under HERMES_HOME: create it private, as `serve` does.
    if let Err(e) = crate::layout::create_private_dir(&config.hermes_home) {
        return fail(format!(
            "cannot create HERMES_HOME {}: {e}",
            config.hermes_home.display()
        ));
    }
    let (host, report) = Host::start(config).await;
    let out = f(&host, &report).await;
    host.shutdown(Duration::from_secs(5)).await;
    out
}

/// The roots as one line for messages, each marked when it does not exist.
pub fn describe_roots(roots: &[PathBuf]) -> String {
    roots
        .iter()
        .map(|r| {
            if r.is_dir() {
                r.display().to_string()
            } else {
                format!("{} (does not exist)", r.display())
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the running service is when no option says: `$HERMES_HOOKS_ADDRESS`, else
/// `$HERMES_HOME/hooks.sock` (as the Python client finds it).
pub fn default_address() -> crate::client::Address {
    match std::env::var("HERMES_HOOKS_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
    {
        Some(a) => crate::client::Address::parse(&a),
        None => crate::client::Address::Unix(crate::layout::hermes_home().join("hooks.sock")),
    }
}

/// The interpreter most Python hooks use, as `(path, why)`: `check` and `list` say it once
/// instead of under every hook, and name it under a hook only where it differs.
pub fn common_python(pythons: impl Iterator<Item = (String, String)>) -> Option<(String, String)> {
    let mut counts: Vec<((String, String), usize)> = Vec::new();
    for p in pythons {
        match counts.iter_mut().find(|(q, _)| *q == p) {
            Some((_, n)) => *n += 1,
            None => counts.push((p, 1)),
        }
    }
    // The first of the most frequent (max_by_key would pick the last).
    let best = counts.iter().map(|(_, n)| *n).max()?;
    counts.into_iter().find(|(_, n)| *n == best).map(|(p, _)| p)
}

/// The context given by `--context JSON` or `--context-file F` (`null` when neither).
pub fn read_context(text: Option<&str>, file: Option<&std::path::Path>) -> Result<Value, String> {
    match (text, file) {
        (Some(text), _) => {
            serde_json::from_str(text).map_err(|e| format!("--context is not valid JSON: {e}"))
        }
        (None, Some(f)) => {
            let t = std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            serde_json::from_str(&t).map_err(|e| format!("{} is not valid JSON: {e}", f.display()))
        }
        (None, None) => Ok(Value::Null),
    }
}
