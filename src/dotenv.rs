//! The gateway's environment for hook processes (issue 19): `$HERMES_HOME/.env`, read the way
//! hermes-agent's gateway loads it at start-up, so a hook sees `TELEGRAM_BOT_TOKEN` and the rest
//! as it did inside the gateway.
//!
//! Precedence, as hermes-agent's `load_hermes_dotenv`: `$HERMES_HOME/.env` overrides the service's
//! own environment (a stale shell export loses); `$HERMES_HOME/.op.env` only fills variables set
//! nowhere else, and is not read at all when `OP_SERVICE_ACCOUNT_TOKEN` is already set (in the
//! environment or by `.env`: upstream loads it only to supply that bootstrap token). A UTF-8 BOM
//! at the start of a file is skipped, and a file that is not UTF-8 is read as Latin-1 (as
//! upstream's fallback). On top come the host's `HERMES_HOME`, `HERMES_HOOK_NAME`, `HERMES_HOOK_DIR` and
//! the hook's own `env:`. The files are read again whenever they change (by their identity, one
//! `stat` per process start): an executable hook sees a change at its next event; the watcher
//! sees the files change and the reload gives every Python hook a new worker ([`fold_into`]). Not read: the gateway's project `.env` (a development fallback of a source
//! checkout) and its machine-wide managed scope.
//!
//! The syntax is python-dotenv's: `KEY=value`, an optional `export `, `#` comments (after
//! whitespace on an unquoted value), single quotes taken literally, double quotes with `\n`, `\t`,
//! `\"`, `\\` escapes, and `${VAR}` expanded in unquoted and double-quoted values (from the file's
//! earlier lines, then the environment).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Variables from one file, by name.
pub type EnvMap = BTreeMap<String, String>;

/// The file's identity when it was parsed: (device, inode, size, mtime, mtime ns, ctime ns).
type Identity = (u64, u64, u64, i64, i64, i64);

/// A parsed file: its path, the identity it had, its variables.
type Parsed = (PathBuf, Option<Identity>, Arc<EnvMap>);
/// Parsed files by path, with the identity they had.
static CACHE: Mutex<Vec<Parsed>> = Mutex::new(Vec::new());

/// The environment a hook process gets on top of the service's: the `.env` files of
/// `hermes_home` (see the module comment), then `hook_env` (which wins).
pub fn for_process(hermes_home: Option<&Path>, hook_env: &EnvMap) -> EnvMap {
    let mut out = EnvMap::new();
    if let Some(home) = hermes_home {
        let user = read(&home.join(".env"));
        let op = read(&home.join(".op.env"));
        merge(&mut out, &user, &op, |k| {
            std::env::var_os(k).is_some_and(|v| !v.is_empty())
        });
    }
    out.extend(hook_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// The 1Password bootstrap token whose presence means `.op.env` is not read.
const OP_TOKEN: &str = "OP_SERVICE_ACCOUNT_TOKEN";

/// `user` (`.env`) over `op` (`.op.env`) into `out`; `op` only for names the environment
/// (`in_env`) and `user` leave unset, and only when neither sets [`OP_TOKEN`].
fn merge(out: &mut EnvMap, user: &EnvMap, op: &EnvMap, in_env: impl Fn(&str) -> bool) {
    let token_set = in_env(OP_TOKEN) || user.get(OP_TOKEN).is_some_and(|v| !v.is_empty());
    if !token_set {
        for (k, v) in op.iter() {
            if !in_env(k) && !user.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out.extend(user.iter().map(|(k, v)| (k.clone(), v.clone())));
}

/// A hash of what `hermes_home`'s `.env` files give (their parsed variables, not their bytes:
/// a comment or a touch changes nothing).
pub fn stamp(hermes_home: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for_process(Some(hermes_home), &EnvMap::new()).hash(&mut h);
    h.finish()
}

/// Makes a Python hook's fingerprint depend on the `.env` files: its worker is long-lived and
/// took its environment when it started, so a changed file is a changed hook for it (a reload
/// gives it a new worker, its queue kept). Other kinds read the files at each process start.
pub fn fold_into(spec: &mut crate::discovery::HookSpec, stamp: u64) {
    if spec.kind.spec().env_at_start {
        spec.fingerprint = spec.fingerprint.rotate_left(17) ^ stamp;
    }
}

/// Whether a change at `path` is one of `hermes_home`'s `.env` files (the watcher rescans).
pub fn is_env_file(path: &Path, hermes_home: &Path) -> bool {
    path.parent() == Some(hermes_home)
        && path
            .file_name()
            .is_some_and(|n| n == ".env" || n == ".op.env")
}

/// The variables of `path` (empty when it does not exist or cannot be read), parsed again only
/// when the file changed.
pub fn read(path: &Path) -> Arc<EnvMap> {
    let id = identity(path);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, seen, map)) = cache.iter().find(|(p, _, _)| p == path)
        && *seen == id
    {
        return map.clone();
    }
    let map = Arc::new(match std::fs::read(path) {
        Ok(bytes) => parse(&decode(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => EnvMap::new(),
        Err(e) => {
            tracing::warn!(file = %path.display(), "cannot read: {e}; hooks get no variables from it");
            EnvMap::new()
        }
    });
    cache.retain(|(p, _, _)| p != path);
    if cache.len() >= 64 {
        cache.clear();
    }
    cache.push((path.to_path_buf(), id, map.clone()));
    map
}

fn identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime_nsec(),
    ))
}

/// A file's text: UTF-8, else Latin-1 (every byte one character), as upstream falls back.
fn decode(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| e.into_bytes().iter().map(|&b| b as char).collect())
}

/// Parses dotenv text (see the module comment); lines that are not assignments are skipped. A
/// UTF-8 BOM at the start is not part of the first name.
pub fn parse(text: &str) -> EnvMap {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = EnvMap::new();
    for raw in text.lines() {
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let Some((key, rest)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
        {
            continue;
        }
        let rest = rest.trim_start();
        let value = if let Some(body) = rest.strip_prefix('\'') {
            body.split_once('\'').map_or(body, |(v, _)| v).to_string()
        } else if let Some(body) = rest.strip_prefix('"') {
            expand(&unescape(closing_quote(body)), &out)
        } else {
            let cut = rest
                .find(" #")
                .or_else(|| rest.find("\t#"))
                .unwrap_or(rest.len());
            expand(rest[..cut].trim_end(), &out)
        };
        out.insert(key.to_string(), value);
    }
    out
}

/// The text of a double-quoted value up to its closing quote (escaped quotes stay inside).
fn closing_quote(body: &str) -> &str {
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return &body[..i],
            _ => escaped = false,
        }
    }
    body
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other @ ('"' | '\\' | '\'')) => out.push(other),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// `${VAR}` (and `${VAR:-default}`) from the file's earlier lines, else the environment.
fn expand(s: &str, earlier: &EnvMap) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start + 2..].find('}') else {
            break;
        };
        out.push_str(&rest[..start]);
        let inner = &rest[start + 2..start + 2 + len];
        let (name, default) = inner.split_once(":-").unwrap_or((inner, ""));
        let value = earlier
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_string());
        out.push_str(&value);
        rest = &rest[start + 3 + len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_python_dotenv_syntax() {
        let text = "# comment\nexport TELEGRAM_BOT_TOKEN=123:abc\nFEISHU_APP_ID = 'cli_x # not a comment'\nQUOTED=\"line\\nnext \\\"q\\\"\" # c\nPLAIN=value # comment\nURL=${PLAIN}/x\nEMPTY=\nbroken line\n";
        let m = parse(text);
        assert_eq!(m["TELEGRAM_BOT_TOKEN"], "123:abc");
        assert_eq!(m["FEISHU_APP_ID"], "cli_x # not a comment");
        assert_eq!(m["QUOTED"], "line\nnext \"q\"");
        assert_eq!(m["PLAIN"], "value");
        assert_eq!(m["URL"], "value/x");
        assert_eq!(m["EMPTY"], "");
        assert_eq!(m.len(), 6);
    }

    #[test]
    fn a_utf8_bom_does_not_hide_the_first_variable() {
        let m = parse("\u{feff}FIRST=1\nSECOND=2\n");
        assert_eq!(m.get("FIRST").map(String::as_str), Some("1"), "{m:?}");
        assert_eq!(m["SECOND"], "2");
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join(".env"), b"\xef\xbb\xbfTOKEN=t\n").unwrap();
        assert_eq!(for_process(Some(home.path()), &EnvMap::new())["TOKEN"], "t");
        // Not UTF-8: Latin-1.
        std::fs::write(home.path().join(".env"), b"NAME=caf\xe9\n").unwrap();
        assert_eq!(
            for_process(Some(home.path()), &EnvMap::new())["NAME"],
            "caf\u{e9}"
        );
    }

    #[test]
    fn op_env_is_read_only_when_no_service_account_token_is_set() {
        let op: EnvMap = [("OP_SERVICE_ACCOUNT_TOKEN", "op-token"), ("FROM_OP", "1")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        let nothing = |_: &str| false;
        // No token anywhere: .op.env fills in.
        let mut out = EnvMap::new();
        merge(&mut out, &EnvMap::new(), &op, nothing);
        assert_eq!(out.get("FROM_OP").map(String::as_str), Some("1"));
        // The token in .env: .op.env is not read at all.
        let user: EnvMap = [("OP_SERVICE_ACCOUNT_TOKEN".to_string(), "env".to_string())].into();
        let mut out = EnvMap::new();
        merge(&mut out, &user, &op, nothing);
        assert_eq!(out.get("FROM_OP"), None, "{out:?}");
        assert_eq!(out["OP_SERVICE_ACCOUNT_TOKEN"], "env");
        // The token in the environment (a systemd EnvironmentFile): not read either.
        let mut out = EnvMap::new();
        merge(&mut out, &EnvMap::new(), &op, |k| {
            k == "OP_SERVICE_ACCOUNT_TOKEN"
        });
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn the_file_beats_the_service_and_the_hook_beats_the_file() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join(".env"), "A=from-file\nB=from-file\n").unwrap();
        std::fs::write(
            home.path().join(".op.env"),
            "A=from-op\nOP_ONLY=op\nPATH=/nope\n",
        )
        .unwrap();
        let hook: EnvMap = [("B".to_string(), "from-hook".to_string())].into();
        let env = for_process(Some(home.path()), &hook);
        assert_eq!(env["A"], "from-file");
        assert_eq!(env["B"], "from-hook");
        assert_eq!(env["OP_ONLY"], "op");
        assert!(!env.contains_key("PATH"), "{env:?}"); // set in the service: .op.env only fills
        // Changed on disk: read again.
        std::fs::write(home.path().join(".env"), "A=changed, longer\n").unwrap();
        assert_eq!(
            for_process(Some(home.path()), &hook)["A"],
            "changed, longer"
        );
    }
}
