//! Trust: which hooks this host is willing to run (DESIGN section 12).
//!
//! Hooks run with the service user's rights, so discovery refuses:
//! - a hook directory, HOOK.yaml or handler file writable by group or others, or owned by a user
//!   other than the service user or root ([`SkipCode::Permissions`]; `--insecure-permissions`
//!   turns this off);
//! - a handler that resolves outside its hook directory (`..`, absolute path, symlink escape);
//! - with `--trust explicit`, any hook not approved in `$HERMES_HOME/hooks-trust.json`, or whose
//!   handler's SHA-256 differs from the approved one ([`SkipCode::NotApproved`]).
//!
//! `hermes-hooks enable NAME` / `disable NAME` approve or revoke in explicit mode; otherwise they
//! flip `enabled:` in the hook's HOOK.yaml by editing that one line (or appending
//! `enabled: false`), so comments, order and quoting stay byte for byte as they were.
//!
//! What an approval covers: the handler file's bytes (for a webhook, its `url` and `secret_env`).
//! HOOK.yaml itself is covered by the permission checks, not by the hash.
//!
//! [`SkipCode::Permissions`]: crate::discovery::SkipCode::Permissions
//! [`SkipCode::NotApproved`]: crate::discovery::SkipCode::NotApproved

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::discovery::HandlerKind;
use crate::manifest::{Manifest, parse_manifest};

/// Name of the approvals file inside `$HERMES_HOME`.
pub const TRUST_FILE: &str = "hooks-trust.json";

/// Which hooks may load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrustMode {
    /// Every hook that passes the checks (the default).
    #[default]
    All,
    /// Only hooks approved with `hermes-hooks enable NAME`, with an unchanged handler.
    Explicit,
}

/// The trust settings of a host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrustPolicy {
    /// `--trust`.
    pub mode: TrustMode,
    /// `--insecure-permissions`: skip the ownership and mode checks.
    pub insecure_permissions: bool,
}

/// Something trust refused or could not do, worded for an operator.
#[derive(Debug, Error)]
pub enum TrustError {
    /// No hook of that name in any root.
    #[error("no hook named {name:?} in {roots}")]
    NotFound {
        /// The name asked for.
        name: String,
        /// The roots searched, for the message.
        roots: String,
    },
    /// A file could not be read or written.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The approvals file is not what this program writes.
    #[error("{} is not a valid approvals file ({reason}); fix or remove it, then approve hooks again with `hermes-hooks enable NAME`", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        reason: String,
    },
    /// The hook cannot be approved or edited as it is.
    #[error("{}: {reason}", path.display())]
    Refused {
        /// The file the problem is in.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
}

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

    fn empty() -> Self {
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
        write_atomically(path, &text, 0o600)
    }
}

/// Writes `bytes` to a temporary sibling of `path` with `mode`, syncs it and renames it over
/// `path`.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TrustError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let io = |op, p: &Path| {
        let p = p.to_path_buf();
        move |source| TrustError::Io {
            op,
            path: p,
            source,
        }
    };
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        // The umask may have narrowed the mode; set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io("set the mode of", &tmp))?;
        f.write_all(bytes).map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("sync", &tmp))?;
        std::fs::rename(&tmp, path).map_err(io("replace", path))?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The uid this process runs as.
fn service_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why `path` is unsafe to run hooks from, or `None` when it is fine: writable by group or
/// others, or owned by a user other than the service user or root. The reason names the path,
/// the problem and the fix.
pub fn permission_problem(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("cannot inspect {}: {e}", path.display())),
    };
    let mode = meta.mode() & 0o7777;
    let what = if meta.is_dir() {
        "hook directory"
    } else {
        "file"
    };
    let override_hint = "or start with --insecure-permissions if this is intended";
    let me = service_uid();
    let owner = meta.uid();
    if owner != me && owner != 0 {
        return Some(format!(
            "{what} {} is owned by uid {owner}, not by the service user (uid {me}) or root: that \
             user could change what this hook runs; fix: `chown {me} {}` ({override_hint})",
            path.display(),
            path.display()
        ));
    }
    let writable = mode & 0o022;
    if writable != 0 {
        let by = match (writable & 0o020 != 0, writable & 0o002 != 0) {
            (true, true) => "group and others",
            (true, false) => "its group",
            _ => "others",
        };
        return Some(format!(
            "{what} {} is writable by {by} (mode {mode:04o}): they could change what this hook \
             runs; fix: `chmod go-w {}` ({override_hint})",
            path.display(),
            path.display()
        ));
    }
    None
}

/// Refuses a handler that resolves (through symlinks) outside the hook directory.
pub fn check_inside(dir: &Path, handler: &Path) -> Result<(), String> {
    let real_dir = dir
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
    let real = handler
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", handler.display()))?;
    if real.starts_with(&real_dir) {
        Ok(())
    } else {
        Err(format!(
            "handler {} resolves to {} outside the hook directory (symlink escape); copy the \
             handler into the hook directory",
            handler.display(),
            real.display()
        ))
    }
}

/// SHA-256 (hex) of what an approval covers: the handler file's bytes, or for a webhook its
/// `url` and `secret_env`.
pub fn approval_hash(
    kind: HandlerKind,
    handler: Option<&Path>,
    manifest: &Manifest,
) -> std::io::Result<String> {
    let digest = match (kind, handler) {
        (HandlerKind::Webhook, _) | (_, None) => {
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
/// `handler` path, the `python` interpreter and the `env` it gets (`LD_PRELOAD`, `PYTHONPATH`...).
/// Comments, `description`, `events`, `timeout` and `queue` are not covered.
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
    hex::encode(h.finalize())
}

/// What discovery consults for every hook: built once per scan from a [`TrustPolicy`] (the
/// approvals file is read once).
#[derive(Debug, Clone, Default)]
pub struct Gate {
    insecure_permissions: bool,
    /// `Some` in explicit mode: the approvals, or why they could not be read.
    approvals: Option<Result<TrustFile, String>>,
}

impl TrustPolicy {
    /// The gate for one discovery scan.
    pub fn gate(&self, hermes_home: &Path) -> Gate {
        Gate {
            insecure_permissions: self.insecure_permissions,
            approvals: (self.mode == TrustMode::Explicit)
                .then(|| TrustFile::load(&trust_file(hermes_home)).map_err(|e| e.to_string())),
        }
    }
}

impl Gate {
    /// Checks the hook directory, HOOK.yaml and the handler file; on refusal returns the
    /// offending path and the reason.
    pub fn check_permissions(
        &self,
        dir: &Path,
        manifest_path: &Path,
        handler: Option<&Path>,
    ) -> Result<(), (PathBuf, String)> {
        if self.insecure_permissions {
            return Ok(());
        }
        for p in [Some(dir), Some(manifest_path), handler]
            .into_iter()
            .flatten()
        {
            if let Some(reason) = permission_problem(p) {
                return Err((p.to_path_buf(), reason));
            }
        }
        Ok(())
    }

    /// In explicit mode, checks that `name` is approved with the current hash.
    pub fn check_approved(
        &self,
        name: &str,
        kind: HandlerKind,
        handler: Option<&Path>,
        manifest: &Manifest,
    ) -> Result<(), String> {
        let Some(approvals) = &self.approvals else {
            return Ok(());
        };
        let approvals = approvals
            .as_ref()
            .map_err(|e| format!("not approved: {e}"))?;
        let Some(approval) = approvals.hooks.get(name) else {
            return Err(format!(
                "not approved (--trust explicit): review the hook, then run `hermes-hooks enable {name}`"
            ));
        };
        let now = approval_hash(kind, handler, manifest)
            .map_err(|e| format!("cannot hash the handler: {e}"))?;
        if now != approval.sha256 {
            let what = if kind == HandlerKind::Webhook {
                "its url/secret_env"
            } else {
                "its handler"
            };
            return Err(format!(
                "{what} changed since it was approved (sha256 {} approved, now {}): review it, \
                 then run `hermes-hooks enable {name}` to approve it again",
                short(&approval.sha256),
                short(&now)
            ));
        }
        if let Some(approved) = &approval.settings_sha256
            && *approved != settings_hash(manifest)
        {
            return Err(format!(
                "its HOOK.yaml settings (handler, python or env) changed since it was approved: \
                 review them, then run `hermes-hooks enable {name}` to approve it again"
            ));
        }
        Ok(())
    }
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

/// A hook directory found by name, read but not checked.
#[derive(Debug)]
pub struct Located {
    /// The hook directory.
    pub dir: PathBuf,
    /// Its HOOK.yaml.
    pub manifest_path: PathBuf,
    /// HOOK.yaml's text.
    pub text: String,
    /// HOOK.yaml parsed, or the parse error.
    pub manifest: Result<Manifest, String>,
}

/// Finds hook `name` across `roots` the way discovery does (roots in order, directories by name,
/// `name:` or the directory name; the first match wins).
pub fn locate(roots: &[PathBuf], name: &str) -> Result<Located, TrustError> {
    for root in roots {
        let dirs = crate::discovery::hook_dirs(root);
        for dir in dirs {
            let manifest_path = dir.join("HOOK.yaml");
            let Ok(text) = std::fs::read_to_string(&manifest_path) else {
                continue;
            };
            let dir_name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let manifest = parse_manifest(&text).map_err(|e| e.to_string());
            let hook_name = match &manifest {
                Ok(m) => m.name.clone().unwrap_or(dir_name),
                Err(_) => dir_name,
            };
            if hook_name == name {
                return Ok(Located {
                    dir,
                    manifest_path,
                    text,
                    manifest,
                });
            }
        }
    }
    Err(TrustError::NotFound {
        name: name.to_string(),
        roots: roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// `hermes-hooks enable NAME` (`on`) or `disable NAME`: approve/revoke in explicit mode, else set
/// `enabled:` in HOOK.yaml. Returns the message to print.
pub fn set_enabled(
    roots: &[PathBuf],
    hermes_home: &Path,
    policy: &TrustPolicy,
    name: &str,
    on: bool,
) -> Result<String, TrustError> {
    match (policy.mode, on) {
        (TrustMode::Explicit, true) => approve(roots, hermes_home, policy, name),
        (TrustMode::Explicit, false) => revoke(hermes_home, name),
        (TrustMode::All, _) => {
            let hook = locate(roots, name)?;
            flip_enabled(&hook, on)
        }
    }
}

fn approve(
    roots: &[PathBuf],
    hermes_home: &Path,
    policy: &TrustPolicy,
    name: &str,
) -> Result<String, TrustError> {
    let hook = locate(roots, name)?;
    let refused = |path: &Path, reason: String| TrustError::Refused {
        path: path.to_path_buf(),
        reason,
    };
    let manifest = hook
        .manifest
        .as_ref()
        .map_err(|e| refused(&hook.manifest_path, format!("{e}; fix HOOK.yaml first")))?;
    let (kind, handler) = if manifest.url.is_some() {
        (HandlerKind::Webhook, None)
    } else {
        let (kind, path) = crate::discovery::find_handler(&hook.dir, manifest.handler.as_deref())
            .map_err(|(_, file, reason)| refused(&file, reason))?;
        check_inside(&hook.dir, &path).map_err(|r| refused(&path, r))?;
        (kind, Some(path))
    };
    if !policy.insecure_permissions {
        let gate = Gate::default();
        gate.check_permissions(&hook.dir, &hook.manifest_path, handler.as_deref())
            .map_err(|(p, r)| refused(&p, format!("cannot approve: {r}")))?;
    }
    let sha256 =
        approval_hash(kind, handler.as_deref(), manifest).map_err(|source| TrustError::Io {
            op: "read",
            path: handler
                .clone()
                .unwrap_or_else(|| hook.manifest_path.clone()),
            source,
        })?;
    let file = trust_file(hermes_home);
    let mut approvals = TrustFile::load(&file)?;
    let previous = approvals.hooks.get(name).map(|a| a.sha256.clone());
    approvals.hooks.insert(
        name.to_string(),
        Approval {
            sha256: sha256.clone(),
            settings_sha256: Some(settings_hash(manifest)),
            kind: kind.as_str().to_string(),
            handler: match (&handler, &manifest.url) {
                (Some(p), _) => p.display().to_string(),
                (None, Some(u)) => u.clone(),
                _ => String::new(),
            },
            dir: hook.dir.clone(),
            approved_at: crate::time::now(),
        },
    );
    approvals.save(&file)?;
    let mut msg = match previous {
        Some(p) if p == sha256 => format!(
            "{name} was already approved (sha256 {}) in {}",
            short(&sha256),
            file.display()
        ),
        Some(p) => format!(
            "approved {name} again (sha256 {} replaces {}) in {}",
            short(&sha256),
            short(&p),
            file.display()
        ),
        None => format!(
            "approved {name} (sha256 {}) in {}",
            short(&sha256),
            file.display()
        ),
    };
    msg.push_str("; a running service picks it up on reload (SIGHUP or POST /v1/reload)");
    if !manifest.enabled {
        msg.push_str(&format!(
            "\nnote: {} has `enabled: false`; the hook stays disabled until that changes",
            hook.manifest_path.display()
        ));
    }
    Ok(msg)
}

fn revoke(hermes_home: &Path, name: &str) -> Result<String, TrustError> {
    let file = trust_file(hermes_home);
    let mut approvals = TrustFile::load(&file)?;
    if approvals.hooks.remove(name).is_none() {
        return Ok(format!(
            "{name} was not approved in {}; nothing to revoke",
            file.display()
        ));
    }
    approvals.save(&file)?;
    Ok(format!(
        "revoked the approval of {name} in {}; a running service unloads it on reload (SIGHUP or POST /v1/reload)",
        file.display()
    ))
}

fn flip_enabled(hook: &Located, on: bool) -> Result<String, TrustError> {
    let path = &hook.manifest_path;
    let manifest = hook.manifest.as_ref().map_err(|e| TrustError::Refused {
        path: path.clone(),
        reason: format!("{e}; fix HOOK.yaml first"),
    })?;
    let word = if on { "enabled" } else { "disabled" };
    let new_text = match edit_enabled(&hook.text, on) {
        Some(t) if manifest.enabled != on => t,
        _ => return Ok(format!("{} is already {word}", path.display())),
    };
    // The edit must change `enabled` and nothing else the manifest says.
    let verified = parse_manifest(&new_text).map(|new| {
        let mut expected = manifest.clone();
        expected.enabled = on;
        new == expected
    });
    if !matches!(verified, Ok(true)) {
        return Err(TrustError::Refused {
            path: path.clone(),
            reason: format!(
                "cannot set `enabled: {on}` by editing one line (is HOOK.yaml a one-line {{...}} \
                 mapping?); edit it by hand"
            ),
        });
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .map_err(|source| TrustError::Io {
            op: "inspect",
            path: path.clone(),
            source,
        })?;
    write_atomically(path, new_text.as_bytes(), mode)?;
    Ok(format!(
        "{word} {} ({}); a running service picks it up on reload",
        path.display(),
        if on {
            "enabled: true"
        } else {
            "enabled: false"
        }
    ))
}

/// Sets the top-level `enabled:` of a HOOK.yaml text by editing only its value (comments, order,
/// quoting and line endings stay as they were), or appends `enabled: false` when the key is
/// absent. `None` when the text already says so (absent counts as `true`).
pub fn edit_enabled(text: &str, on: bool) -> Option<String> {
    let value = if on { "true" } else { "false" };
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let Some(rest) = ["enabled", "\"enabled\"", "'enabled'"]
            .iter()
            .find_map(|k| line.strip_prefix(k))
        else {
            continue;
        };
        let after_key = rest.trim_start_matches([' ', '\t']);
        let Some(after_colon) = after_key.strip_prefix(':') else {
            continue;
        };
        // Where the value starts and ends within `line` (before a comment or the line end).
        let colon_at = line.len() - after_colon.len();
        let value_start =
            colon_at + (after_colon.len() - after_colon.trim_start_matches([' ', '\t']).len());
        let body_end = line.trim_end_matches(['\n', '\r']).len();
        let mut value_end = body_end;
        let bytes = line.as_bytes();
        for i in value_start..body_end {
            if bytes[i] == b'#' && i > 0 && matches!(bytes[i - 1], b' ' | b'\t') {
                value_end = i;
                break;
            }
        }
        let current = line[value_start..value_end].trim_end_matches([' ', '\t']);
        value_end = value_start + current.len();
        if current == value {
            return None;
        }
        if current.is_empty() {
            // `enabled:` with the value elsewhere: not a one-line edit; the caller's check fails.
            let mut out = text.to_string();
            out.insert_str(start + colon_at, &format!(" {value}"));
            return Some(out);
        }
        let mut out = String::with_capacity(text.len() + 1);
        out.push_str(&text[..start + value_start]);
        out.push_str(value);
        out.push_str(&text[start + value_end..]);
        return Some(out);
    }
    if on {
        return None;
    }
    let eol = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut out = text.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push_str(eol);
    }
    out.push_str("enabled: false");
    out.push_str(eol);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_only_the_value() {
        let t = "# my hook\nname: x   # the name\nevents: [a]\nenabled: true    # keep me\n";
        assert_eq!(
            edit_enabled(t, false).unwrap(),
            "# my hook\nname: x   # the name\nevents: [a]\nenabled: false    # keep me\n"
        );
        assert_eq!(edit_enabled(t, true), None);
        let crlf = "events: [a]\r\nenabled: false\r\n";
        assert_eq!(
            edit_enabled(crlf, true).unwrap(),
            "events: [a]\r\nenabled: true\r\n"
        );
        assert_eq!(
            edit_enabled("'enabled' : no # x\nevents: [a]", true).unwrap(),
            "'enabled' : true # x\nevents: [a]"
        );
    }

    #[test]
    fn appends_when_absent() {
        assert_eq!(edit_enabled("events: [a]", true), None);
        assert_eq!(
            edit_enabled("events: [a] # c", false).unwrap(),
            "events: [a] # c\nenabled: false\n"
        );
        // Indented keys (inside another mapping) are not the top-level one.
        assert_eq!(
            edit_enabled("events: [a]\nenv:\n  enabled: true\n", false).unwrap(),
            "events: [a]\nenv:\n  enabled: true\nenabled: false\n"
        );
    }

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
