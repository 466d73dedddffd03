//! Landlock through raw system calls: the kernel's ABI version, a ruleset built from a hook's
//! rules (in the service, once per handler), and the two calls a child makes between fork and
//! exec to confine itself (`no_new_privs`, `landlock_restrict_self`). The Python runner makes
//! the same calls with `ctypes` from the rules the host sends it ([`Rules`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Filesystem access rights (`LANDLOCK_ACCESS_FS_*`).
pub mod fs {
    /// Execute a file.
    pub const EXECUTE: u64 = 1 << 0;
    /// Open a file for writing.
    pub const WRITE_FILE: u64 = 1 << 1;
    /// Open a file for reading.
    pub const READ_FILE: u64 = 1 << 2;
    /// List a directory.
    pub const READ_DIR: u64 = 1 << 3;
    /// Remove a directory.
    pub const REMOVE_DIR: u64 = 1 << 4;
    /// Remove a file.
    pub const REMOVE_FILE: u64 = 1 << 5;
    /// Make a directory.
    pub const MAKE_DIR: u64 = 1 << 7;
    /// Make a regular file.
    pub const MAKE_REG: u64 = 1 << 8;
    /// Make a socket.
    pub const MAKE_SOCK: u64 = 1 << 9;
    /// Make a named pipe.
    pub const MAKE_FIFO: u64 = 1 << 10;
    /// Make a symbolic link.
    pub const MAKE_SYM: u64 = 1 << 12;
    /// Link or rename a file across directories (ABI 2).
    pub const REFER: u64 = 1 << 13;
    /// Truncate a file (ABI 3).
    pub const TRUNCATE: u64 = 1 << 14;
    /// ioctl on a device file (ABI 5).
    pub const IOCTL_DEV: u64 = 1 << 15;
    /// The rights a rule on a file (not a directory) may carry.
    pub const FILE: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;
}

/// `LANDLOCK_ACCESS_NET_BIND_TCP`.
pub const NET_BIND_TCP: u64 = 1 << 0;
/// `LANDLOCK_ACCESS_NET_CONNECT_TCP`.
pub const NET_CONNECT_TCP: u64 = 1 << 1;
/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL`.
pub const SCOPES: u64 = 0b11;
/// The oldest ABI that enforces everything a sandbox declares (TCP rules came with ABI 4).
pub const FULL_ABI: i32 = 4;

const CREATE_RULESET: libc::c_long = 444;
const ADD_RULE: libc::c_long = 445;
const RESTRICT_SELF: libc::c_long = 446;
const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: u32 = 1;
const RULE_NET_PORT: u32 = 2;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

/// The kernel's Landlock ABI version, 0 when Landlock is absent or disabled.
pub fn abi() -> i32 {
    static ABI: OnceLock<i32> = OnceLock::new();
    *ABI.get_or_init(|| {
        // SAFETY: with a null attribute and size 0 the VERSION flag only returns a number.
        let v = unsafe {
            libc::syscall(
                CREATE_RULESET,
                std::ptr::null::<RulesetAttr>(),
                0usize,
                CREATE_RULESET_VERSION,
            )
        };
        i32::try_from(v).unwrap_or(0).max(0)
    })
}

/// The filesystem rights this ABI knows.
pub fn handled_fs(abi: i32) -> u64 {
    // EXECUTE ..= MAKE_SYM (ABI 1), devices included: a hook makes none.
    let mut all = (1 << 13) - 1;
    if abi >= 2 {
        all |= fs::REFER;
    }
    if abi >= 3 {
        all |= fs::TRUNCATE;
    }
    if abi >= 5 {
        all |= fs::IOCTL_DEV;
    }
    all
}

/// The network rights this ABI knows.
pub fn handled_net(abi: i32) -> u64 {
    if abi >= 4 {
        NET_BIND_TCP | NET_CONNECT_TCP
    } else {
        0
    }
}

/// The scopes this ABI knows.
pub fn scopes(abi: i32) -> u64 {
    if abi >= 6 { SCOPES } else { 0 }
}

/// The Landlock rules of a policy, as the service enforces them and the runner receives them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rules {
    /// Filesystem rights handled (denied unless a rule grants them).
    pub handled_fs: u64,
    /// Network rights handled.
    pub handled_net: u64,
    /// Scopes (abstract UNIX sockets, signals) confined to the hook's processes.
    pub scoped: u64,
    /// The system's paths (and the files an executable needs to start) and the rights granted
    /// beneath each: root's, so their links are followed.
    pub paths: Vec<(PathBuf, u64)>,
    /// The hook's own grants, resolved by the service ([`super::pin`]) and opened without
    /// following any link: a link found on one now was made since, and is refused.
    pub grants: Vec<(PathBuf, u64)>,
    /// TCP ports and the rights granted on each.
    pub ports: Vec<(u16, u64)>,
    /// The rights of a read-only grant (the runner adds its interpreter's directories so).
    pub read_rights: u64,
}

/// A ruleset ready to be enforced by any number of children.
#[derive(Debug)]
pub struct Ruleset {
    fd: OwnedFd,
}

impl Ruleset {
    /// The descriptor a child passes to [`restrict_self`] (close-on-exec: no program inherits
    /// it).
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn last_error(what: &str) -> std::io::Error {
    let e = std::io::Error::last_os_error();
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Builds the ruleset of `rules` (a path that does not exist is left out: nothing to grant).
pub fn build(rules: &Rules) -> std::io::Result<Ruleset> {
    let attr = RulesetAttr {
        handled_access_fs: rules.handled_fs,
        handled_access_net: rules.handled_net,
        scoped: rules.scoped,
    };
    // Older ABIs take a shorter attribute: the fields they know.
    let size = if rules.scoped != 0 {
        24
    } else if rules.handled_net != 0 {
        16
    } else {
        8
    };
    // SAFETY: `attr` outlives the call and `size` is at most its size.
    let fd = unsafe { libc::syscall(CREATE_RULESET, &attr as *const RulesetAttr, size, 0u32) };
    if fd < 0 {
        return Err(last_error("landlock_create_ruleset"));
    }
    // SAFETY: the call returned a new descriptor this process owns.
    let ruleset = Ruleset {
        fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
    };
    add_paths(&ruleset, &rules.paths)?;
    for (path, rights) in &rules.grants {
        add_path(&ruleset, path, *rights, true)?;
    }
    for (port, rights) in &rules.ports {
        let rule = NetPortAttr {
            allowed_access: *rights,
            port: u64::from(*port),
        };
        // SAFETY: `rule` outlives the call; the ruleset descriptor is open.
        let r = unsafe {
            libc::syscall(
                ADD_RULE,
                ruleset.raw(),
                RULE_NET_PORT,
                &rule as *const NetPortAttr,
                0u32,
            )
        };
        if r < 0 {
            return Err(last_error(&format!("landlock_add_rule (port {port})")));
        }
    }
    Ok(ruleset)
}

/// Adds `paths` (their links followed: system paths, not the hook's) to a ruleset not yet
/// enforced; one that does not exist is left out.
pub fn add_paths(ruleset: &Ruleset, paths: &[(PathBuf, u64)]) -> std::io::Result<()> {
    for (path, rights) in paths {
        add_path(ruleset, path, *rights, false)?;
    }
    Ok(())
}

fn add_path(ruleset: &Ruleset, path: &Path, rights: u64, pinned: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = if pinned {
        super::pin::open_nofollow(path).map(std::fs::File::from)
    } else {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(path)
    };
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", path.display()),
            ));
        }
    };
    let is_dir = file.metadata().map(|m| m.is_dir()).unwrap_or(false);
    let allowed = if is_dir { rights } else { rights & fs::FILE };
    let rule = PathBeneathAttr {
        allowed_access: allowed,
        parent_fd: file.as_raw_fd(),
    };
    // SAFETY: `rule` outlives the call; both descriptors are open.
    let r = unsafe {
        libc::syscall(
            ADD_RULE,
            ruleset.raw(),
            RULE_PATH_BENEATH,
            &rule as *const PathBeneathAttr,
            0u32,
        )
    };
    if r < 0 {
        return Err(last_error(&format!(
            "landlock_add_rule ({})",
            path.display()
        )));
    }
    Ok(())
}

/// Confines the calling process: `no_new_privs`, then the ruleset, then the filter that keeps
/// it from making a Unix socket ([`super::seccomp`]). Only system calls, no allocation: safe
/// between fork and exec.
pub fn restrict_self(ruleset: RawFd) -> std::io::Result<()> {
    // SAFETY: prctl and a raw system call on a descriptor the process holds; both are
    // async-signal-safe and touch no memory of ours.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(RESTRICT_SELF, ruleset, 0u32) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    super::seccomp::install()
}
