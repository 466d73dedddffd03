//! Handler kinds behind one small trait ([`Handler`]: ready, call, shutdown).
//!
//! A hook's worker ([`crate::dispatch`]) owns one [`Handler`] and hands it queued events (up to
//! [`Handler::max_calls`] at once), so a handler needs `&mut self` and no locking. Each kind lives
//! in its own file and builds on [`api`]; adding a kind means one new file and one arm in [`start`].

use crate::discovery::{HandlerKind, HookSpec};

mod api;
pub mod dylib;
pub mod exec;
pub mod process;
pub mod pylog;
pub mod python;
pub mod verified_exec;
pub mod webhook;
pub mod zygote;

pub use api::*;

/// Starts the handler for `spec`: for Python this spawns the worker and waits for its ready
/// handshake, so import errors and a missing `handle` surface here.
pub async fn start(spec: &HookSpec, ctx: HandlerContext) -> Result<Box<dyn Handler>, HandlerError> {
    match spec.kind {
        HandlerKind::Python => Ok(Box::new(python::PythonHandler::start(ctx).await?)),
        HandlerKind::Exec => Ok(Box::new(exec::ExecHandler::new(ctx)?)),
        HandlerKind::Dylib => Ok(Box::new(dylib::DylibHandler::start(ctx).await?)),
        HandlerKind::Webhook => Ok(Box::new(webhook::WebhookHandler::new(
            &ctx,
            webhook::WebhookTarget::of(spec),
        )?)),
    }
}
