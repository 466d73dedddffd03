//! `remove`: an installed hook's directory (or link) and its lock entry deleted; with
//! `--purge` also its state directory `$HERMES_HOME/hook-state/NAME`.

use std::path::{Path, PathBuf};

use crate::package::error::PackageError;
use crate::package::lock::{LockFile, lock_file};
use crate::package::update::locked;

/// What `remove` did.
#[derive(Debug)]
pub struct Removed {
    /// The hook directory (or link) deleted.
    pub dir: PathBuf,
    /// The state directory deleted with `--purge`, if there was one.
    pub purged: Option<PathBuf>,
}

/// Removes the installed hook `name`: first out of the hook root in one rename (the service
/// sees it gone at once), then deleted; then its lock entry.
pub fn remove(hermes_home: &Path, name: &str, purge: bool) -> Result<Removed, PackageError> {
    let entry = locked(hermes_home, name)?;
    let dir = entry.dir.clone();
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::remove_file(&dir).map_err(PackageError::io("remove the link", &dir))?;
        }
        Ok(_) => {
            let root = dir.parent().unwrap_or(Path::new("/"));
            let trash = tempfile::Builder::new()
                .prefix(".hermes-remove-")
                .tempdir_in(root)
                .map_err(PackageError::io("create a directory in", root))?;
            std::fs::rename(&dir, trash.path().join("old"))
                .map_err(PackageError::io("move out of the hook root", &dir))?;
            trash
                .close()
                .map_err(PackageError::io("delete the removed hook of", root))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(PackageError::io("inspect", &dir)(e)),
    }
    let lock_path = lock_file(hermes_home);
    let mut lock = LockFile::load(&lock_path)?;
    lock.hooks.remove(name);
    lock.save(&lock_path)?;
    let state =
        crate::sandbox::policy::state_dir(hermes_home, name).map_err(PackageError::Hooks)?;
    let purged = if purge && state.is_dir() {
        std::fs::remove_dir_all(&state).map_err(PackageError::io("delete", &state))?;
        Some(state)
    } else {
        None
    };
    Ok(Removed { dir, purged })
}
