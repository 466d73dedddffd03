//! A sandbox's grants pinned on the filesystem, so the kernel gets exactly what `check` shows:
//! each grant resolved once by the service, following the operator's links but refusing a link
//! in a directory the hook can write (it could have planted it: `cache -> /`); and the two
//! operations on a pinned path that never follow a link, whoever made it since: opening it for
//! a Landlock rule ([`open_nofollow`]) and making it as a directory ([`make_dirs_nofollow`]).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// How many links one grant may pass through (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// `write` and `read` resolved (in that order), or why a grant cannot be: it is, or passes
/// through, a symbolic link inside a directory the hook can write.
pub fn resolve_grants(
    write: &[PathBuf],
    read: &[PathBuf],
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), String> {
    // Where the hook's writable grants really are (links followed, to find them).
    let writable: Vec<PathBuf> = write
        .iter()
        .map(|w| resolve(w, &[]).unwrap_or_else(|_| w.clone()))
        .collect();
    let pin = |list: &[PathBuf]| -> Result<Vec<PathBuf>, String> {
        list.iter().map(|p| resolve(p, &writable)).collect()
    };
    Ok((pin(write)?, pin(read)?))
}

/// `path` with every link resolved (a missing tail kept as written, `..` taken lexically
/// there), refusing a link whose directory lies inside one of `writable`.
pub fn resolve(path: &Path, writable: &[PathBuf]) -> Result<PathBuf, String> {
    let path = std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut todo: Vec<PathBuf> = components(&path);
    todo.reverse();
    let mut cur = PathBuf::from("/");
    let mut links = 0;
    let mut missing = false;
    while let Some(c) = todo.pop() {
        if c.as_os_str() == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&c);
        if missing {
            cur = next;
            continue;
        }
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Some(w) = writable.iter().find(|w| cur.starts_with(w)) {
                    return Err(format!(
                        "{} passes through the symbolic link {}, inside {} which the hook can \
                         write (it may have made that link): the service does not follow it; \
                         delete the link (a directory the hook needs there is made again), or \
                         grant the link's target by its own path",
                        path.display(),
                        next.display(),
                        w.display()
                    ));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(format!("{}: too many levels of links", path.display()));
                }
                let target = std::fs::read_link(&next)
                    .map_err(|e| format!("cannot read the link {}: {e}", next.display()))?;
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                let mut more = components(&target);
                more.reverse();
                todo.extend(more);
            }
            Ok(_) => cur = next,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                missing = true;
                cur = next;
            }
            Err(e) => return Err(format!("cannot inspect {}: {e}", next.display())),
        }
    }
    Ok(cur)
}

/// The normal and `..` components of `p` (the root and `.` dropped).
fn components(p: &Path) -> Vec<PathBuf> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(PathBuf::from(n)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect()
}

fn c_name(name: &std::ffi::OsStr) -> std::io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in a path"))
}

fn refused_link(path: &Path, at: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "{} is a symbolic link (made after the sandbox was resolved): {} is not granted \
             through it; delete the link",
            at.display(),
            path.display()
        ),
    )
}

/// One step of a walk: `name` under `dir`, as an `O_PATH` descriptor, never following a link.
fn step(dir: &OwnedFd, name: &std::ffi::OsStr) -> std::io::Result<OwnedFd> {
    let c = c_name(name)?;
    // SAFETY: `c` is a valid C string and `dir` an open descriptor.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn is_link(fd: &OwnedFd) -> std::io::Result<bool> {
    let file = std::fs::File::from(fd.try_clone()?);
    Ok(file.metadata()?.file_type().is_symlink())
}

fn root() -> std::io::Result<OwnedFd> {
    // SAFETY: a constant C string.
    let fd = unsafe { libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the pinned `path` (`O_PATH`) one component at a time from `/`, refusing any link.
pub fn open_nofollow(path: &Path) -> std::io::Result<OwnedFd> {
    let mut fd = root()?;
    let mut at = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => {
                at.push(n);
                fd = step(&fd, n)?;
                if is_link(&fd)? {
                    return Err(refused_link(path, &at));
                }
            }
            Component::RootDir | Component::CurDir => {}
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} is not a resolved path", path.display()),
                ));
            }
        }
    }
    Ok(fd)
}

/// Makes the pinned `path` and its missing parents as directories of `mode`, one component
/// at a time from `/`, never following a link (an existing link anywhere on it is refused).
pub fn make_dirs_nofollow(path: &Path, mode: u32) -> std::io::Result<()> {
    let mut fd = root()?;
    let mut at = PathBuf::from("/");
    for c in path.components() {
        let Component::Normal(n) = c else {
            continue;
        };
        at.push(n);
        fd = match step(&fd, n) {
            Ok(next) => next,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let name = c_name(n)?;
                // SAFETY: valid C string, open descriptor.
                let r = unsafe { libc::mkdirat(fd.as_raw_fd(), name.as_ptr(), mode) };
                if r != 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::AlreadyExists {
                        return Err(std::io::Error::new(
                            e.kind(),
                            format!("mkdir {}: {e}", at.display()),
                        ));
                    }
                }
                step(&fd, n)?
            }
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", at.display()),
                ));
            }
        };
        if is_link(&fd)? {
            return Err(refused_link(path, &at));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_in_a_writable_directory_is_refused_an_operators_link_followed() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        let state = base.join("state");
        std::fs::create_dir(&state).unwrap();
        std::os::unix::fs::symlink("/", state.join("cache")).unwrap();
        let why = resolve_grants(&[state.clone(), state.join("cache")], &[]).unwrap_err();
        assert!(
            why.contains("symbolic link") && why.contains("cache"),
            "{why}"
        );
        // The operator's link outside anything the hook writes is followed and shown resolved.
        std::fs::create_dir(base.join("real")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("data")).unwrap();
        let (w, r) =
            resolve_grants(std::slice::from_ref(&state), &[base.join("data/x/../y")]).unwrap();
        assert_eq!(w, vec![state.clone()]);
        assert_eq!(r, vec![base.join("real/y")]);
        // Pinned operations refuse a link made later.
        assert!(open_nofollow(&state.join("cache")).is_err());
        assert!(make_dirs_nofollow(&state.join("cache/sub"), 0o700).is_err());
        make_dirs_nofollow(&state.join("a/b"), 0o700).unwrap();
        assert!(state.join("a/b").is_dir());
        assert!(open_nofollow(&state.join("a/b")).is_ok());
    }
}
