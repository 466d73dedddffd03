//! The kernel's rule that keeps a confined hook away from the service (issue 57): a seccomp
//! filter every confined hook process carries, with Landlock, from before its handler runs.
//!
//! Landlock (ABI 7) does not mediate `connect()` to a socket that has a path, so a confined hook
//! could reach `hooks.sock` (or any pathname socket of its user) and drive the control API; the
//! service then had to guess from process ancestry and flags whether a caller was a hook, and
//! guesses have neighbours (an orphan of a hook under a service that itself runs with
//! `no_new_privs`, issue 57 row 2). The filter takes the guess away: a confined process cannot
//! make a Unix socket at all.
//!
//! - `socket(AF_UNIX, …)` fails with `EACCES`. Socket pairs (`socketpair`, which asyncio and
//!   `subprocess` use) still work: they are connected to each other, never to a path. Abstract
//!   Unix sockets are already scoped by Landlock (ABI 6, `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`).
//! - `io_uring_setup` fails with `EACCES`: io_uring can make sockets without the `socket` call
//!   the filter sees.
//! - Any system call of another ABI (i386's `int 0x80`, with its `socketcall`; x32) fails with
//!   `EACCES`: the filter reads numbers of the native ABI only.
//!
//! A filter cannot be removed, is inherited by every process the hook starts and survives its
//! parent's exit, so a confined hook's orphans carry it too, whatever the service runs with.
//! TCP is Landlock's: a `connect:` grant that would reach the service's own listener is refused
//! when the hook loads (`policy.rs`). The program is written here once: `handler/spawn.rs`
//! installs it in an executable's child before the exec ([`install`]), and the Python runner
//! installs the same instructions, sent in its hello ([`program`]).

use serde_json::{Value, json};

/// One BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

const RET_ALLOW: u32 = 0x7fff_0000; // SECCOMP_RET_ALLOW
const RET_ERRNO: u32 = 0x0005_0000; // SECCOMP_RET_ERRNO

/// Offsets in `struct seccomp_data`: the call's number, the ABI, the first argument's low word.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;

/// The native ABI (`AUDIT_ARCH_*`).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the confined hooks' seccomp filter knows x86_64 and aarch64 only");

/// x32's calls are the native ABI's with this bit set.
const X32_BIT: u32 = 0x4000_0000;

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// The filter. Jumps are relative to the next instruction; the last one refuses.
const PROGRAM: [Insn; 10] = [
    insn(LD_W_ABS, 0, 0, ARCH),                           // 0
    insn(JEQ_K, 0, 7, AUDIT_ARCH),                        // 1: another ABI -> 9
    insn(LD_W_ABS, 0, 0, NR),                             // 2
    insn(JGE_K, 5, 0, X32_BIT),                           // 3: x32 -> 9
    insn(JEQ_K, 0, 2, libc::SYS_socket as u32),           // 4: not socket -> 7
    insn(LD_W_ABS, 0, 0, ARG0_LOW),                       // 5
    insn(JEQ_K, 2, 1, libc::AF_UNIX as u32),              // 6: AF_UNIX -> 9, else 8
    insn(JEQ_K, 1, 0, libc::SYS_io_uring_setup as u32),   // 7: io_uring -> 9
    insn(RET_K, 0, 0, RET_ALLOW),                         // 8
    insn(RET_K, 0, 0, RET_ERRNO | (libc::EACCES as u32)), // 9
];

/// `struct sock_fprog`.
#[repr(C)]
struct Fprog {
    len: libc::c_ushort,
    filter: *const Insn,
}

/// Installs the filter on the calling thread (the whole process when it has one thread, as a
/// child between fork and exec and the Python runner at confinement have). Needs
/// `no_new_privs` (set by [`super::landlock::restrict_self`] first). Only a system call: safe
/// between fork and exec.
pub fn install() -> std::io::Result<()> {
    let prog = Fprog {
        len: PROGRAM.len() as libc::c_ushort,
        filter: PROGRAM.as_ptr(),
    };
    // SAFETY: prctl reads `prog` and the static program it points to, both alive for the call.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &prog as *const Fprog as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The program as `[[code, jt, jf, k], …]`, for the Python runner, which installs exactly
/// these instructions with `ctypes`.
pub fn program() -> Value {
    Value::Array(
        PROGRAM
            .iter()
            .map(|i| json!([i.code, i.jt, i.jf, i.k]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each jump lands inside the program, and the last two instructions are its two answers.
    #[test]
    fn every_jump_lands_in_the_program() {
        for (at, i) in PROGRAM.iter().enumerate() {
            if i.code & 0x07 == 0x05 {
                assert!(at + 1 + (i.jt as usize) < PROGRAM.len(), "insn {at}: jt");
                assert!(at + 1 + (i.jf as usize) < PROGRAM.len(), "insn {at}: jf");
            }
        }
        assert_eq!(PROGRAM[8], insn(RET_K, 0, 0, RET_ALLOW));
        assert_eq!(PROGRAM[9].k & 0xffff_0000, RET_ERRNO);
    }

    /// In a child process (the filter cannot be removed): a Unix socket is refused with EACCES,
    /// a socket pair and a TCP socket are not.
    #[test]
    fn a_filtered_process_cannot_make_a_unix_socket_but_can_make_pairs_and_tcp() {
        // SAFETY: the child only makes system calls and exits; it touches no lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let code = unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || install().is_err() {
                    10
                } else if libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) >= 0 {
                    11
                } else if *libc::__errno_location() != libc::EACCES {
                    12
                } else {
                    let mut pair = [0; 2];
                    if libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) != 0
                    {
                        13
                    } else if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) < 0 {
                        14
                    } else {
                        0
                    }
                }
            };
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "status {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "see the codes in the child");
    }
}
