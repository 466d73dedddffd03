//! Runs an executable handler from the very file whose bytes were checked: the file is opened
//! once when the handler starts, and before every process the hook's tree is checked and the
//! content behind that descriptor is compared with the hook version's manifest (hashed through
//! the descriptor, or taken from the hash cache when its identity is unchanged: see
//! `trust::files`). The process is started from `/proc/self/fd/N` (the descriptor is inherited
//! for the exec only: `handler/spawn.rs` clears its close-on-exec flag in the child). Renaming
//! another file over the path changes nothing that runs: the tree check refuses the start, and
//! the descriptor still names the checked file.
//! A script with a `#!` line gets `/proc/self/fd/N` as its path (its interpreter opens that,
//! so `$0` is that path too: a script finds its directory through `HERMES_HOOK_DIR`, or its
//! working directory with `cwd: hook`).
//!
//! The check runs where the process is started (`handler/exec.rs`): on the hook's own starter
//! thread (`handler/starter.rs`), never on a runtime thread; a check of an unchanged tree opens
//! nothing (the caches of `trust::files` answer it with `stat` calls).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::api::{HandlerContext, HandlerError};
use crate::trust::files::{RunFiles, open_file_sha256};
use crate::trust::prestart::StartRefused;

/// The open handler file of an executable hook.
#[derive(Debug)]
pub struct VerifiedExec {
    file: std::fs::File,
    /// `/proc/self/fd/N`.
    path: PathBuf,
    /// The handler's path, for messages.
    program: PathBuf,
    /// The handler's path relative to the hook directory (its key in the manifest).
    rel: String,
}

/// Why a process was not started: the start was refused (with whether the refusal was logged
/// already), or the start itself failed.
#[derive(Debug)]
pub enum NotStarted {
    /// The tree or the handler's content is not what was loaded.
    Refused(StartRefused, bool),
    /// The process could not be started.
    Io(std::io::Error),
}

impl VerifiedExec {
    /// Opens the handler file of `ctx`'s hook (off the runtime's threads). Its content is
    /// checked before each process, not here.
    pub async fn open(ctx: &HandlerContext, program: &Path) -> Result<Self, HandlerError> {
        let program = program.to_path_buf();
        let rel = program
            .strip_prefix(&ctx.files.dir)
            .unwrap_or(&program)
            .display()
            .to_string();
        // On the hook's own starter thread, within the check's deadline: a handler file on a
        // file system that stalls delays this hook only (issue 47).
        let opened = ctx.starter.run(
            "opening the handler file",
            Some(super::starter::CHECK_DEADLINE),
            move || {
                let cannot = |e: std::io::Error| {
                    HandlerError::Load(format!("cannot open {}: {e}", program.display()))
                };
                let file = std::fs::File::open(&program).map_err(cannot)?;
                // Above 0, 1 and 2: a started process gets its pipes there.
                let file =
                    std::fs::File::from(super::spawn::above_stdio(file.into()).map_err(cannot)?);
                let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                Ok(Self {
                    file,
                    path,
                    program,
                    rel,
                })
            },
            |_| {},
        );
        opened
            .await
            .map_err(|e| HandlerError::Load(format!("opening the handler failed: {e}")))?
    }

    /// The path that runs this very file: `/proc/self/fd/N`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open descriptor (what [`VerifiedExec::path`] names).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }

    /// Checks hook `hook`'s tree against `files` ([`crate::trust::prestart`]), then the content
    /// behind the descriptor against the manifest. Blocks (a changed file is read and hashed).
    pub fn check_blocking(&self, files: &RunFiles, hook: &str) -> Result<(), NotStarted> {
        // (Refused by the tree check: already logged there.)
        crate::trust::prestart::check_blocking(files, hook)
            .map_err(|e| NotStarted::Refused(e, true))?;
        let refused =
            |why: String, changed: bool| NotStarted::Refused(StartRefused { why, changed }, false);
        let sha = open_file_sha256(&self.file, &self.program)
            .map_err(|e| refused(e.to_string(), false))?;
        match files.files.get(&self.rel) {
            Some(want) if *want == sha => Ok(()),
            Some(_) => Err(refused(
                format!(
                    "{} changed since this version of the hook was loaded; only the files it \
                     was loaded (and approved) with run",
                    self.rel
                ),
                true,
            )),
            None => Err(refused(
                format!(
                    "{} is not among the files this version of the hook was loaded with",
                    self.rel
                ),
                true,
            )),
        }
    }
}

impl NotStarted {
    /// The handler's error for this, logging a refusal the tree check did not log.
    pub fn into_error(self, hook: &str, program: &Path) -> HandlerError {
        match self {
            NotStarted::Refused(e, logged) => {
                if !logged {
                    tracing::warn!(hook = %hook, "process start refused: {}", e.why);
                }
                HandlerError::from(e)
            }
            NotStarted::Io(e) => {
                HandlerError::Failed(format!("cannot run {}: {e}", program.display()))
            }
        }
    }
}
