//! Dynamic-library handlers (`handler.so` / `.dylib` / `.dll`): the C ABI v1 (docs/hook-authors.md).
//!
//! ```c
//! typedef struct { uint8_t *ptr; size_t len; } HermesHookBuf;
//! uint32_t hermes_hook_abi_version(void);                          /* must return 1 */
//! int32_t  hermes_hook_handle(const uint8_t *event, size_t event_len,
//!                             const uint8_t *context_json, size_t context_len,
//!                             HermesHookBuf *out);  /* 0: out = JSON or empty; else out = message */
//! void     hermes_hook_free(HermesHookBuf buf);     /* frees what the library put in out */
//! int32_t  hermes_hook_init(const uint8_t *hook_dir, size_t len);   /* optional; non-zero refuses */
//! void     hermes_hook_shutdown(void);                                /* optional */
//! ```
//!
//! - **Private copy.** The file is copied to a unique path under the runtime directory and loaded
//!   from there (then the copy is unlinked; the mapping stays). glibc hands back an already loaded
//!   library for the same path or inode, so this is what makes a rebuilt `handler.so` at the same
//!   path really load anew on reload.
//! - **One OS thread per loaded library.** Loading, `hermes_hook_init`, every call and
//!   `hermes_hook_shutdown` run on that thread, never on the async runtime's workers. Calls reach
//!   it over a channel, one at a time, and results come back over a oneshot. Both sides poll
//!   briefly (yielding the CPU between polls) before they block, so a busy hook does not pay two
//!   thread wake-ups per event: the library thread for [`SPIN_FOR`] after each call while
//!   calls keep coming that fast, the caller for up to [`WAIT_SPIN`] while the library keeps
//!   answering that fast.
//! - **Timeouts.** A call cannot be interrupted. When the dispatcher's timeout fires, the call is
//!   left running and the handler reports [`Handler::stuck`]: the worker marks the hook `stuck` and
//!   waits in [`Handler::ready`] until the call returns; the hook gets no new calls meanwhile (its
//!   queue applies its overflow policy), then resumes.
//! - **Retirement.** When the handler is shut down or dropped (reload, removal, host stop), the
//!   library gets no new calls; after its in-flight call returns, `hermes_hook_shutdown` runs on
//!   its thread and the library stays mapped for the life of the process (never `dlclose`:
//!   unloading a Rust cdylib with thread-local destructors is unsound). Retained libraries are
//!   counted ([`retained_libraries`], metric `hermes_hooks_dylibs_retained`).
//!
//! A library that fails the ABI checks before any of its hook code ran (missing symbol, wrong
//! version) is closed again, so a broken file retried on every rescan does not pile up mappings;
//! one whose `hermes_hook_init` ran (and refused) is retained like any other.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::oneshot;

use super::api::{
    BoxFuture, Call, Handler, HandlerContext, HandlerError, HandlerResult, Report, Signals,
};

/// Most queued events handed to the library's thread at once (one wake-up for all of them).
const BATCH_LIMIT: usize = 256;

/// The ABI version this host speaks.
pub const ABI_VERSION: u32 = 1;
/// Largest result accepted from a library (it is discarded beyond, with an error).
pub const MAX_RESULT: usize = 16 * 1024 * 1024;
/// Largest error message kept from a library.
const MAX_MESSAGE: usize = 4096;
/// Time `hermes_hook_init` gets, at least.
const MIN_INIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time `hermes_hook_shutdown` gets before a host shutdown stops waiting for it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Stack of a library's thread (the size of a main thread's, for C code that expects it).
const THREAD_STACK: usize = 8 * 1024 * 1024;
/// How long a library thread keeps polling for the next call (yielding the CPU between polls)
/// before it blocks: a hook under load then takes its next call without a wake-up. Not on a
/// single CPU.
const SPIN_FOR: Duration = Duration::from_micros(50);
/// How long a call polls for its reply (yielding between polls) before the task parks, while the
/// library answers that fast: parking and waking the task costs more than a fast call. Not on a
/// single CPU; switched off while calls take longer than this.
const WAIT_SPIN: Duration = Duration::from_micros(20);

/// Libraries retired (or refused after their init ran) and kept mapped, process-wide.
static RETAINED: AtomicU64 = AtomicU64::new(0);
/// Makes every private copy's name unique within the process.
static COPY_SEQ: AtomicU64 = AtomicU64::new(0);

/// Number of dynamic libraries this process stopped calling but keeps mapped (never `dlclose`d).
pub fn retained_libraries() -> u64 {
    RETAINED.load(Ordering::Relaxed)
}

/// `HermesHookBuf` of the C ABI.
#[repr(C)]
struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

type AbiVersionFn = unsafe extern "C" fn() -> u32;
type HandleFn = unsafe extern "C" fn(*const u8, usize, *const u8, usize, *mut RawBuf) -> i32;
type FreeFn = unsafe extern "C" fn(RawBuf);
type InitFn = unsafe extern "C" fn(*const u8, usize) -> i32;
type ShutdownFn = unsafe extern "C" fn();

/// Why a library did not load; becomes a LoadReport entry (`load_failed`).
#[derive(Debug, Error)]
pub enum DylibError {
    /// The hook has no handler file.
    #[error("dynamic-library hook {hook:?} has no handler file")]
    NoFile {
        /// Hook name.
        hook: String,
    },
    /// The private copy could not be made.
    #[error("cannot copy {file} to {copy} before loading it: {source}")]
    Copy {
        /// The handler file.
        file: PathBuf,
        /// Where the copy was going.
        copy: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The loader refused the file (not a library, wrong architecture, missing dependency...).
    #[error("cannot load {file}: {message}")]
    Open {
        /// The handler file.
        file: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// A required symbol is missing.
    #[error(
        "{file} does not export {symbols} (C ABI v1 needs hermes_hook_abi_version, \
         hermes_hook_handle and hermes_hook_free)"
    )]
    MissingSymbol {
        /// The handler file.
        file: PathBuf,
        /// The missing symbol names, comma-separated.
        symbols: String,
    },
    /// `hermes_hook_abi_version` returned something else than 1.
    #[error(
        "{file} implements hook ABI version {found} (hermes_hook_abi_version); this host supports \
         version {ABI_VERSION}"
    )]
    AbiVersion {
        /// The handler file.
        file: PathBuf,
        /// What the library returned.
        found: u32,
    },
    /// `hermes_hook_init` returned non-zero.
    #[error(
        "hermes_hook_init of {file} returned {code}: the library refused to load (its own message, \
         if it wrote one, is in the service log)"
    )]
    InitFailed {
        /// The handler file.
        file: PathBuf,
        /// The return code.
        code: i32,
    },
    /// `hermes_hook_init` did not return in time.
    #[error(
        "hermes_hook_init of {file} did not return within {}; the library is not used",
        crate::time::fmt_duration(*timeout)
    )]
    InitTimeout {
        /// The handler file.
        file: PathBuf,
        /// The time it had.
        timeout: Duration,
    },
    /// The private copy is not the library this version was loaded (and approved) with: the
    /// file was replaced between the check and the copy.
    #[error(
        "{file} changed since this version of the hook was loaded; only the library it was \
         loaded (and approved) with is loaded"
    )]
    Changed {
        /// The handler file.
        file: PathBuf,
    },
    /// The thread for the library could not be started.
    #[error("cannot start a thread for hook {hook:?}: {source}")]
    Thread {
        /// Hook name.
        hook: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The library's thread ended before reporting (a bug; the library is not used).
    #[error("the thread loading {file} ended before reporting")]
    ThreadLost {
        /// The handler file.
        file: PathBuf,
    },
}

impl From<DylibError> for HandlerError {
    fn from(e: DylibError) -> Self {
        HandlerError::Load(e.to_string())
    }
}

/// Work for the library's thread.
enum Request {
    /// One call (emit_collect of a single event, or a batch of one).
    One {
        call: Call,
        reply: oneshot::Sender<HandlerResult>,
    },
    /// Several calls in order; each result is sent as soon as its call returns. The contexts are
    /// encoded on this thread, off the async runtime.
    Batch {
        events: Vec<Call>,
        replies: tokio::sync::mpsc::Sender<HandlerResult>,
        /// Which calls have started; lets the handler stop the rest.
        ctl: Arc<BatchCtl>,
    },
}

/// How far the library's thread got in a batch, and whether it must stop: one atomic word (the
/// count of calls started, and a cancelled bit), so claiming a call costs one compare-and-swap.
#[derive(Debug, Default)]
struct BatchCtl(AtomicUsize);

/// The cancelled bit of [`BatchCtl`].
const CANCELLED: usize = 1 << (usize::BITS - 1);

impl BatchCtl {
    /// The thread claims the next call; false when the batch was cancelled.
    fn claim(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & CANCELLED == 0).then_some(s + 1)
            })
            .is_ok()
    }

    /// Cancels what has not started; returns how many calls had started.
    fn cancel(&self) -> usize {
        self.0.fetch_or(CANCELLED, Ordering::AcqRel) & !CANCELLED
    }
}

/// What the library's thread needs to load.
struct Setup {
    hook: String,
    file: PathBuf,
    dir: PathBuf,
    copy_dir: PathBuf,
    /// The SHA-256 this version of the hook was loaded (and approved) with: the private copy
    /// must have it, or it is not loaded.
    want: Option<String>,
}

/// A loaded library: its entry points, valid for the life of the process once it is retained.
struct Loaded {
    /// `Some` until retained; dropping it would `dlclose`.
    lib: Option<libloading::Library>,
    handle: HandleFn,
    free: FreeFn,
    shutdown: Option<ShutdownFn>,
    /// The handler file's name, for messages.
    label: String,
}

impl Loaded {
    /// Runs one call and always hands the returned buffer back to the library.
    fn call(&self, event: &str, context: &[u8]) -> HandlerResult {
        let mut out = RawBuf {
            ptr: std::ptr::null_mut(),
            len: 0,
        };
        // SAFETY: the library exports `hermes_hook_handle` with the ABI v1 signature (checked by
        // name and version at load); the input buffers outlive the call and `out` is writable.
        let rc = unsafe {
            (self.handle)(
                event.as_ptr(),
                event.len(),
                context.as_ptr(),
                context.len(),
                &mut out,
            )
        };
        let result = if out.ptr.is_null() || out.len == 0 {
            interpret(rc, &[], &self.label)
        } else {
            // SAFETY: ABI v1: on return `out` holds `len` readable bytes owned by the library
            // until `hermes_hook_free`.
            let bytes = unsafe { std::slice::from_raw_parts(out.ptr, out.len) };
            interpret(rc, bytes, &self.label)
        };
        if !out.ptr.is_null() {
            // SAFETY: handing back exactly what the library returned, once.
            unsafe { (self.free)(out) };
        }
        result
    }

    /// No more calls: runs `hermes_hook_shutdown` and keeps the library mapped for good.
    fn retire(mut self, hook: &str) {
        if let Some(shutdown) = self.shutdown {
            // SAFETY: exported by the library with the ABI v1 signature; called once, after the
            // last call, on the thread that made every call.
            unsafe { shutdown() };
        }
        self.keep_mapped();
        tracing::info!(
            hook = %hook,
            retained = retained_libraries(),
            "{} retired: it gets no more calls and stays mapped (never unloaded)",
            self.label
        );
    }

    fn keep_mapped(&mut self) {
        if let Some(lib) = self.lib.take() {
            std::mem::forget(lib);
            RETAINED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Turns what `hermes_hook_handle` produced into a call result (fuzzed in the tests below).
pub(crate) fn interpret(rc: i32, out: &[u8], label: &str) -> HandlerResult {
    if rc != 0 {
        let mut msg = String::from_utf8_lossy(&out[..out.len().min(MAX_MESSAGE)])
            .trim()
            .to_string();
        if out.len() > MAX_MESSAGE {
            msg.push_str("...");
        }
        return Err(HandlerError::Failed(if msg.is_empty() {
            format!("{label} returned error {rc}")
        } else {
            format!("{label} returned error {rc}: {msg}")
        }));
    }
    if out.len() > MAX_RESULT {
        return Err(HandlerError::Failed(format!(
            "{label} returned a result larger than {} MiB; it was discarded",
            MAX_RESULT >> 20
        )));
    }
    let text = std::str::from_utf8(out).map_err(|e| {
        HandlerError::Failed(format!(
            "{label} returned a result that is not valid UTF-8 ({e})"
        ))
    })?;
    super::api::parse_json_result(text, &format!("the result of {label}"), "")
}

/// A file name safe to use in the private copy's name.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// Copies the library to a fresh unique path in `copy_dir`.
fn private_copy(setup: &Setup) -> Result<PathBuf, DylibError> {
    let ext = setup
        .file
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("so");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let copy = setup.copy_dir.join(format!(
        "{}-{}-{}-{nanos:09}.{ext}",
        sanitize(&setup.hook),
        std::process::id(),
        COPY_SEQ.fetch_add(1, Ordering::Relaxed),
    ));
    let fail = |source| DylibError::Copy {
        file: setup.file.clone(),
        copy: copy.clone(),
        source,
    };
    std::fs::create_dir_all(&setup.copy_dir).map_err(fail)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&setup.copy_dir, std::fs::Permissions::from_mode(0o700));
    }
    std::fs::copy(&setup.file, &copy).map_err(fail)?;
    Ok(copy)
}

#[cfg(unix)]
fn open(path: &Path) -> Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // RTLD_NOW: an unresolved symbol fails the load here, not as a crash in the middle of a call.
    // SAFETY: loading runs the library's initialisers; running the operator's hook code is what
    // this handler kind is for. It is never unloaded once its hook code ran.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
}

#[cfg(not(unix))]
fn open(path: &Path) -> Result<libloading::Library, libloading::Error> {
    // SAFETY: as above.
    unsafe { libloading::Library::new(path) }
}

/// Copies, opens and checks the library, then runs `hermes_hook_init`. On the library's thread.
fn load(setup: &Setup) -> Result<Loaded, DylibError> {
    let copy = private_copy(setup)?;
    // The copy is in the service's private directory: the bytes hashed here are the bytes
    // loaded, whatever happens to the hook's file meanwhile.
    let copied =
        std::fs::read(&copy).map(|b| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&b)));
    if copied.ok() != setup.want {
        let _ = std::fs::remove_file(&copy);
        return Err(DylibError::Changed {
            file: setup.file.clone(),
        });
    }
    let opened = open(&copy);
    // The mapping outlives the file: remove the copy now so none pile up. (Windows cannot delete
    // a loaded file; the copy stays there.)
    if cfg!(unix) || opened.is_err() {
        let _ = std::fs::remove_file(&copy);
    }
    let lib = opened.map_err(|e| DylibError::Open {
        file: setup.file.clone(),
        // The loader names the private copy; name the operator's file instead.
        message: e.to_string().replace(
            &copy.display().to_string(),
            &setup.file.display().to_string(),
        ),
    })?;
    let label = setup
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| setup.file.display().to_string());

    // SAFETY (all `get`s): the symbol types are those of the ABI v1; a library exporting these
    // names with other signatures breaks the contract it claims by its version.
    let version: Option<AbiVersionFn> =
        unsafe { lib.get::<AbiVersionFn>(b"hermes_hook_abi_version\0") }
            .ok()
            .map(|s| *s);
    let handle: Option<HandleFn> = unsafe { lib.get::<HandleFn>(b"hermes_hook_handle\0") }
        .ok()
        .map(|s| *s);
    let free: Option<FreeFn> = unsafe { lib.get::<FreeFn>(b"hermes_hook_free\0") }
        .ok()
        .map(|s| *s);
    let (Some(version), Some(handle), Some(free)) = (version, handle, free) else {
        let missing: Vec<&str> = [
            ("hermes_hook_abi_version", version.is_none()),
            ("hermes_hook_handle", handle.is_none()),
            ("hermes_hook_free", free.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, missing)| missing.then_some(name))
        .collect();
        // No hook code ran: closing it again is as safe as loading it was.
        drop(lib);
        return Err(DylibError::MissingSymbol {
            file: setup.file.clone(),
            symbols: missing.join(", "),
        });
    };
    // SAFETY: ABI v1 signature, no arguments.
    let found = unsafe { version() };
    if found != ABI_VERSION {
        drop(lib);
        return Err(DylibError::AbiVersion {
            file: setup.file.clone(),
            found,
        });
    }
    let init: Option<InitFn> = unsafe { lib.get::<InitFn>(b"hermes_hook_init\0") }
        .ok()
        .map(|s| *s);
    let shutdown: Option<ShutdownFn> = unsafe { lib.get::<ShutdownFn>(b"hermes_hook_shutdown\0") }
        .ok()
        .map(|s| *s);
    let mut loaded = Loaded {
        lib: Some(lib),
        handle,
        free,
        shutdown,
        label,
    };
    if let Some(init) = init {
        let dir = setup.dir.as_os_str().as_encoded_bytes();
        // SAFETY: ABI v1 signature; `dir` outlives the call.
        let code = unsafe { init(dir.as_ptr(), dir.len()) };
        if code != 0 {
            // Its code ran (threads, thread-locals...): keep it mapped like a retired library.
            loaded.keep_mapped();
            return Err(DylibError::InitFailed {
                file: setup.file.clone(),
                code,
            });
        }
    }
    tracing::debug!(hook = %setup.hook, file = %setup.file.display(), "dynamic library loaded from a private copy");
    Ok(loaded)
}

/// Waits for the next request, spinning briefly first (when `spin`) so a busy hook avoids a
/// wake-up per call. Also says whether it came within [`SPIN_FOR`], i.e. whether spinning
/// for the next one is likely to pay: requests that come further apart (a hook fed in bursts
/// by a fleet worker on a loaded machine) would only burn the CPU others need.
fn next_request(rx: &mpsc::Receiver<Request>, spin: bool) -> (Option<Request>, bool) {
    let start = Instant::now();
    if spin {
        loop {
            match rx.try_recv() {
                Ok(r) => return (Some(r), true),
                Err(mpsc::TryRecvError::Disconnected) => return (None, false),
                Err(mpsc::TryRecvError::Empty) => {}
            }
            if start.elapsed() >= SPIN_FOR {
                return (rx.recv().ok(), false);
            }
            std::thread::yield_now();
        }
    }
    let r = rx.recv().ok();
    (r, start.elapsed() < SPIN_FOR)
}

/// True on a machine with more than one CPU (where polling for a hand-off can pay off).
fn multi_core() -> bool {
    static MULTI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MULTI.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// The library's thread: load, report, serve calls until the handler goes away, retire.
/// Calls the library with one event, its context encoded here (on the library's thread, off the
/// async runtime) unless another hook of the event already did.
fn call_with(loaded: &Loaded, call: &Call) -> HandlerResult {
    // The last moment before the library runs it (issue 56 row 8).
    if !crate::start_gate::may_start(call.gate.as_deref()) {
        return Err(HandlerError::Expired);
    }
    match call.context.json() {
        Ok(context) => loaded.call(&call.event, context.as_bytes()),
        Err(e) => Err(HandlerError::Failed(format!(
            "cannot encode the event: {e}"
        ))),
    }
}

fn thread_main(
    setup: Setup,
    loaded_tx: oneshot::Sender<Result<(), DylibError>>,
    rx: mpsc::Receiver<Request>,
    retired_tx: oneshot::Sender<()>,
) {
    let loaded = match load(&setup) {
        Ok(l) => l,
        Err(e) => {
            let _ = loaded_tx.send(Err(e));
            return;
        }
    };
    if loaded_tx.send(Ok(())).is_err() {
        // The start gave up waiting (init too slow): nothing will ever call this library.
        loaded.retire(&setup.hook);
        return;
    }
    let mut spin = multi_core();
    loop {
        let (req, quick) = next_request(&rx, spin);
        spin = quick && multi_core();
        let Some(req) = req else { break };
        match req {
            Request::One { call, reply } => {
                let result = call_with(&loaded, &call);
                // The receiver is gone only if the hook was torn down mid-call; nothing to tell.
                let _ = reply.send(result);
            }
            Request::Batch {
                events,
                replies,
                ctl,
            } => {
                for call in events {
                    if !ctl.claim() {
                        break;
                    }
                    let result = call_with(&loaded, &call);
                    if replies.blocking_send(result).is_err() {
                        break;
                    }
                }
            }
        }
    }
    loaded.retire(&setup.hook);
    let _ = retired_tx.send(());
}

/// The dynamic-library handler of one hook (one loaded copy of the library).
pub struct DylibHandler {
    hook: String,
    label: String,
    timeout: Duration,
    /// Calls to the library's thread; dropped to retire the library.
    tx: Option<mpsc::Sender<Request>>,
    /// The reply of a call in flight; still `Some` after `call` returns only when the call was
    /// abandoned at the timeout and the hook was reloaded before it returned.
    pending: Option<oneshot::Receiver<HandlerResult>>,
    /// A library call cannot be interrupted: a stuck call is still running while the
    /// handler's thread is held by it (shown as `stuck`; no new calls meanwhile).
    stuck: bool,
    /// Fires once `hermes_hook_shutdown` has run.
    retired: Option<oneshot::Receiver<()>>,
    /// Poll for the reply before parking (the last call answered within [`WAIT_SPIN`]).
    spin_wait: bool,
    /// Restarts, stuck, superseded: shared with the hook's worker.
    signals: Arc<Signals>,
}

impl DylibHandler {
    /// Copies and loads the library on a new thread, checks its ABI and runs its optional
    /// `hermes_hook_init`; any failure is a [`HandlerError::Load`] naming the file.
    pub async fn start(ctx: HandlerContext) -> Result<Self, HandlerError> {
        ctx.check_files().await?;
        let file = ctx.handler_path.clone().ok_or_else(|| DylibError::NoFile {
            hook: ctx.name.clone(),
        })?;
        let label = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| file.display().to_string());
        let want = file
            .strip_prefix(&ctx.files.dir)
            .ok()
            .and_then(|rel| ctx.files.files.get(&rel.display().to_string()).cloned());
        let setup = Setup {
            hook: ctx.name.clone(),
            file: file.clone(),
            dir: ctx.dir.clone(),
            copy_dir: ctx.runtime_dir.join("dylib"),
            want,
        };
        let (loaded_tx, loaded_rx) = oneshot::channel();
        let (tx, rx) = mpsc::channel();
        let (retired_tx, retired_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("hook-{}", ctx.name))
            .stack_size(THREAD_STACK)
            .spawn(move || thread_main(setup, loaded_tx, rx, retired_tx))
            .map_err(|source| DylibError::Thread {
                hook: ctx.name.clone(),
                source,
            })?;
        let init_timeout = ctx.timeout.max(MIN_INIT_TIMEOUT);
        match tokio::time::timeout(init_timeout, loaded_rx).await {
            Ok(Ok(Ok(()))) => Ok(Self {
                hook: ctx.name,
                label,
                timeout: ctx.timeout,
                tx: Some(tx),
                pending: None,
                stuck: false,
                retired: Some(retired_rx),
                spin_wait: multi_core(),
                signals: ctx.signals,
            }),
            Ok(Ok(Err(e))) => Err(e.into()),
            Ok(Err(_)) => Err(DylibError::ThreadLost { file }.into()),
            Err(_) => Err(DylibError::InitTimeout {
                file,
                timeout: init_timeout,
            }
            .into()),
        }
    }

    async fn run(&mut self, call: Call) -> HandlerResult {
        let (reply, rx) = oneshot::channel();
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send(Request::One { call, reply }).is_ok());
        if !sent {
            return Err(self.thread_gone());
        }
        let sent = Instant::now();
        // Kept in `self` so that a call abandoned at the timeout can still be waited for.
        let rx = self.pending.insert(rx);
        if self.spin_wait {
            loop {
                match rx.try_recv() {
                    Ok(result) => {
                        self.pending = None;
                        return result;
                    }
                    Err(oneshot::error::TryRecvError::Closed) => break,
                    Err(oneshot::error::TryRecvError::Empty) => {}
                }
                if sent.elapsed() >= WAIT_SPIN {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let outcome = rx.await;
        self.pending = None;
        self.spin_wait = multi_core() && sent.elapsed() < WAIT_SPIN;
        outcome.unwrap_or_else(|_| Err(self.thread_gone()))
    }

    fn thread_gone(&self) -> HandlerError {
        HandlerError::Crashed(format!(
            "the thread of {} is gone; the hook cannot be called",
            self.label
        ))
    }
}

impl DylibHandler {
    /// One call, straight to the library's thread (a lone event: the fastest path).
    async fn call_one(&mut self, call: &Call, report: &mut Report<'_>) {
        match tokio::time::timeout(self.timeout, self.run(call.clone())).await {
            Ok(result) => report(0, result),
            Err(_) => {
                report(0, Err(HandlerError::TimedOut(self.timeout)));
                self.became_stuck();
                let Some(rx) = self.pending.as_mut() else {
                    return;
                };
                let started = Instant::now();
                // Biased: a result that is already there wins over a reload that came with it.
                tokio::select! {
                    biased;
                    outcome = rx => {
                        self.pending = None;
                        self.resumed(started, outcome.ok());
                    }
                    // A newer version takes over; the call keeps running until it returns.
                    _ = self.signals.wait_superseded() => {}
                }
            }
        }
    }

    /// Several calls in one hand-off: the contexts are encoded on the library's thread and the
    /// results come back in order, each under the hook's timeout (counted from the previous
    /// result). Past it the hook is stuck until the call returns; if the hook is reloaded
    /// meanwhile, the calls not started are reported [`HandlerError::NotStarted`] and go back to
    /// the queue for the new version.
    async fn call_batch(&mut self, calls: Vec<Call>, report: &mut Report<'_>) {
        let n = calls.len();
        let (replies, mut results) = tokio::sync::mpsc::channel(n);
        let ctl = Arc::new(BatchCtl::default());
        let sent = match &self.tx {
            Some(tx) => tx
                .send(Request::Batch {
                    events: calls,
                    replies,
                    ctl: ctl.clone(),
                })
                .is_ok(),
            None => false,
        };
        if !sent {
            for i in 0..n {
                report(i, Err(self.thread_gone()));
            }
            return;
        }
        let mut i = 0;
        while i < n {
            // Most results of a fast library are already there: no timer needed for those.
            let next = match results.try_recv() {
                Ok(r) => Ok(Some(r)),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => Ok(None),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                    tokio::time::timeout(self.timeout, results.recv()).await
                }
            };
            match next {
                Ok(Some(r)) => report(i, r),
                Ok(None) => {
                    for j in i..n {
                        report(j, Err(self.thread_gone()));
                    }
                    return;
                }
                Err(_) => {
                    report(i, Err(HandlerError::TimedOut(self.timeout)));
                    self.became_stuck();
                    let started = Instant::now();
                    // Biased: when the stuck call returned and the hook was reloaded by the time
                    // this task runs, the result is taken (the calls after it then run here, once)
                    // rather than discarding calls that already ran.
                    tokio::select! {
                        biased;
                        r = results.recv() => self.resumed(started, r.map(Some).unwrap_or(None)),
                        _ = self.signals.wait_superseded() => {
                            let began = ctl.cancel();
                            for j in i + 1..n {
                                report(j, if j < began {
                                    Err(HandlerError::Failed("the hook was reloaded while an earlier call was stuck; this call's result is discarded".into()))
                                } else {
                                    Err(HandlerError::NotStarted)
                                });
                            }
                            return;
                        }
                    }
                }
            }
            i += 1;
        }
    }

    fn became_stuck(&mut self) {
        self.stuck = true;
        self.signals.set_stuck(true);
        tracing::warn!(
            hook = %self.hook,
            "{} exceeded its {} timeout; a library call cannot be interrupted: the hook is stuck and gets no new calls until it returns",
            self.label,
            crate::time::fmt_duration(self.timeout)
        );
    }

    fn resumed(&mut self, since: Instant, outcome: Option<HandlerResult>) {
        self.stuck = false;
        self.signals.set_stuck(false);
        let how = match &outcome {
            Some(Ok(_)) => "succeeded".to_string(),
            Some(Err(e)) => format!("failed: {e}"),
            None => "never returned (its thread is gone)".to_string(),
        };
        tracing::info!(
            hook = %self.hook,
            "the call that exceeded the timeout returned {:.1?} later and {how} (result discarded); the hook resumes",
            since.elapsed()
        );
    }
}

impl Handler for DylibHandler {
    fn max_calls(&self) -> usize {
        BATCH_LIMIT
    }

    fn call<'a>(&'a mut self, calls: Vec<Call>, report: &'a mut Report<'_>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            match calls.len() {
                0 => {}
                1 => self.call_one(&calls[0], report).await,
                _ => self.call_batch(calls, report).await,
            }
        })
    }

    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // No new calls; the thread runs hermes_hook_shutdown after its in-flight call.
            drop(self.tx.take());
            let Some(retired) = self.retired.take() else {
                return;
            };
            if self.pending.is_some() || self.stuck {
                tracing::warn!(
                    hook = %self.hook,
                    "{} is still in a call that exceeded the timeout; hermes_hook_shutdown will run when it returns",
                    self.label
                );
                return;
            }
            if tokio::time::timeout(SHUTDOWN_GRACE, retired).await.is_err() {
                tracing::warn!(
                    hook = %self.hook,
                    "hermes_hook_shutdown of {} did not return within {}; not waiting for it",
                    self.label,
                    crate::time::fmt_duration(SHUTDOWN_GRACE)
                );
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::any_json;
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 384, failure_persistence: None, ..ProptestConfig::default() })]

        /// Fuzzed: whatever a library returns decodes to a result (rc 0) or a capped failure.
        #[test]
        fn library_answers_decode_to_a_result_or_a_failure(
            rc in prop_oneof![Just(0i32), any::<i32>()],
            out in prop_oneof![
                any::<Vec<u8>>(),
                any_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
                Just(vec![b'"'; 5000]),
            ],
        ) {
            match interpret(rc, &out, "handler.so") {
                Ok(_) => prop_assert_eq!(rc, 0),
                Err(HandlerError::Failed(msg)) => {
                    prop_assert!(!msg.is_empty());
                    prop_assert!(msg.len() < 8 * 1024, "error text is capped, got {} bytes", msg.len());
                }
                Err(other) => prop_assert!(false, "unexpected error kind {other:?}"),
            }
        }
    }

    #[test]
    fn an_oversized_library_result_is_a_failure() {
        let big = vec![b' '; 17 * 1024 * 1024];
        let err = interpret(0, &big, "handler.so").unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
    }

    #[test]
    fn interpret_results() {
        assert_eq!(interpret(0, b"", "h.so"), Ok(None));
        assert_eq!(interpret(0, b"  null ", "h.so"), Ok(None));
        assert_eq!(
            interpret(0, b"{\"a\": 1}", "h.so"),
            Ok(Some(json!({"a": 1})))
        );
        assert_eq!(
            interpret(3, b"boom\n", "h.so"),
            Err(HandlerError::Failed("h.so returned error 3: boom".into()))
        );
        assert_eq!(
            interpret(-1, b"", "h.so"),
            Err(HandlerError::Failed("h.so returned error -1".into()))
        );
        let Err(HandlerError::Failed(m)) = interpret(0, b"{nope", "h.so") else {
            panic!("bad JSON accepted")
        };
        assert!(m.contains("not one JSON value"), "{m}");
        let Err(HandlerError::Failed(m)) = interpret(0, b"\"\xff\"", "h.so") else {
            panic!("bad UTF-8 accepted")
        };
        assert!(m.contains("UTF-8"), "{m}");
    }

    /// Issue 35 item 3: what is loaded is the private copy, and only when its hash is the one
    /// the hook version was loaded (and approved) with: a library renamed over the handler after
    /// the check is refused instead of loaded.
    #[test]
    fn only_a_copy_with_the_checked_hash_is_loaded() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("handler.so");
        std::fs::write(&file, b"not really a library").unwrap();
        let setup = |want: &str| Setup {
            hook: "h".into(),
            file: file.clone(),
            dir: tmp.path().to_path_buf(),
            copy_dir: tmp.path().join("copies"),
            want: Some(want.to_string()),
        };
        let err = load(&setup(&"0".repeat(64)))
            .err()
            .expect("a changed copy is refused");
        assert!(matches!(err, DylibError::Changed { .. }), "{err}");
        let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            b"not really a library",
        ));
        let err = load(&setup(&sha)).err().expect("not a library");
        assert!(matches!(err, DylibError::Open { .. }), "{err}");
        // No copy is left behind either way.
        let left = std::fs::read_dir(tmp.path().join("copies"))
            .unwrap()
            .count();
        assert_eq!(left, 0);
    }

    #[test]
    fn sanitize_names() {
        assert_eq!(sanitize("my-hook_1"), "my-hook_1");
        assert_eq!(sanitize("a/b c"), "a_b_c");
    }
}
