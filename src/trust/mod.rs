//! Trust: which hooks this host is willing to run.
//!
//! - [`policy`]: the checks discovery makes (permissions, the approvals gate); the path rules
//!   (a handler stays inside its hook directory) are [`crate::layout`]'s, shared with discovery.
//! - [`approvals`]: the approvals file `$HERMES_HOME/hooks-trust.json` and what its hashes cover.
//! - [`edit`]: the `enabled:` line editor for HOOK.yaml.
//! - [`modes`]: the ownership and mode rule for one path.
//! - [`files`]: the files of a hook that are code (hashed) and the permissions of its whole tree.
//! - [`data`]: what of a hook's tree is data (`data:` in HOOK.yaml, and defaults).
//! - [`coverage`]: what an approval covers, file by file, for `check`.
//! - [`prestart`]: the check before every process start (the tree is still the one loaded).
//! - [`error`]: what trust refused or could not do.
//!
//! Hooks run with the service user's rights, so discovery refuses:
//! - a hook directory, HOOK.yaml, handler file, or any file or directory under the hook
//!   directory (helper modules, packages), or a `python:` interpreter, writable by others or
//!   by a group other than the owner's private group ([`modes`]: OpenSSH's user-group-modes), or owned by a user other than the service user or root ([`SkipCode::Permissions`]; `--insecure-permissions`
//!   turns this off);
//! - a handler that resolves outside its hook directory (`..`, absolute path, symlink escape);
//! - with `--trust explicit`, any hook not approved in `$HERMES_HOME/hooks-trust.json`, or whose
//!   handler's SHA-256, or the SHA-256 of any file of its tree that is not data ([`data`]),
//!   differs from the approved one ([`SkipCode::NotApproved`]).
//!
//! Before every process start ([`prestart`]) the tree is checked again: its files that can run
//! must be the ones the version was loaded with, so neither a replaced helper module nor a broken
//! edit runs under an approved or working version's name.
//!
//! `hermes-hooks enable NAME` / `disable NAME` approve or revoke in explicit mode; otherwise they
//! flip `enabled:` in the hook's HOOK.yaml by editing that one line (or appending
//! `enabled: false`), so comments, order and quoting stay byte for byte as they were.
//!
//! What an approval covers: the handler file's bytes (for a webhook, its `url` and `secret_env`),
//! every file of the tree but its data ([`files`]) and the HOOK.yaml settings that change what
//! runs (`handler`, `python`, `env`, `url`, `secret_env`, `data`). The rest of HOOK.yaml is covered by the
//! permission checks, not by the hash.
//!
//! [`SkipCode::Permissions`]: crate::discovery::SkipCode::Permissions
//! [`SkipCode::NotApproved`]: crate::discovery::SkipCode::NotApproved

pub mod approvals;
pub mod coverage;
pub mod data;
pub mod edit;
pub mod error;
pub mod files;
pub mod modes;
pub mod policy;
pub mod prestart;
pub mod racy;

pub use files::permission_problem;
pub use policy::{TrustMode, TrustPolicy};
