//! The approvals of `--trust explicit`: the file `$HERMES_HOME/hooks-trust.json` (read, written
//! atomically with mode 0600) and the hashes an approval records: the handler file's bytes (for
//! a webhook its `url` and `secret_env`) and the HOOK.yaml settings that change what runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::kind::ApprovalInput;
use crate::layout::HandlerKind;
use crate::manifest::Manifest;
use crate::trust::error::TrustError;

/// Name of the approvals file inside `$HERMES_HOME`.
pub const TRUST_FILE: &str = "hooks-trust.json";

/// `$HERMES_HOME/hooks-trust.json`.
pub fn trust_file(hermes_home: &Path) -> PathBuf {
    hermes_home.join(TRUST_FILE)
}

/// One approved hook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// SHA-256 (hex) of the handler file, or of a webhook's `url` and `secret_env`.
    pub sha256: String,
    /// SHA-256 (hex) of the HOOK.yaml settings that change what runs or what it may touch
    /// ([`settings_hash`]): editing them needs approving again too. Absent in approvals written
    /// before it existed: then enough only while the hook sets none of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings_sha256: Option<String>,
    /// Those settings as a person reads them ([`covered_settings`]), so that a refusal says
    /// which one changed. Absent in approvals written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<BTreeMap<String, String>>,
    /// SHA-256 (hex) of every file of the hook that can run, by path relative to the hook
    /// directory ([`crate::trust::files`]): a changed helper module needs approving again.
    /// Absent in approvals written before it existed: then only a hook whose handler is its one
    /// file that can run passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, String>>,
    /// Handler kind at approval time.
    #[serde(default)]
    pub kind: String,
    /// The handler file or URL that was approved, for people reading the file.
    #[serde(default)]
    pub handler: String,
    /// `events:` of HOOK.yaml at approval time: an approved observer re-pointed at an event
    /// whose answer Hermes reads (`pre_llm_call`, `transform_*`, `pre_tool_call`) needs
    /// approving again (issue 57, suspected case). Absent in approvals written before it
    /// existed: then enough only while the hook takes none of the agent's deciding events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
    /// The hook directory at approval time.
    #[serde(default)]
    pub dir: PathBuf,
    /// When (RFC 3339 UTC).
    #[serde(default)]
    pub approved_at: String,
}

/// The content of `hooks-trust.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrustFile {
    /// Format version (1).
    #[serde(default = "one")]
    pub version: u32,
    /// Approvals by hook name.
    #[serde(default)]
    pub hooks: BTreeMap<String, Approval>,
    /// Approvals revoked by the operator (`disable` under `--trust explicit`), by hook name,
    /// with when: an approval the service would give by itself (a config.yaml entry on the
    /// allowlist, whose hook directory is made again when the entry comes back) is not given to
    /// these (issue 57 row 8). Only the operator's own `enable` takes a name off.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub revoked: BTreeMap<String, String>,
}

fn one() -> u32 {
    1
}

impl TrustFile {
    /// Reads `path`; a missing file is an empty set of approvals.
    pub fn load(path: &Path) -> Result<Self, TrustError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::empty()),
            Err(source) => {
                return Err(TrustError::Io {
                    op: "read",
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        serde_json::from_str(&text).map_err(|e| TrustError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// Reads `path`, lets `change` edit the approvals, and writes them back if it changed them,
    /// all under an exclusive lock (`flock` on `PATH.lock` beside it): two enables, disables
    /// or installs at once (two CLIs, the API and a CLI) each see the other's write, and no
    /// revocation is lost.
    pub fn update<T>(
        path: &Path,
        change: impl FnOnce(&mut TrustFile) -> Result<T, TrustError>,
    ) -> Result<T, TrustError> {
        let _lock = lock(path)?;
        let mut file = Self::load(path)?;
        let before = file.clone();
        let out = change(&mut file)?;
        if file != before {
            file.save(path)?;
        }
        Ok(out)
    }

    pub(crate) fn empty() -> Self {
        Self {
            version: 1,
            hooks: BTreeMap::new(),
            revoked: BTreeMap::new(),
        }
    }

    /// Writes `path` atomically (a temporary file in the same directory, mode 0600, then a
    /// rename), creating the directory when needed.
    pub fn save(&self, path: &Path) -> Result<(), TrustError> {
        let mut text = serde_json::to_vec_pretty(self).map_err(|e| TrustError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| TrustError::Io {
                op: "create",
                path: dir.to_path_buf(),
                source,
            })?;
        }
        Ok(crate::atomic::write(path, &text, 0o600)?)
    }
}

/// The exclusive lock on the approvals file `path` (`PATH.lock`, mode 0600), held until the
/// returned file is dropped.
pub fn lock(path: &Path) -> Result<std::fs::File, TrustError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let io = |op: &'static str, source| TrustError::Io {
        op,
        path: lock_path.clone(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("create the directory of", e))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock_path)
        .map_err(|e| io("open", e))?;
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(io("lock", e));
        }
    }
}

/// SHA-256 (hex) of what an approval covers: the handler file's bytes, or for a webhook its
/// `url` and `secret_env`.
pub fn approval_hash(
    kind: HandlerKind,
    handler: Option<&Path>,
    manifest: &Manifest,
) -> std::io::Result<String> {
    let digest = match (kind.spec().approval, handler) {
        (ApprovalInput::Endpoint, _) | (_, None) => {
            let mut h = Sha256::new();
            h.update(b"webhook\n");
            h.update(manifest.url.as_deref().unwrap_or("").as_bytes());
            h.update(b"\n");
            h.update(manifest.secret_env.as_deref().unwrap_or("").as_bytes());
            h.finalize()
        }
        (_, Some(path)) => Sha256::digest(std::fs::read(path)?),
    };
    Ok(hex::encode(digest))
}

/// SHA-256 (hex) of the HOOK.yaml settings that decide what runs besides the handler file, and
/// what it may touch: the `handler` path, the `python` interpreter and the `env` it gets
/// (`LD_PRELOAD`, `PYTHONPATH`...), a webhook's `url`, `secret_env` and `ca_file`, `runs:`,
/// `data:`, and (issue 46) `sandbox:`, `cwd:` and `requires:`. Keys added over time are hashed
/// only when set away from their default, so approvals of hooks that do not use them stay
/// valid. Comments, `description`, `events`, `timeout` and `queue` are not covered.
pub fn settings_hash(manifest: &Manifest) -> String {
    let mut h = Sha256::new();
    for (key, value) in [
        ("handler", manifest.handler.as_deref().unwrap_or("")),
        ("python", manifest.python.as_deref().unwrap_or("")),
    ] {
        h.update(key.as_bytes());
        h.update(b"=");
        h.update(value.as_bytes());
        h.update(b"\n");
    }
    for (k, v) in &manifest.env {
        h.update(b"env ");
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    // `runs:` decides whether the gateway imports the hook; hashed only when set away from the
    // default, so approvals made before the key existed stay valid.
    let runs =
        (manifest.runs != crate::manifest::Runs::Auto).then(|| manifest.runs.as_str().to_string());
    for (key, value) in [
        ("url", &manifest.url),
        ("secret_env", &manifest.secret_env),
        ("ca_file", &manifest.ca_file),
        ("runs", &runs),
    ] {
        if let Some(v) = value {
            h.update(key.as_bytes());
            h.update(b"=");
            h.update(v.as_bytes());
            h.update(b"\n");
        }
    }
    // `data:` decides what the approval does not cover.
    for d in &manifest.data {
        h.update(b"data=");
        h.update(d.as_bytes());
        h.update(b"\n");
    }
    // What the hook may touch: its sandbox, where it starts, what it needs to load.
    for (key, value) in confinement_settings(manifest) {
        h.update(key.as_bytes());
        h.update(b"=");
        h.update(value.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

/// `sandbox:`, `cwd:` and `requires:` as an approval records them, each only when set away from
/// its default (so an approval of a hook without them is unchanged).
fn confinement_settings(manifest: &Manifest) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(sb) = &manifest.sandbox {
        out.push(("sandbox", sandbox_text(sb)));
    }
    if manifest.cwd != crate::manifest::Cwd::Service {
        out.push(("cwd", "hook".to_string()));
    }
    let r = &manifest.requires;
    for (key, list) in [
        ("requires.bins", &r.bins),
        ("requires.env", &r.env),
        ("requires.os", &r.os),
    ] {
        if !list.is_empty() {
            out.push((key, list.join(",")));
        }
    }
    out
}

/// `sandbox:` in one canonical line: `none`, `strict`, or the grants over strict.
pub fn sandbox_text(sb: &crate::sandbox::Sandbox) -> String {
    let Some(g) = &sb.grants else {
        return "none".to_string();
    };
    if *g == crate::sandbox::decl::Grants::default() {
        return "strict".to_string();
    }
    let connect: Vec<String> = g
        .connect
        .iter()
        .map(|c| format!("{}:{}", c.host.as_deref().unwrap_or("*"), c.port))
        .collect();
    format!(
        "strict + read {:?} write {:?} connect {:?} env {:?} exec {} best_effort {}",
        g.read, g.write, connect, g.env, g.exec, g.best_effort
    )
}

/// Every setting an approval covers, by key, as a person reads it (only those set away from
/// their default): shown by a review before anyone approves, recorded in the approval so that a
/// refusal can say which one changed.
pub fn covered_settings(manifest: &Manifest) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut put = |k: &str, v: Option<&str>| {
        if let Some(v) = v {
            out.insert(k.to_string(), v.to_string());
        }
    };
    put("handler", manifest.handler.as_deref());
    put("python", manifest.python.as_deref());
    put("url", manifest.url.as_deref());
    put("secret_env", manifest.secret_env.as_deref());
    put("ca_file", manifest.ca_file.as_deref());
    if manifest.runs != crate::manifest::Runs::Auto {
        put("runs", Some(manifest.runs.as_str()));
    }
    for (k, v) in &manifest.env {
        out.insert(format!("env.{k}"), v.clone());
    }
    if !manifest.data.is_empty() {
        out.insert("data".to_string(), manifest.data.join(", "));
    }
    for (k, v) in confinement_settings(manifest) {
        out.insert(k.to_string(), v);
    }
    out
}

/// What changed between two [`covered_settings`], as `key: old -> new` (at most five).
pub fn describe_settings_change(
    approved: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> String {
    let keys: std::collections::BTreeSet<&String> = approved.keys().chain(now.keys()).collect();
    let shown = |v: Option<&String>| v.map_or("(unset)".to_string(), |v| format!("{v:?}"));
    let changes: Vec<String> = keys
        .into_iter()
        .filter(|k| approved.get(*k) != now.get(*k))
        .map(|k| format!("{k}: {} -> {}", shown(approved.get(k)), shown(now.get(k))))
        .collect();
    let more = changes.len().saturating_sub(5);
    let mut text = changes.into_iter().take(5).collect::<Vec<_>>().join("; ");
    if more > 0 {
        text.push_str(&format!("; and {more} more"));
    }
    text
}

/// The first 12 hex digits of a hash, for messages.
pub(crate) fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("home").join(TRUST_FILE);
        assert_eq!(TrustFile::load(&path).unwrap(), TrustFile::empty());
        let mut f = TrustFile::empty();
        f.hooks.insert(
            "a".into(),
            Approval {
                sha256: "00".into(),
                settings_sha256: Some("11".into()),
                settings: None,
                files: None,
                kind: "exec".into(),
                handler: "h".into(),
                events: None,
                dir: PathBuf::from("/x"),
                approved_at: String::new(),
            },
        );
        f.save(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(TrustFile::load(&path).unwrap(), f);
        std::fs::write(&path, "not json").unwrap();
        assert!(matches!(
            TrustFile::load(&path),
            Err(TrustError::Corrupt { .. })
        ));
    }
}
