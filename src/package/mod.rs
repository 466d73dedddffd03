//! Hook packages: installing hooks from where they are published (a git repository, a local
//! directory, a `.tar.gz` or `.zip` archive), recording what was installed in
//! `$HERMES_HOME/hooks.lock`, updating and removing them. Nothing from a package runs while it
//! is installed: its tree is checked (paths, links, owners, size), each hook is validated the
//! way discovery loads it (no Python import), and only then moved into the hook root.
//!
//! Files: [`source`] (what SOURCE names), [`git`] (fetching with the system `git`),
//! [`archive`] (safe extraction), [`tree`] (walking, hashing, comparing a hook's files),
//! [`lock`] (the lock file), [`stage`] (a package fetched into a private directory of the hook
//! root, its hooks found and checked), [`install`], [`update`], [`remove`].

pub mod archive;
pub mod error;
pub mod git;
pub mod install;
pub mod lock;
pub mod remove;
pub mod source;
pub mod stage;
pub mod tree;
pub mod update;

pub use error::PackageError;
pub use install::{InstallOptions, install};
pub use lock::{Drift, LockFile, lock_file};
pub use remove::remove;
pub use update::{Plan, apply, plan_update};

/// Largest package accepted: the sum of its files' sizes (declared sizes for archives,
/// checked before anything is written).
pub const MAX_PACKAGE_BYTES: u64 = 64 * 1024 * 1024;

/// Most entries (files, directories, links) a package may hold.
pub const MAX_PACKAGE_ENTRIES: usize = 20_000;
