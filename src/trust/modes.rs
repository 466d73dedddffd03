//! The ownership and mode rule for what a hook runs, as Debian's OpenSSH applies it to
//! `~/.ssh` (its "user-group-modes" rule): a file or directory must be owned by the service
//! user or root and not writable by others; writable by its group is fine only when that group
//! is the owner's *private* group (the owner's primary group, with no other member). That is
//! what a default Ubuntu or Fedora account gets under umask 002 (0775 directories, 0664 files,
//! one group per user), and a group somebody else is in still refuses.
//!
//! The rule covers directories and code (see [`crate::trust::files`]), not the data files a
//! hook writes for itself. Group facts come from the system's user database (NSS: `getpwuid_r`,
//! `getgrgid_r`, and `getpwent` for primary members); they are cached for a few seconds.

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a private-group answer is reused.
const CACHE_FOR: Duration = Duration::from_secs(5);

/// `(owner uid, gid)` -> (when asked, whether the group is the owner's private group).
type PrivateCache = HashMap<(u32, u32), (Instant, bool)>;
/// Answers of [`is_private_group`], reused for [`CACHE_FOR`].
static PRIVATE: Mutex<Option<PrivateCache>> = Mutex::new(None);
/// Serialises `setpwent`/`getpwent`/`endpwent` (their cursor is process-wide).
static PWENT: Mutex<()> = Mutex::new(());

/// Why `path` (with `meta`) is unsafe to run hooks from, or `None`. `tree` is the hook
/// directory the path belongs to: the fix offered is one command for that whole tree.
pub fn mode_problem(path: &Path, meta: &std::fs::Metadata, tree: Option<&Path>) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode() & 0o7777;
    let what = if meta.is_dir() { "directory" } else { "file" };
    let fix_path = tree.unwrap_or(path);
    let override_hint = "or start with --insecure-permissions if this is intended";
    let me = service_uid();
    let owner = meta.uid();
    if owner != me && owner != 0 {
        return Some(format!(
            "{what} {} is owned by uid {owner}, not by the service user (uid {me}) or root: that \
             user could change what this hook runs; fix: `chown -R {me} {}` ({override_hint})",
            path.display(),
            fix_path.display()
        ));
    }
    let group_w = mode & 0o020 != 0;
    let other_w = mode & 0o002 != 0;
    if !group_w && !other_w {
        return None;
    }
    if group_w && !other_w && is_private_group(owner, meta.gid()) {
        return None;
    }
    let by = match (group_w, other_w) {
        (true, true) => "group and others",
        (true, false) => "its group, which is not the owner's private group",
        _ => "others",
    };
    Some(format!(
        "{what} {} is writable by {by} (mode {mode:04o}): they could change what this hook \
         runs; fix the whole tree with `chmod -R go-w {}` ({override_hint})",
        path.display(),
        fix_path.display()
    ))
}

/// [`mode_problem`] for a path not inspected yet (following symbolic links).
pub fn path_problem(path: &Path, tree: Option<&Path>) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(meta) => mode_problem(path, &meta, tree),
        Err(e) => Some(format!("cannot inspect {}: {e}", path.display())),
    }
}

/// The uid this process runs as.
pub fn service_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `gid` is `owner`'s private group: the owner's primary group, no other user has it
/// as primary group, and it lists no member but the owner. Unknown users or groups: false.
pub fn is_private_group(owner: u32, gid: u32) -> bool {
    {
        let cache = PRIVATE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, answer)) = cache.as_ref().and_then(|c| c.get(&(owner, gid)))
            && at.elapsed() < CACHE_FOR
        {
            return *answer;
        }
    }
    let answer = ask_private_group(owner, gid);
    let mut cache = PRIVATE.lock().unwrap_or_else(|p| p.into_inner());
    let map = cache.get_or_insert_with(HashMap::new);
    if map.len() > 1024 {
        map.clear();
    }
    map.insert((owner, gid), (Instant::now(), answer));
    answer
}

fn ask_private_group(owner: u32, gid: u32) -> bool {
    let Some((name, primary)) = user_of(owner) else {
        return false;
    };
    if primary != gid {
        return false;
    }
    let Some(members) = group_members(gid) else {
        return false;
    };
    if members.iter().any(|m| *m != name) {
        return false;
    }
    !another_user_has_primary(owner, gid)
}

/// Size of the buffer handed to the `_r` lookups (grown on ERANGE up to 1 MiB).
const BUF_START: usize = 4096;

/// Runs one of the reentrant NSS lookups (`getpwuid_r`, `getgrgid_r`): `call` gets a zeroed
/// record, the buffer and the result pointer, and answers the lookup's return code. The buffer
/// grows on ERANGE up to 1 MiB. Some((record, buffer)) when an entry was found; the record's
/// pointers point into the buffer.
fn lookup_r<T>(
    mut call: impl FnMut(&mut T, &mut [u8], &mut *mut T) -> libc::c_int,
) -> Option<(T, Vec<u8>)> {
    let mut buf = vec![0u8; BUF_START];
    loop {
        // SAFETY: the records used here (passwd, group) are plain C structs of integers and
        // pointers, for which all-zero is a valid value; the lookup fills them in.
        let mut record: T = unsafe { std::mem::zeroed() };
        let mut result: *mut T = std::ptr::null_mut();
        let rc = call(&mut record, &mut buf, &mut result);
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        return Some((record, buf));
    }
}

/// The user's name and primary gid.
fn user_of(uid: u32) -> Option<(Vec<u8>, u32)> {
    // SAFETY: getpwuid_r writes into the record and into the buffer, whose length is passed.
    let (pw, _buf) = lookup_r(|pw: &mut libc::passwd, buf, result| unsafe {
        libc::getpwuid_r(uid, pw, buf.as_mut_ptr().cast(), buf.len(), result)
    })?;
    if pw.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name points into `_buf` (still alive), NUL-terminated by getpwuid_r.
    let name = unsafe { CStr::from_ptr(pw.pw_name) }.to_bytes().to_vec();
    Some((name, pw.pw_gid))
}

/// The supplementary members listed for `gid`.
fn group_members(gid: u32) -> Option<Vec<Vec<u8>>> {
    // SAFETY: as in `user_of`, for getgrgid_r.
    let (gr, _buf) = lookup_r(|gr: &mut libc::group, buf, result| unsafe {
        libc::getgrgid_r(gid, gr, buf.as_mut_ptr().cast(), buf.len(), result)
    })?;
    let mut members = Vec::new();
    let mut p = gr.gr_mem;
    // SAFETY: gr_mem is a null-terminated array of NUL-terminated strings in `_buf`.
    while !p.is_null() && !unsafe { *p }.is_null() {
        members.push(unsafe { CStr::from_ptr(*p) }.to_bytes().to_vec());
        p = unsafe { p.add(1) };
    }
    Some(members)
}

/// Whether a user other than `owner` has `gid` as primary group.
fn another_user_has_primary(owner: u32, gid: u32) -> bool {
    let _guard = PWENT.lock().unwrap_or_else(|p| p.into_inner());
    let mut found = false;
    // SAFETY: the enumeration cursor is only used under PWENT; each entry is read before the
    // next getpwent call overwrites it.
    unsafe {
        libc::setpwent();
        loop {
            let pw = libc::getpwent();
            if pw.is_null() {
                break;
            }
            if (*pw).pw_gid == gid && (*pw).pw_uid != owner {
                found = true;
                break;
            }
        }
        libc::endpwent();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_of_another_user_is_not_private() {
        let me = service_uid();
        let (_, primary) = user_of(me).expect("the service user is in the user database");
        // Another user's primary group (if any such user exists) is never ours.
        let _guard = PWENT.lock().unwrap_or_else(|p| p.into_inner());
        let mut other = None;
        unsafe {
            libc::setpwent();
            loop {
                let pw = libc::getpwent();
                if pw.is_null() {
                    break;
                }
                if (*pw).pw_uid != me && (*pw).pw_gid != primary {
                    other = Some((*pw).pw_gid);
                    break;
                }
            }
            libc::endpwent();
        }
        drop(_guard);
        if let Some(gid) = other {
            assert!(!is_private_group(me, gid));
        }
        assert!(!is_private_group(me, u32::MAX - 7));
    }
}
