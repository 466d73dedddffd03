//! What `check` and `/v1/hooks` show of a hook's sandbox: its mode, what the kernel enforces
//! of it here (or why nothing is), and its effective permissions.

use super::choice::refusal;
use super::decl::Sandbox;
use super::landlock;
use super::policy::{self, Policy, Where};
use crate::kind::Confinement;

/// What `check` and `/v1/hooks` show of a hook's sandbox.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Shown {
    /// `none`, `strict` or `custom`.
    pub mode: &'static str,
    /// What the kernel enforces, in words (or why nothing is).
    pub enforced: String,
    /// The effective permissions, for a confined hook.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
}

impl Shown {
    /// The view of `sandbox` for a hook of `confinement` at `w`.
    pub fn of(sandbox: &Sandbox, confinement: Confinement, in_gateway: bool, w: &Where) -> Self {
        let policy = policy::resolve(sandbox, w);
        let abi = landlock::abi();
        let enforced = match (&policy, confinement) {
            (None, _) => "nothing: not confined (sandbox: none)".to_string(),
            (Some(_), Confinement::Remote) => {
                "nothing local to confine: the service only sends the request".to_string()
            }
            (Some(p), Confinement::InService) => format!(
                "refused: {}",
                refusal(Some(p), confinement).unwrap_or_default()
            ),
            (Some(_), _) if in_gateway => {
                "not confined: it runs inside the gateway's process".to_string()
            }
            (Some(p), _) => match p.refusal(abi) {
                Some(why) => format!("refused: {why}"),
                None => p.enforced(abi),
            },
        };
        Self {
            mode: sandbox.mode(),
            enforced,
            policy,
        }
    }

    /// One line per aspect for `check`; nothing for a hook that is not confined (as before
    /// sandboxes, and most hooks are not).
    pub fn lines(&self) -> Vec<String> {
        let Some(p) = &self.policy else {
            return Vec::new();
        };
        let mut out = vec![format!("sandbox: {} ({})", self.mode, self.enforced)];
        let list = |v: &[std::path::PathBuf]| {
            v.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push(format!(
            "  read:    {} (and the system's programs and libraries)",
            list(&p.read)
        ));
        out.push(format!("  write:   {}", list(&p.write)));
        let connect = if p.connect.is_empty() {
            "nothing".to_string()
        } else {
            p.connect
                .iter()
                .map(|c| match &c.host {
                    Some(h) => format!("port {} ({h}: host not enforced)", c.port),
                    None => format!("port {}", c.port),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push(format!("  connect: {connect}"));
        out.push(format!("  env:     {}", p.env.join(", ")));
        out.push(format!("  exec:    {}", if p.exec { "yes" } else { "no" }));
        out
    }
}
