//! The work of `hermes-hooks enable NAME` / `disable NAME` and of the service's
//! `POST /v1/hooks/{name}/enable|disable` (not in [`crate::trust`], which discovery uses): find
//! the hook the way discovery does ([`crate::discovery::locate`]), resolve its handler with
//! discovery's rules, then approve or revoke it (explicit mode) or flip `enabled:` in its
//! HOOK.yaml. [`review`] says what an approval would cover (the files and their SHA-256) before
//! anyone approves, and [`set_enabled_reviewed`] approves only what was reviewed.

use std::path::{Path, PathBuf};

use crate::discovery::{Located, locate, resolve_handler};
use crate::manifest::parse_manifest;
use crate::trust::approvals::{
    Approval, TrustFile, approval_hash, covered_settings, settings_hash, short, trust_file,
};
use crate::trust::edit::edit_enabled;
use crate::trust::error::TrustError;
use crate::trust::files::RunFiles;
use crate::trust::policy::{Gate, TrustMode, TrustPolicy};

/// `hermes-hooks enable NAME` (`on`) or `disable NAME`: approve/revoke in explicit mode, else set
/// `enabled:` in HOOK.yaml. Returns the message to print.
pub fn set_enabled(
    roots: &[PathBuf],
    hermes_home: &Path,
    policy: &TrustPolicy,
    name: &str,
    on: bool,
) -> Result<String, TrustError> {
    set_enabled_reviewed(roots, hermes_home, policy, name, on, None)
}

/// [`set_enabled`], except that in explicit mode an approval happens only when what it would
/// cover still has the digest `reviewed` (the [`Review::digest`] shown to whoever approves).
pub fn set_enabled_reviewed(
    roots: &[PathBuf],
    hermes_home: &Path,
    policy: &TrustPolicy,
    name: &str,
    on: bool,
    reviewed: Option<&str>,
) -> Result<String, TrustError> {
    let roots = &crate::config_hooks::roots_with_made(hermes_home, roots);
    match (policy.mode, on) {
        (TrustMode::Explicit, true) => approve(roots, hermes_home, policy, name, reviewed),
        (TrustMode::Explicit, false) => revoke(hermes_home, name),
        (TrustMode::All, _) => {
            let hook = find(roots, name)?;
            flip_enabled(&hook, on)
        }
    }
}

/// Hook `name` as discovery finds it (roots in order, directories in discovery order, named by
/// `name:` or the directory; the first match wins).
fn find(roots: &[PathBuf], name: &str) -> Result<Located, TrustError> {
    locate(roots, name).ok_or_else(|| TrustError::NotFound {
        name: name.to_string(),
        roots: roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// What approving a hook covers, shown before the approval: the handler (or endpoint), the
/// SHA-256 an approval records, every file that can run with its SHA-256, and the approval
/// already recorded, if any.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Review {
    /// The hook's name.
    pub name: String,
    /// Handler kind.
    pub kind: &'static str,
    /// The hook directory.
    pub dir: PathBuf,
    /// Handler file or URL.
    pub handler: String,
    /// What an approval records (the handler's bytes, or a webhook's endpoint).
    pub sha256: String,
    /// Every file of the tree that can run (relative path -> SHA-256).
    pub files: std::collections::BTreeMap<String, String>,
    /// The approval already recorded: its SHA-256 and when.
    pub approved: Option<ReviewApproved>,
    /// The trust mode (`explicit` or `all`).
    pub trust: &'static str,
    /// A digest of all of the above that can run: an approval given with it happens only if
    /// nothing has changed since it was shown.
    pub digest: String,
    /// `enabled:` of HOOK.yaml.
    pub enabled: bool,
    /// The sandbox the hook runs in, as `check` shows it (`none`, `strict`, or the grants), and
    /// whether HOOK.yaml says it or the service's default applies: shown before Approve.
    pub sandbox: String,
    /// Every HOOK.yaml setting the approval covers besides the files (`sandbox`, `env.*`,
    /// `cwd`, `python`, `requires.*`...), as written; the digest covers them.
    pub settings: std::collections::BTreeMap<String, String>,
    /// The code itself (issue 50): every file that can run, with its text, and what changed
    /// since the recorded approval (a diff when the approved text was kept); files the
    /// approval covered that are gone are listed as `removed`.
    pub code: Vec<ReviewFile>,
    /// A hook made from an entry of config.yaml's `hooks:` block (issue 60 row 2): the command
    /// it runs and the script that command names. Its files above are the handler hermes-hooks
    /// wrote for every such entry, with the entry in `entry.py`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_entry: Option<ConfigEntryReview>,
    /// Why the handler would not load, as far as can be told without running it (issue 60 row
    /// 6: an unapproved hook with a syntax error read only `not_approved`): a Python handler
    /// that does not compile, a shell script that `sh -n` refuses. Absent when it compiles or
    /// cannot be told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syntax_error: Option<String>,
}

/// Compiles a Python file without running it: the error, one line, on stdout.
const PY_COMPILE: &str = "import sys\np = sys.argv[1]\ntry:\n    compile(open(p, 'rb').read(), p, 'exec')\n\
except (SyntaxError, ValueError) as e:\n    print('%s, line %s: %s: %s' % (p, getattr(e, 'lineno', '?'), \
type(e).__name__, getattr(e, 'msg', e)))\n    sys.exit(1)\n";

/// [`Review::syntax_error`]: a Python handler compiled by the hook's interpreter (`-I -S`:
/// nothing of the hook's directory or the site is imported, `compile` runs no code); a shell
/// handler checked by its `#!` shell's `-n`. Blocks (starts a process).
fn syntax_error(p: &Prepared, hermes_home: &Path) -> Option<String> {
    let handler = p.handler.as_deref()?;
    if !p.kind.spec().python {
        return crate::handler::shell_syntax::syntax_error(handler);
    }
    let default = crate::interpreter::default_python(hermes_home);
    let python =
        crate::interpreter::for_hook(p.manifest.python.as_deref(), &default, hermes_home).path;
    let out = std::process::Command::new(&python)
        .args(["-I", "-S", "-c", PY_COMPILE])
        .arg(handler)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!out.status.success() && !said.is_empty())
        .then(|| format!("{python} does not compile it: {}", crate::text::cap(said)))
}

/// The config.yaml entries a hook is made from (those of one command), as a review shows them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConfigEntryReview {
    /// Where they are: `hooks.EVENT[INDEX]` of config.yaml, each, joined by `, `.
    pub at: String,
    /// The agent's event the first entry runs on (all of them: `entries`).
    pub event: String,
    /// The command line, as written (what the approval covers, through `entry.py`).
    pub command: String,
    /// The first entry's tool-name regular expression (tool events only).
    pub matcher: Option<String>,
    /// Seconds the command may run, on the first entry.
    pub timeout_s: u64,
    /// Every entry of the command, in file order (issue 58 row 1: one hook runs them all).
    pub entries: Vec<crate::config_hooks::WrittenEntry>,
    /// The script the command runs, when it names a text file: the program itself found on
    /// `PATH` or by its path, else the first argument with a `/` (`bash ~/gate.sh`).
    pub script: Option<ReviewFile>,
}

/// What a review shows of the config.yaml entries behind hook `name`, if it is one.
fn config_entry_review(hermes_home: &Path, name: &str) -> Option<ConfigEntryReview> {
    if !crate::hook_name::config_shaped(name) {
        return None;
    }
    let all = crate::config_hooks::entries_named(hermes_home, name);
    let e = all.first()?.clone();
    let argv = crate::config_hooks::command_argv(&e.command).unwrap_or_default();
    let path_dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let candidates = argv.iter().enumerate().flat_map(|(i, arg)| {
        let path = PathBuf::from(arg);
        if arg.contains('/') {
            vec![path]
        } else if i == 0 {
            path_dirs.iter().map(|d| d.join(arg)).collect()
        } else {
            Vec::new()
        }
    });
    let script = candidates
        .filter(|p| p.is_absolute() && p.is_file())
        .find_map(|p| script_file(&p));
    let at: Vec<String> = all
        .iter()
        .map(|e| format!("hooks.{}[{}]", e.event, e.index))
        .collect();
    let entries = all
        .into_iter()
        .map(|e| crate::config_hooks::WrittenEntry {
            event: e.event,
            matcher: e.matcher,
            command: e.command,
            timeout: e.timeout,
            index: e.index,
        })
        .collect();
    Some(ConfigEntryReview {
        at: at.join(", "),
        event: e.event,
        command: e.command,
        matcher: e.matcher,
        timeout_s: e.timeout,
        entries,
        script,
    })
}

/// Extensions of scripts an interpreter runs (a file without `#!` is shown only with one).
const SCRIPT_EXTENSIONS: &[&str] = &[
    "sh", "bash", "zsh", "fish", "py", "rb", "pl", "js", "mjs", "ts", "php", "lua",
];

/// A script's text, when `path` is a readable UTF-8 text file of at most [`SHOWN_BYTES`] that
/// starts with `#!` or has a script's extension (a program such as `bash` is not one, nor is a
/// data file the command reads, say a key: a review does not show it).
fn script_file(path: &Path) -> Option<ReviewFile> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    if file.metadata().ok()?.len() > SHOWN_BYTES {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(SHOWN_BYTES + 1).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8(bytes)
        .ok()
        .filter(|t| !t.contains('\0'))?;
    let named = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| SCRIPT_EXTENSIONS.contains(&e));
    if !text.starts_with("#!") && !named {
        return None;
    }
    let (shown, hidden) = visible(&text);
    Some(ReviewFile {
        path: path.display().to_string(),
        sha256: sha256_hex(text.as_bytes()),
        status: "script",
        text: Some(shown),
        note: Some(hidden.map_or_else(String::new, |h| format!("{h}; ")) + SCRIPT_NOTE),
        diff: None,
    })
}

/// What an approval of a config.yaml hook covers of its script.
const SCRIPT_NOTE: &str = "the approval covers the command, not this file: an edit of the \
                           script runs without a new approval (as with Hermes's own allowlist)";

/// One file of a [`Review`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReviewFile {
    /// Relative to the hook directory.
    pub path: String,
    /// Its SHA-256 now (empty when `removed`).
    pub sha256: String,
    /// `new` (not in the recorded approval, or no approval), `unchanged`, `changed` or
    /// `removed`; `script` for the script of a config.yaml hook's command.
    pub status: &'static str,
    /// Its text, when it is UTF-8 and at most [`SHOWN_BYTES`].
    pub text: Option<String>,
    /// Why the text is not shown (binary, too large, unreadable).
    pub note: Option<String>,
    /// `changed`: the unified diff from the approved text, when that text was kept at approval
    /// (`$HERMES_HOME/hooks-approved/`).
    pub diff: Option<String>,
}

/// Largest file whose text a review shows (and whose approved text is kept for a diff).
pub const SHOWN_BYTES: u64 = 256 * 1024;

/// Where the texts of approved files are kept, by SHA-256, for a later review's diff.
fn approved_store(hermes_home: &Path) -> PathBuf {
    hermes_home.join("hooks-approved")
}

/// The text of the file `rel` of the hook directory `dir`, or why not. Opened beneath `dir`
/// by the kernel's rule (`openat2` with `RESOLVE_BENEATH`): a link that leads out of the hook
/// directory is not followed, whatever its text (issue 57 row 3: `leak.txt -> ../../.env`
/// showed `$HERMES_HOME/.env` to whoever asked for the review).
fn text_of(dir: &Path, rel: &str) -> Result<String, String> {
    use std::io::Read;
    let mut file = open_beneath(dir, rel).map_err(|e| match e.raw_os_error() {
        Some(libc::EXDEV) | Some(libc::ELOOP) => {
            "a symbolic link out of the hook directory: not followed, not shown".to_string()
        }
        _ => format!("cannot read it: {e}"),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    if meta.len() > SHOWN_BYTES {
        return Err(format!("{} bytes: too large to show here", meta.len()));
    }
    let mut bytes = Vec::new();
    file.by_ref()
        .take(SHOWN_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.contains(&0) {
        return Err("binary".to_string());
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())
}

/// `rel` opened for reading beneath `dir`: no `..`, absolute link or link chain may leave it,
/// and no `/proc` magic link is followed.
fn open_beneath(dir: &Path, rel: &str) -> std::io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    /// `struct open_how`.
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_BENEATH: u64 = 0x08;
    let top = std::fs::File::open(dir)?;
    let rel =
        std::ffi::CString::new(rel).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK) as u64,
        mode: 0,
        resolve: RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 reads the path and `how` (both alive for the call) and returns a new
    // descriptor that nothing else owns.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            top.as_raw_fd(),
            rel.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: see above.
    Ok(unsafe { std::fs::File::from_raw_fd(fd as i32) })
}

/// `text` as a review shows it, with what would otherwise hide code made visible (issue 57
/// row 9): a carriage return not followed by a line feed ends a line for Python (and a
/// browser draws it as a space), so it is shown as `␍` and a line break; a bidirectional
/// control character (which reorders what is drawn) as `<U+XXXX>`. The note says so.
fn visible(text: &str) -> (String, Option<String>) {
    let (mut out, mut crs, mut bidi) = (String::with_capacity(text.len()), 0, 0);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' if chars.peek() != Some(&'\n') => {
                crs += 1;
                out.push_str("\u{240D}\n");
            }
            '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' => {
                bidi += 1;
                out.push_str(&format!("<U+{:04X}>", c as u32));
            }
            c => out.push(c),
        }
    }
    let mut notes = Vec::new();
    if crs > 0 {
        notes.push(format!(
            "{crs} carriage return(s) not followed by a line feed, shown as \u{240D} and a line \
             break: Python reads each as the end of a line"
        ));
    }
    if bidi > 0 {
        notes.push(format!(
            "{bidi} bidirectional control character(s), shown as <U+XXXX>: they reorder what \
             an editor or a browser draws"
        ));
    }
    (out, (!notes.is_empty()).then(|| notes.join("; ")))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// A review's settings as shown: the value of an `env.` setting whose name says it is a
/// secret (`…TOKEN`, `…PASSWORD`, `…KEY`, …) is shown by its length and the start of its
/// SHA-256, never its text (the digest still covers the value; issue 57 row 3).
fn shown_settings(
    settings: std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    settings
        .into_iter()
        .map(|(k, v)| {
            let secret = k.strip_prefix("env.").is_some_and(|name| {
                let name = name.to_ascii_uppercase();
                [
                    "TOKEN",
                    "SECRET",
                    "PASSWORD",
                    "PASSWD",
                    "KEY",
                    "CREDENTIAL",
                    "AUTH",
                    "COOKIE",
                ]
                .iter()
                .any(|w| name.contains(w))
            });
            if secret {
                let sha = sha256_hex(v.as_bytes());
                let shown = format!(
                    "(secret: {} characters, sha256 {})",
                    v.chars().count(),
                    &sha[..12]
                );
                (k, shown)
            } else {
                (k, v)
            }
        })
        .collect()
}

/// Keeps the texts of the files just approved in [`approved_store`] (best effort: a review
/// without them shows no diff, nothing else depends on them).
fn keep_approved(
    hermes_home: &Path,
    dir: &Path,
    files: &std::collections::BTreeMap<String, String>,
) {
    let store = approved_store(hermes_home);
    if crate::layout::create_private_dir(&store).is_err() {
        return;
    }
    for (path, sha) in files {
        let kept = store.join(sha);
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) || kept.exists() {
            continue;
        }
        // Kept only when what was read is what was approved: a hook that rewrites its file
        // between the approval's hash and this read cannot plant an "approved" text.
        if let Ok(text) = text_of(dir, path)
            && sha256_hex(text.as_bytes()) == *sha
        {
            let _ = crate::atomic::write(&kept, text.as_bytes(), 0o600);
        }
    }
}

/// The code part of a review: each file now against the approval `approved` (path -> sha).
fn review_code(
    hermes_home: &Path,
    dir: &Path,
    now: &std::collections::BTreeMap<String, String>,
    approved: Option<&std::collections::BTreeMap<String, String>>,
) -> Vec<ReviewFile> {
    let store = approved_store(hermes_home);
    let mut out: Vec<ReviewFile> = now
        .iter()
        .map(|(path, sha)| {
            let then = approved.and_then(|a| a.get(path));
            let status = match then {
                None => "new",
                Some(t) if t == sha => "unchanged",
                Some(_) => "changed",
            };
            let (text, note) = match text_of(dir, path) {
                Ok(t) => {
                    let (shown, hidden) = visible(&t);
                    (Some(shown), hidden)
                }
                Err(why) => (None, Some(why)),
            };
            let diff = match (status, then, &text) {
                ("changed", Some(t), Some(new)) => std::fs::read_to_string(store.join(t))
                    .ok()
                    // A kept text is used only when it still hashes to what was approved.
                    .filter(|old| sha256_hex(old.as_bytes()) == *t)
                    .and_then(|old| crate::diff::unified(&visible(&old).0, new)),
                _ => None,
            };
            ReviewFile {
                path: path.clone(),
                sha256: sha.clone(),
                status,
                text,
                note,
                diff,
            }
        })
        .collect();
    for (path, _) in approved.into_iter().flatten() {
        if !now.contains_key(path) {
            out.push(ReviewFile {
                path: path.clone(),
                sha256: String::new(),
                status: "removed",
                text: None,
                note: None,
                diff: None,
            });
        }
    }
    out
}

/// An approval already recorded for a hook.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReviewApproved {
    /// What it covers.
    pub sha256: String,
    /// When it was given.
    pub approved_at: String,
}

/// Everything an approval of a hook is made of, read from its directory.
struct Prepared {
    hook: Located,
    manifest: crate::manifest::Manifest,
    kind: crate::kind::HandlerKind,
    handler: Option<PathBuf>,
    files: RunFiles,
    sha256: String,
}

fn prepare(roots: &[PathBuf], policy: &TrustPolicy, name: &str) -> Result<Prepared, TrustError> {
    let hook = find(roots, name)?;
    let refused = |path: &Path, reason: String| TrustError::Refused {
        path: path.to_path_buf(),
        reason,
    };
    let manifest = hook
        .manifest
        .as_ref()
        .map_err(|e| refused(&hook.manifest_path, format!("{e}; fix HOOK.yaml first")))?
        .clone();
    let (kind, handler) = resolve_handler(&hook.dir, &hook.manifest_path, &manifest)
        .map_err(|(_, file, reason)| refused(&file, reason))?;
    if !policy.insecure_permissions {
        let gate = Gate::default();
        gate.check_permissions(&hook.dir, &hook.manifest_path, handler.as_deref())
            .map_err(|(p, r)| refused(&p, format!("cannot approve: {r}")))?;
    }
    let files = RunFiles::scan(
        &hook.dir,
        kind,
        handler.as_deref(),
        &manifest,
        !policy.insecure_permissions,
    )
    .map_err(|e| refused(e.path(), format!("cannot approve: {e}")))?;
    let sha256 =
        approval_hash(kind, handler.as_deref(), &manifest).map_err(|source| TrustError::Io {
            op: "read",
            path: handler
                .clone()
                .unwrap_or_else(|| hook.manifest_path.clone()),
            source,
        })?;
    Ok(Prepared {
        hook,
        manifest,
        kind,
        handler,
        files,
        sha256,
    })
}

impl Prepared {
    fn handler_text(&self) -> String {
        match (&self.handler, &self.manifest.url) {
            (Some(p), _) => p.display().to_string(),
            (None, Some(u)) => u.clone(),
            _ => String::new(),
        }
    }

    /// SHA-256 over what an approval covers: the recorded hash, the settings and every file.
    fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.sha256.as_bytes());
        h.update(b"\0");
        h.update(settings_hash(&self.manifest).as_bytes());
        for event in &self.manifest.events {
            h.update(b"\0event\0");
            h.update(event.as_bytes());
        }
        for (path, sha) in &self.files.files {
            h.update(b"\0");
            h.update(path.as_bytes());
            h.update(b"\0");
            h.update(sha.as_bytes());
        }
        hex::encode(h.finalize())
    }
}

/// What approving hook `name` would cover now (see [`Review`]).
pub fn review(
    roots: &[PathBuf],
    hermes_home: &Path,
    policy: &TrustPolicy,
    sandbox_default: crate::sandbox::DefaultSandbox,
    name: &str,
) -> Result<Review, TrustError> {
    let roots = &crate::config_hooks::roots_with_made(hermes_home, roots);
    let p = prepare(roots, policy, name)?;
    let approvals = TrustFile::load(&trust_file(hermes_home))?;
    let recorded = approvals.hooks.get(name).and_then(|a| a.files.as_ref());
    let code = review_code(hermes_home, &p.hook.dir, &p.files.files, recorded);
    Ok(Review {
        name: name.to_string(),
        kind: p.kind.as_str(),
        dir: p.hook.dir.clone(),
        handler: p.handler_text(),
        sha256: p.sha256.clone(),
        files: p.files.files.clone(),
        approved: approvals.hooks.get(name).map(|a| ReviewApproved {
            sha256: a.sha256.clone(),
            approved_at: a.approved_at.clone(),
        }),
        trust: match policy.mode {
            TrustMode::Explicit => "explicit",
            TrustMode::All => "all",
        },
        digest: p.digest(),
        enabled: p.manifest.enabled,
        sandbox: p.manifest.sandbox.as_ref().map_or_else(
            || {
                let default = match sandbox_default {
                    crate::sandbox::DefaultSandbox::None => "none",
                    crate::sandbox::DefaultSandbox::Strict => "strict",
                };
                format!("{default} (not set in HOOK.yaml: the service's --sandbox-default)")
            },
            crate::trust::approvals::sandbox_text,
        ),
        settings: {
            let mut shown = shown_settings(covered_settings(&p.manifest));
            // Covered by the approval and its digest too (the events whose answers count).
            shown.insert("events".to_string(), p.manifest.events.join(", "));
            shown
        },
        code,
        config_entry: config_entry_review(hermes_home, name),
        syntax_error: syntax_error(&p, hermes_home),
    })
}

fn approve(
    roots: &[PathBuf],
    hermes_home: &Path,
    policy: &TrustPolicy,
    name: &str,
    reviewed: Option<&str>,
) -> Result<String, TrustError> {
    let p = prepare(roots, policy, name)?;
    if let Some(reviewed) = reviewed
        && reviewed != p.digest()
    {
        return Err(TrustError::Refused {
            path: p.hook.dir.clone(),
            reason: "its files changed since they were reviewed; review them again, then approve"
                .to_string(),
        });
    }
    let handler_text = p.handler_text();
    let Prepared {
        hook,
        manifest,
        kind,
        handler: _,
        files,
        sha256,
    } = p;
    let manifest = &manifest;
    keep_approved(hermes_home, &hook.dir, &files.files);
    let file = trust_file(hermes_home);
    let approval = Approval {
        sha256: sha256.clone(),
        settings_sha256: Some(settings_hash(manifest)),
        settings: Some(covered_settings(manifest)),
        files: Some(files.files.clone()),
        kind: kind.as_str().to_string(),
        handler: handler_text,
        events: Some(manifest.events.clone()),
        dir: hook.dir.clone(),
        approved_at: crate::time::now(),
    };
    let previous = TrustFile::update(&file, |approvals| {
        approvals.revoked.remove(name);
        Ok(approvals
            .hooks
            .insert(name.to_string(), approval)
            .map(|a| a.sha256))
    })?;
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
    // The approvals file is not watched (docs/operators.md): this one needs the reload.
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
    let removed = TrustFile::update(&file, |approvals| {
        // Remembered for the hooks the service would approve by itself again (config.yaml's,
        // from the allowlist, when their directory is made again): issue 57 row 8.
        if crate::hook_name::config_shaped(name) {
            approvals
                .revoked
                .insert(name.to_string(), crate::time::now());
        }
        Ok(approvals.hooks.remove(name))
    })?;
    if removed.is_none() {
        return Ok(format!(
            "{name} was not approved in {}; nothing to revoke",
            file.display()
        ));
    }
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
    crate::atomic::write(path, new_text.as_bytes(), mode)?;
    Ok(format!(
        "{word} {} ({}); a running service picks it up by itself (its watcher sees the edit; \
         under --no-watch: SIGHUP or POST /v1/reload)",
        path.display(),
        if on {
            "enabled: true"
        } else {
            "enabled: false"
        }
    ))
}

/// The message of an enable or disable the service made itself and reloaded after (the API:
/// the dashboard's Approve): what the reload did, instead of the CLI's advice to reload.
/// `loaded`: the reload's loaded hooks, or `None` when it did not finish in time.
pub fn after_reload(message: &str, name: &str, loaded: Option<&[String]>) -> String {
    let head = ["; a running service ", "; a running service"]
        .iter()
        .find_map(|m| message.find(m))
        .map_or(message, |i| &message[..i]);
    let runs = loaded.map(|l| l.iter().any(|n| n == name));
    let tail = match runs {
        Some(true) => format!("; the service reloaded: {name} runs now"),
        Some(false) => format!("; the service reloaded: {name} is not running"),
        None => "; the service is reloading".to_string(),
    };
    let rest = message
        .find('\n')
        .map_or(String::new(), |i| message[i..].to_string());
    format!("{head}{tail}{rest}")
}

/// Approves hook `name` as staged in `staged_root` (a hook root holding it under its name),
/// before it is moved to `final_dir`: the approval then names `final_dir`. Returns the message.
pub fn approve_staged(
    staged_root: &Path,
    hermes_home: &Path,
    policy: &TrustPolicy,
    name: &str,
    final_dir: &Path,
) -> Result<String, TrustError> {
    let msg = approve(
        &[staged_root.to_path_buf()],
        hermes_home,
        policy,
        name,
        None,
    )?;
    TrustFile::update(&trust_file(hermes_home), |approvals| {
        if let Some(a) = approvals.hooks.get_mut(name) {
            a.dir = final_dir.to_path_buf();
        }
        Ok(())
    })?;
    Ok(msg.replace(
        &staged_root.display().to_string(),
        &final_dir.display().to_string(),
    ))
}

/// The approvals file's bytes (`None`: no file), to put back with [`restore_approvals`] when
/// what was approved does not land.
pub fn snapshot_approvals(hermes_home: &Path) -> Option<Vec<u8>> {
    std::fs::read(trust_file(hermes_home)).ok()
}

/// Puts back the approvals file as [`snapshot_approvals`] read it.
pub fn restore_approvals(hermes_home: &Path, saved: Option<Vec<u8>>) {
    let file = trust_file(hermes_home);
    let _lock = crate::trust::approvals::lock(&file);
    let _ = match saved {
        Some(bytes) => crate::atomic::write(&file, &bytes, 0o600).map_err(|e| e.to_string()),
        None => std::fs::remove_file(&file).map_err(|e| e.to_string()),
    };
}
