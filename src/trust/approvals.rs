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
    /// SHA-256 (hex) of the HOOK.yaml settings that change what runs (`handler`, `python`,
    /// `env`): editing them needs approving again too. Absent in approvals written before it
    /// existed (then not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings_sha256: Option<String>,
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

    pub(crate) fn empty() -> Self {
        Self {
            version: 1,
            hooks: BTreeMap::new(),
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

/// SHA-256 (hex) of the HOOK.yaml settings that decide what runs besides the handler file: the
/// `handler` path, the `python` interpreter and the `env` it gets (`LD_PRELOAD`, `PYTHONPATH`...),
/// and a webhook's `url`, `secret_env` and `ca_file` (only hashed when set, so approvals of other hooks
/// written before they were covered stay valid). Comments, `description`, `events`, `timeout`
/// and `queue` are not covered.
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
    hex::encode(h.finalize())
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
                files: None,
                kind: "exec".into(),
                handler: "h".into(),
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
