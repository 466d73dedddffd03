//! Trust policy: the `--trust` mode and `--insecure-permissions`, and the [`Gate`] discovery
//! consults for every hook: ownership and mode of the hook directory, HOOK.yaml and the handler
//! (the rest of the tree is [`crate::trust::files`]'), and in explicit mode the approval with its
//! current hashes.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::kind::ApprovalInput;
use crate::layout::HandlerKind;
use crate::manifest::Manifest;
use crate::trust::approvals::{
    TrustFile, approval_hash, covered_settings, describe_settings_change, settings_hash, short,
    trust_file,
};
use crate::trust::files::{RunFiles, describe_changes};

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
    /// False with `--insecure-permissions`.
    pub fn checks_permissions(&self) -> bool {
        !self.insecure_permissions
    }

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
            if let Some(reason) = crate::trust::modes::path_problem(p, Some(dir)) {
                return Err((p.to_path_buf(), reason));
            }
        }
        Ok(())
    }

    /// In explicit mode, whether the operator revoked `name`'s approval (and gave none since).
    pub fn revoked(&self, name: &str) -> bool {
        matches!(&self.approvals, Some(Ok(t)) if t.revoked.contains_key(name) && !t.hooks.contains_key(name))
    }

    /// In explicit mode, checks that `name` is approved with the current hash.
    pub fn check_approved(
        &self,
        name: &str,
        kind: HandlerKind,
        handler: Option<&Path>,
        manifest: &Manifest,
        files: &RunFiles,
    ) -> Result<(), String> {
        let Some(approvals) = &self.approvals else {
            return Ok(());
        };
        let approvals = approvals
            .as_ref()
            .map_err(|e| format!("not approved: {e}"))?;
        let Some(approval) = approvals.hooks.get(name) else {
            if let Some(when) = approvals.revoked.get(name) {
                return Err(format!(
                    "its approval was revoked ({when}, `disable {name}`): it stays off until \
                     `hermes-hooks enable {name} --trust explicit`"
                ));
            }
            return Err(format!(
                "not approved (--trust explicit): review the hook, then run `hermes-hooks enable {name} --trust explicit`"
            ));
        };
        let now = approval_hash(kind, handler, manifest)
            .map_err(|e| format!("cannot hash the handler: {e}"))?;
        if now != approval.sha256 {
            let what = if kind.spec().approval == ApprovalInput::Endpoint {
                "its url/secret_env"
            } else {
                "its handler"
            };
            return Err(format!(
                "{what} changed since it was approved (sha256 {} approved, now {}): review it, \
                 then run `hermes-hooks enable {name} --trust explicit` to approve it again",
                short(&approval.sha256),
                short(&now)
            ));
        }
        let settings_now = covered_settings(manifest);
        match &approval.settings_sha256 {
            Some(approved) if *approved != settings_hash(manifest) => {
                let what = approval.settings.as_ref().map_or_else(
                    || {
                        "handler, python, env, url, secret_env, ca_file, runs, data, sandbox, \
                         cwd or requires"
                            .to_string()
                    },
                    |then| describe_settings_change(then, &settings_now),
                );
                return Err(format!(
                    "its HOOK.yaml settings changed since it was approved ({what}): review them, \
                     then run `hermes-hooks enable {name} --trust explicit` to approve it again"
                ));
            }
            Some(_) => {}
            // An approval from before settings were covered: enough only while the hook sets
            // none of them (a `sandbox: none` added since would otherwise pass).
            None if settings_now.is_empty() => {}
            None => {
                return Err(format!(
                    "the approval predates the approval of HOOK.yaml settings, and the hook sets \
                     some ({}): review them, then run `hermes-hooks enable {name} --trust \
                     explicit` to approve it again",
                    settings_now.keys().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        check_events(name, approval.events.as_deref(), &manifest.events)?;
        match &approval.files {
            Some(approved) if *approved != files.files => Err(format!(
                "its files changed since it was approved ({}): review them, then run \
                 `hermes-hooks enable {name} --trust explicit` to approve it again",
                describe_changes(approved, &files.files)
            )),
            Some(_) => Ok(()),
            // An approval from before approvals covered every file: enough only when the
            // handler (whose hash was checked above) is all that can run.
            None if files.files.len() <= 1 => Ok(()),
            None => Err(format!(
                "the approval covers only the handler, but the hook has other files that can run \
                 ({}): review them, then run `hermes-hooks enable {name} --trust explicit` to approve them too",
                files
                    .files
                    .keys()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// The approval's `events:` against HOOK.yaml's now: equal, or (an approval from before events
/// were recorded) none of the agent's deciding events taken (issue 57, suspected case: an
/// approved observer re-pointed at `pre_llm_call` would inject text without a review).
fn check_events(name: &str, approved: Option<&[String]>, now: &[String]) -> Result<(), String> {
    match approved {
        Some(then) if then == now => Ok(()),
        Some(then) => Err(format!(
            "its `events:` changed since it was approved ({} -> {}): review them, then run \
             `hermes-hooks enable {name} --trust explicit` to approve it again",
            then.join(", "),
            now.join(", ")
        )),
        None => {
            let set = crate::pattern::PatternSet::new(now).map_err(|e| e.to_string())?;
            let deciding: Vec<&str> = crate::events::AGENT_EVENTS
                .iter()
                .filter(|e| e.decides && set.matches(e.name).is_some())
                .map(|e| e.name)
                .collect();
            if deciding.is_empty() {
                return Ok(());
            }
            Err(format!(
                "the approval predates the approval of `events:`, and the hook takes events whose \
                 answer the agent reads ({}): review it, then run `hermes-hooks enable {name} \
                 --trust explicit` to approve it again",
                deciding.join(", ")
            ))
        }
    }
}
