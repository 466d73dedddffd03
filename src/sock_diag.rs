//! One TCP socket of this network namespace looked up by its two ends, through the kernel's
//! `sock_diag` netlink interface (`NETLINK_SOCK_DIAG`, what `ss` uses): its uid and inode in one
//! exact lookup. `/proc/net/tcp` formats every socket of the namespace (`TIME_WAIT` ones too) for
//! each read, milliseconds on a machine whose clients open a connection per request, once per
//! connection (issue 57: the API asks who is on the other end of every local TCP connection).
//! `caller.rs` falls back to `/proc/net/tcp` when the kernel refuses this.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const INET_DIAG_NOCOOKIE: u32 = !0;

/// `struct nlmsghdr` then `struct inet_diag_req_v2`, as sent (72 bytes).
#[repr(C)]
struct Request {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    interface: u32,
    cookie: [u32; 2],
}

/// Offsets in the answer: `nlmsghdr` (16), then `inet_diag_msg`: family, state, timer, retrans
/// (4), the socket id (48), expires, rqueue, wqueue (12), uid, inode.
const ANSWER_UID: usize = 16 + 4 + 48 + 12;
const ANSWER_INODE: usize = ANSWER_UID + 4;

fn octets(addr: SocketAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match addr {
        SocketAddr::V4(a) => out[..4].copy_from_slice(&a.ip().octets()),
        SocketAddr::V6(a) => out.copy_from_slice(&a.ip().octets()),
    }
    out
}

/// The inode and uid of the TCP socket whose local end is `local` and remote end `remote` (both
/// of one family); `Ok(None)` when there is none; an error when the kernel will not answer
/// (no netlink here). Blocking: a netlink round trip (no file system).
pub fn lookup(local: SocketAddr, remote: SocketAddr) -> std::io::Result<Option<(u64, u32)>> {
    let err = std::io::Error::last_os_error;
    let family = match local {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: a new socket; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(err());
    }
    // SAFETY: the kernel just made it; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let req = Request {
        len: std::mem::size_of::<Request>() as u32,
        kind: SOCK_DIAG_BY_FAMILY,
        flags: NLM_F_REQUEST,
        seq: 1,
        pid: 0,
        family: family as u8,
        protocol: libc::IPPROTO_TCP as u8,
        ext: 0,
        pad: 0,
        states: !0,
        sport: local.port().to_be_bytes(),
        dport: remote.port().to_be_bytes(),
        src: octets(local),
        dst: octets(remote),
        interface: 0,
        cookie: [INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE],
    };
    // SAFETY: sockaddr_nl zeroed is the kernel's address (pid 0, no groups).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `req` and `kernel` are valid for the sizes given for the call's duration.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            (&req as *const Request).cast(),
            std::mem::size_of::<Request>(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(err());
    }
    let mut answer = [0u8; 4096];
    // SAFETY: `answer` is valid for writes of its length.
    let got = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            answer.as_mut_ptr().cast(),
            answer.len(),
            0,
        )
    };
    let got = usize::try_from(got).map_err(|_| err())?;
    // An error message (ENOENT: no such socket) or anything short is "not found".
    let kind = u16::from_ne_bytes([answer[4], answer[5]]);
    if got < ANSWER_INODE + 4 || kind != SOCK_DIAG_BY_FAMILY {
        return Ok(None);
    }
    let word = |at: usize| {
        u32::from_ne_bytes([answer[at], answer[at + 1], answer[at + 2], answer[at + 3]])
    };
    Ok(Some((u64::from(word(ANSWER_INODE)), word(ANSWER_UID))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_has_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<Request>(), 16 + 56);
    }

    /// A connection of this process: its client socket is found, with this process's uid and the
    /// inode `/proc/self/fd` shows; a socket that does not exist is not.
    #[test]
    fn a_socket_of_this_process_is_found_by_its_ends() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, remote) = l.accept().unwrap();
        let (inode, uid) = lookup(remote, l.local_addr().unwrap())
            .unwrap()
            .expect("found");
        // SAFETY: geteuid has no preconditions.
        assert_eq!(uid, unsafe { libc::geteuid() });
        let link = std::fs::read_link(format!("/proc/self/fd/{}", c.as_raw_fd())).unwrap();
        assert_eq!(link.to_string_lossy(), format!("socket:[{inode}]"));
        let nobody: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(lookup(nobody, l.local_addr().unwrap()).unwrap(), None);
    }
}
