//! `hermes-hooks new NAME --kind ...`: writes a working hook directory to start from. Each
//! scaffold passes `check` as written and runs under `test`; nothing is ever overwritten.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The kinds `new` can scaffold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// `handler.py` run by a persistent Python worker.
    Python,
    /// An executable shell script, one process per event.
    Exec,
    /// A Rust dynamic library built with the SDK.
    Rust,
    /// An HTTP endpoint receiving signed POSTs.
    Webhook,
}

/// Why a scaffold was not written.
#[derive(Debug, Error)]
pub enum ScaffoldError {
    /// The name cannot be a hook name.
    #[error("invalid hook name {name:?}: {reason}")]
    BadName {
        /// The name given.
        name: String,
        /// Why.
        reason: String,
    },
    /// The directory exists.
    #[error("{0} already exists; choose another name or remove it first (nothing was overwritten)")]
    Exists(PathBuf),
    /// Writing failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// This kind cannot be scaffolded by this build.
    #[error("{0}")]
    Unsupported(String),
}

/// What was written.
#[derive(Debug)]
pub struct Scaffold {
    /// The hook directory.
    pub dir: PathBuf,
    /// Files written, relative to `dir`.
    pub files: Vec<String>,
    /// What to do next, for the person.
    pub next: String,
}

fn write(dir: &Path, rel: &str, content: &str, mode: u32) -> Result<(), ScaffoldError> {
    let path = dir.join(rel);
    let io = |source| ScaffoldError::Io {
        path: path.clone(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(&path, content).map_err(io)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(io)
}

/// Where `new --kind rust` keeps the crate it builds the hook from (outside the hook roots, so
/// builds never wake the watcher).
pub fn rust_source_dir(hermes_home: &Path, name: &str) -> Result<PathBuf, String> {
    crate::hook_name::path_under(&hermes_home.join("hook-src"), name)
}

/// Writes a new hook called `name` of `kind` into `root`. `url` is the endpoint of a webhook;
/// `src` is where a Rust hook's crate goes.
pub fn new_hook(
    root: &Path,
    name: &str,
    kind: Kind,
    url: Option<&str>,
    src: Option<&Path>,
) -> Result<Scaffold, ScaffoldError> {
    crate::manifest::validate_name(name).map_err(|reason| ScaffoldError::BadName {
        name: name.into(),
        reason,
    })?;
    let dir =
        crate::hook_name::path_under(root, name).map_err(|reason| ScaffoldError::BadName {
            name: name.into(),
            reason,
        })?;
    if dir.exists() {
        return Err(ScaffoldError::Exists(dir));
    }
    let io = |source| ScaffoldError::Io {
        path: dir.clone(),
        source,
    };
    std::fs::create_dir_all(root).map_err(io)?;
    std::fs::create_dir(&dir).map_err(io)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
    let env_name = name
        .to_ascii_uppercase()
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let (files, next): (Vec<(&str, String, u32)>, String) = match kind {
        Kind::Python => (
            vec![
                (
                    "HOOK.yaml",
                    manifest(name, "A Python hook", "", None),
                    0o644,
                ),
                ("handler.py", python_handler(name), 0o644),
            ],
            format!(
                "edit {0}/handler.py, then: hermes-hooks test agent:start --hook {name}",
                dir.display()
            ),
        ),
        Kind::Exec => (
            vec![
                (
                    "HOOK.yaml",
                    manifest(name, "An executable hook (one process per event)", "", None),
                    0o644,
                ),
                ("handler.sh", exec_handler(name), 0o755),
            ],
            format!(
                "edit {0}/handler.sh, then: hermes-hooks test agent:start --hook {name}",
                dir.display()
            ),
        ),
        Kind::Webhook => {
            let url = url.unwrap_or("http://127.0.0.1:8080/hermes-hook");
            let extra = format!(
                "# Deliveries are POSTed here; 2xx JSON answers are the hook's result.\nurl: {url}\n\
                 # HMAC-SHA256 signature (X-Hermes-Signature-256) with the secret in this variable;\n\
                 # unset = deliveries go out unsigned (listed as UNSIGNED).\nsecret_env: {env_name}_SECRET\n"
            );
            (
                vec![(
                    "HOOK.yaml",
                    manifest(
                        name,
                        "A webhook: events are POSTed to an HTTP endpoint",
                        &extra,
                        None,
                    ),
                    0o644,
                )],
                format!(
                    "set url: in {0}/HOOK.yaml and export {env_name}_SECRET, then: hermes-hooks test agent:start --hook {name}",
                    dir.display()
                ),
            )
        }
        Kind::Rust => {
            let Some(src) = src else {
                let _ = std::fs::remove_dir(&dir);
                return Err(ScaffoldError::Unsupported(
                    "a Rust hook needs a source directory".into(),
                ));
            };
            return match rust_hook(&dir, src, name) {
                Ok(s) => Ok(s),
                Err(e) => {
                    // Leave no half-made hook directory behind (the sources stay for a retry).
                    let _ = std::fs::remove_dir_all(&dir);
                    Err(e)
                }
            };
        }
    };
    let mut written = Vec::new();
    for (rel, content, mode) in files {
        write(&dir, rel, &content, mode)?;
        written.push(rel.to_string());
    }
    Ok(Scaffold {
        dir,
        files: written,
        next,
    })
}

/// The SDK, embedded so a scaffolded Rust hook builds without this repository.
const SDK_LIB: &str = include_str!("../sdk/src/lib.rs");
const SDK_MANIFEST: &str = include_str!("../sdk/Cargo.toml");

/// Writes the crate of a Rust hook into `src`, builds it with cargo (its `build.sh`) and installs
/// HOOK.yaml and handler.so into `dir`. `CARGO` and `CARGO_TARGET_DIR` are honoured;
/// `HERMES_HOOK_PROFILE=debug` builds without optimisations.
fn rust_hook(dir: &Path, src: &Path, name: &str) -> Result<Scaffold, ScaffoldError> {
    if src.exists() {
        return Err(ScaffoldError::Exists(src.to_path_buf()));
    }
    let crate_name = format!(
        "hermes_hook_{}",
        name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    );
    let cargo_toml = format!(
        r#"[package]
name = "{crate_name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
hermes-hooks-sdk = {{ path = "hermes-hooks-sdk" }}

# A workspace of its own, wherever this directory lives.
[workspace]
"#
    );
    let lib_rs = format!(
        r#"//! {name}: a hermes-hooks dynamic-library hook (C ABI v1 through hermes-hooks-sdk).
//!
//! After an edit, `./build.sh` rebuilds and installs it; the running service reloads it.
//! Calls come one at a time on one thread; a panic becomes an error result.

use hermes_hooks_sdk::serde_json::{{Value, json}};

fn handle(event: &str, context: &Value) -> Result<Option<Value>, String> {{
    let keys = context.as_object().map(|o| o.len()).unwrap_or(0);
    Ok(Some(json!({{"hook": "{name}", "event": event, "context_keys": keys}})))
}}

hermes_hooks_sdk::export_hook!(handle);
"#
    );
    let ext = if cfg!(target_os = "macos") {
        "dylib"
    } else {
        "so"
    };
    let dest = shell_quote(&dir.display().to_string());
    let build_sh = format!(
        r#"#!/bin/sh
# Builds {name} and installs handler.{ext} into its hook directory (by rename: the service never
# sees a half-written library).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
profile=${{HERMES_HOOK_PROFILE:-release}}
target=${{CARGO_TARGET_DIR:-$here/target}}
flag=
[ "$profile" = release ] && flag=--release
# shellcheck disable=SC2086
"${{CARGO:-cargo}}" build $flag --manifest-path "$here/Cargo.toml" --target-dir "$target"
mkdir -p {dest}
cp "$target/$profile/lib{crate_name}.{ext}" {dest}/.handler.{ext}.tmp
mv -f {dest}/.handler.{ext}.tmp {dest}/handler.{ext}
echo "installed handler.{ext} in {dest}"
"#
    );
    write(src, "Cargo.toml", &cargo_toml, 0o644)?;
    write(src, "src/lib.rs", &lib_rs, 0o644)?;
    write(src, "hermes-hooks-sdk/Cargo.toml", SDK_MANIFEST, 0o644)?;
    write(src, "hermes-hooks-sdk/src/lib.rs", SDK_LIB, 0o644)?;
    write(src, "build.sh", &build_sh, 0o755)?;
    let status = std::process::Command::new("sh")
        .arg(src.join("build.sh"))
        .status()
        .map_err(|e| {
            ScaffoldError::Unsupported(format!("cannot run {}/build.sh: {e}", src.display()))
        })?;
    if !status.success() {
        return Err(ScaffoldError::Unsupported(format!(
            "building the hook failed ({status}); the crate is in {0}: fix it and run {0}/build.sh, then write HOOK.yaml next to handler.{ext}",
            src.display()
        )));
    }
    write(
        dir,
        "HOOK.yaml",
        &manifest(name, "A Rust dynamic-library hook", "", None),
        0o644,
    )?;
    Ok(Scaffold {
        dir: dir.to_path_buf(),
        files: vec!["HOOK.yaml".into(), format!("handler.{ext}")],
        next: format!(
            "edit {0}/src/lib.rs, run {0}/build.sh, then: hermes-hooks test agent:start --hook {name}",
            src.display()
        ),
    })
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn manifest(name: &str, description: &str, extra: &str, handler: Option<&str>) -> String {
    let handler = handler
        .map(|h| format!("handler: {h}\n"))
        .unwrap_or_default();
    let timeout_note = if extra.contains("url:") {
        "Seconds per delivery attempt, 1 to 60 (a webhook's default is 10)."
    } else {
        "Seconds per invocation, more than 0 and at most 300 (default 30)."
    };
    format!(
        "# {name}: {description}. Every field: docs/hook-authors.md, section HOOK.yaml.\n\
         name: {name}\n\
         description: {description:?}\n\
         # Exact event names or globs: \"agent:*\", \"command:*\", \"{{session,agent}}:start\", \"*\".\n\
         events: [\"agent:start\", \"command:*\"]\n\
         # {timeout_note}\n\
         timeout: 10\n\
         {handler}{extra}"
    )
}

fn python_handler(name: &str) -> String {
    format!(
        r#""""{name}: called once per matching event, in a long-lived worker.

handle() may be sync or async. Whatever it returns (a JSON value) is its result for
decision events (emit_collect); return None for "nothing". print() goes to the service log.
Module globals persist between events until the worker restarts.
"""

import json
import os

HERMES_HOME = os.environ.get("HERMES_HOME", os.path.expanduser("~/.hermes"))
seen = 0


def handle(event_type, context):
    global seen
    seen += 1
    print("{name}: event #%d %s %s" % (seen, event_type, json.dumps(context)[:200]))
    return None
"#
    )
}

fn exec_handler(name: &str) -> String {
    format!(
        r#"#!/bin/sh
# {name}: runs once per matching event.
# stdin:  one JSON object {{"hook_event_name", "event", "context", "hook"}}
# stdout: nothing, or one JSON value (the result for decision events)
# stderr: goes to the service log. A non-zero exit is reported as an error.
set -eu
payload=$(cat)
echo "{name} got: $payload" >&2
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_overwrite_and_bad_names() {
        let tmp = std::env::temp_dir().join(format!("hh-scaffold-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let s = new_hook(&tmp, "demo", Kind::Python, None, None).unwrap();
        assert_eq!(s.files, vec!["HOOK.yaml", "handler.py"]);
        assert!(matches!(
            new_hook(&tmp, "demo", Kind::Exec, None, None),
            Err(ScaffoldError::Exists(_))
        ));
        assert!(matches!(
            new_hook(&tmp, "a/b", Kind::Exec, None, None),
            Err(ScaffoldError::BadName { .. })
        ));
        assert!(
            crate::manifest::parse_manifest(
                &std::fs::read_to_string(s.dir.join("HOOK.yaml")).unwrap()
            )
            .is_ok()
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
