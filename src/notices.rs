//! The machine-readable record of what the host does (`serve --output json`): one JSON object
//! per line on stdout, `{"v": 1, "type", "time", ...}`, `host_start` first and `host_stop` last.
//!
//! Notices are sent from anywhere (reload, workers, the emit path on overflow) into a bounded
//! channel and written by one dedicated thread, so a slow reader of stdout never blocks a runtime
//! worker; when the channel is full a notice is counted as lost and the count is reported in
//! `host_stop`.
//!
//! The service also keeps the last [`RECENT`] notices in memory (with or without `--output
//! json`), numbered, for `GET /v1/notices` (the dashboard's live tail): [`Notices::recent`].

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{Map, Value, json};

/// Version of the notice format; changes only when a field changes meaning or goes away.
pub const VERSION: u64 = 1;
/// Notices waiting for the writer before new ones are dropped (and counted).
const CAPACITY: usize = 4096;
/// Notices kept in memory for [`Notices::recent`].
pub const RECENT: usize = 256;

struct Inner {
    tx: Mutex<Option<SyncSender<String>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    lost: AtomicU64,
    recent: Mutex<Recent>,
}

/// The last [`RECENT`] notices, each with its number (from 1, in the order sent).
#[derive(Default)]
struct Recent {
    last: u64,
    lines: std::collections::VecDeque<(u64, String)>,
}

impl Inner {
    fn new(tx: Option<SyncSender<String>>, writer: Option<JoinHandle<()>>) -> Self {
        Self {
            tx: Mutex::new(tx),
            writer: Mutex::new(writer),
            lost: AtomicU64::new(0),
            recent: Mutex::default(),
        }
    }

    fn remember(&self, line: &str) {
        let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        r.last += 1;
        let n = r.last;
        if r.lines.len() == RECENT {
            r.lines.pop_front();
        }
        r.lines.push_back((n, line.to_string()));
    }
}

/// `{"v", "type", "time", ...fields}` as one line.
fn envelope(kind: &str, fields: Value) -> String {
    let mut obj = Map::new();
    obj.insert("v".into(), json!(VERSION));
    obj.insert("type".into(), json!(kind));
    obj.insert("time".into(), json!(crate::time::now()));
    if let Value::Object(f) = fields {
        obj.extend(f);
    }
    Value::Object(obj).to_string()
}

/// A handle for sending notices; cheap to clone. The default handle sends nothing.
#[derive(Clone, Default)]
pub struct Notices {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.inner.is_some() {
            "Notices(on)"
        } else {
            "Notices(off)"
        })
    }
}

impl Notices {
    /// Notices written to `out` (stdout for `serve --output json`) by a dedicated thread.
    pub fn to_writer(out: impl Write + Send + 'static) -> Self {
        let (tx, rx) = sync_channel::<String>(CAPACITY);
        let writer = std::thread::Builder::new()
            .name("notices".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::new(out);
                while let Ok(line) = rx.recv() {
                    let _ = out.write_all(line.as_bytes());
                    let _ = out.write_all(b"\n");
                    // Flush when nothing else is waiting: lines appear promptly, bursts batch.
                    for l in rx.try_iter() {
                        let _ = out.write_all(l.as_bytes());
                        let _ = out.write_all(b"\n");
                    }
                    let _ = out.flush();
                }
                let _ = out.flush();
            })
            .ok();
        Self {
            inner: Some(Arc::new(Inner::new(Some(tx), writer))),
        }
    }

    /// Notices kept in memory only (for [`Notices::recent`]), written nowhere.
    pub fn recording() -> Self {
        Self {
            inner: Some(Arc::new(Inner::new(None, None))),
        }
    }

    /// The notices kept in memory whose number is above `after`, oldest first, as JSON objects
    /// with their number added as `seq`; and the number of the last notice sent (0 before any).
    pub fn recent(&self, after: u64) -> (Vec<Value>, u64) {
        let Some(inner) = &self.inner else {
            return (Vec::new(), 0);
        };
        let r = inner.recent.lock().unwrap_or_else(|p| p.into_inner());
        let notices = r
            .lines
            .iter()
            .filter(|(n, _)| *n > after)
            .filter_map(|(n, line)| {
                let mut v: Value = serde_json::from_str(line).ok()?;
                v.as_object_mut()?.insert("seq".into(), json!(n));
                Some(v)
            })
            .collect();
        (notices, r.last)
    }

    /// True when notices are being written.
    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Sends a notice of `kind` with `fields` (an object) added to the envelope.
    pub fn send(&self, kind: &str, fields: Value) {
        let Some(inner) = &self.inner else { return };
        let line = envelope(kind, fields);
        inner.remember(&line);
        let tx = inner.tx.lock().unwrap_or_else(|p| p.into_inner());
        match tx.as_ref().map(|t| t.try_send(line)) {
            Some(Ok(())) | None => {}
            Some(Err(TrySendError::Full(_) | TrySendError::Disconnected(_))) => {
                inner.lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sends the final notice (`host_stop`, with the count of lost notices), then waits until
    /// everything is written. Later notices are ignored.
    pub fn finish(&self, kind: &str, fields: Value) {
        let Some(inner) = &self.inner else { return };
        let mut fields = fields;
        if let Value::Object(f) = &mut fields {
            f.insert(
                "notices_lost".into(),
                json!(inner.lost.load(Ordering::Relaxed)),
            );
        }
        // The last notice must not be lost: wait for room.
        let tx = inner.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(envelope(kind, fields));
        }
        if let Some(w) = inner
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = w.join();
        }
    }
}
