//! Write hermes-hooks dynamic-library hooks in Rust.
//!
//! A hook is a `cdylib` exporting the C ABI v1 of hermes-hooks. This crate writes that ABI for
//! you: write one function and export it with [`export_hook!`].
//!
//! ```no_run
//! use hermes_hooks_sdk::serde_json::{Value, json};
//!
//! fn handle(event: &str, context: &Value) -> Result<Option<Value>, String> {
//!     match event {
//!         "message:pre_route" => Ok(Some(json!({"seen": context.get("message")}))),
//!         _ => Ok(None), // no result
//!     }
//! }
//!
//! hermes_hooks_sdk::export_hook!(handle);
//! # fn main() {}
//! ```
//!
//! `Cargo.toml` of the hook:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! hermes-hooks-sdk = { path = ".../sdk" }
//! ```
//!
//! Build it and copy `target/release/lib<name>.so` to `handler.so` next to the hook's `HOOK.yaml`.
//!
//! # What the macro guarantees
//! - `Ok(Some(value))` becomes the hook's JSON result, `Ok(None)` no result, `Err(message)` an
//!   error that the host records for that call (the hook keeps running).
//! - A panic in your function is caught at the boundary (`catch_unwind`) and becomes an error
//!   result `handler panicked: <message>`; it never unwinds into the host or aborts it. This needs
//!   the default `panic = "unwind"`: do not set `panic = "abort"` in the hook's profile.
//! - Result buffers are allocated by this crate and freed by the exported `hermes_hook_free`.
//!
//! Optional hooks: `export_hook!(handle, init = my_init, shutdown = my_shutdown)` (either may be
//! given alone). `init(hook_dir)` runs once when the library is loaded, on the thread that later
//! runs every call; an `Err` refuses the load (the message is written to the service's stderr).
//! `shutdown()` runs once after the last call, when the hook is removed, reloaded or the service
//! stops.
//!
//! # Things to know
//! - Calls come one at a time, from one thread per loaded copy of the library. State kept in
//!   `static`s or `thread_local!`s persists between calls.
//! - A reload loads a *new copy* of the library (fresh statics); the old copy stays mapped in
//!   memory after its `shutdown` (unloading Rust libraries is unsafe), so keep reloads of very
//!   large libraries reasonable.
//! - A call cannot be interrupted: a call past the hook's timeout marks the hook `stuck` until it
//!   returns. Keep calls short, or hand long work to a thread of your own.

use std::panic::{AssertUnwindSafe, catch_unwind};

pub use serde_json;
pub use serde_json::Value;

/// The ABI version this crate exports.
pub const ABI_VERSION: u32 = 1;

/// What a hook function returns: a JSON result, no result, or an error message.
pub type HookResult = Result<Option<Value>, String>;

/// The signature [`export_hook!`] accepts.
pub type HandleFn = fn(&str, &Value) -> HookResult;

/// The signature of an `init` function.
pub type InitFn = fn(&std::path::Path) -> Result<(), String>;

/// A byte buffer crossing the C ABI: `{ uint8_t *ptr; size_t len; }`.
#[repr(C)]
#[derive(Debug)]
pub struct HermesHookBuf {
    /// Start of the bytes (null when empty).
    pub ptr: *mut u8,
    /// Number of bytes.
    pub len: usize,
}

impl HermesHookBuf {
    /// Hands `bytes` over to the host; it comes back through `hermes_hook_free`.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        if bytes.is_empty() {
            return Self {
                ptr: std::ptr::null_mut(),
                len: 0,
            };
        }
        let boxed: Box<[u8]> = bytes.into_boxed_slice();
        let len = boxed.len();
        let ptr = Box::into_raw(boxed).cast::<u8>();
        Self { ptr, len }
    }
}

/// Exports a Rust function as a hermes-hooks dynamic-library hook (C ABI v1).
///
/// `export_hook!(handle)` with `fn handle(event: &str, context: &Value) -> Result<Option<Value>,
/// String>`; optionally `init = f` (`fn(&Path) -> Result<(), String>`) and/or `shutdown = g`
/// (`fn()`), in that order. Use it once per library, at the crate root.
#[macro_export]
macro_rules! export_hook {
    ($handle:path $(,)?) => {
        $crate::export_hook!(@core $handle);
    };
    ($handle:path, init = $init:path $(,)?) => {
        $crate::export_hook!(@core $handle);
        $crate::export_hook!(@init $init);
    };
    ($handle:path, shutdown = $shutdown:path $(,)?) => {
        $crate::export_hook!(@core $handle);
        $crate::export_hook!(@shutdown $shutdown);
    };
    ($handle:path, init = $init:path, shutdown = $shutdown:path $(,)?) => {
        $crate::export_hook!(@core $handle);
        $crate::export_hook!(@init $init);
        $crate::export_hook!(@shutdown $shutdown);
    };
    (@core $handle:path) => {
        /// ABI version of this hook library.
        #[unsafe(no_mangle)]
        pub extern "C" fn hermes_hook_abi_version() -> u32 {
            $crate::ABI_VERSION
        }

        /// Handles one event (C ABI v1).
        ///
        /// # Safety
        /// `event`/`context` must point to `*_len` readable bytes (or be null with length 0) and
        /// `out` must be null or writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn hermes_hook_handle(
            event: *const u8,
            event_len: usize,
            context: *const u8,
            context_len: usize,
            out: *mut $crate::HermesHookBuf,
        ) -> i32 {
            let f: $crate::HandleFn = $handle;
            // SAFETY: forwarded from the caller's contract.
            unsafe { $crate::__private::handle(event, event_len, context, context_len, out, f) }
        }

        /// Frees a buffer returned by `hermes_hook_handle`.
        ///
        /// # Safety
        /// `buf` must come from `hermes_hook_handle` of this library, and be freed once.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn hermes_hook_free(buf: $crate::HermesHookBuf) {
            // SAFETY: forwarded from the caller's contract.
            unsafe { $crate::__private::free(buf) }
        }
    };
    (@init $init:path) => {
        /// Runs once at load (C ABI v1); non-zero refuses the load.
        ///
        /// # Safety
        /// `dir` must point to `len` readable bytes (or be null with length 0).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn hermes_hook_init(dir: *const u8, len: usize) -> i32 {
            let f: $crate::InitFn = $init;
            // SAFETY: forwarded from the caller's contract.
            unsafe { $crate::__private::init(dir, len, f) }
        }
    };
    (@shutdown $shutdown:path) => {
        /// Runs once after the last call (C ABI v1).
        #[unsafe(no_mangle)]
        pub extern "C" fn hermes_hook_shutdown() {
            let f: fn() = $shutdown;
            $crate::__private::shutdown(f)
        }
    };
}

/// Implementation details of [`export_hook!`]; not a stable API.
#[doc(hidden)]
pub mod __private {
    use super::*;

    /// Status returned when the hook function returned `Err`.
    pub const RC_ERROR: i32 = 1;
    /// Status returned when the hook function panicked.
    pub const RC_PANIC: i32 = 2;

    /// # Safety
    /// `ptr` must point to `len` readable bytes, or be null.
    unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
        if ptr.is_null() || len == 0 {
            &[]
        } else {
            // SAFETY: guaranteed by the caller.
            unsafe { std::slice::from_raw_parts(ptr, len) }
        }
    }

    fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
        if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "(a non-string panic payload)".to_string()
        }
    }

    /// # Safety
    /// See `hermes_hook_handle` in [`export_hook!`].
    pub unsafe fn handle(
        event: *const u8,
        event_len: usize,
        context: *const u8,
        context_len: usize,
        out: *mut HermesHookBuf,
        f: HandleFn,
    ) -> i32 {
        // SAFETY: guaranteed by the caller.
        let (event, context) = unsafe { (bytes(event, event_len), bytes(context, context_len)) };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let event = std::str::from_utf8(event)
                .map_err(|e| format!("the event name is not valid UTF-8: {e}"))?;
            let context: Value = if context.is_empty() {
                Value::Object(serde_json::Map::new())
            } else {
                serde_json::from_slice(context)
                    .map_err(|e| format!("the context is not valid JSON: {e}"))?
            };
            match f(event, &context)? {
                None => Ok(Vec::new()),
                Some(v) => {
                    serde_json::to_vec(&v).map_err(|e| format!("cannot encode the result: {e}"))
                }
            }
        }));
        let (rc, bytes) = match outcome {
            Ok(Ok(result)) => (0, result),
            Ok(Err(message)) => (RC_ERROR, message.into_bytes()),
            Err(payload) => {
                let msg = format!("handler panicked: {}", panic_message(payload.as_ref()));
                // Dropping a payload can panic in theory; keep it from unwinding out of here.
                let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
                (RC_PANIC, msg.into_bytes())
            }
        };
        if !out.is_null() {
            // SAFETY: `out` is writable per the caller's contract.
            unsafe { out.write(HermesHookBuf::from_vec(bytes)) };
        }
        rc
    }

    /// # Safety
    /// `buf` must come from [`handle`] (through [`HermesHookBuf::from_vec`]), freed once.
    pub unsafe fn free(buf: HermesHookBuf) {
        if buf.ptr.is_null() || buf.len == 0 {
            return;
        }
        let slice = std::ptr::slice_from_raw_parts_mut(buf.ptr, buf.len);
        // SAFETY: `ptr`/`len` come from `Box::<[u8]>::into_raw` in `from_vec`.
        drop(unsafe { Box::from_raw(slice) });
    }

    /// # Safety
    /// `dir` must point to `len` readable bytes, or be null.
    pub unsafe fn init(dir: *const u8, len: usize, f: InitFn) -> i32 {
        // SAFETY: guaranteed by the caller.
        let dir = unsafe { bytes(dir, len) };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            #[cfg(unix)]
            let path = {
                use std::os::unix::ffi::OsStrExt;
                std::path::PathBuf::from(std::ffi::OsStr::from_bytes(dir))
            };
            #[cfg(not(unix))]
            let path = std::path::PathBuf::from(String::from_utf8_lossy(dir).into_owned());
            f(&path)
        }));
        match outcome {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                eprintln!("hermes-hooks-sdk: init failed: {e}");
                RC_ERROR
            }
            Err(payload) => {
                eprintln!(
                    "hermes-hooks-sdk: init panicked: {}",
                    panic_message(payload.as_ref())
                );
                RC_PANIC
            }
        }
    }

    /// Runs `f`, keeping a panic from crossing the C boundary.
    pub fn shutdown(f: fn()) {
        if let Err(payload) = catch_unwind(f) {
            eprintln!(
                "hermes-hooks-sdk: shutdown panicked: {}",
                panic_message(payload.as_ref())
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn handle(event: &str, context: &Value) -> HookResult {
        match event {
            "t:ok" => Ok(Some(json!({"event": event, "n": context["n"]}))),
            "t:none" => Ok(None),
            "t:err" => Err("nope".into()),
            _ => panic!("boom {event}"),
        }
    }

    fn init(dir: &std::path::Path) -> Result<(), String> {
        if dir.as_os_str().is_empty() {
            Err("no dir".into())
        } else {
            Ok(())
        }
    }

    fn shutdown() {}

    export_hook!(handle, init = init, shutdown = shutdown);

    fn call(event: &str, context: &str) -> (i32, Vec<u8>) {
        let mut out = HermesHookBuf {
            ptr: std::ptr::null_mut(),
            len: 0,
        };
        // SAFETY: valid buffers.
        let rc = unsafe {
            hermes_hook_handle(
                event.as_ptr(),
                event.len(),
                context.as_ptr(),
                context.len(),
                &mut out,
            )
        };
        let bytes = if out.ptr.is_null() {
            Vec::new()
        } else {
            // SAFETY: the buffer we were handed.
            unsafe { std::slice::from_raw_parts(out.ptr, out.len) }.to_vec()
        };
        // SAFETY: handed back once.
        unsafe { hermes_hook_free(out) };
        (rc, bytes)
    }

    #[test]
    fn results_errors_and_panics() {
        assert_eq!(hermes_hook_abi_version(), 1);
        let (rc, out) = call("t:ok", r#"{"n": 3}"#);
        assert_eq!(rc, 0);
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap(),
            json!({"event": "t:ok", "n": 3})
        );
        assert_eq!(call("t:none", "{}"), (0, Vec::new()));
        assert_eq!(call("t:err", "{}"), (1, b"nope".to_vec()));
        let (rc, out) = call("t:panic", "{}");
        assert_eq!(rc, 2);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "handler panicked: boom t:panic"
        );
        let (rc, out) = call("t:ok", "{bad");
        assert_eq!(rc, 1);
        assert!(String::from_utf8(out).unwrap().contains("not valid JSON"));
        hermes_hook_shutdown();
    }

    #[test]
    fn init_reports_errors() {
        let dir = "/tmp/x";
        // SAFETY: valid buffers.
        assert_eq!(unsafe { hermes_hook_init(dir.as_ptr(), dir.len()) }, 0);
        // SAFETY: null with length 0 is allowed.
        assert_eq!(unsafe { hermes_hook_init(std::ptr::null(), 0) }, 1);
    }
}
