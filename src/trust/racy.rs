//! How long after a file's last change a read of it (a hash, a directory listing) may be
//! trusted while its `stat` stays the same: git's "racy clean" rule. A write within the same
//! timestamp tick as the read can leave mtime and ctime unchanged, so a file changed less than
//! one tick before the read is read again next time.
//!
//! The tick depends on the filesystem: the local Linux ones this service meets (ext4, XFS,
//! Btrfs, tmpfs, overlayfs over them, F2FS) keep nanosecond fields updated at least once per
//! scheduler tick (at most 10 ms), so [`LOCAL_WINDOW`] covers them with room; anything else
//! (FAT's two seconds, network filesystems whose times come from another clock) gets
//! [`RACY_WINDOW`]. The answer is kept per device.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// The window for a filesystem not known to have fine timestamps: the coarsest in use (FAT,
/// some network filesystems).
pub const RACY_WINDOW: Duration = Duration::from_secs(2);
/// The window for the local filesystems named in the module comment: five ticks of the
/// slowest scheduler clock (100 Hz), for timestamps that lag the wall clock by up to a tick.
pub const LOCAL_WINDOW: Duration = Duration::from_millis(50);

/// `statfs` magic numbers of the filesystems with fine timestamps (see the module comment).
const FINE: [i64; 6] = [
    0xEF53,      // ext2/3/4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0x0102_1994, // tmpfs
    0x794C_7630, // overlayfs
    0xF2F5_2010, // F2FS
];

/// Windows already known, by device.
static BY_DEVICE: Mutex<Option<HashMap<u64, Duration>>> = Mutex::new(None);

/// The window of the filesystem `path` (whose `stat` is `meta`) is on.
pub fn window(path: &Path, meta: &std::fs::Metadata) -> Duration {
    let dev = meta.dev();
    if let Some(w) = BY_DEVICE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(&dev))
    {
        return *w;
    }
    let Some(kind) = fs_type(path) else {
        return RACY_WINDOW; // unknown now: not remembered, asked again next time
    };
    let w = if FINE.contains(&kind) {
        LOCAL_WINDOW
    } else {
        RACY_WINDOW
    };
    let mut map = BY_DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    map.get_or_insert_with(HashMap::new).insert(dev, w);
    w
}

/// Whether a read made at `read_at` of `path` (whose `stat`, unchanged since, is `meta`) still
/// stands: its last change is more than its filesystem's window older than the read.
pub fn settled(read_at: SystemTime, path: &Path, meta: &std::fs::Metadata) -> bool {
    meta.modified().is_ok_and(|modified| {
        read_at
            .duration_since(modified)
            .is_ok_and(|age| age > window(path, meta))
    })
}

/// The `statfs` type of the filesystem `path` is on.
fn fs_type(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: an all-zero statfs is a valid value for statfs(2) to fill.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C path and a pointer to a statfs we own.
    if unsafe { libc::statfs(c.as_ptr(), &mut buf) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // f_type is i64 on x86_64, u32 or i32 elsewhere
    Some(buf.f_type as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory's filesystem is recognised, and a file changed just now is not
    /// settled while one changed long before the read is.
    #[test]
    fn a_just_changed_file_is_not_settled() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, "x").unwrap();
        let meta = std::fs::metadata(&f).unwrap();
        assert!(!settled(SystemTime::now(), &f, &meta));
        let w = window(&f, &meta);
        assert!(w == LOCAL_WINDOW || w == RACY_WINDOW);
        assert!(settled(
            SystemTime::now() + RACY_WINDOW + Duration::from_millis(1),
            &f,
            &meta
        ));
    }
}
