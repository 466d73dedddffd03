//! Who is on the other end of an API connection, and whether it is one of this service's own
//! hook processes (issues 46, 57). A confined hook never gets here: the kernel keeps it from
//! making a Unix socket (`sandbox/seccomp.rs`) and from the service's TCP port (`connect:`
//! grants of it are refused). What is left to tell apart is an unconfined hook's process,
//! which runs as the operator and can do what the operator can: it is refused what changes what
//! runs and the agent's events while it is recognisable, which is a courtesy, not a boundary
//! (README, "What a hook can reach").
//!
//! The process is found by the kernel's word, not by anything the caller sends:
//! - on the Unix socket, the peer credentials taken when the connection was accepted
//!   (`SO_PEERCRED`, and `SO_PEERPIDFD` so that a pid reused after the caller exited is not
//!   mistaken for it);
//! - on TCP, the socket of the client's end in this network namespace's `/proc/net/tcp{,6}`
//!   (the address and port the service sees as remote are that socket's local ones), its owner's
//!   uid there, then the process holding that socket (`/proc/PID/fd`), once per connection.
//!
//! A process is a hook process when this service is among its ancestors (every hook process
//! the service starts is its descendant until its parent exits). No flag is read as a sign of
//! a hook: `no_new_privs` was (every confined hook has it), but the service may have it too (a
//! systemd unit's `NoNewPrivileges=yes`), and so may the agent (issue 57 row 2).
//!
//! Everything here reads `/proc`: callers run it off the runtime threads (`spawn_blocking`).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The peer of one accepted connection, as the kernel told it at accept time.
#[derive(Debug, Clone)]
pub enum Peer {
    /// A Unix-socket peer.
    Unix {
        /// Its pid (`SO_PEERCRED`), when the kernel tells.
        pid: Option<i32>,
        /// A pidfd of that process (`SO_PEERPIDFD`, Linux 6.5+): it refers to that process
        /// and no other, even after the pid is reused.
        pidfd: Option<Arc<OwnedFd>>,
    },
    /// A TCP peer.
    Tcp {
        /// The service's end.
        local: SocketAddr,
        /// The client's end.
        remote: SocketAddr,
        /// Its socket's owner, looked up once per connection ([`Peer::tcp_owner`]).
        owner: Arc<OnceLock<TcpOwner>>,
        /// The process holding that socket, looked up once per connection when asked for
        /// (scanning `/proc/*/fd` costs more than a table read).
        holder: Arc<OnceLock<Option<i32>>>,
    },
}

/// The local process behind a TCP connection, as `/proc` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpOwner {
    /// The client's socket is not in this network namespace: another machine (or namespace).
    Remote,
    /// A socket of this machine: the uid that made it, and its inode.
    Local {
        /// The socket's uid (`/proc/net/tcp`).
        uid: u32,
        /// The socket's inode, to find the process holding it.
        inode: u64,
    },
}

/// `SO_PEERPIDFD` (include/uapi/asm-generic/socket.h); not in every libc release.
const SO_PEERPIDFD: libc::c_int = 77;

impl Peer {
    /// The peer of an accepted Unix-socket connection.
    pub fn of_unix(fd: RawFd) -> Self {
        Peer::Unix {
            pid: peer_pid(fd),
            pidfd: peer_pidfd(fd).map(Arc::new),
        }
    }

    /// The peer of an accepted TCP connection (nothing read yet).
    pub fn of_tcp(local: SocketAddr, remote: SocketAddr) -> Self {
        Self::of_tcp_known(local, remote, None)
    }

    /// [`Peer::of_tcp`] with its owner already looked up (by the listener, at accept).
    pub fn of_tcp_known(local: SocketAddr, remote: SocketAddr, owner: Option<TcpOwner>) -> Self {
        Peer::Tcp {
            local,
            remote,
            owner: Arc::new(owner.map(OnceLock::from).unwrap_or_default()),
            holder: Arc::default(),
        }
    }

    /// A TCP peer's owner (looked up on the first call, then kept for the connection); `None`
    /// on a Unix socket. Blocking: reads `/proc`.
    pub fn tcp_owner(&self) -> Option<TcpOwner> {
        let Peer::Tcp {
            local,
            remote,
            owner,
            ..
        } = self
        else {
            return None;
        };
        Some(*owner.get_or_init(|| match socket_entry(*remote, *local) {
            None => TcpOwner::Remote,
            Some((inode, uid)) => TcpOwner::Local { uid, inode },
        }))
    }

    /// Whether [`Peer::tcp_owner`] is known without reading `/proc` (looked up already, or
    /// not a TCP peer).
    pub fn tcp_owner_known(&self) -> bool {
        match self {
            Peer::Tcp { owner, .. } => owner.get().is_some(),
            Peer::Unix { .. } => true,
        }
    }

    /// The pid of the process on the other end, when this machine can tell (a TCP peer's
    /// lookup is kept for the connection). Blocking: reads `/proc`.
    fn pid(&self) -> Option<i32> {
        match self {
            Peer::Unix { pid, .. } => *pid,
            Peer::Tcp { holder, .. } => match self.tcp_owner()? {
                TcpOwner::Remote => None,
                TcpOwner::Local { inode, .. } => *holder.get_or_init(|| owner_of_socket(inode)),
            },
        }
    }

    /// Whether the process that connected over the Unix socket has exited since (its pid may
    /// now name another); `false` on TCP, where no pidfd is held.
    fn gone(&self) -> bool {
        matches!(self, Peer::Unix { pidfd: Some(fd), .. } if !alive(fd.as_raw_fd()))
    }

    /// The working directory of the process on the other end, read from the kernel
    /// (`/proc/PID/cwd`); `None` when it cannot be known (another machine, a process gone).
    /// Blocking: reads `/proc`.
    pub fn cwd(&self) -> Option<PathBuf> {
        let pid = self.pid()?;
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        // Read again after: the pid still named the caller throughout.
        (!self.gone()).then_some(cwd)
    }
}

/// A caller found to be one of this service's hook processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookCaller {
    /// Its pid.
    pub pid: i32,
    /// Its command line's first word, for the refusal and the log.
    pub command: String,
    /// How it was recognised.
    pub why: &'static str,
}

/// What is known of the caller of a request that would change what the service runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not a hook process of this service (or not one this machine can tell: a remote client).
    Outside,
    /// One of this service's hook processes (or its descendant).
    Hook(HookCaller),
    /// The process that connected is gone (exited, or its pid reused): refused, since a pid
    /// read now could name another process.
    Gone,
}

/// Whether `peer` is one of this service's hook processes. Blocking: reads `/proc`.
pub fn judge(peer: &Peer) -> Verdict {
    match peer {
        Peer::Unix { pid, pidfd } => {
            let Some(pid) = *pid else {
                return Verdict::Gone;
            };
            if pidfd.as_ref().is_some_and(|fd| !alive(fd.as_raw_fd())) {
                return Verdict::Gone;
            }
            let verdict = judge_pid(pid);
            // Checked again after /proc was read: the pid still named the caller throughout.
            if pidfd.as_ref().is_some_and(|fd| !alive(fd.as_raw_fd())) {
                return Verdict::Gone;
            }
            verdict
        }
        Peer::Tcp { .. } => match (peer.tcp_owner(), peer.pid()) {
            // Not a socket of this network namespace: a client on another machine (or in
            // another namespace), which no hook of this service is.
            (None | Some(TcpOwner::Remote), _) => Verdict::Outside,
            (Some(TcpOwner::Local { .. }), Some(pid)) => judge_pid(pid),
            // The socket exists here but no process we can see holds it: it was passed to or
            // kept by a process of another user, or closed meanwhile.
            (Some(TcpOwner::Local { .. }), None) => Verdict::Gone,
        },
    }
}

/// [`judge`] for a process known by pid.
pub fn judge_pid(pid: i32) -> Verdict {
    let me = std::process::id() as i32;
    if pid == me {
        return Verdict::Outside;
    }
    let mut at = pid;
    for _ in 0..256 {
        match parent_of(at) {
            Some(p) if p == me => {
                return Verdict::Hook(caller(pid, "a descendant of the service"));
            }
            Some(p) if p > 1 => at = p,
            _ => break,
        }
    }
    if parent_of(pid).is_none() {
        return Verdict::Gone;
    }
    Verdict::Outside
}

fn caller(pid: i32, why: &'static str) -> HookCaller {
    let command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|b| {
            let first = b.split(|c| *c == 0).next().unwrap_or_default();
            String::from_utf8_lossy(first).into_owned()
        })
        .unwrap_or_default();
    HookCaller { pid, command, why }
}

/// The parent pid of `pid` (`/proc/PID/stat`, field 4, after the command in parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Whether the process behind `pidfd` still runs (signal 0 through the pidfd).
fn alive(pidfd: RawFd) -> bool {
    // SAFETY: pidfd_send_signal with signal 0 and no info only checks that the process exists
    // and may be signalled; the descriptor is open for as long as the borrowed Arc lives.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The pid of the process that connected a Unix socket (`SO_PEERCRED`).
pub fn peer_pid(fd: RawFd) -> Option<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes given; the fd is an open socket.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

fn peer_pidfd(fd: RawFd) -> Option<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: pidfd and len are valid for writes of the sizes given; the fd is an open socket.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: on success the kernel made a new descriptor that nothing else owns.
    (rc == 0 && pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) })
}

/// The inode and uid of the TCP socket whose local end is `local` and remote end `remote`, in
/// this network namespace. A service on a dual-stack socket (`[::]`) sees an IPv4 client as
/// `::ffff:a.b.c.d`, while the client's own socket may be an IPv4 one: both forms are looked up.
fn socket_entry(local: SocketAddr, remote: SocketAddr) -> Option<(u64, u32)> {
    let v4 = |a: SocketAddr| match a {
        SocketAddr::V6(v6) => v6
            .ip()
            .to_ipv4_mapped()
            .map(|ip| SocketAddr::new(ip.into(), v6.port())),
        SocketAddr::V4(_) => None,
    };
    let mapped = v4(local).zip(v4(remote));
    std::iter::once((local, remote)).chain(mapped).find_map(
        |(l, r)| match crate::sock_diag::lookup(l, r) {
            Ok(found) => found,
            // No sock_diag here: the table, which formats every socket.
            Err(_) => inode_in_table(l, r),
        },
    )
}

/// [`socket_entry`] in the table of the addresses' family.
fn inode_in_table(local: SocketAddr, remote: SocketAddr) -> Option<(u64, u32)> {
    let table = match local {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table).ok()?;
    let (want_local, want_remote) = (proc_addr(local), proc_addr(remote));
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == want_local && f[2] == want_remote)
            .then(|| Some((f[9].parse().ok()?, f[7].parse().ok()?)))
            .flatten()
    })
}

/// An address as `/proc/net/tcp{,6}` writes it: the address's 32-bit words in host order, in
/// hex, then `:PORT` in hex.
fn proc_addr(addr: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match addr {
        SocketAddr::V4(a) => vec![a.ip().octets()],
        SocketAddr::V6(a) => a
            .ip()
            .octets()
            .chunks(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect(),
    };
    let mut s = String::new();
    for w in words {
        s.push_str(&format!("{:08X}", u32::from_ne_bytes(w)));
    }
    format!("{s}:{:04X}", addr.port())
}

/// The first process found holding the socket `inode` (this service's own descendants are
/// looked at first: the usual case of a hook).
fn owner_of_socket(inode: u64) -> Option<i32> {
    let link = format!("socket:[{inode}]");
    let holds = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|t| t.as_os_str().as_encoded_bytes() == link.as_bytes())
            })
    };
    let pids: Vec<i32> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let (mine, others): (Vec<i32>, Vec<i32>) = pids
        .into_iter()
        .partition(|p| matches!(judge_pid(*p), Verdict::Hook(_)));
    mine.into_iter().chain(others).find(|p| holds(*p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_of_the_service_is_a_hook_and_its_parent_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let v = judge_pid(child.id() as i32);
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(v, Verdict::Hook(_)), "{v:?}");
        let parent = parent_of(std::process::id() as i32).expect("a parent");
        assert_eq!(judge_pid(parent), Verdict::Outside);
    }

    #[test]
    fn addresses_are_written_as_proc_net_tcp_writes_them() {
        let a: SocketAddr = "127.0.0.1:8787".parse().unwrap();
        assert_eq!(proc_addr(a), "0100007F:2253");
        let b: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(proc_addr(b), "00000000000000000000000001000000:0050");
    }

    /// Issue 46 row 3's neighbour: a service on a dual-stack socket sees an IPv4 client as
    /// `::ffff:127.0.0.1`; the client's socket, an IPv4 one, is still found (else a hook would
    /// pass as "another machine").
    #[test]
    fn an_ipv4_client_of_a_dual_stack_listener_is_found_by_its_socket() {
        let l = std::net::TcpListener::bind("[::]:0").expect("this machine binds [::]");
        let port = l.local_addr().unwrap().port();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, remote) = l.accept().unwrap();
        assert!(matches!(remote, SocketAddr::V6(_)), "{remote}");
        let local = s.local_addr().unwrap();
        let (inode, uid) = socket_entry(remote, local).expect("the client's IPv4 socket");
        // SAFETY: geteuid has no preconditions.
        assert_eq!(uid, unsafe { libc::geteuid() });
        assert_eq!(owner_of_socket(inode), Some(std::process::id() as i32));
        drop(c);
    }

    #[test]
    fn a_tcp_client_of_this_process_is_found_by_its_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, remote) = l.accept().unwrap();
        let (inode, _) = socket_entry(remote, l.local_addr().unwrap()).expect("in /proc/net/tcp");
        // The client is this very process: found, and not a hook of itself.
        let me = std::process::id() as i32;
        assert_eq!(owner_of_socket(inode), Some(me));
        assert_eq!(
            judge(&Peer::of_tcp(l.local_addr().unwrap(), remote)),
            Verdict::Outside
        );
        drop(c);
    }
}
