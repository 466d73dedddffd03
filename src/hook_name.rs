//! The one rule for hook names and the one way a path is built from one. A name is used as a
//! single path component (`hooks/NAME`, `hook-state/NAME`, `hook-src/NAME`, the approval key),
//! so it must be exactly one harmless component: letters, digits, `-`, `_` and `.`, not
//! starting with a dot (no `.`, `..` or hidden entries), at most [`MAX_LEN`] bytes.

use std::path::{Path, PathBuf};

/// The longest hook name, in bytes.
pub const MAX_LEN: usize = 64;

/// What to write instead, appended to every refusal.
const WHAT_TO_WRITE: &str = "a hook name is one path component: letters, digits, `-`, `_` and \
     `.` (not first), at most 64 bytes, e.g. `name: my-hook`";

/// Why `name` is not a hook name, if it is not.
pub fn validate(name: &str) -> Result<(), String> {
    let why = if name.is_empty() {
        "is empty".to_string()
    } else if name.len() > MAX_LEN {
        format!("{name:?} is longer than {MAX_LEN} bytes")
    } else if name.starts_with('.') {
        format!("{name:?} starts with a dot (`.`, `..` and hidden names are refused)")
    } else if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        format!("{name:?} contains {c:?}")
    } else {
        return Ok(());
    };
    Err(format!("{why}: {WHAT_TO_WRITE}"))
}

/// The folder of the hooks the service makes from config.yaml's shell hooks
/// (`$HERMES_HOME/config-hooks`, `config_hooks.rs`).
pub const CONFIG_ROOT_DIR: &str = "config-hooks";

/// The names of those hooks: `shell-DIGEST` (DIGEST: 10 lowercase hex digits of the command;
/// issue 58 row 1), and before that `shell-EVENT-DIGEST` (one hook per entry).
pub const CONFIG_PREFIX: &str = "shell-";

/// Whether `name` has the shape of a config.yaml hook's name: `shell-` and ten lowercase hex
/// digits, or the older `shell-`, an event, `-` and ten lowercase hex digits (still reserved,
/// so that no other hook takes a name an older release gave), and no other (`shell-logger`
/// has not: a hook may be called that).
pub fn config_shaped(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(CONFIG_PREFIX) else {
        return false;
    };
    let digest = |d: &str| {
        d.len() == 10
            && d.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    match rest.rsplit_once('-') {
        Some((event, d)) => !event.is_empty() && digest(d),
        None => digest(rest),
    }
}

/// Why a hook under `root` may not be called `name`: a name of config.yaml's shell hooks
/// belongs to them (issue 57 row 5: a HOOK.yaml saying `name: shell-pre_tool_call-…` shadowed
/// the operator's gate, and `enable` approved the impostor). One rule, applied where hooks are
/// loaded and where they are looked up by name.
pub fn borrowed(root: &Path, name: &str) -> Option<String> {
    let made = root
        .file_name()
        .is_some_and(|n| n == std::ffi::OsStr::new(CONFIG_ROOT_DIR));
    (config_shaped(name) && !made).then(|| {
        format!(
            "the name {name:?} is reserved: names of the shape `{CONFIG_PREFIX}DIGEST` (or \
             `{CONFIG_PREFIX}EVENT-DIGEST`) belong to the hooks made from config.yaml's `hooks:` block (under \
             $HERMES_HOME/{CONFIG_ROOT_DIR}); give this hook another `name:`"
        )
    })
}

/// `base/name`: the only way a path is made from a hook name (state directories, hook
/// directories of a root, staging, sources). Refuses a name [`validate`] refuses, so no name
/// can reach outside `base`.
pub fn path_under(base: &Path, name: &str) -> Result<PathBuf, String> {
    validate(name).map_err(|why| format!("hook name {why}"))?;
    Ok(base.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_shape_of_a_config_hooks_name_is_reserved() {
        let made = Path::new("/h/config-hooks");
        let other = Path::new("/h/hooks");
        for name in ["shell-0f431b51fb", "shell-pre_tool_call-0f431b51fb"] {
            assert!(borrowed(other, name).is_some(), "{name}");
            assert!(borrowed(made, name).is_none(), "{name}");
        }
        for free in [
            "shell-logger",
            "shell-x-0F431B51FB",
            "shell--0f431b51fb",
            "shell-x-0f43",
            "shell-0f431b51f",
            "shell-0F431B51FB",
        ] {
            assert!(borrowed(other, free).is_none(), "{free}");
        }
    }

    #[test]
    fn one_safe_component_only() {
        for ok in [
            "agent-logger",
            "pre_route.policy",
            "a",
            "A1",
            &"x".repeat(64),
        ] {
            assert!(validate(ok).is_ok(), "{ok}");
        }
        for no in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a\\b",
            "a\0b",
            "a b",
            "é",
            "../x",
            &"x".repeat(65),
        ] {
            let why = validate(no).unwrap_err();
            assert!(why.contains("e.g. `name: my-hook`"), "{no:?}: {why}");
            assert!(path_under(Path::new("/h"), no).is_err());
        }
        assert_eq!(
            path_under(Path::new("/h"), "x").unwrap(),
            PathBuf::from("/h/x")
        );
    }
}
