//! Atomic file writes: a temporary file in the same directory, written, synced, then renamed
//! over the target ([`tempfile::NamedTempFile::persist`]), so a reader sees the old file or the
//! new one, never a part. A leaf: it uses no other module of this crate.

use std::io::Write;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// A step of an atomic write that failed.
#[derive(Debug, Error)]
#[error("cannot {op} {}: {source}", path.display())]
pub struct WriteError {
    /// What was being done ("write", "replace", ...).
    pub op: &'static str,
    /// The file it was done to.
    pub path: PathBuf,
    /// The cause.
    pub source: std::io::Error,
}

/// Writes `bytes` to `path` atomically with exactly `mode` (the umask does not narrow it), then
/// syncs the directory so the rename survives a crash.
pub fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), WriteError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let err = |op, p: &Path| {
        let path = p.to_path_buf();
        move |source| WriteError { op, path, source }
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".hermes-hooks-")
        .tempfile_in(dir)
        .map_err(err("create a temporary file in", dir))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(err("set the mode of", tmp.path()))?;
    tmp.write_all(bytes).map_err(err("write", tmp.path()))?;
    tmp.as_file().sync_all().map_err(err("sync", tmp.path()))?;
    tmp.persist(path)
        .map_err(|e| err("replace", path)(e.error))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_with_the_exact_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "old").unwrap();
        write(&path, b"new", 0o640).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
    }
}
