//! A hook's sandbox from its spec: its own `sandbox:` (else the service's default) resolved
//! for it ([`policy_of`], what its processes are held to) and shown ([`view_of`], for `check`
//! and `/v1/hooks`).

use std::path::Path;

use crate::discovery::HookSpec;
use crate::sandbox::view::Shown;
use crate::sandbox::{DefaultSandbox, Policy, Where};

/// Where `spec`'s sandbox is resolved: its directory and name, `$HERMES_HOME`, the keys of its
/// own `env:`.
fn where_of<'a>(spec: &'a HookSpec, hermes_home: &'a Path) -> Where<'a> {
    Where {
        hook_dir: &spec.dir,
        name: &spec.name,
        hermes_home,
        own_env: spec.manifest.env.keys().cloned().collect(),
        python: spec
            .manifest
            .python
            .as_deref()
            .filter(|p| p.contains('/'))
            .map(|p| {
                let p = Path::new(p);
                if p.is_absolute() {
                    p.to_path_buf()
                } else {
                    spec.dir.join(p)
                }
            }),
    }
}

/// The policy of `spec`'s sandbox (its own, else `default`); `None`: not confined.
pub fn policy_of(spec: &HookSpec, default: DefaultSandbox, hermes_home: &Path) -> Option<Policy> {
    let sandbox = crate::sandbox::effective(spec.manifest.sandbox.as_ref(), default);
    crate::sandbox::policy::resolve(&sandbox, &where_of(spec, hermes_home))
}

/// `spec`'s sandbox as `check` and `/v1/hooks` show it.
pub fn view_of(spec: &HookSpec, default: DefaultSandbox, hermes_home: &Path) -> Shown {
    let sandbox = crate::sandbox::effective(spec.manifest.sandbox.as_ref(), default);
    Shown::of(
        &sandbox,
        spec.kind.spec().confinement,
        spec.placement.in_gateway(),
        &where_of(spec, hermes_home),
    )
}
