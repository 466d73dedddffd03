//! One descriptor per handler kind: what discovery, trust and the `/v1/hooks` view need to know
//! about a kind, in one table ([`KINDS`]) that they consult instead of matching on the kind.
//! A leaf: it uses no other module of this crate.
//!
//! Adding a kind is its code under `handler/` plus one registration: a [`HandlerKind`] variant
//! with its [`KindSpec`] in [`KINDS`], and its arm in `handler::start` (see docs/architecture.md,
//! "Where each handler kind lives").

use serde::Serialize;

/// What runs a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerKind {
    /// `handler.py`, run in a persistent Python worker.
    Python,
    /// An executable (or a shell script), one process per event.
    Exec,
    /// A dynamic library with the C ABI v1.
    Dylib,
    /// An HTTP endpoint (`url:`).
    Webhook,
}

/// A handler file looked for next to HOOK.yaml when HOOK.yaml names none.
#[derive(Debug)]
pub(crate) struct DefaultFile {
    /// The file name.
    pub name: &'static str,
    /// Only taken when it has a run bit.
    pub needs_run_bit: bool,
}

/// What an approval (`hermes-hooks enable`) of a hook of this kind covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApprovalInput {
    /// The bytes of the handler file.
    HandlerFile,
    /// The endpoint named in HOOK.yaml (`url`, `secret_env`), nothing on disk.
    Endpoint,
}

/// Everything outside `handler/` that depends on a hook's kind.
#[derive(Debug)]
pub(crate) struct KindSpec {
    /// The kind described.
    pub kind: HandlerKind,
    /// Lower-case name, as shown by the API and the CLI.
    pub name: &'static str,
    /// Handler files tried when HOOK.yaml names none, in order (kinds are tried in [`KINDS`]
    /// order).
    pub default_files: &'static [DefaultFile],
    /// How the "no handler" message names those files.
    pub default_hint: &'static [&'static str],
    /// Extensions of an explicit `handler:` path that select this kind.
    pub extensions: &'static [&'static str],
    /// An explicit `handler:` path with an extension no kind claims is of this kind.
    pub other_extensions: bool,
    /// An explicit handler of this kind needs a run bit (or to be a shell script).
    pub needs_run_bit: bool,
    /// Runs files on this machine: its tree is scanned, hashed and permission-checked.
    pub runs_locally: bool,
    /// Runs Python: `python:` in HOOK.yaml applies, the interpreter is shown, and it may run
    /// inside the gateway (`runs:`).
    pub python: bool,
    /// Handles one event at a time outside fleet mode (`concurrency:` only applies there).
    pub serial: bool,
    /// What an approval covers.
    pub approval: ApprovalInput,
    /// Takes the `.env` files' variables once, when its long-lived worker starts (so a changed
    /// file is a changed hook); the other kinds read them at each process start.
    pub env_at_start: bool,
    /// What a `sandbox:` can confine of it.
    pub confinement: Confinement,
}

/// What a `sandbox:` can confine of a hook of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// Its own processes: the kernel's rules are applied to them before hook code runs.
    Process,
    /// Nothing: it runs inside the service, which cannot confine a part of itself.
    InService,
    /// Nothing local: the service only sends it a request.
    Remote,
}

/// The kinds, in the order their default handler files are tried.
pub(crate) static KINDS: [KindSpec; 4] = [
    KindSpec {
        kind: HandlerKind::Python,
        name: "python",
        default_files: &[DefaultFile {
            name: "handler.py",
            needs_run_bit: false,
        }],
        default_hint: &["handler.py"],
        extensions: &["py"],
        other_extensions: false,
        needs_run_bit: false,
        runs_locally: true,
        python: true,
        serial: true,
        approval: ApprovalInput::HandlerFile,
        env_at_start: true,
        confinement: Confinement::Process,
    },
    KindSpec {
        kind: HandlerKind::Exec,
        name: "exec",
        default_files: &[
            DefaultFile {
                name: "handler",
                needs_run_bit: true,
            },
            DefaultFile {
                name: "handler.sh",
                needs_run_bit: false,
            },
        ],
        default_hint: &["an executable `handler`", "handler.sh"],
        extensions: &[],
        other_extensions: true,
        needs_run_bit: true,
        runs_locally: true,
        python: false,
        serial: false,
        approval: ApprovalInput::HandlerFile,
        env_at_start: false,
        confinement: Confinement::Process,
    },
    KindSpec {
        kind: HandlerKind::Dylib,
        name: "dylib",
        default_files: &[
            DefaultFile {
                name: "handler.so",
                needs_run_bit: false,
            },
            DefaultFile {
                name: "handler.dylib",
                needs_run_bit: false,
            },
            DefaultFile {
                name: "handler.dll",
                needs_run_bit: false,
            },
        ],
        default_hint: &["handler.so"],
        extensions: &["so", "dylib", "dll"],
        other_extensions: false,
        needs_run_bit: false,
        runs_locally: true,
        python: false,
        serial: true,
        approval: ApprovalInput::HandlerFile,
        env_at_start: false,
        confinement: Confinement::InService,
    },
    KindSpec {
        kind: HandlerKind::Webhook,
        name: "webhook",
        default_files: &[],
        default_hint: &[],
        extensions: &[],
        other_extensions: false,
        needs_run_bit: false,
        runs_locally: false,
        python: false,
        serial: false,
        approval: ApprovalInput::Endpoint,
        env_at_start: false,
        confinement: Confinement::Remote,
    },
];

impl HandlerKind {
    /// Lower-case name, as shown by the API and the CLI.
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// This kind's descriptor.
    pub(crate) fn spec(self) -> &'static KindSpec {
        KINDS.iter().find(|k| k.kind == self).unwrap_or(&KINDS[0])
    }

    /// The kind of an explicit handler file, from its extension.
    pub(crate) fn of_extension(ext: Option<&str>) -> HandlerKind {
        let claimed = KINDS
            .iter()
            .find(|k| ext.is_some_and(|e| k.extensions.contains(&e)));
        claimed
            .or_else(|| KINDS.iter().find(|k| k.other_extensions))
            .map_or(HandlerKind::Exec, |k| k.kind)
    }
}

/// The default handler files, worded for the "no handler" message: "handler.py, an executable
/// `handler`, handler.sh or handler.so".
pub(crate) fn default_hint() -> String {
    let hints: Vec<&str> = KINDS
        .iter()
        .flat_map(|k| k.default_hint.iter().copied())
        .collect();
    match hints.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => (*last).to_string(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_descriptor() {
        for k in [
            HandlerKind::Python,
            HandlerKind::Exec,
            HandlerKind::Dylib,
            HandlerKind::Webhook,
        ] {
            assert_eq!(KINDS.iter().filter(|s| s.kind == k).count(), 1, "{k:?}");
            assert_eq!(k.spec().kind, k);
        }
    }

    #[test]
    fn names_and_extensions() {
        assert_eq!(HandlerKind::Webhook.as_str(), "webhook");
        assert_eq!(HandlerKind::of_extension(Some("py")), HandlerKind::Python);
        assert_eq!(HandlerKind::of_extension(Some("dll")), HandlerKind::Dylib);
        assert_eq!(HandlerKind::of_extension(Some("sh")), HandlerKind::Exec);
        assert_eq!(HandlerKind::of_extension(None), HandlerKind::Exec);
    }

    #[test]
    fn hint_reads_as_before() {
        assert_eq!(
            default_hint(),
            "handler.py, an executable `handler`, handler.sh or handler.so"
        );
    }
}
