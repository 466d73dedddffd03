//! Which sandbox a hook gets (its own `sandbox:`, else the service's default) and whether a
//! hook of its kind can start with it.

use super::decl::Sandbox;
use super::landlock;
use super::policy::Policy;
use crate::kind::Confinement;

/// The environment variable of `serve --sandbox-default`.
pub const DEFAULT_ENV: &str = "HERMES_HOOKS_SANDBOX_DEFAULT";

/// The sandbox of hooks whose HOOK.yaml has no `sandbox:` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DefaultSandbox {
    /// Not confined (today's behaviour).
    #[default]
    None,
    /// `sandbox: strict`.
    Strict,
}

impl DefaultSandbox {
    /// From `DEFAULT_ENV`: unset or `none` is none; anything else but `strict` is strict
    /// too, with a warning (a misspelt request for confinement does not run hooks unconfined).
    pub fn from_env() -> Self {
        match std::env::var(DEFAULT_ENV).as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("none") => Self::None,
            Ok("strict") => Self::Strict,
            Ok(other) => {
                tracing::warn!(
                    "{DEFAULT_ENV}={other:?} is neither `none` nor `strict`: taken as strict"
                );
                Self::Strict
            }
        }
    }

    /// The sandbox it stands for.
    pub fn sandbox(self) -> Sandbox {
        match self {
            Self::None => Sandbox::none(),
            Self::Strict => Sandbox::strict(),
        }
    }
}

/// A hook's sandbox: its own `sandbox:`, else the service's default.
pub fn effective(declared: Option<&Sandbox>, default: DefaultSandbox) -> Sandbox {
    declared.cloned().unwrap_or_else(|| default.sandbox())
}

/// Why a hook of this confinement cannot start with `policy`, if it cannot: a library hook
/// asking for a sandbox, or a sandbox this kernel cannot enforce (without `best_effort`).
pub fn refusal(policy: Option<&Policy>, confinement: Confinement) -> Option<String> {
    let policy = policy?;
    match confinement {
        Confinement::InService => Some(format!(
            "a library hook runs inside the service, which cannot confine a part of itself, and \
             {} asks for a sandbox: write `sandbox: none` to run it unconfined, or make it an \
             executable or Python hook",
            policy.where_declared()
        )),
        Confinement::Remote => None,
        Confinement::Process => policy.refusal(landlock::abi()),
    }
}
