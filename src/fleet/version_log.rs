//! The versions each worker runs, kept at the broker (issue 56): the key-value bucket
//! `<PREFIX>_VERSIONS` (file storage), one key per hook and worker, written when a worker's
//! version of a hook loads and again every [`REFRESH`].
//!
//! A worker's memory of the other versions ([`super::versions`]) comes from the status messages
//! it hears while it runs; a worker that restarts (SIGKILL, a crash, an upgrade) would otherwise
//! not know which version it or a peer ran before, and could take an event that only such a
//! version matched for one that no version ever matched. So before it runs anything a worker
//! reads every record: its own earlier versions count as replaced now, a peer's as gone (it
//! may come back with it) since the record's time ([`super::versions::Versions::seed`]).
//! Records older than the consumer grace are left out there.

use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, kv};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::FleetConfig;

/// How often a worker writes its records again (a record's age tells how long ago its worker
/// last ran the version).
pub const REFRESH: Duration = Duration::from_secs(60);

/// How long a write or read of the bucket may take before the worker goes on without it.
const WAIT: Duration = Duration::from_secs(2);

/// One worker's version of one hook.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// The hook's identity ([`super::identity`]).
    pub key: String,
    pub worker: String,
    /// Its `events:` patterns.
    pub patterns: Vec<String>,
    /// When the worker last said it runs it (Unix ms).
    pub at_ms: u64,
}

impl Record {
    /// When the worker last said it runs the version.
    pub fn at(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.at_ms)
    }
}

/// The bucket, created when missing (file storage: it outlives a broker restart).
pub async fn bucket(cfg: &FleetConfig, js: &jetstream::Context) -> Result<kv::Store, String> {
    let name = cfg.versions_bucket();
    let config = super::lease::kv_stream(
        cfg,
        &name,
        "hermes-hooks: the version of each hook each worker runs",
    );
    super::attempts::open_bucket(js, config, &name, WAIT * 2).await
}

/// Writes `worker`'s version of hook `key` (its patterns), as of now.
pub async fn write(store: &kv::Store, key: &str, worker: &str, patterns: &[String]) -> bool {
    let at_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let record = Record {
        key: key.to_string(),
        worker: worker.to_string(),
        patterns: patterns.to_vec(),
        at_ms,
    };
    let body = serde_json::to_vec(&record).unwrap_or_default();
    let k = super::attempts::key(&super::consumer_name(key), worker);
    matches!(
        tokio::time::timeout(WAIT, store.put(k, body.into())).await,
        Ok(Ok(_))
    )
}

/// Every record written within `horizon`; `None` when the bucket could not be read in time.
pub async fn read_all(store: &kv::Store, horizon: Duration) -> Option<Vec<Record>> {
    let since = SystemTime::now()
        .checked_sub(horizon)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let read = async {
        let mut keys = store.keys().await.ok()?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.ok()?;
            if let Some(body) = store.get(&k).await.ok()?
                && let Ok(r) = serde_json::from_slice::<Record>(&body)
                && r.at() >= since
            {
                out.push(r);
            }
        }
        Some(out)
    };
    tokio::time::timeout(WAIT * 2, read).await.ok().flatten()
}
