//! A confined hook's processes ([`crate::sandbox`]): its private state directory made, an
//! executable's Landlock ruleset built once per handler (with what it needs to start at all:
//! its handler file, the `#!` interpreter, the dynamic loader), and a command set up to run
//! confined: the environment replaced by what the sandbox allows and, before the exec,
//! `no_new_privs` and the ruleset enforced (by `handler/spawn.rs`, in the child). A Python
//! worker confines itself (the runner, from the rules in its hello): only its environment is
//! set here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::process::Command;

use super::api::{HandlerContext, HandlerError};
use crate::sandbox::landlock::{self, Ruleset};

/// Makes the state directory of a confined hook and any `write:` path that does not exist yet,
/// as directories of mode 0700 (Landlock grants on what exists), one component at a time
/// without following a link: a link the hook left where its grant was resolved (`cache -> /`)
/// is refused, never kept.
pub async fn make_state_dir(ctx: &HandlerContext) -> Result<(), HandlerError> {
    let Some(policy) = ctx.sandbox.clone() else {
        return Ok(());
    };
    tokio::task::spawn_blocking(move || {
        for dir in &policy.write {
            crate::sandbox::pin::make_dirs_nofollow(dir, 0o700).map_err(|e| {
                HandlerError::Load(format!(
                    "cannot make {} (the hook's state directory or a `write:` path of \
                     its sandbox): {e}",
                    dir.display()
                ))
            })?;
        }
        Ok(())
    })
    .await
    .map_err(|e| HandlerError::Load(format!("making the state directory failed: {e}")))?
}

/// The ruleset of an executable hook (`None` when it is not confined), built once.
pub async fn exec_ruleset(
    ctx: &HandlerContext,
    program: &Path,
    via_shell: bool,
) -> Result<Option<Arc<Ruleset>>, HandlerError> {
    let Some(policy) = ctx.sandbox.clone() else {
        return Ok(None);
    };
    let abi = landlock::abi();
    if abi == 0 {
        return Ok(None); // best effort (a refusal was decided before): environment only
    }
    let program = program.to_path_buf();
    let built = tokio::task::spawn_blocking(move || {
        let mut exec = vec![program.clone()];
        if via_shell {
            exec.extend(crate::layout::find_on_path("sh"));
        }
        // A `#!` interpreter may itself be a script (up to the kernel's own limit of nesting).
        let mut next = interpreters(&program);
        for _ in 0..4 {
            let deeper: Vec<PathBuf> = next.iter().flat_map(|p| interpreters(p)).collect();
            exec.append(&mut next);
            next = deeper;
        }
        exec.extend(dynamic_loaders());
        landlock::build(&policy.rules(abi, &exec))
    })
    .await
    .map_err(|e| HandlerError::Load(format!("building the sandbox failed: {e}")))?;
    built
        .map(|r| Some(Arc::new(r)))
        .map_err(|e| HandlerError::Load(format!("cannot build the sandbox: {e}")))
}

/// The `#!` interpreter of a script, and the program `#!/usr/bin/env NAME` runs.
fn interpreters(program: &Path) -> Vec<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return Vec::new();
    };
    let line = String::from_utf8_lossy(line);
    let line = line.lines().next().unwrap_or("");
    let mut words = line.split_whitespace();
    let Some(interp) = words.next() else {
        return Vec::new();
    };
    let mut out = vec![PathBuf::from(interp)];
    if Path::new(interp).file_name().is_some_and(|n| n == "env")
        && let Some(name) = words.find(|w| !w.starts_with('-'))
    {
        out.extend(crate::layout::find_on_path(name));
    }
    out
}

/// The dynamic loaders of the system: the kernel opens one to start any dynamic program.
fn dynamic_loaders() -> Vec<PathBuf> {
    const DIRS: &[&str] = &[
        "/lib64",
        "/lib",
        "/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ];
    DIRS.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ld-linux") || n.starts_with("ld-musl"))
        })
        .collect()
}

/// Replaces the environment of `cmd` by what the hook's sandbox allows (nothing changes for a
/// hook that is not confined). A Python worker's; an executable's environment is built by
/// `ExecHandler` from [`HandlerContext::confined_env`].
pub fn set_env(cmd: &mut Command, ctx: &HandlerContext) {
    if let Some(env) = ctx.confined_env() {
        cmd.env_clear().envs(env);
    }
}

/// For a confined hook whose process failed saying an access was refused: the line to log and
/// add to the error, naming the HOOK.yaml key that would allow it.
pub fn denial_hint(ctx: &HandlerContext, stderr: &str) -> Option<String> {
    let policy = ctx.sandbox.as_ref()?;
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains("Permission denied") || l.contains("Operation not permitted"))?;
    let line = line.trim();
    let home = if policy.env.iter().any(|p| p == "HOME") {
        ""
    } else {
        " (HOME is withheld unless `env:` lists it: `~` is then the passwd entry's home, \
         so a path under `~` may not be the one you granted)"
    };
    // A program the shell could not start is an exec denial, not a read one (issue 50).
    if !policy.exec && looks_like_exec_denial(line) {
        return Some(format!(
            "sandbox: starting a program was denied ({line}): to allow it, add `exec: true` to \
             {}",
            policy.where_declared()
        ));
    }
    Some(format!(
        "sandbox: access denied ({line}): to allow it, grant it under {}: `read:`/`write:` for \
         a path{home}, `connect:` for a port, `exec: true` to start programs",
        policy.where_declared()
    ))
}

/// Whether a denial line is a shell's (or a runtime's) report of a program it could not start:
/// `sh: 1: /usr/bin/id: Permission denied`, `bash: line 1: ...`, `cannot execute`, `execve`,
/// or a denied file that is executable.
fn looks_like_exec_denial(line: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    if line.contains("cannot execute") || line.contains("execve") || line.contains("exec:") {
        return true;
    }
    let fields: Vec<&str> = line.split(": ").collect();
    // `SCRIPT: LINE: PROGRAM: Permission denied` (dash; bash says `line N`), but not the
    // shell's own `cannot open FILE` (a redirection: a read or write).
    let shell_said = fields.len() >= 4
        && fields[1].trim_start_matches("line ").parse::<u32>().is_ok()
        && !fields[2].starts_with("cannot ");
    let denied = fields
        .iter()
        .rev()
        .nth(1)
        .map(|p| p.trim_matches(['\'', '"']));
    let executable = denied.is_some_and(|p| {
        p.starts_with('/')
            && std::fs::metadata(p)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    shell_said || executable
}

/// What the Python runner needs to confine itself, sent in its hello: the Landlock rules (the
/// runner adds its interpreter's directories read-only), the variables it may keep, whether to
/// go on without Landlock, and where the sandbox is declared (for its denial messages).
pub fn for_runner(policy: &crate::sandbox::Policy) -> serde_json::Value {
    let abi = landlock::abi();
    serde_json::json!({
        "abi": abi,
        "rules": policy.rules(abi, &[]),
        "env": policy.env,
        "best_effort": policy.best_effort,
        "where": policy.where_declared(),
        "seccomp": crate::sandbox::seccomp::program(),
    })
}
