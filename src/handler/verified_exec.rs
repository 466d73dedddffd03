//! Runs an executable handler from the very file whose bytes were checked: the file is opened,
//! its content hashed through that descriptor and compared with the hook version's manifest,
//! and the process is started from `/proc/self/fd/N` (the descriptor is inherited for the exec
//! only: `handler/spawn.rs` clears its close-on-exec flag in the child). Renaming another file
//! over the path between the check and the exec changes nothing.
//! A script with a `#!` line gets `/proc/self/fd/N` as its path (its interpreter opens that,
//! so `$0` is that path too: a script finds its directory through `HERMES_HOOK_DIR`, or its
//! working directory with `cwd: hook`).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::api::{HandlerContext, HandlerError};
use crate::trust::files::open_file_sha256;
use crate::trust::prestart::StartRefused;

/// An open, checked executable.
#[derive(Debug)]
pub struct VerifiedExec {
    file: std::fs::File,
    path: PathBuf,
}

impl VerifiedExec {
    /// The path that runs this very file: `/proc/self/fd/N`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open descriptor (what [`VerifiedExec::path`] names).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

fn refused(why: String, changed: bool) -> StartRefused {
    StartRefused { why, changed }
}

/// Checks the hook's tree ([`crate::trust::prestart`]), then opens `program` and checks its
/// bytes against the hook version's manifest: one trip to a blocking thread for both.
pub async fn open(ctx: &HandlerContext, program: &Path) -> Result<VerifiedExec, HandlerError> {
    let files = ctx.files.clone();
    let program = program.to_path_buf();
    let hook = ctx.name.clone();
    let name = hook.clone();
    let checked = tokio::task::spawn_blocking(move || {
        // (Refused by the tree check: already logged there.)
        crate::trust::prestart::check_blocking(&files, &name).map_err(|e| (e, true))?;
        let refused = |why: String, changed: bool| (refused(why, changed), false);
        let rel = program
            .strip_prefix(&files.dir)
            .unwrap_or(&program)
            .display()
            .to_string();
        let file = std::fs::File::open(&program)
            .map_err(|e| refused(format!("cannot open {}: {e}", program.display()), false))?;
        // Above 0, 1 and 2: a started process gets its pipes there.
        let file = std::fs::File::from(
            super::spawn::above_stdio(file.into())
                .map_err(|e| refused(format!("cannot open {}: {e}", program.display()), false))?,
        );
        let sha = open_file_sha256(&file, &program).map_err(|e| refused(e.to_string(), false))?;
        match files.files.get(&rel) {
            Some(want) if *want == sha => {
                let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                Ok(VerifiedExec { file, path })
            }
            Some(_) => Err(refused(
                format!(
                    "{rel} changed since this version of the hook was loaded; only the files it \
                     was loaded (and approved) with run"
                ),
                true,
            )),
            None => Err(refused(
                format!("{rel} is not among the files this version of the hook was loaded with"),
                true,
            )),
        }
    })
    .await
    .map_err(|e| refused(format!("checking the handler failed: {e}"), false))?;
    checked.map_err(|(e, logged): (StartRefused, bool)| {
        if !logged {
            tracing::warn!(hook = %hook, "process start refused: {}", e.why);
        }
        HandlerError::from(e)
    })
}
