//! Fetching a repository with the system `git` (a child process, waited for): a full clone
//! without checkout, the ref resolved to a commit, that commit checked out detached. No
//! repository hook runs (an empty template directory, `core.hooksPath` pointing nowhere), no
//! submodule is fetched, git never prompts.

use std::path::Path;
use std::process::Command;

use crate::package::error::PackageError;

/// Clones `url` into `dest` (which must not exist) and checks out `reference` (a branch, tag
/// or commit; the default branch when `None`). Returns the commit checked out (full hex).
pub fn fetch(url: &str, reference: Option<&str>, dest: &Path) -> Result<String, PackageError> {
    let empty_template = dest.with_extension("template");
    std::fs::create_dir_all(&empty_template)
        .map_err(PackageError::io("create", &empty_template))?;
    let mut clone = git();
    clone
        .arg("clone")
        .arg("--quiet")
        .arg("--no-checkout")
        .arg("--no-recurse-submodules")
        .arg(format!("--template={}", empty_template.display()))
        .arg("--")
        .arg(url)
        .arg(dest);
    run(clone, "clone", url)?;
    let commit = resolve(dest, url, reference)?;
    let mut checkout = git();
    checkout
        .arg("-C")
        .arg(dest)
        .args(["checkout", "--quiet", "--detach"])
        .arg(&commit);
    run(checkout, "checkout", url)?;
    Ok(commit)
}

/// `reference` (or HEAD) as a commit: a tag, a commit, or a branch of the remote.
fn resolve(repo: &Path, url: &str, reference: Option<&str>) -> Result<String, PackageError> {
    let candidates: Vec<String> = match reference {
        None => [
            "HEAD",
            "refs/remotes/origin/HEAD",
            "refs/remotes/origin/main",
            "refs/remotes/origin/master",
        ]
        .map(String::from)
        .to_vec(),
        Some(r) if r.starts_with('-') => {
            return Err(PackageError::Git {
                what: "rev-parse",
                url: url.into(),
                detail: format!("{r:?} is not a ref"),
            });
        }
        Some(r) => vec![
            format!("refs/tags/{r}"),
            format!("refs/remotes/origin/{r}"),
            r.to_string(),
        ],
    };
    for c in &candidates {
        let mut cmd = git();
        cmd.arg("-C")
            .arg(repo)
            .args(["rev-parse", "--verify", "--quiet"])
            .arg(format!("{c}^{{commit}}"));
        if let Ok(out) = cmd.output()
            && out.status.success()
        {
            return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
        }
    }
    Err(PackageError::Git {
        what: "rev-parse",
        url: url.into(),
        detail: format!(
            "no branch, tag or commit {:?} in the repository",
            reference.unwrap_or("HEAD")
        ),
    })
}

/// `git` with the settings every call gets: no prompt, no hooks, no system or global
/// templates.
fn git() -> Command {
    let mut cmd = Command::new("git");
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "true")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .args(["-c", "core.hooksPath=/dev/null"])
        .args(["-c", "advice.detachedHead=false"])
        // A stalled transfer fails instead of hanging: under 1 KB/s for a minute.
        .args([
            "-c",
            "http.lowSpeedLimit=1000",
            "-c",
            "http.lowSpeedTime=60",
        ])
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs `cmd` to completion (its output collected, the child reaped).
fn run(mut cmd: Command, what: &'static str, url: &str) -> Result<(), PackageError> {
    let out = cmd.output().map_err(|e| PackageError::Git {
        what,
        url: url.into(),
        detail: if e.kind() == std::io::ErrorKind::NotFound {
            "git is not installed (install it, e.g. apt-get install git)".into()
        } else {
            e.to_string()
        },
    })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(PackageError::Git {
        what,
        url: url.into(),
        detail: crate::text::cap(stderr.trim().to_string()),
    })
}
