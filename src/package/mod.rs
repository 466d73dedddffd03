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

pub use install::{InstallOptions, install};
pub use lock::{Drift, LockFile, lock_file};
pub use remove::remove;
pub use update::{Plan, apply, plan_update};
