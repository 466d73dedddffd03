//! Handler kinds behind one small trait ([`Handler`]: ready, call, shutdown).
//!
//! A hook's worker ([`crate::hook`]) owns one [`Handler`] and hands it queued events (up to
//! [`Handler::max_calls`] at once), so a handler needs `&mut self` and no locking. Each kind lives
//! in its own file or folder and builds on [`api`]; [`start`] picks the kind. What the rest of
//! the crate knows about a kind (handler file names, files that can run, approval inputs, Python
//! or not) is its descriptor in `crate::kind`, so a new kind is one new file or folder here plus
//! one registration: its descriptor in `kind::KINDS` and its arm in [`start`]
//! (docs/architecture.md, "Where each handler kind lives").

use crate::discovery::{HandlerKind, HookSpec};

mod api;
pub mod confine;
pub mod context;
pub mod dylib;
pub mod exec;
pub mod hook_sandbox;
pub mod process;
pub mod python;
pub mod retire;
pub mod shell_syntax;
mod spawn;
pub mod starter;
pub mod verified_exec;
pub mod webhook;

pub use api::*;

/// Starts the handler for `spec`: for Python this spawns the worker and waits for its ready
/// handshake, so import errors and a missing `handle` surface here.
pub async fn start(spec: &HookSpec, ctx: HandlerContext) -> Result<Box<dyn Handler>, HandlerError> {
    if let Some(why) = crate::sandbox::refusal(ctx.sandbox.as_deref(), spec.kind.spec().confinement)
    {
        tracing::warn!(hook = %spec.name, "not started: {why}");
        return Err(HandlerError::Load(why));
    }
    match spec.kind {
        HandlerKind::Python => Ok(Box::new(python::PythonHandler::start(ctx).await?)),
        HandlerKind::Exec => Ok(Box::new(exec::ExecHandler::start(ctx).await?)),
        HandlerKind::Dylib => Ok(Box::new(dylib::DylibHandler::start(ctx).await?)),
        HandlerKind::Webhook => Ok(Box::new(webhook::WebhookHandler::new(
            &ctx,
            webhook::WebhookTarget::of(spec),
        )?)),
    }
}

/// What a kind derives from its manifest, applied to a freshly discovered spec before it is
/// planned: a webhook's worker timeout covers the whole delivery (both attempts; `timeout:` is
/// per attempt), and an unset `secret_env` is a load-time warning.
pub fn prepare(spec: &mut HookSpec) {
    if spec.kind == HandlerKind::Webhook {
        spec.manifest.timeout = webhook::delivery_budget(&spec.manifest);
        let warning = webhook::unsigned_warning(&spec.manifest);
        spec.manifest.warnings.extend(warning);
    }
}

/// The `signed` field of `/v1/hooks`: for a webhook, whether its deliveries are signed; `None`
/// for the other kinds.
pub fn signed(spec: &HookSpec) -> Option<bool> {
    (spec.kind == HandlerKind::Webhook).then(|| webhook::is_signed(&spec.manifest))
}
