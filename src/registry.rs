//! The registry: an immutable snapshot of the loaded hooks, swapped atomically on reload.
//!
//! `emit` loads the current snapshot (a pointer read) and walks it; a reload builds a new snapshot
//! and stores it, so emit never waits for a reload.

use std::path::PathBuf;
use std::sync::Arc;

use crate::discovery::Skipped;
use crate::dispatch::LoadedHook;
use crate::pattern::MatchKind;

/// One generation of loaded hooks.
#[derive(Default)]
pub struct Registry {
    /// Loaded hooks in discovery order.
    pub hooks: Vec<Arc<LoadedHook>>,
    /// Directories that did not load, with reasons.
    pub skipped: Vec<Skipped>,
    /// Roots scanned.
    pub roots: Vec<PathBuf>,
    /// Incremented on every reload.
    pub generation: u64,
}

impl Registry {
    /// Hooks matching `event` in match order: exact-pattern hooks first, then wildcard-only
    /// hooks, each group in discovery order. A hook appears once.
    pub fn matching(&self, event: &str) -> Vec<&Arc<LoadedHook>> {
        let mut exact = Vec::new();
        let mut wild = Vec::new();
        for hook in &self.hooks {
            match hook.spec.patterns.matches(event) {
                Some(MatchKind::Exact) => exact.push(hook),
                Some(MatchKind::Wildcard) => wild.push(hook),
                None => {}
            }
        }
        exact.extend(wild);
        exact
    }

    /// The loaded hook called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<LoadedHook>> {
        self.hooks.iter().find(|h| h.spec.name == name)
    }
}
