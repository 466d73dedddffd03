//! Runs an executable handler from the very bytes that were checked: the file is opened once
//! when the handler starts and copied into a sealed memory file ([`private_copy`]), and before
//! every process the hook's tree is checked and the
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
    /// Its start gate shut while it waited for the start ([`crate::start_gate`]): the fleet
    /// delivery or lease that let it start may be another worker's now.
    Expired,
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
                let file = private_copy(&file, &program)
                    .map_err(cannot)?
                    .unwrap_or(file);
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

/// Largest handler copied into a sealed memory file ([`private_copy`]); a larger one runs from
/// its file, whose content is checked (by `stat` identity) before each start.
pub const MAX_PRIVATE_COPY: u64 = 64 * 1024 * 1024;

/// The handler's bytes in a sealed memory file (`memfd`, sealed against writes, growth and
/// shrinking), so that what runs can never differ from what was checked, whatever happens to
/// the file afterwards: a write through a shared mapping that leaves `stat` unchanged (tmpfs;
/// a second write through a live mapping on ext4) cannot reach it (issue 47, row 5). Checked
/// like the file was: the content hash against the version's manifest before each start
/// (cached by the memory file's identity: sealed, it cannot change). Costs the handler's size
/// in memory per loaded version. `None` (run from the file) above [`MAX_PRIVATE_COPY`].
fn private_copy(file: &std::fs::File, program: &Path) -> std::io::Result<Option<std::fs::File>> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::FromRawFd;
    if file.metadata()?.len() > MAX_PRIVATE_COPY {
        tracing::info!(
            "{} is larger than {} MiB: it runs from its file (checked by identity before each start), not from a private copy",
            program.display(),
            MAX_PRIVATE_COPY >> 20
        );
        return Ok(None);
    }
    let name = c"hermes-hook-handler";
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create with a valid name; returns a new descriptor or -1. MFD_EXEC (Linux
    // 6.3+, needed where vm.memfd_noexec is set) is retried without on an older kernel.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), flags | libc::MFD_EXEC) };
    if fd < 0 {
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    }
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    let mut copy = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut source = file;
    source.seek(std::io::SeekFrom::Start(0))?;
    let mut bytes = Vec::new();
    source.take(MAX_PRIVATE_COPY + 1).read_to_end(&mut bytes)?;
    copy.write_all(&bytes)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on our descriptor; no writable mapping of it exists.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some(copy))
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
            NotStarted::Expired => HandlerError::Expired,
        }
    }
}
