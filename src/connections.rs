//! How many API connections the service holds, from whom, and for how long (issue 57 row 6: a
//! hook that held 1,200 idle connections to `hooks.sock` put the service at its 1,024-descriptor
//! limit, and every request, the agent's decisions included, hung).
//!
//! - The open-file limit is raised to the hard limit when the service starts
//!   ([`raise_open_files`]).
//! - A listener is wrapped ([`Guarded`]): at most [`total_cap`] connections at once (half the
//!   open-file limit: the other half is for hooks, pipes and files), and at most
//!   [`PER_CALLER`] from one caller (a process on the Unix socket, by `SO_PEERCRED`; a user on
//!   loopback TCP, by `/proc/net/tcp`; an address otherwise). A connection over either cap is
//!   closed at once, and said in the log at most every ten seconds.
//! - A connection that sends nothing is closed: [`FIRST_BYTE`] after it opened, [`BETWEEN`]
//!   after an answer was written. While a request is being answered no timer runs, so a long
//!   collect is never cut; a request that sends bytes but never ends is cut after
//!   [`REQUEST_LIMIT`].

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Connections one caller may hold at once. The agent's plugin may hold one per thread.
pub const PER_CALLER: usize = 512;
/// How long a new connection may stay silent.
pub const FIRST_BYTE: Duration = Duration::from_secs(10);
/// How long a kept-alive connection may stay silent after an answer.
pub const BETWEEN: Duration = Duration::from_secs(60);
/// The longest a request may take from its first byte to the start of its answer: the longest
/// collect deadline and a margin.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(330);

/// Raises the soft limit on open files to the hard limit (the service holds a descriptor per
/// connection, per hook process pipe and per watched directory). Returns the limit now.
pub fn raise_open_files() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                tracing::debug!(
                    from = lim.rlim_cur,
                    to = lim.rlim_max,
                    "raised the open-file limit"
                );
                return lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// The most connections the API holds at once: half the open-file limit, within 64..=65,536.
pub fn total_cap() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as in raise_open_files.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    ((cur / 2) as usize).clamp(64, 65_536)
}

/// Who a connection comes from, for [`PER_CALLER`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    /// A process, on the Unix socket.
    Pid(i32),
    /// A user, on loopback TCP.
    Uid(u32),
    /// An address, on TCP from elsewhere.
    Addr(std::net::IpAddr),
    /// Not known (counted against the total only).
    Unknown,
}

/// An accepted stream that can say who is on its other end.
pub trait CallerOf {
    /// Who is behind this stream, and for TCP its socket's owner (kept for the request guard).
    /// Blocking when [`CallerOf::reads_proc`] (loopback TCP asks the kernel, `sock_diag.rs`):
    /// then called on a blocking thread.
    fn caller(&self) -> (Caller, Option<crate::caller::TcpOwner>);

    /// Whether [`CallerOf::caller`] reads `/proc`.
    fn reads_proc(&self) -> bool {
        false
    }
}

impl CallerOf for tokio::net::UnixStream {
    fn caller(&self) -> (Caller, Option<crate::caller::TcpOwner>) {
        use std::os::fd::AsRawFd;
        let pid = crate::caller::peer_pid(self.as_raw_fd());
        (pid.map_or(Caller::Unknown, Caller::Pid), None)
    }
}

impl CallerOf for tokio::net::TcpStream {
    fn reads_proc(&self) -> bool {
        self.peer_addr()
            .is_ok_and(|a| a.ip().is_loopback() || is_mapped_loopback(a.ip()))
    }

    fn caller(&self) -> (Caller, Option<crate::caller::TcpOwner>) {
        let (Ok(local), Ok(remote)) = (self.local_addr(), self.peer_addr()) else {
            return (Caller::Unknown, None);
        };
        if !remote.ip().is_loopback() && !is_mapped_loopback(remote.ip()) {
            return (Caller::Addr(remote.ip()), None);
        }
        let owner = crate::caller::Peer::of_tcp(local, remote).tcp_owner();
        match owner {
            Some(crate::caller::TcpOwner::Local { uid, .. }) => (Caller::Uid(uid), owner),
            _ => (Caller::Addr(remote.ip()), owner),
        }
    }
}

fn is_mapped_loopback(ip: std::net::IpAddr) -> bool {
    matches!(ip, std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()))
}

/// The counts behind the caps, shared by a listener and its connections.
#[derive(Debug)]
struct Slots {
    total: AtomicUsize,
    max: usize,
    per_caller: Mutex<HashMap<Caller, usize>>,
    per_caller_max: usize,
    last_warned: Mutex<Option<Instant>>,
    /// [`FIRST_BYTE`] and [`BETWEEN`] (shorter in tests).
    silences: (Duration, Duration),
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Caller, usize>> {
        self.per_caller.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for `caller`, or why not.
    fn take(self: &Arc<Self>, caller: Caller) -> Result<Slot, &'static str> {
        let mut per = self.lock();
        if self.total.load(Ordering::Relaxed) >= self.max {
            return Err("the service holds as many connections as it may");
        }
        if caller != Caller::Unknown {
            let n = per.entry(caller.clone()).or_insert(0);
            if *n >= self.per_caller_max {
                return Err("this caller holds as many connections as one caller may");
            }
            *n += 1;
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            slots: self.clone(),
            caller,
        })
    }

    fn warn(&self, caller: &Caller, why: &str) {
        let mut last = self.last_warned.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!(
                ?caller,
                total = self.total.load(Ordering::Relaxed),
                max = self.max,
                per_caller = self.per_caller_max,
                "refused an API connection: {why} (said at most every 10 s)"
            );
        }
    }
}

/// One connection's place in the counts, given back when it closes.
#[derive(Debug)]
struct Slot {
    slots: Arc<Slots>,
    caller: Caller,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.total.fetch_sub(1, Ordering::Relaxed);
        if self.caller != Caller::Unknown {
            let mut per = self.slots.lock();
            if let Some(n) = per.get_mut(&self.caller) {
                *n -= 1;
                if *n == 0 {
                    per.remove(&self.caller);
                }
            }
        }
    }
}

/// A listener whose connections are capped and timed out (see the module's comment).
#[derive(Debug)]
pub struct Guarded<L> {
    inner: L,
    slots: Arc<Slots>,
}

impl<L> Guarded<L> {
    /// `inner` with the caps of this process ([`total_cap`], [`PER_CALLER`]).
    pub fn new(inner: L) -> Self {
        Self::with_caps(inner, total_cap(), PER_CALLER, (FIRST_BYTE, BETWEEN))
    }

    /// `inner` with the given caps and silences (tests).
    pub fn with_caps(
        inner: L,
        max: usize,
        per_caller: usize,
        silences: (Duration, Duration),
    ) -> Self {
        Self {
            inner,
            slots: Arc::new(Slots {
                total: AtomicUsize::new(0),
                max,
                per_caller: Mutex::new(HashMap::new()),
                per_caller_max: per_caller,
                last_warned: Mutex::new(None),
                silences,
            }),
        }
    }

    /// The listener inside.
    pub fn get_ref(&self) -> &L {
        &self.inner
    }
}

impl<L> axum::serve::Listener for Guarded<L>
where
    L: axum::serve::Listener,
    L::Io: CallerOf + Sync,
{
    type Io = GuardedIo<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, addr) = self.inner.accept().await;
            // Loopback TCP's caller is looked up off the runtime's threads (it reads /proc).
            let (io, (caller, owner)) = if io.reads_proc() {
                let io = Arc::new(io);
                let found = {
                    let io = io.clone();
                    tokio::task::spawn_blocking(move || io.caller())
                        .await
                        .unwrap_or((Caller::Unknown, None))
                };
                let Some(io) = Arc::into_inner(io) else {
                    continue; // cannot happen: the blocking task ended and dropped its clone
                };
                (io, found)
            } else {
                let found = io.caller();
                (io, found)
            };
            match self.slots.take(caller.clone()) {
                Ok(slot) => {
                    let mut io = GuardedIo::new(io, slot);
                    io.owner = owner;
                    return (io, addr);
                }
                Err(why) => {
                    self.slots.warn(&caller, why);
                    drop(io);
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// An accepted connection, holding its slot, closed when silent too long.
#[derive(Debug)]
pub struct GuardedIo<S> {
    io: S,
    _slot: Slot,
    /// When the connection is cut unless it makes progress.
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// How long it may stay silent after an answer.
    between: Duration,
    /// A request has started (bytes read) and its answer is not written yet: no silence timer,
    /// only [`REQUEST_LIMIT`].
    answering: bool,
    /// A TCP connection's socket owner, looked up at accept (handed to the request guard).
    owner: Option<crate::caller::TcpOwner>,
}

impl<S> GuardedIo<S> {
    fn new(io: S, slot: Slot) -> Self {
        let (first_byte, between) = slot.slots.silences;
        Self {
            io,
            _slot: slot,
            deadline: Box::pin(tokio::time::sleep(first_byte)),
            between,
            answering: false,
            owner: None,
        }
    }

    /// A TCP connection's socket owner, when the listener looked it up.
    pub fn owner(&self) -> Option<crate::caller::TcpOwner> {
        self.owner
    }

    /// The stream inside.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    fn arm(&mut self, after: Duration) {
        self.deadline
            .as_mut()
            .reset(tokio::time::Instant::now() + after);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before && !self.answering {
                    // A request begins: no silence timer until its answer, only the limit.
                    self.answering = true;
                    self.arm(REQUEST_LIMIT);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if self.deadline.as_mut().poll(cx).is_ready() {
                    let what = if self.answering {
                        "a request that did not end within the request limit"
                    } else {
                        "a connection silent for too long"
                    };
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            // An answer is going out: the next silence starts now.
            self.answering = false;
            let between = self.between;
            self.arm(between);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.answering = false;
            let between = self.between;
            self.arm(between);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(80));

    #[test]
    fn a_caller_over_its_cap_is_refused_and_a_closed_connection_gives_its_slot_back() {
        let g = Guarded::with_caps((), 3, 2, QUICK);
        let a1 = g.slots.take(Caller::Pid(1)).unwrap();
        let _a2 = g.slots.take(Caller::Pid(1)).unwrap();
        assert!(g.slots.take(Caller::Pid(1)).is_err(), "a third from pid 1");
        let _b = g.slots.take(Caller::Pid(2)).unwrap();
        assert!(g.slots.take(Caller::Pid(3)).is_err(), "over the total");
        drop(a1);
        assert!(g.slots.take(Caller::Pid(3)).is_ok(), "a slot came back");
    }
}

#[cfg(test)]
mod silence {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const QUICK: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(80));

    /// A connection that never sends is cut; one that sent a request is not cut while its
    /// answer takes longer than the silences; after the answer the silence counts again.
    #[tokio::test]
    async fn silence_is_cut_but_a_slow_answer_is_not() {
        let g = Guarded::with_caps((), 8, 8, QUICK);
        let (client, server) = tokio::io::duplex(1024);
        let mut io = GuardedIo::new(server, g.slots.take(Caller::Pid(1)).unwrap());
        let mut buf = [0u8; 16];
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        drop((io, client));

        let (mut client, server) = tokio::io::duplex(1024);
        let mut io = GuardedIo::new(server, g.slots.take(Caller::Pid(1)).unwrap());
        client.write_all(b"GET").await.unwrap();
        assert_eq!(io.read(&mut buf).await.unwrap(), 3);
        // The answer takes three times the silences: no cut meanwhile.
        let slow = tokio::time::timeout(Duration::from_millis(300), io.read(&mut buf)).await;
        assert!(
            slow.is_err(),
            "cut while a request was being answered: {slow:?}"
        );
        io.write_all(b"200").await.unwrap();
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
