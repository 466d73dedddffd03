//! Discovery: hook roots -> hook specs plus a report of every directory that did not load.
//!
//! Roots are scanned in the order given, each root's directories by name ascending; that is the
//! discovery order, which is also the order hooks fire in within a match group. On a name clash the
//! earlier hook wins and the later one is reported as shadowed. Nothing here starts a process:
//! Python import checks happen when a handler starts ([`crate::host`]).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::manifest::{Manifest, parse_manifest};
use crate::pattern::PatternSet;
use crate::trust::Gate;

/// What runs a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerKind {
    /// `handler.py`, run in a persistent Python worker.
    Python,
    /// An executable (or a shell script), one process per event.
    Exec,
    /// A dynamic library with the C ABI v1.
    Dylib,
    /// An HTTP endpoint (`url:`).
    Webhook,
}

impl HandlerKind {
    /// Lower-case name, as shown by the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            HandlerKind::Python => "python",
            HandlerKind::Exec => "exec",
            HandlerKind::Dylib => "dylib",
            HandlerKind::Webhook => "webhook",
        }
    }
}

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
}

impl Skipped {
    /// True for deliberate skips (`enabled: false`) that are not problems.
    pub fn is_problem(&self) -> bool {
        !matches!(self.code, SkipCode::Disabled)
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
    /// Position in discovery order.
    pub order: usize,
    /// Where the hook runs (service or gateway) and why.
    pub placement: crate::placement::Placement,
    /// SHA-256 (hex) of the handler file as discovered; the gateway's client refuses to import
    /// an in-gateway hook whose file no longer has it.
    pub sha256: Option<String>,
}

/// Result of scanning the roots.
#[derive(Debug, Default)]
pub struct Discovery {
    /// Hooks that can be started, in discovery order.
    pub hooks: Vec<HookSpec>,
    /// Directories that did not load.
    pub skipped: Vec<Skipped>,
}

/// Scans `roots` in order. Missing roots load nothing; entries that are not directories are
/// ignored; every hook directory yields either a [`HookSpec`] or a [`Skipped`].
pub fn discover(roots: &[PathBuf]) -> Discovery {
    discover_with(roots, &Gate::default())
}

/// [`discover`] under a trust gate (permission checks, explicit approvals).
pub fn discover_with(roots: &[PathBuf], gate: &Gate) -> Discovery {
    let mut out = Discovery::default();
    let mut by_name: HashMap<String, PathBuf> = HashMap::new();
    for root in roots {
        let dirs = hook_dirs(root);
        for dir in dirs {
            match load_dir_with(root, &dir, gate) {
                Ok(mut spec) => {
                    if let Some(first) = by_name.get(&spec.name) {
                        out.skipped.push(Skipped {
                            name: spec.name.clone(),
                            file: spec.manifest_path.clone(),
                            code: SkipCode::Shadowed,
                            reason: format!(
                                "shadowed: a hook named '{}' was already loaded from {}; rename one of them (`name:` in HOOK.yaml)",
                                spec.name,
                                first.display()
                            ),
                            dir,
                        });
                        continue;
                    }
                    by_name.insert(spec.name.clone(), dir.clone());
                    spec.order = out.hooks.len();
                    out.hooks.push(spec);
                }
                Err(skip) => out.skipped.push(*skip),
            }
        }
    }
    out
}

/// The hook directories of `root` in discovery order (name ascending; hidden entries and
/// files ignored; a missing root has none).
pub fn hook_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .filter(|p| !is_hidden(p))
        .collect();
    dirs.sort();
    dirs
}

fn is_hidden(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'))
}

fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Loads one hook directory.
pub fn load_dir(root: &Path, dir: &Path) -> Result<HookSpec, Box<Skipped>> {
    load_dir_with(root, dir, &Gate::default())
}

/// [`load_dir`] under a trust gate.
pub fn load_dir_with(root: &Path, dir: &Path, gate: &Gate) -> Result<HookSpec, Box<Skipped>> {
    let manifest_path = dir.join("HOOK.yaml");
    let mut name = dir_name(dir);
    let skip = |name: &str, file: &Path, code: SkipCode, reason: String| {
        Box::new(Skipped {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            file: file.to_path_buf(),
            code,
            reason,
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
    let text = std::fs::read_to_string(&manifest_path).map_err(|e| {
        skip(
            &name,
            &manifest_path,
            SkipCode::Unreadable,
            format!("cannot read HOOK.yaml: {e}"),
        )
    })?;
    let mut manifest = parse_manifest(&text).map_err(|e| {
        use crate::manifest::ManifestError as M;
        let code = match e {
            M::Yaml(_) => SkipCode::YamlError,
            M::NotMapping(_) => SkipCode::NotMapping,
            M::NoEvents => SkipCode::NoEvents,
            M::BadField { .. } => SkipCode::BadField,
        };
        skip(&name, &manifest_path, code, e.to_string())
    })?;
    if let Some(n) = &manifest.name {
        name = n.clone();
    } else if let Err(reason) = crate::manifest::validate_name(&name) {
        return Err(skip(
            &name,
            &manifest_path,
            SkipCode::BadField,
            format!("the directory name {reason}; set `name:` in HOOK.yaml"),
        ));
    }
    let patterns = PatternSet::new(&manifest.events)
        .map_err(|e| skip(&name, &manifest_path, SkipCode::BadPattern, e.to_string()))?;
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

    let (kind, handler_path) = if let Some(url) = &manifest.url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(skip(
                &name,
                &manifest_path,
                SkipCode::BadField,
                format!("`url`: {url:?} is not an http:// or https:// URL"),
            ));
        }
        // The worker's timeout covers the whole delivery (both attempts); `timeout:` is per attempt.
        manifest.timeout = crate::handler::webhook::delivery_budget(&manifest);
        manifest
            .warnings
            .extend(crate::handler::webhook::unsigned_warning(&manifest));
        (HandlerKind::Webhook, None)
    } else {
        let (kind, path) = find_handler(dir, manifest.handler.as_deref())
            .map_err(|(code, file, reason)| skip(&name, &file, code, reason))?;
        crate::trust::check_inside(dir, &path)
            .map_err(|r| skip(&name, &path, SkipCode::HandlerOutside, r))?;
        (kind, Some(path))
    };
    gate.check_permissions(dir, &manifest_path, handler_path.as_deref())
        .map_err(|(file, reason)| skip(&name, &file, SkipCode::Permissions, reason))?;

    let placement = match &handler_path {
        Some(p) => crate::placement::decide(manifest.runs, kind == HandlerKind::Python, dir, p),
        None => crate::placement::decide(manifest.runs, false, dir, &manifest_path),
    }
    .map_err(|r| skip(&name, &manifest_path, SkipCode::BadField, r))?;

    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    let mut sha256 = None;
    if let Some(p) = &handler_path {
        match std::fs::read(p) {
            Ok(bytes) => {
                use sha2::Digest;
                sha256 = Some(crate::handler::webhook::hex(&sha2::Sha256::digest(&bytes)));
                bytes.hash(&mut hasher)
            }
            Err(e) => {
                return Err(skip(
                    &name,
                    p,
                    SkipCode::BadHandler,
                    format!("cannot read handler: {e}"),
                ));
            }
        }
    }
    hash_other_files(dir, &mut hasher);
    gate.check_approved(&name, kind, handler_path.as_deref(), &manifest)
        .map_err(|r| {
            let file = handler_path.as_deref().unwrap_or(&manifest_path);
            skip(&name, file, SkipCode::NotApproved, r)
        })?;
    Ok(HookSpec {
        name,
        dir: dir.to_path_buf(),
        root: root.to_path_buf(),
        manifest_path,
        handler_path,
        kind,
        manifest,
        patterns,
        fingerprint: hasher.finish(),
        order: 0,
        placement,
        sha256,
    })
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

type HandlerProblem = (SkipCode, PathBuf, String);

/// Finds the handler: the explicit `handler:` path, or the first of handler.py, handler (with the
/// run bit), handler.sh, handler.so/.dylib/.dll.
pub(crate) fn find_handler(
    dir: &Path,
    explicit: Option<&str>,
) -> Result<(HandlerKind, PathBuf), HandlerProblem> {
    if let Some(rel) = explicit {
        let path = resolve_inside(dir, rel)?;
        if !path.is_file() {
            return Err((
                SkipCode::NoHandler,
                path.clone(),
                format!("handler {rel:?} (named in HOOK.yaml) does not exist or is not a file"),
            ));
        }
        let kind = kind_of(&path);
        if kind == HandlerKind::Exec && !is_executable(&path) && !is_shell_script(&path) {
            return Err((
                SkipCode::BadHandler,
                path,
                format!("handler {rel:?} is not executable: run `chmod +x` on it"),
            ));
        }
        return Ok((kind, path));
    }
    let py = dir.join("handler.py");
    if py.is_file() {
        return Ok((HandlerKind::Python, py));
    }
    let bin = dir.join("handler");
    if bin.is_file() && is_executable(&bin) {
        return Ok((HandlerKind::Exec, bin));
    }
    let sh = dir.join("handler.sh");
    if sh.is_file() {
        return Ok((HandlerKind::Exec, sh));
    }
    for ext in ["so", "dylib", "dll"] {
        let lib = dir.join(format!("handler.{ext}"));
        if lib.is_file() {
            return Ok((HandlerKind::Dylib, lib));
        }
    }
    let reason = if bin.is_file() {
        "no handler: `handler` exists but is not executable (chmod +x handler)".to_string()
    } else {
        "no handler: expected handler.py, an executable `handler`, handler.sh or handler.so \
         next to HOOK.yaml (or `handler:`/`url:` in HOOK.yaml)"
            .to_string()
    };
    Err((SkipCode::NoHandler, dir.to_path_buf(), reason))
}

/// Resolves `rel` against `dir`, refusing absolute paths, `..` and symlinks that lead outside.
fn resolve_inside(dir: &Path, rel: &str) -> Result<PathBuf, HandlerProblem> {
    let rel_path = Path::new(rel);
    let outside = |reason: String| (SkipCode::HandlerOutside, dir.join("HOOK.yaml"), reason);
    if rel_path.is_absolute() {
        return Err(outside(format!(
            "handler {rel:?} is an absolute path; it must be a file inside the hook directory"
        )));
    }
    if rel_path
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(outside(format!(
            "handler {rel:?} uses `..`; it must be a file inside the hook directory"
        )));
    }
    let path = dir.join(rel_path);
    if path.exists() {
        let real_dir = dir
            .canonicalize()
            .map_err(|e| outside(format!("cannot resolve directory: {e}")))?;
        let real = path
            .canonicalize()
            .map_err(|e| outside(format!("cannot resolve handler: {e}")))?;
        if !real.starts_with(&real_dir) {
            return Err(outside(format!(
                "handler {rel:?} resolves to {} outside the hook directory (symlink escape)",
                real.display()
            )));
        }
    }
    Ok(path)
}

fn kind_of(path: &Path) -> HandlerKind {
    match path.extension().and_then(|e| e.to_str()) {
        Some("py") => HandlerKind::Python,
        Some("so" | "dylib" | "dll") => HandlerKind::Dylib,
        _ => HandlerKind::Exec,
    }
}

/// True for `*.sh` files, which run with `sh` when they lack the run bit.
pub fn is_shell_script(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()) == Some("sh")
}

/// True when the file has any execute bit.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
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

/// Looks `program` up on `PATH` (or checks it directly when it contains a slash).
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return (p.is_file() && is_executable(&p)).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file() && is_executable(p))
}
