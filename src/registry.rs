//! The registry: an immutable snapshot of the loaded hooks, swapped atomically on reload.
//!
//! `emit` loads the current snapshot (a pointer read) and walks it; a reload builds a new snapshot
//! and stores it, so emit never waits for a reload.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::discovery::Skipped;
use crate::hook::LoadedHook;
use crate::pattern::MatchKind;

/// Event names whose match lists are cached per snapshot; beyond this, matches are computed
/// each time (protects against callers inventing unbounded event names).
const MATCH_CACHE_MAX: usize = 4096;

/// One generation of loaded hooks.
#[derive(Default)]
pub struct Registry {
    /// Event name -> indices into `hooks` in match order. The snapshot is immutable, so entries
    /// never go stale; a reload starts a new snapshot with an empty cache.
    match_cache: RwLock<HashMap<Box<str>, Arc<[usize]>>>,
    /// Loaded hooks in discovery order.
    pub hooks: Vec<Arc<LoadedHook>>,
    /// Directories that did not load, with reasons.
    pub skipped: Vec<Skipped>,
    /// Incremented on every reload.
    pub generation: u64,
}

impl Registry {
    /// A snapshot of `hooks` (in discovery order).
    pub fn new(hooks: Vec<Arc<LoadedHook>>, skipped: Vec<Skipped>, generation: u64) -> Self {
        Self {
            match_cache: RwLock::default(),
            hooks,
            skipped,
            generation,
        }
    }

    /// Hooks matching `event` in match order: exact-pattern hooks first, then wildcard-only
    /// hooks, each group in discovery order. A hook appears once. Hooks that run in the gateway
    /// are not included (the service has no worker for them).
    pub fn matching(&self, event: &str) -> Vec<&Arc<LoadedHook>> {
        self.match_indices(event)
            .iter()
            .map(|&i| &self.hooks[i])
            .collect()
    }

    /// [`Registry::matching`] as indices into `hooks`, cached per event name.
    pub fn match_indices(&self, event: &str) -> Arc<[usize]> {
        let cache = self.match_cache.read().unwrap_or_else(|p| p.into_inner());
        if let Some(hit) = cache.get(event) {
            return hit.clone();
        }
        let full = cache.len() >= MATCH_CACHE_MAX;
        drop(cache);
        let mut exact = Vec::new();
        let mut wild = Vec::new();
        for (i, hook) in self.hooks.iter().enumerate() {
            if hook.spec.placement.in_gateway() {
                continue; // run by the gateway's client, never queued here
            }
            match hook.spec.patterns.matches(event) {
                Some(MatchKind::Exact) => exact.push(i),
                Some(MatchKind::Wildcard) => wild.push(i),
                None => {}
            }
        }
        exact.extend(wild);
        let list: Arc<[usize]> = exact.into();
        if !full {
            self.match_cache
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(event.into(), list.clone());
        }
        list
    }

    /// The loaded hook called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<LoadedHook>> {
        self.hooks.iter().find(|h| h.spec.name == name)
    }
}
