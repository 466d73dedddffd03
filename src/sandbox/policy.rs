//! A hook's sandbox resolved for its processes: the paths of its grants expanded (`~`,
//! `$HERMES_HOME`, `{hook_dir}`, `{state_dir}`), what `strict` always grants (the hook's
//! directory read-only, its private state directory read-write, the system's programs and
//! libraries read-only), the variables its processes may see, and the Landlock rules of it
//! ([`Rules`]), which the service enforces on an executable and the Python runner on itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::decl::{Connect, Sandbox};
use super::landlock::{self, Rules, fs};

/// The variable that names a confined hook's state directory.
pub const STATE_DIR_ENV: &str = "HERMES_HOOK_STATE_DIR";

/// Read-only for every confined hook: the programs, libraries and locale/time-zone data of the
/// system, and the harmless devices.
const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/locale.alias",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
];

/// Read-only for a hook that may connect somewhere: name resolution and certificates.
const NET_READ: &[&str] = &[
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/host.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
];

/// Variables a confined hook always sees: the host's own, locale, time zone, `PATH`.
const DEFAULT_ENV: &[&str] = &["HERMES_*", "LANG", "LANGUAGE", "LC_*", "TZ", "PATH"];

/// Where a hook's sandbox is resolved.
#[derive(Debug, Clone)]
pub struct Where<'a> {
    /// The hook's directory (`{hook_dir}`).
    pub hook_dir: &'a Path,
    /// The hook's name (its state directory's name).
    pub name: &'a str,
    /// `$HERMES_HOME`.
    pub hermes_home: &'a Path,
    /// The keys of the hook's own `env:` (declared by the hook, so visible to it).
    pub own_env: Vec<String>,
    /// The hook's `python:` interpreter as written, made absolute (a relative one is under its
    /// directory); `None` without the key.
    pub python: Option<PathBuf>,
}

/// The private state directory of hook `name` (refused for a name that is not one safe path
/// component, [`crate::hook_name`]).
pub fn state_dir(hermes_home: &Path, name: &str) -> Result<PathBuf, String> {
    crate::hook_name::path_under(&hermes_home.join("hook-state"), name)
}

/// Variables that steer an interpreter, the dynamic loader or a shell before any code of the
/// hook's own runs (what to import or preload, where from, options read at start-up): a
/// sandboxed hook may not set them in its `env:`, since they act before (or around) the
/// sandbox. A `*` ends a prefix.
const STEERING_ENV: &[&str] = &[
    "PYTHON*",
    "LD_*",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "MALLOC_*",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RESOLV_*",
    "PERL5*",
    "PERLLIB",
    "PERLIO*",
    "NODE_OPTIONS",
    "NODE_PATH",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "IFS",
    "BASH_FUNC_*",
];

/// `PYTHON*` variables that only set an option (no module, path or code): allowed.
const HARMLESS_ENV: &[&str] = &[
    "PYTHONHASHSEED",
    "PYTHONUNBUFFERED",
    "PYTHONUTF8",
    "PYTHONIOENCODING",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONFAULTHANDLER",
];

/// Whether the variable name or `PREFIX_*` pattern `p` steers (or could match a variable that
/// steers) an interpreter or the loader ([`STEERING_ENV`]).
pub fn steers(p: &str) -> bool {
    if HARMLESS_ENV.contains(&p) {
        return false;
    }
    let (base, prefix) = match p.strip_suffix('*') {
        Some(b) => (b, true),
        None => (p, false),
    };
    STEERING_ENV.iter().any(|s| match s.strip_suffix('*') {
        Some(sb) => base.starts_with(sb) || (prefix && sb.starts_with(base)),
        None => base == *s || (prefix && s.starts_with(base)),
    })
}

/// Why a sandboxed hook's `env:` (its own variables, and those of the service it asks to see)
/// cannot be kept: the variables that steer its interpreter.
fn steering_refusal(own_env: &[String], granted: &[String]) -> Option<String> {
    let bad: Vec<&str> = own_env
        .iter()
        .chain(granted)
        .filter(|k| steers(k))
        .map(String::as_str)
        .collect();
    (!bad.is_empty()).then(|| {
        format!(
            "`env:` of a sandboxed hook sets {}, which steer the interpreter or the dynamic \
             loader before the sandbox holds (what to import or preload, and from where): \
             remove {} from `env:` (keep modules inside the hook's directory, which is \
             importable as it is), or write `sandbox: none`",
            bad.join(", "),
            if bad.len() == 1 { "it" } else { "them" }
        )
    })
}

/// What a confined hook's processes may do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Policy {
    /// `strict` or `custom`.
    pub mode: &'static str,
    /// Readable (besides the system's programs and libraries): the hook directory and `read:`.
    pub read: Vec<PathBuf>,
    /// Readable and writable: the state directory and `write:`.
    pub write: Vec<PathBuf>,
    /// TCP ports it may connect to (a host is recorded, not enforced).
    pub connect: Vec<Connect>,
    /// Variables it may see (`NAME`, `PREFIX_*`).
    pub env: Vec<String>,
    /// Whether it may start programs.
    pub exec: bool,
    /// Runs with what the kernel can enforce.
    pub best_effort: bool,
    /// Its private state directory (`{state_dir}`, `$HERMES_HOOK_STATE_DIR`).
    pub state_dir: PathBuf,
    /// The line of `sandbox:` in HOOK.yaml.
    #[serde(skip)]
    pub line: Option<usize>,
    /// Why this sandbox cannot be enforced as written, and the hook does not start: a name
    /// that is not one path component, a grant through a link the hook could have planted, an
    /// `env:` that steers the interpreter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

fn expand(p: &str, w: &Where, state: &Path) -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let rest = |prefix: &str| p[prefix.len()..].trim_start_matches('/').to_string();
    let base_join = |base: &Path, r: String| {
        if r.is_empty() {
            base.to_path_buf()
        } else {
            base.join(r)
        }
    };
    if p == "~" || p.starts_with("~/") {
        base_join(
            home.as_deref().unwrap_or(Path::new("/nonexistent")),
            rest("~"),
        )
    } else if p.starts_with("$HERMES_HOME") {
        base_join(w.hermes_home, rest("$HERMES_HOME"))
    } else if p.starts_with("{hook_dir}") {
        base_join(w.hook_dir, rest("{hook_dir}"))
    } else if p.starts_with("{state_dir}") {
        base_join(state, rest("{state_dir}"))
    } else {
        PathBuf::from(p)
    }
}

/// The policy of `sandbox` for the hook at `w`; `None` for `sandbox: none`.
pub fn resolve(sandbox: &Sandbox, w: &Where) -> Option<Policy> {
    let grants = sandbox.grants.as_ref()?;
    let (state, mut refused) = match state_dir(w.hermes_home, w.name) {
        Ok(s) => (s, None),
        Err(why) => (PathBuf::from("/nonexistent/hook-state"), Some(why)),
    };
    let mut read = vec![w.hook_dir.to_path_buf()];
    read.extend(grants.read.iter().map(|p| expand(p, w, &state)));
    let mut write = vec![state.clone()];
    write.extend(grants.write.iter().map(|p| expand(p, w, &state)));
    // What the kernel will get, and `check` shows: each grant with its links resolved once.
    match super::pin::resolve_grants(&write, &read) {
        Ok((w, r)) => (write, read) = (w, r),
        Err(why) => refused = refused.or(Some(why)),
    }
    let state = write.first().cloned().unwrap_or(state);
    refused = refused.or_else(|| outside_anchor(grants, &read, &write));
    refused = refused.or_else(|| hook_interpreter(w, &write));
    refused = refused.or_else(|| steering_refusal(&w.own_env, &grants.env));
    refused = refused.or_else(|| service_port(&grants.connect));
    let mut env: Vec<String> = DEFAULT_ENV.iter().map(|s| s.to_string()).collect();
    env.extend(w.own_env.iter().cloned());
    env.extend(grants.env.iter().cloned());
    env.dedup();
    Some(Policy {
        mode: sandbox.mode(),
        read,
        write,
        connect: grants.connect.clone(),
        env,
        exec: grants.exec,
        best_effort: grants.best_effort,
        state_dir: state,
        line: sandbox.line,
        refused,
    })
}

/// The TCP ports this process's API listens on (issue 57): a `connect:` grant of one of them
/// would let a confined hook reach the service, which the kernel otherwise keeps it from
/// (Landlock filters TCP by port only, whatever host the grant names; `seccomp.rs` refuses it
/// every Unix socket).
static SERVICE_PORTS: std::sync::RwLock<Vec<u16>> = std::sync::RwLock::new(Vec::new());

/// Records a TCP port the service's API listens on (before hooks load: `service::run`).
pub fn note_service_port(port: u16) {
    if let Ok(mut ports) = SERVICE_PORTS.write()
        && !ports.contains(&port)
    {
        ports.push(port);
    }
}

/// Why `connect` is refused: a grant of a port the service's API listens on.
fn service_port(connect: &[super::decl::Connect]) -> Option<String> {
    let ports = SERVICE_PORTS.read().ok()?;
    let c = connect.iter().find(|c| ports.contains(&c.port))?;
    Some(format!(
        "`connect:` grants port {} ({}), which is this service's own API listener: a confined \
         hook may not reach the service (Landlock filters TCP by port, not host, so the grant \
         would reach 127.0.0.1:{} too); grant another port, or run the service's API on \
         another port",
        c.port,
        c.host.as_deref().unwrap_or("any host"),
        c.port
    ))
}

/// Variables of the service no hook receives, confined or not: the control API's token and
/// where it is kept (a hook holding it could drive the API as the operator).
const SERVICE_SECRETS: &[&str] = &["HERMES_HOOKS_TOKEN", "HERMES_HOOKS_TOKEN_FILE"];

/// The service's own secrets, kept from every hook.
pub fn service_secrets() -> &'static [&'static str] {
    SERVICE_SECRETS
}

/// Whether `key` is one of the service's own secrets, kept from every hook.
pub fn service_secret(key: &str) -> bool {
    SERVICE_SECRETS.contains(&key)
}

/// Whether a variable the default grant (`HERMES_*`) would pass looks like a credential: a
/// confined hook sees it only when it names it under `env:`.
fn looks_secret(key: &str) -> bool {
    [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "API_KEY",
        "PRIVATE",
    ]
    .iter()
    .any(|w| key.contains(w))
}

/// Why a grant written under `{hook_dir}` or `{state_dir}` lands outside that directory once
/// resolved (`..`, or a link of the hook's tree leading out), if one does. `read`/`write`: the
/// resolved lists, the hook's directory and state directory first.
fn outside_anchor(
    grants: &super::decl::Grants,
    read: &[PathBuf],
    write: &[PathBuf],
) -> Option<String> {
    let (hook_dir, state) = (read.first()?, write.first()?);
    let written = grants.read.iter().zip(&read[1..]);
    written
        .chain(grants.write.iter().zip(&write[1..]))
        .find_map(|(raw, resolved)| {
            let (key, base) = if raw.starts_with("{hook_dir}") {
                ("{hook_dir}", hook_dir)
            } else if raw.starts_with("{state_dir}") {
                ("{state_dir}", state)
            } else {
                return None;
            };
            (!resolved.starts_with(base)).then(|| {
                format!(
                    "the grant {raw:?} resolves to {}, outside {key} ({}): a grant under {key} \
                     stays inside it; write the path it should reach by its own name",
                    resolved.display(),
                    base.display()
                )
            })
        })
}

/// Why a sandboxed hook's `python:` cannot be used: an interpreter inside the hook's own
/// directory or one it can write (a virtualenv shipped with the hook) starts, and runs its
/// `site` set-up (`.pth` files), before the worker confines itself.
fn hook_interpreter(w: &Where, write: &[PathBuf]) -> Option<String> {
    let python = w.python.as_ref()?;
    let inside = std::iter::once(w.hook_dir.to_path_buf())
        .chain(w.hook_dir.canonicalize().ok())
        .chain(write.iter().cloned())
        .find(|d| python.starts_with(d))?;
    Some(format!(
        "`python: {}` lies inside {}, which the hook ships or can write, and an interpreter \
         starts (with its virtualenv's `.pth` files) before the sandbox holds: install the \
         virtualenv outside the hook's directory (e.g. `$HERMES_HOME/venvs/NAME`) and name \
         that, or write `sandbox: none`",
        python.display(),
        inside.display()
    ))
}

/// Whether every confined hook sees the variable `key` (the host's own but its secrets,
/// locale, time zone, `PATH`).
pub fn always_seen(key: &str) -> bool {
    !service_secret(key) && !looks_secret(key) && DEFAULT_ENV.iter().any(|p| matches(p, key))
}

fn matches(pattern: &str, key: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => pattern == key,
    }
}

impl Policy {
    /// Whether its processes may see the variable `key`.
    pub fn allows_env(&self, key: &str) -> bool {
        !service_secret(key)
            && (always_seen(key)
                || self
                    .env
                    .iter()
                    .filter(|p| !DEFAULT_ENV.contains(&p.as_str()))
                    .any(|p| matches(p, key)))
    }

    /// `env` without what the hook may not see.
    pub fn filter_env(&self, env: BTreeMap<String, String>) -> BTreeMap<String, String> {
        env.into_iter()
            .filter(|(k, _)| self.allows_env(k))
            .collect()
    }

    /// "HOOK.yaml line N" (or just "HOOK.yaml"), for the messages that name the key to edit.
    pub fn where_declared(&self) -> String {
        match self.line {
            Some(l) => format!("`sandbox:` at HOOK.yaml line {l}"),
            None => "a `sandbox:` key in HOOK.yaml (the service's --sandbox-default applies)"
                .to_string(),
        }
    }

    /// Why a hook with this policy may not start on a kernel of Landlock `abi`, if it may not.
    pub fn refusal(&self, abi: i32) -> Option<String> {
        if let Some(why) = &self.refused {
            return Some(why.clone());
        }
        if abi >= landlock::FULL_ABI || self.best_effort {
            return None;
        }
        let have = if abi == 0 {
            "this kernel has no Landlock (or it is disabled)".to_string()
        } else {
            format!("this kernel's Landlock (ABI {abi}) cannot confine TCP connections")
        };
        Some(format!(
            "{have}, so the sandbox cannot be enforced: add `best_effort: true` to {} to run \
             with what the kernel can enforce, or write `sandbox: none`",
            self.where_declared()
        ))
    }

    /// What the kernel enforces of this policy at `abi`, in words.
    pub fn enforced(&self, abi: i32) -> String {
        if abi == 0 {
            return "best effort: no Landlock on this kernel; only the environment is filtered \
                    and no_new_privs set"
                .into();
        }
        let mut what = vec!["files"];
        if abi >= 4 {
            what.push("TCP ports");
        }
        if abi >= 6 {
            what.push("signals and abstract sockets");
        }
        let partial = if abi < landlock::FULL_ABI {
            "best effort: "
        } else {
            ""
        };
        format!(
            "{partial}landlock ABI {abi} ({}), no_new_privs, environment filtered",
            what.join(", ")
        )
    }

    /// The Landlock rules at `abi`; `extra_exec`: files an executable hook needs to run even
    /// without `exec: true` (its handler, its interpreter, the dynamic loader).
    pub fn rules(&self, abi: i32, extra_exec: &[PathBuf]) -> Rules {
        let handled_fs = landlock::handled_fs(abi);
        let exec = if self.exec { fs::EXECUTE } else { 0 };
        let read = (fs::READ_FILE | fs::READ_DIR | exec) & handled_fs;
        let write = (read
            | fs::WRITE_FILE
            | fs::REMOVE_DIR
            | fs::REMOVE_FILE
            | fs::MAKE_DIR
            | fs::MAKE_REG
            | fs::MAKE_SYM
            | fs::MAKE_SOCK
            | fs::MAKE_FIFO
            | fs::REFER
            | fs::TRUNCATE)
            & handled_fs;
        let mut paths: Vec<(PathBuf, u64)> = SYSTEM_READ
            .iter()
            .map(|p| (PathBuf::from(p), read))
            .collect();
        if !self.connect.is_empty() {
            paths.extend(NET_READ.iter().map(|p| (PathBuf::from(p), read)));
        }
        paths.push(("/dev/null".into(), fs::READ_FILE | fs::WRITE_FILE));
        let mut grants: Vec<(PathBuf, u64)> = self.read.iter().map(|p| (p.clone(), read)).collect();
        grants.extend(self.write.iter().map(|p| (p.clone(), write)));
        paths.extend(
            extra_exec
                .iter()
                .map(|p| (p.clone(), fs::READ_FILE | fs::EXECUTE)),
        );
        let handled_net = landlock::handled_net(abi);
        let mut ports: Vec<(u16, u64)> = if handled_net == 0 {
            Vec::new()
        } else {
            self.connect
                .iter()
                .map(|c| (c.port, landlock::NET_CONNECT_TCP))
                .collect()
        };
        ports.sort_unstable();
        ports.dedup();
        Rules {
            handled_fs,
            handled_net,
            scoped: landlock::scopes(abi),
            paths,
            grants,
            ports,
            read_rights: read,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at<'a>(dir: &'a Path, home: &'a Path) -> Where<'a> {
        Where {
            hook_dir: dir,
            name: "n",
            hermes_home: home,
            own_env: vec!["OWN".into()],
            python: None,
        }
    }

    #[test]
    fn strict_grants_the_hook_dir_its_state_and_default_variables() {
        let (dir, home) = (Path::new("/h/hooks/n"), Path::new("/h"));
        let p = resolve(&Sandbox::strict(), &at(dir, home)).unwrap();
        assert_eq!(p.read, vec![dir.to_path_buf()]);
        assert_eq!(p.write, vec![PathBuf::from("/h/hook-state/n")]);
        for ok in ["HERMES_HOME", "LANG", "LC_ALL", "TZ", "OWN"] {
            assert!(p.allows_env(ok), "{ok}");
        }
        for no in ["OPENAI_API_KEY", "HOME", "OWNER"] {
            assert!(!p.allows_env(no), "{no}");
        }
        assert!(resolve(&Sandbox::none(), &at(dir, home)).is_none());
        let r = p.rules(7, &[]);
        assert_eq!(r.read_rights & fs::EXECUTE, 0, "no exec unless declared");
        assert!(r.ports.is_empty() && r.handled_net != 0, "no network");
    }

    #[test]
    fn grants_expand_and_old_kernels_refuse_unless_best_effort() {
        let (dir, home) = (Path::new("/h/hooks/n"), Path::new("/h"));
        let s = super::super::decl::parse(
            &serde_json::json!({"read": ["$HERMES_HOME/.env", "{hook_dir}/x"], "write": ["{state_dir}/y"], "connect": ["a.example:443"], "env": ["SLACK_*"]}),
            Some(3),
        )
        .unwrap();
        let p = resolve(&s, &at(dir, home)).unwrap();
        assert!(p.read.contains(&PathBuf::from("/h/.env")));
        assert!(p.read.contains(&PathBuf::from("/h/hooks/n/x")));
        assert!(p.write.contains(&PathBuf::from("/h/hook-state/n/y")));
        assert!(p.allows_env("SLACK_TOKEN"));
        assert_eq!(
            p.rules(7, &[]).ports,
            vec![(443, landlock::NET_CONNECT_TCP)]
        );
        assert!(p.refusal(7).is_none());
        let why = p.refusal(3).unwrap();
        assert!(
            why.contains("line 3") && why.contains("best_effort"),
            "{why}"
        );
        assert!(p.refusal(0).unwrap().contains("no Landlock"));
    }
}
