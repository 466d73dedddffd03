//! Which Python interpreter runs a hook's `handler.py`, and why.
//!
//! The order is: `python:` in HOOK.yaml, else `$HERMES_HOOKS_PYTHON`, else the interpreter of the
//! gateway that autostarted this service (`$HERMES_HOOKS_GATEWAY_PYTHON`, set by the client's
//! autostart: what the original host ran hooks in, wherever the gateway's venv lies and whether
//! or not its `bin` is on `PATH`), else the gateway's own virtual environment
//! `$HERMES_HOME/hermes-agent/venv/bin/python` when it exists and runs (the Hermes installer's
//! layout, where the gateway's packages and modules import), else `python3`.
//! The host-wide default (the last three) is chosen once per configuration by
//! [`default_python`]; [`for_hook`] adds the per-hook setting and the reason shown by `list`,
//! `check` and `/v1/hooks`. A leaf module: it knows nothing of hooks beyond the two settings.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The environment variable that names the default interpreter.
pub const PYTHON_ENV: &str = "HERMES_HOOKS_PYTHON";
/// The variable through which an autostarting gateway hands its own interpreter to the service.
pub const GATEWAY_PYTHON_ENV: &str = "HERMES_HOOKS_GATEWAY_PYTHON";
/// The interpreter used when nothing else is set or found.
pub const FALLBACK: &str = "python3";
/// How long the gateway venv's interpreter gets to prove it runs.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The interpreter of one hook and the reason it was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interpreter {
    /// Program run as the worker (a path or a name looked up on `PATH`).
    pub path: String,
    /// Why this one, in words ("python: in HOOK.yaml", "the gateway's venv ...").
    pub why: String,
}

/// The gateway's interpreter in the Hermes installer's layout.
pub fn gateway_venv_python(hermes_home: &Path) -> PathBuf {
    hermes_home
        .join("hermes-agent")
        .join("venv")
        .join("bin")
        .join("python")
}

/// The host-wide default: `$HERMES_HOOKS_PYTHON`, else the autostarting gateway's interpreter
/// when it runs, else the gateway's venv when it exists and runs, else `python3`. Runs the
/// candidate interpreter once (`-c pass`, bounded by a timeout).
pub fn default_python(hermes_home: &Path) -> String {
    if let Some(p) = std::env::var(PYTHON_ENV).ok().filter(|p| !p.is_empty()) {
        return p;
    }
    if let Some(p) = std::env::var(GATEWAY_PYTHON_ENV)
        .ok()
        .filter(|p| !p.is_empty() && runs(Path::new(p)))
    {
        return p;
    }
    let venv = gateway_venv_python(hermes_home);
    if runs(&venv) {
        return venv.display().to_string();
    }
    FALLBACK.to_string()
}

/// The interpreter of a hook whose HOOK.yaml says `manifest_python`, on a host whose default is
/// `default` (as [`default_python`] chose it), with the reason.
pub fn for_hook(manifest_python: Option<&str>, default: &str, hermes_home: &Path) -> Interpreter {
    if let Some(p) = manifest_python {
        return Interpreter {
            path: p.to_string(),
            why: "`python:` in HOOK.yaml".into(),
        };
    }
    let venv = gateway_venv_python(hermes_home);
    let why = if std::env::var(PYTHON_ENV).is_ok_and(|v| v == default) {
        format!("${PYTHON_ENV}")
    } else if std::env::var(GATEWAY_PYTHON_ENV).is_ok_and(|v| v == default) {
        format!("the gateway's own interpreter (${GATEWAY_PYTHON_ENV}, handed over by autostart)")
    } else if Path::new(default) == venv {
        "the gateway's venv ($HERMES_HOME/hermes-agent/venv) exists and runs".to_string()
    } else if default == FALLBACK {
        format!(
            "default: no `python:` in HOOK.yaml, ${PYTHON_ENV} unset, no runnable gateway venv at {}",
            venv.display()
        )
    } else {
        "the host's configured default".to_string()
    };
    Interpreter {
        path: default.to_string(),
        why,
    }
}

/// The advice added to an import failure caused by a missing module.
pub fn missing_module_hint(interpreter: &Interpreter) -> String {
    format!(
        "interpreter {} ({}) lacks it: pick the one that has it with `python: /path/to/python` in \
         HOOK.yaml or ${PYTHON_ENV}",
        interpreter.path, interpreter.why
    )
}

/// The hint for a hook whose import failed with `ModuleNotFoundError` (`reason`): when the hook's
/// own Python files look for modules under `$HERMES_HOME/plugins` (as gateway plugins are
/// installed), the plugin is what is missing, not the interpreter; otherwise
/// [`missing_module_hint`].
pub fn module_not_found_hint(
    reason: &str,
    interpreter: &Interpreter,
    hook_dir: &Path,
    hermes_home: Option<&Path>,
) -> String {
    let module = reason
        .split("No module named '")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .map(|m| m.split('.').next().unwrap_or(m).to_string());
    if let (Some(module), Some(home)) = (module, hermes_home)
        && mentions_plugins(hook_dir)
    {
        let plugins = home.join("plugins");
        let there = plugins.join(&module);
        let found = there.exists() || plugins.join(format!("{module}.py")).exists();
        return format!(
            "the hook looks for modules under {} (gateway plugins), and {module:?} is {}: \
             install or enable that plugin there (the interpreter, {}, is not the problem)",
            plugins.display(),
            if found {
                "there but does not import"
            } else {
                "not there"
            },
            interpreter.path
        );
    }
    missing_module_hint(interpreter)
}

/// Whether the Python files at the top of `dir` name the `plugins` directory (bounded read).
fn mentions_plugins(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "py"))
        .take(32)
        .any(|p| {
            std::fs::read(&p).is_ok_and(|b| {
                let text = String::from_utf8_lossy(&b[..b.len().min(256 * 1024)]);
                text.contains("\"plugins\"")
                    || text.contains("'plugins'")
                    || text.contains("/plugins")
            })
        })
}

/// True when `python` is an executable file that exits 0 for `-c pass` within the probe timeout.
fn runs(python: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable =
        std::fs::metadata(python).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if !executable {
        return false;
    }
    use std::os::unix::process::CommandExt;
    // Its own process group, as every process the service starts: see crate::reaper.
    let mut cmd = std::process::Command::new(python);
    cmd.process_group(0)
        .args(["-c", "pass"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // At the service's starting priority, not a SCHED_IDLE runtime thread's: a probe starved by
    // a busy machine would time out and call a working interpreter broken.
    let child = crate::priority::spawn_at_base(move || cmd.spawn());
    let Ok(mut child) = child else {
        return false;
    };
    let deadline = Instant::now() + PROBE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!(
                    "the gateway venv's interpreter {} did not answer within {PROBE_TIMEOUT:?}; using {FALLBACK}",
                    python.display()
                );
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_setting_wins() {
        let i = for_hook(Some("/opt/py"), "python3", Path::new("/nowhere"));
        assert_eq!(i.path, "/opt/py");
        assert!(i.why.contains("HOOK.yaml"), "{}", i.why);
    }

    #[test]
    fn venv_is_named_when_it_is_the_default() {
        let home = Path::new("/h");
        let venv = gateway_venv_python(home).display().to_string();
        let i = for_hook(None, &venv, home);
        assert!(i.why.contains("venv"), "{}", i.why);
    }

    #[test]
    fn missing_venv_falls_back() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(!runs(&gateway_venv_python(tmp.path())));
    }
}
