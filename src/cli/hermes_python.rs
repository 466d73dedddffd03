//! `doctor`'s questions to the Python that runs `hermes` (issue 58 row 9): a client installed
//! for the service but not in Hermes's environment leaves every gate off while everything else
//! looks right. Found from `hermes` on `PATH` (else the installer's
//! `$HERMES_HOME/hermes-agent/venv/bin/hermes`) by its `#!` line; asked with `hermes_probe.py`
//! whether it imports the plugin, has its entry point and, by Hermes's own reader, lists it in
//! `plugins.enabled`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::cli::dashboard::PLUGIN;

/// What Hermes's Python is asked (`-c`).
const PROBE: &str = include_str!("hermes_probe.py");

/// The module the entry point must name.
const MODULE: &str = "hermes_hooks.agent_plugin";

/// How long the probe may take (Hermes's imports included).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// One line of the report: whether it is a problem, a warning or ok, and what it says.
#[derive(Debug, PartialEq)]
pub(crate) enum Said {
    /// Counts as a problem.
    Problem(String),
    /// Said, not counted.
    Warning(String),
    /// Fine.
    Ok(String),
}

/// The `hermes` program Hermes runs as: on `PATH`, else in the installer's venv.
fn find_hermes(hermes_home: &Path) -> Option<PathBuf> {
    crate::layout::find_on_path("hermes").or_else(|| {
        let venv = hermes_home.join("hermes-agent/venv/bin/hermes");
        crate::layout::is_executable(&venv).then_some(venv)
    })
}

/// The interpreter of the script `hermes` from its first lines: `#!/venv/bin/python`,
/// `#!/usr/bin/env python3` (looked up on `PATH`), or pip's `#!/bin/sh` launcher for a long
/// path (`'''exec' /venv/bin/python "$0" "$@"`); why not for anything else (a binary).
fn interpreter_of(hermes: &Path) -> Result<PathBuf, String> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(hermes)
        .and_then(|f| f.take(4096).read_to_end(&mut head))
        .map_err(|e| format!("cannot read {}: {e}", hermes.display()))?;
    let head = String::from_utf8_lossy(&head);
    let not_python = || {
        format!(
            "{} is not a Python script with a `#!` line: cannot tell which Python runs Hermes",
            hermes.display()
        )
    };
    let shebang = head
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!"))
        .ok_or_else(not_python)?;
    let mut words = shebang.split_whitespace();
    let program = words.next().ok_or_else(not_python)?;
    if program.ends_with("/env") {
        let name = words.find(|w| !w.starts_with('-')).ok_or_else(not_python)?;
        return crate::layout::find_on_path(name)
            .ok_or_else(|| format!("{} runs {name:?}, which is not on PATH", hermes.display()));
    }
    if program.ends_with("/sh") {
        // pip's launcher: the path after `'''exec' `, in double quotes when it has a space.
        let rest = head
            .lines()
            .find_map(|l| l.trim().strip_prefix("'''exec' "))
            .ok_or_else(not_python)?;
        let path = match rest.strip_prefix('"') {
            Some(quoted) => quoted.split('"').next(),
            None => rest.split_whitespace().next(),
        };
        return path.map(PathBuf::from).ok_or_else(not_python);
    }
    Ok(PathBuf::from(program))
}

/// Runs the probe in `python` (`reader`: Hermes's own reader of `plugins.enabled` asked too);
/// its answer.
async fn ask(python: &Path, reader: bool) -> Result<Value, String> {
    let child = tokio::process::Command::new(python)
        .args(["-c", PROBE])
        .args(reader.then_some("--reader"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(PROBE_TIMEOUT, child).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("cannot run {}: {e}", python.display())),
        Err(_) => {
            return Err(format!(
                "{} did not answer within {}s",
                python.display(),
                PROBE_TIMEOUT.as_secs()
            ));
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).map_err(|_| {
        let err = String::from_utf8_lossy(&out.stderr);
        format!(
            "{} did not run the check ({}): {}",
            python.display(),
            out.status,
            crate::text::cap(err.trim().chars().take(300).collect())
        )
    })
}

/// Asks Hermes's Python; the lines to say. `enabled_here`: config.yaml's `plugins.enabled`, as
/// read by doctor, lists the plugin (so a differing answer from Hermes's reader is news).
pub(crate) async fn check(hermes_home: &Path, enabled_here: bool) -> Vec<Said> {
    let Some(hermes) = find_hermes(hermes_home) else {
        return vec![Said::Warning(
            "`hermes` is not on PATH (nor in $HERMES_HOME/hermes-agent/venv): cannot ask \
             Hermes's Python whether it loads the plugin; run doctor where `hermes` runs"
                .into(),
        )];
    };
    let python = match interpreter_of(&hermes) {
        Ok(p) => p,
        Err(e) => return vec![Said::Warning(e)],
    };
    let reader = hermes_home.join("config.yaml").is_file();
    match ask(&python, reader).await {
        Ok(answer) => read_answer(&answer, &hermes, &python, enabled_here),
        Err(e) => vec![Said::Problem(format!(
            "Hermes's Python, which runs {}: {e}",
            hermes.display()
        ))],
    }
}

/// The lines the probe's `answer` makes.
fn read_answer(answer: &Value, hermes: &Path, python: &Path, enabled_here: bool) -> Vec<Said> {
    let whose = format!(
        "Hermes's Python ({}, which runs {})",
        python.display(),
        hermes.display()
    );
    let install = format!(
        "install the client into it: `{} -m pip install ./clients/python` from a hermes-hooks \
         checkout (or the wheel of `maturin build --release`), then restart Hermes",
        python.display()
    );
    let mut said = Vec::new();
    if let Some(e) = answer["import_error"].as_str() {
        said.push(Said::Problem(format!(
            "{whose} cannot import {MODULE} ({e}): Hermes cannot load the plugin, so no HOOK.yaml \
             hook sees the agent's events and every pre_tool_call gate is off; {install}"
        )));
    } else {
        said.push(Said::Ok(format!(
            "{whose} imports {MODULE} ({})",
            answer["plugin"].as_str().unwrap_or("?")
        )));
        match answer["entry_points"][PLUGIN].as_str() {
            Some(MODULE) => said.push(Said::Ok(format!(
                "its entry point {PLUGIN} (hermes_agent.plugins) names {MODULE}"
            ))),
            Some(other) => said.push(Said::Problem(format!(
                "its entry point {PLUGIN} (hermes_agent.plugins) names {other}, not {MODULE}: \
                 another package took the name; {install}"
            ))),
            None => said.push(Said::Problem(format!(
                "{whose} has no entry point {PLUGIN} in hermes_agent.plugins (the client is on \
                 its path but not installed): Hermes finds plugins by their entry point; {install}"
            ))),
        }
    }
    said.extend(hermes_reader(answer, enabled_here));
    said
}

/// What Hermes's own reader of `plugins.enabled` says, when it could be asked.
fn hermes_reader(answer: &Value, enabled_here: bool) -> Option<Said> {
    if let Some(e) = answer["hermes_error"].as_str() {
        if e.contains("not asked") {
            return None;
        }
        return Some(Said::Warning(format!(
            "could not ask Hermes's own config reader (hermes_cli.plugins: {e})"
        )));
    }
    let listed = |key: &str| {
        answer[key]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p.as_str() == Some(PLUGIN)))
    };
    if listed("disabled") {
        return Some(Said::Problem(format!(
            "Hermes lists {PLUGIN} in plugins.disabled, which wins: run `hermes plugins enable \
             {PLUGIN}`"
        )));
    }
    match (listed("enabled"), enabled_here) {
        (true, _) => Some(Said::Ok(format!(
            "Hermes's own reader lists {PLUGIN} in plugins.enabled"
        ))),
        // Said above already, with the fix.
        (false, false) => None,
        (false, true) => Some(Said::Problem(format!(
            "Hermes's own reader does not list {PLUGIN} in plugins.enabled (it reads another \
             config.yaml: is HERMES_HOME the same for Hermes?)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_interpreter_of_each_launcher() {
        let dir = tempfile::tempdir().unwrap();
        let write = |text: &str| {
            let p = dir.path().join("hermes");
            std::fs::write(&p, text).unwrap();
            p
        };
        let direct = write("#!/venv/bin/python3.11\nimport sys\n");
        assert_eq!(
            interpreter_of(&direct).unwrap(),
            Path::new("/venv/bin/python3.11")
        );
        let long = write(
            "#!/bin/sh\n'''exec' \"/a very/long/venv/bin/python\" \"$0\" \"$@\"\n' '''\nimport sys\n",
        );
        assert_eq!(
            interpreter_of(&long).unwrap(),
            Path::new("/a very/long/venv/bin/python")
        );
        let unquoted = write("#!/bin/sh\n'''exec' /long/venv/bin/python \"$0\" \"$@\"\n' '''\n");
        assert_eq!(
            interpreter_of(&unquoted).unwrap(),
            Path::new("/long/venv/bin/python")
        );
        let binary = write("\u{7f}ELF");
        assert!(interpreter_of(&binary).is_err());
    }
}
