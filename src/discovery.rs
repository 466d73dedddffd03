//! Discovery: hook roots -> hook specs plus a report of every directory that did not load.
//!
//! Roots are scanned in the order given, each root's directories by name ascending; that is the
//! discovery order, which is also the order hooks fire in within a match group. On a name clash the
//! earlier hook wins and the later one is reported as shadowed. Nothing here starts a process:
//! Python import checks happen when a handler starts ([`crate::host`]), and what a handler kind
//! derives from its manifest (a webhook's delivery budget) is applied there too. The layout of a
//! hook directory (which file is the handler, the order of directories) is [`crate::layout`]'s.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::layout::{HandlerFault, dir_name, find_handler};
pub use crate::layout::{HandlerKind, find_on_path, hook_dirs, is_executable, is_shell_script};
use crate::manifest::{Manifest, parse_manifest};
use crate::pattern::PatternSet;
use crate::trust::files::{RunFiles, TreeError};
use crate::trust::policy::Gate;

/// Why a directory did not load, in a form scripts can match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipCode {
    /// No HOOK.yaml in the directory.
    NoManifest,
    /// HOOK.yaml could not be read.
    Unreadable,
    /// HOOK.yaml is not valid YAML or has a field of the wrong type.
    YamlError,
    /// HOOK.yaml is not a mapping.
    NotMapping,
    /// `events:` missing or empty.
    NoEvents,
    /// An event pattern does not compile.
    BadPattern,
    /// A field has an unacceptable value.
    BadField,
    /// No handler file was found.
    NoHandler,
    /// The handler path leaves the hook directory.
    HandlerOutside,
    /// The handler file exists but cannot be used (not executable, ...).
    BadHandler,
    /// The handler failed to load (Python import error, no `handle`, ...).
    LoadFailed,
    /// `enabled: false`.
    Disabled,
    /// A `requires:` condition does not hold.
    Requirements,
    /// Another hook with the same name was found first.
    Shadowed,
    /// Files or directories with unsafe permissions.
    Permissions,
    /// Not approved in `--trust explicit` mode.
    NotApproved,
    /// Its approval was revoked by the operator (`disable` under `--trust explicit`): off by
    /// choice, like `enabled: false` (the agent plugin keeps Hermes's own runner off it too).
    Revoked,
}

/// A directory that did not become a loaded hook, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    /// The hook directory.
    pub dir: PathBuf,
    /// The hook's name (from HOOK.yaml when it could be read, else the directory name).
    pub name: String,
    /// The file the problem is in.
    pub file: PathBuf,
    /// Machine-readable reason.
    pub code: SkipCode,
    /// Human-readable reason, saying what to change.
    pub reason: String,
    /// The hook's `events:` patterns when its HOOK.yaml could be read (empty otherwise, and
    /// then not shown): a collect of a matching event names it as a hook that cannot answer
    /// (issue 33); the agent plugin reads which events of a config.yaml command an operator
    /// turned off (issue 58 row 1).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
}

impl SkipCode {
    /// The code for a handler file problem found by `crate::layout::find_handler`.
    pub fn of(fault: HandlerFault) -> Self {
        match fault {
            HandlerFault::Missing => SkipCode::NoHandler,
            HandlerFault::Unusable => SkipCode::BadHandler,
            HandlerFault::Outside => SkipCode::HandlerOutside,
        }
    }
}

impl Skipped {
    /// True for deliberate skips (`enabled: false`) that are not problems.
    pub fn is_problem(&self) -> bool {
        !matches!(self.code, SkipCode::Disabled | SkipCode::Revoked)
    }
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.reason)
    }
}

/// A hook that passed discovery and is ready to be started.
#[derive(Debug, Clone)]
pub struct HookSpec {
    /// Unique name (HOOK.yaml `name:` or the directory name).
    pub name: String,
    /// The hook directory.
    pub dir: PathBuf,
    /// The root it was found in.
    pub root: PathBuf,
    /// Path of HOOK.yaml.
    pub manifest_path: PathBuf,
    /// The handler file (absent for webhooks).
    pub handler_path: Option<PathBuf>,
    /// What runs it.
    pub kind: HandlerKind,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// Compiled `events:`.
    pub patterns: PatternSet,
    /// Hash of the manifest text and the handler file's content: equal fingerprints mean
    /// "unchanged" on reload.
    pub fingerprint: u64,
    /// The files that can run, as this version loaded them (checked before every process start).
    pub files: std::sync::Arc<RunFiles>,
    /// Position in discovery order.
    pub order: usize,
    /// Where the hook runs (service or gateway) and why.
    pub placement: crate::placement::Placement,
    /// SHA-256 (hex) of the handler file as discovered; the gateway's client refuses to import
    /// an in-gateway hook whose file no longer has it.
    pub sha256: Option<String>,
    /// A hook made from config.yaml's `hooks:` block: the entries of its command, as written
    /// there, in file order (`list`, `/v1/hooks` and the dashboard show them instead of the
    /// made directory); empty for any other hook.
    pub config_entries: Vec<crate::config_hooks::WrittenEntry>,
}

/// Result of scanning the roots.
#[derive(Debug, Default)]
pub struct Discovery {
    /// Hooks that can be started, in discovery order.
    pub hooks: Vec<HookSpec>,
    /// Directories that did not load.
    pub skipped: Vec<Skipped>,
    /// Roots whose listing did not answer in time (the service's bounded scan): their running
    /// hooks keep running.
    pub stalled_roots: Vec<PathBuf>,
}

/// Scans `roots` in order. Missing roots load nothing; entries that are not directories, and
/// directories without a HOOK.yaml, are ignored (debug log only, as upstream); every hook
/// directory yields either a [`HookSpec`] or a [`Skipped`].
pub fn discover(roots: &[PathBuf]) -> Discovery {
    discover_with(roots, &Gate::default())
}

/// [`discover`] under a trust gate (permission checks, explicit approvals).
pub fn discover_with(roots: &[PathBuf], gate: &Gate) -> Discovery {
    assemble(walk(roots).map(|(root, dir)| load_dir_with(root, &dir, gate)))
}

/// The [`Discovery`] of each hook directory's load, in discovery order: the first hook of a
/// name loads, a later one is shadowed; directories without HOOK.yaml are not hooks.
pub fn assemble(loads: impl Iterator<Item = Result<HookSpec, Box<Skipped>>>) -> Discovery {
    let mut out = Discovery::default();
    let mut by_name: HashMap<String, PathBuf> = HashMap::new();
    for load in loads {
        match load {
            Ok(mut spec) => {
                if let Some(first) = by_name.get(&spec.name) {
                    out.skipped.push(Skipped {
                        name: spec.name.clone(),
                        file: spec.manifest_path.clone(),
                        code: SkipCode::Shadowed,
                        events: spec.manifest.events.clone(),
                        reason: format!(
                            "shadowed: a hook named '{}' was already loaded from {}; rename one of them (`name:` in HOOK.yaml)",
                            spec.name,
                            first.display()
                        ),
                        dir: spec.dir.clone(),
                    });
                    continue;
                }
                by_name.insert(spec.name.clone(), spec.dir.clone());
                spec.order = out.hooks.len();
                out.hooks.push(spec);
            }
            // As upstream: a directory without HOOK.yaml (`_disabled/`, `__pycache__/`, a
            // `logs/` directory a hook made) is not a hook, not a problem.
            Err(skip) if skip.code == SkipCode::NoManifest => {
                tracing::debug!(dir = %skip.dir.display(), "no HOOK.yaml: not a hook directory");
            }
            Err(skip) => out.skipped.push(*skip),
        }
    }
    out
}

/// Every candidate hook directory of `roots`, in discovery order: roots in the order given,
/// each root's directories by name ([`hook_dirs`]).
pub fn walk(roots: &[PathBuf]) -> impl Iterator<Item = (&Path, PathBuf)> {
    roots.iter().flat_map(|root| {
        hook_dirs(root)
            .into_iter()
            .map(move |d| (root.as_path(), d))
    })
}

/// A hook's name: `name:` in its HOOK.yaml, else its directory's name.
pub fn hook_name(dir: &Path, manifest: Option<&Manifest>) -> String {
    manifest
        .and_then(|m| m.name.clone())
        .unwrap_or_else(|| dir_name(dir))
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
    /// HOOK.yaml parsed, or why it does not parse.
    pub manifest: Result<Manifest, String>,
}

/// Finds hook `name` the way discovery names hooks, in discovery order ([`walk`],
/// [`hook_name`]; the first match wins, as on a name clash). Directories without a readable
/// HOOK.yaml are passed over; nothing else is checked.
pub fn locate(roots: &[PathBuf], name: &str) -> Option<Located> {
    walk(roots).find_map(|(root, dir)| {
        if crate::hook_name::borrowed(root, name).is_some() {
            return None;
        }
        let manifest_path = dir.join("HOOK.yaml");
        let text = std::fs::read_to_string(&manifest_path).ok()?;
        let manifest = parse_manifest(&text).map_err(|e| e.to_string());
        (hook_name(&dir, manifest.as_ref().ok()) == name).then_some(Located {
            dir,
            manifest_path,
            text,
            manifest,
        })
    })
}

/// What runs the hook in `dir`: a webhook (`url:`, which must be http(s)), or the handler file
/// found by [`crate::layout::find_handler`]. On refusal: the code, the file and the reason.
pub fn resolve_handler(
    dir: &Path,
    manifest_path: &Path,
    manifest: &Manifest,
) -> Result<(HandlerKind, Option<PathBuf>), (SkipCode, PathBuf, String)> {
    if let Some(url) = &manifest.url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err((
                SkipCode::BadField,
                manifest_path.to_path_buf(),
                format!("`url`: {url:?} is not an http:// or https:// URL"),
            ));
        }
        return Ok((HandlerKind::Webhook, None));
    }
    let (kind, path) = find_handler(dir, manifest.handler.as_deref())
        .map_err(|p| (SkipCode::of(p.fault), p.file, p.reason))?;
    Ok((kind, Some(path)))
}

/// Why a hook placed in the gateway cannot have the sandbox its HOOK.yaml asks for: it would
/// run inside the gateway's own process, unconfined under a sandbox it declares (issue 57,
/// suspected case). Refused rather than run so.
fn sandbox_in_gateway(
    manifest: &Manifest,
    placement: &crate::placement::Placement,
) -> Option<String> {
    let sandbox = manifest.sandbox.as_ref().filter(|s| s.grants.is_some())?;
    placement.in_gateway().then(|| {
        format!(
            "`sandbox: {}` cannot hold: the hook runs inside the gateway's own process ({}), \
             where no sandbox applies and the hook is the gateway; remove `runs: gateway` (or \
             its imports of the gateway's modules) to run it confined in the service, or write \
             `sandbox: none`",
            sandbox.mode(),
            placement.why
        )
    })
}

/// Loads one hook directory under a trust gate.
pub fn load_dir_with(root: &Path, dir: &Path, gate: &Gate) -> Result<HookSpec, Box<Skipped>> {
    let manifest_path = dir.join("HOOK.yaml");
    let mut name = dir_name(dir);
    // The `events:` of HOOK.yaml once it is read, for the skips after that.
    let events = std::cell::RefCell::new(Vec::new());
    let skip = |name: &str, file: &Path, code: SkipCode, reason: String| {
        Box::new(Skipped {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            file: file.to_path_buf(),
            code,
            reason,
            events: events.borrow().clone(),
        })
    };
    if !manifest_path.is_file() {
        return Err(skip(
            &name,
            &manifest_path,
            SkipCode::NoManifest,
            "no HOOK.yaml: a hook directory needs a HOOK.yaml naming its events".into(),
        ));
    }
    let (text, mut manifest) = read_manifest(&manifest_path)
        .map_err(|(code, reason)| skip(&name, &manifest_path, code, reason))?;
    name = hook_name(dir, Some(&manifest));
    events.replace(manifest.events.clone());
    let misnamed = crate::hook_name::borrowed(root, &name).or_else(|| {
        let bad = manifest
            .name
            .is_none()
            .then(|| crate::manifest::validate_name(&name).err());
        bad.flatten()
            .map(|reason| format!("the directory name {reason}; set `name:` in HOOK.yaml"))
    });
    if let Some(reason) = misnamed {
        return Err(skip(&name, &manifest_path, SkipCode::BadField, reason));
    }
    let patterns = PatternSet::new(&manifest.events)
        .map_err(|e| skip(&name, &manifest_path, SkipCode::BadPattern, e.to_string()))?;
    // Said by the service's log and `/v1/hooks` too, not only by `check`.
    let misspelt = manifest
        .events
        .iter()
        .filter_map(|p| crate::pattern::misspelt_warning(p));
    manifest.warnings.extend(misspelt.collect::<Vec<_>>());
    if !manifest.enabled {
        return Err(skip(
            &name,
            &manifest_path,
            SkipCode::Disabled,
            "disabled (`enabled: false` in HOOK.yaml)".into(),
        ));
    }
    check_requires(&manifest)
        .map_err(|r| skip(&name, &manifest_path, SkipCode::Requirements, r))?;

    let (kind, handler_path) = resolve_handler(dir, &manifest_path, &manifest)
        .map_err(|(code, file, reason)| skip(&name, &file, code, reason))?;
    if manifest.concurrency > 1 && kind.spec().serial {
        manifest.notes.push(format!(
            "`concurrency: {}` applies in fleet mode only (events in flight across the fleet): \
             here a {} hook handles its events one at a time, in order",
            manifest.concurrency,
            kind.as_str()
        ));
    }
    gate.check_permissions(dir, &manifest_path, handler_path.as_deref())
        .map_err(|(file, reason)| skip(&name, &file, SkipCode::Permissions, reason))?;
    let files = RunFiles::scan(
        dir,
        kind,
        handler_path.as_deref(),
        &manifest,
        gate.checks_permissions(),
    )
    .map_err(|e| {
        let code = match e {
            TreeError::Permissions { .. } => SkipCode::Permissions,
            _ => SkipCode::BadHandler,
        };
        skip(&name, e.path(), code, e.to_string())
    })?;

    let placement = match &handler_path {
        Some(p) => crate::placement::decide(manifest.runs, kind.spec().python, dir, p),
        None => crate::placement::decide(manifest.runs, false, dir, &manifest_path),
    }
    .map_err(|r| skip(&name, &manifest_path, SkipCode::BadField, r))?;
    if let Some(reason) = sandbox_in_gateway(&manifest, &placement) {
        return Err(skip(&name, &manifest_path, SkipCode::BadField, reason));
    }
    manifest
        .warnings
        .extend(agent_events_in_gateway(&placement, &patterns));

    let (fingerprint, sha256) = fingerprint(&text, handler_path.as_deref(), dir, &files);
    gate.check_approved(&name, kind, handler_path.as_deref(), &manifest, &files)
        .map_err(|r| {
            let file = handler_path.as_deref().unwrap_or(&manifest_path);
            let code = [SkipCode::NotApproved, SkipCode::Revoked][gate.revoked(&name) as usize];
            skip(&name, file, code, r)
        })?;
    Ok(HookSpec {
        config_entries: crate::config_hooks::written_entries(root, dir, &name),
        name,
        dir: dir.to_path_buf(),
        root: root.to_path_buf(),
        manifest_path,
        handler_path,
        kind,
        manifest,
        patterns,
        fingerprint,
        files: std::sync::Arc::new(files),
        order: 0,
        placement,
        sha256,
    })
}

/// The agent's events reach the service only (the Hermes plugin asks it): a hook run inside
/// the gateway whose `events:` take one never sees it (issue 49). The warning, if so.
fn agent_events_in_gateway(
    placement: &crate::placement::Placement,
    patterns: &PatternSet,
) -> Option<String> {
    if !placement.in_gateway() {
        return None;
    }
    let e = crate::events::AGENT_EVENTS
        .iter()
        .find(|e| patterns.matches(e.name).is_some())?;
    Some(format!(
        "`events:` takes the agent's `{}`, but the hook runs inside the gateway, which the \
         agent's events never reach: set `runs: service` to receive them",
        e.name
    ))
}

/// Reads and parses HOOK.yaml: its text and the manifest, or why not.
fn read_manifest(manifest_path: &Path) -> Result<(String, Manifest), (SkipCode, String)> {
    let text = std::fs::read_to_string(manifest_path)
        .map_err(|e| (SkipCode::Unreadable, format!("cannot read HOOK.yaml: {e}")))?;
    let manifest = parse_manifest(&text).map_err(|e| {
        use crate::manifest::ManifestError as M;
        let code = match e {
            M::Yaml(_) => SkipCode::YamlError,
            M::NotMapping(_) => SkipCode::NotMapping,
            M::NoEvents => SkipCode::NoEvents,
            M::BadField { .. } => SkipCode::BadField,
        };
        (code, e.to_string())
    })?;
    Ok((text, manifest))
}

/// A hook version's fingerprint (the manifest text, its helper files and the files that can
/// run, the handler among them) and the handler file's SHA-256, both from what
/// [`RunFiles::scan`] hashed (the handler is not read again).
fn fingerprint(
    text: &str,
    handler_path: Option<&Path>,
    dir: &Path,
    files: &RunFiles,
) -> (u64, Option<String>) {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    let sha256 = handler_path.and_then(|p| files.sha256_of(p));
    sha256.hash(&mut hasher);
    hash_other_files(dir, &mut hasher);
    files.digest().hash(&mut hasher);
    (hasher.finish(), sha256)
}

/// Most files looked at per hook directory when fingerprinting its helper files.
const MAX_FINGERPRINT_FILES: usize = 512;

/// Folds the identity (path, size, mtime, inode) of the other Python files in the hook directory
/// into the fingerprint, so that editing a module `handler.py` imports also reloads the hook.
/// Other files are left out on purpose: a hook that writes data into its own directory must not
/// restart itself. Hidden files and `__pycache__` are skipped.
fn hash_other_files(dir: &Path, hasher: &mut DefaultHasher) {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let fname = e.file_name();
            let n = fname.to_string_lossy();
            if n.starts_with('.') || n == "__pycache__" || n == "HOOK.yaml" {
                continue;
            }
            seen += 1;
            if seen > MAX_FINGERPRINT_FILES {
                return;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else if n.ends_with(".py") {
                (
                    e.path(),
                    meta.len(),
                    meta.mtime(),
                    meta.mtime_nsec(),
                    meta.ino(),
                )
                    .hash(hasher);
            }
        }
    }
}

fn check_requires(m: &Manifest) -> Result<(), String> {
    let req = &m.requires;
    if !req.os.is_empty() {
        let os = std::env::consts::OS;
        let ok = req.os.iter().any(|o| {
            let o = o.to_ascii_lowercase();
            o == os || (o == "darwin" && os == "macos")
        });
        if !ok {
            return Err(format!(
                "requires os {} but this is {os}",
                req.os.join(" or ")
            ));
        }
    }
    let missing_env: Vec<&str> = req
        .env
        .iter()
        .filter(|v| std::env::var_os(v).is_none_or(|x| x.is_empty()))
        .map(String::as_str)
        .collect();
    if !missing_env.is_empty() {
        return Err(format!(
            "requires environment variable(s) {} to be set",
            missing_env.join(", ")
        ));
    }
    let missing_bins: Vec<&str> = req
        .bins
        .iter()
        .filter(|b| find_on_path(b).is_none())
        .map(String::as_str)
        .collect();
    if !missing_bins.is_empty() {
        return Err(format!(
            "requires program(s) {} on PATH",
            missing_bins.join(", ")
        ));
    }
    Ok(())
}
