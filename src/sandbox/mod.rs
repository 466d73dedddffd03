//! Sandboxed hooks: what a hook declares it may read, write, connect to, see and start
//! (`sandbox:` in HOOK.yaml, [`decl`]), resolved for its processes ([`policy`]) and held to by
//! the kernel ([`landlock`], [`seccomp`]): Landlock rules, a filter that keeps every confined
//! process from making a Unix socket (so from reaching the service), `no_new_privs` and an environment holding only
//! what is declared, applied to an executable between fork and exec (`handler/exec.rs`) and by
//! the Python runner on itself before the hook is imported (`handler/python/runner.py`). Also
//! the service's default for hooks without the key and the view `check` and `/v1/hooks` show.

pub mod choice;
pub mod decl;
pub mod landlock;
pub mod pin;
pub mod policy;
pub mod seccomp;
pub mod view;

pub use choice::{DEFAULT_ENV, DefaultSandbox, effective, refusal};
pub use decl::Sandbox;
pub use policy::{Policy, Where};
