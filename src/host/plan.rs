//! Reload as a pure value: what a rescan changes in the set of running hooks.
//!
//! [`Plan::new`] compares the running versions with what discovery found, by name and directory
//! (never by position): an unchanged hook is kept as it runs; a changed one (same name and
//! directory, new fingerprint: an edited handler, a new kind) is started as a successor that
//! takes over the old version's queue and counters; anything else found is added fresh; a
//! running version nothing takes over is removed. A rename is an add plus a remove. After the
//! starts, [`keep_last_good`] keeps the running version of a hook whose directory no longer
//! loads (a broken edit), unless it was deliberately disabled, removed or refused by trust.
//! `Host::reload` applies the plan in named phases; nothing here touches a process.

use std::collections::HashMap;
use std::path::Path;

use crate::discovery::{HookSpec, SkipCode, Skipped};

/// What the plan needs to know of a hook version, running or found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Version<'a> {
    /// Hook name.
    pub name: &'a str,
    /// Hook directory.
    pub dir: &'a Path,
    /// Equal fingerprints mean "unchanged".
    pub fingerprint: u64,
    /// Runs inside the gateway: no worker and no queue to take over.
    pub in_gateway: bool,
}

impl<'a> Version<'a> {
    /// The version `spec` describes.
    pub fn of(spec: &'a HookSpec) -> Self {
        Self {
            name: &spec.name,
            dir: &spec.dir,
            fingerprint: spec.fingerprint,
            in_gateway: spec.placement.in_gateway(),
        }
    }
}

/// One hook to start: an index into what was found, and the running version it takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    /// Index into the found versions.
    pub found: usize,
    /// Index into the running versions, for a changed hook.
    pub takes_over: Option<usize>,
}

/// What a rescan changes; indices point into the running and found lists given to [`Plan::new`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Running versions kept as they are (unchanged).
    pub kept: Vec<usize>,
    /// Hooks to start, in discovery order: added ones and changed ones.
    pub starts: Vec<Start>,
    /// How many versions were running.
    running: usize,
}

impl Plan {
    /// Compares `running` with `found`; with `gateway_hooks_only` (a fleet edge) a found hook
    /// that runs in the service is left to the workers.
    pub fn new(running: &[Version<'_>], found: &[Version<'_>], gateway_hooks_only: bool) -> Self {
        let by_name: HashMap<&str, usize> = running
            .iter()
            .enumerate()
            .map(|(i, v)| (v.name, i))
            .collect();
        let mut plan = Plan {
            running: running.len(),
            ..Plan::default()
        };
        for (i, new) in found.iter().enumerate() {
            if gateway_hooks_only && !new.in_gateway {
                continue;
            }
            let prev = by_name.get(new.name).map(|&p| (p, &running[p]));
            match prev {
                Some((p, old)) if old.dir == new.dir && old.fingerprint == new.fingerprint => {
                    plan.kept.push(p)
                }
                // An in-gateway version has no worker and a closed queue: nothing to take over.
                Some((p, old)) if old.dir == new.dir && !old.in_gateway => {
                    plan.starts.push(Start {
                        found: i,
                        takes_over: Some(p),
                    })
                }
                _ => plan.starts.push(Start {
                    found: i,
                    takes_over: None,
                }),
            }
        }
        plan
    }

    /// Found hooks with no running version to take over (new, renamed or moved).
    pub fn to_add(&self) -> Vec<usize> {
        self.starts
            .iter()
            .filter(|s| s.takes_over.is_none())
            .map(|s| s.found)
            .collect()
    }

    /// Changed hooks: (found, running) pairs, the new version taking over the old one's queue.
    pub fn to_change(&self) -> Vec<(usize, usize)> {
        self.starts
            .iter()
            .filter_map(|s| s.takes_over.map(|p| (s.found, p)))
            .collect()
    }

    /// Running versions that neither stay nor are taken over (before [`keep_last_good`]).
    pub fn to_remove(&self) -> Vec<usize> {
        (0..self.running)
            .filter(|i| !self.kept.contains(i) && !self.to_change().iter().any(|c| c.1 == *i))
            .collect()
    }
}

/// Whether a running version survives its directory being skipped with `code`: a broken edit
/// keeps the last good version; a deliberate stop (disabled, shadowed) or a trust refusal (an
/// executable re-reads its file per event) does not, nor a failed start (handled by its caller).
fn keeps_last_good(code: SkipCode) -> bool {
    !matches!(
        code,
        SkipCode::Disabled
            | SkipCode::Shadowed
            | SkipCode::LoadFailed
            | SkipCode::Permissions
            | SkipCode::NotApproved
            | SkipCode::Revoked
            | SkipCode::HandlerOutside
    )
}

/// The running versions (indices into `running`) to keep because their directory no longer
/// loads; `loaded` names the hooks the new set already holds. Each kept version's skip reason
/// gains " (the previous version keeps running)".
pub(crate) fn keep_last_good(
    running: &[Version<'_>],
    skipped: &mut [Skipped],
    loaded: &[&str],
) -> Vec<(usize, usize)> {
    let mut keep: Vec<(usize, usize)> = Vec::new();
    for (si, s) in skipped.iter_mut().enumerate() {
        if !keeps_last_good(s.code) {
            continue;
        }
        let Some(p) = running.iter().position(|h| h.dir == s.dir) else {
            continue;
        };
        let name = running[p].name;
        if loaded.contains(&name) || keep.iter().any(|(k, _)| running[*k].name == name) {
            continue;
        }
        keep.push((p, si));
    }
    for (_, si) in &keep {
        skipped[*si]
            .reason
            .push_str(" (the previous version keeps running)");
    }
    keep
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn v<'a>(name: &'a str, dir: &'a Path, fingerprint: u64) -> Version<'a> {
        Version {
            name,
            dir,
            fingerprint,
            in_gateway: false,
        }
    }

    fn skipped(dir: &Path, name: &str, code: SkipCode) -> Skipped {
        Skipped {
            dir: dir.to_path_buf(),
            name: name.into(),
            file: dir.join("HOOK.yaml"),
            code,
            reason: "bad".into(),
            events: Vec::new(),
        }
    }

    #[test]
    fn an_unchanged_hook_is_kept_and_a_new_one_added() {
        let (a, b) = (PathBuf::from("/r/a"), PathBuf::from("/r/b"));
        let plan = Plan::new(&[v("a", &a, 1)], &[v("a", &a, 1), v("b", &b, 7)], false);
        assert_eq!(plan.kept, [0]);
        assert_eq!(plan.to_add(), [1]);
        assert!(plan.to_change().is_empty());
        assert!(plan.to_remove().is_empty());
    }

    #[test]
    fn a_changed_hook_takes_over_its_running_version() {
        let a = PathBuf::from("/r/a");
        let plan = Plan::new(&[v("a", &a, 1)], &[v("a", &a, 2)], false);
        assert!(plan.kept.is_empty());
        assert_eq!(plan.to_change(), [(0, 0)]);
        assert!(plan.to_add().is_empty() && plan.to_remove().is_empty());
    }

    #[test]
    fn a_kind_change_is_a_change_but_not_from_the_gateway() {
        // A new kind means a new handler file, so a new fingerprint: the successor takes over.
        let a = PathBuf::from("/r/a");
        let plan = Plan::new(&[v("a", &a, 1)], &[v("a", &a, 3)], false);
        assert_eq!(plan.to_change(), [(0, 0)]);
        // An in-gateway version has no queue to hand over: the service version starts fresh.
        let mut old = v("a", &a, 1);
        old.in_gateway = true;
        let plan = Plan::new(&[old], &[v("a", &a, 3)], false);
        assert_eq!(plan.to_add(), [0]);
        assert_eq!(plan.to_remove(), [0]);
    }

    #[test]
    fn a_removed_hook_is_removed() {
        let (a, b) = (PathBuf::from("/r/a"), PathBuf::from("/r/b"));
        let plan = Plan::new(&[v("a", &a, 1), v("b", &b, 1)], &[v("b", &b, 1)], false);
        assert_eq!(plan.kept, [1]);
        assert_eq!(plan.to_remove(), [0]);
        assert!(plan.starts.is_empty());
    }

    #[test]
    fn a_rename_is_an_add_and_a_remove() {
        let a = PathBuf::from("/r/a");
        let plan = Plan::new(&[v("old", &a, 1)], &[v("new", &a, 1)], false);
        assert_eq!(plan.to_add(), [0]);
        assert_eq!(plan.to_remove(), [0]);
        assert!(plan.kept.is_empty() && plan.to_change().is_empty());
        // A hook moved to another directory under the same name starts fresh too.
        let b = PathBuf::from("/r/b");
        let plan = Plan::new(&[v("a", &a, 1)], &[v("a", &b, 1)], false);
        assert_eq!((plan.to_add(), plan.to_remove()), (vec![0], vec![0]));
    }

    #[test]
    fn a_broken_edit_keeps_the_last_good_version() {
        let (a, b) = (PathBuf::from("/r/a"), PathBuf::from("/r/b"));
        let running = [v("a", &a, 1), v("b", &b, 1)];
        let plan = Plan::new(&running, &[], false);
        assert_eq!(plan.to_remove(), [0, 1]);
        let mut skips = vec![
            skipped(&a, "a", SkipCode::YamlError),
            skipped(&b, "b", SkipCode::Disabled),
        ];
        let keep = keep_last_good(&running, &mut skips, &[]);
        assert_eq!(keep, [(0, 0)]);
        assert_eq!(skips[0].reason, "bad (the previous version keeps running)");
        assert_eq!(skips[1].reason, "bad");
        // Not when a version of that name is already loaded.
        let mut skips = vec![skipped(&a, "a", SkipCode::YamlError)];
        assert!(keep_last_good(&running, &mut skips, &["a"]).is_empty());
    }

    #[test]
    fn a_fleet_edge_plans_only_gateway_hooks() {
        let (a, b) = (PathBuf::from("/r/a"), PathBuf::from("/r/b"));
        let mut g = v("g", &b, 1);
        g.in_gateway = true;
        let plan = Plan::new(&[], &[v("a", &a, 1), g], true);
        assert_eq!(plan.to_add(), [1]);
    }
}
