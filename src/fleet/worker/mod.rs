//! A fleet worker (`worker --fleet URL`), one file per part (none uses this file; each uses only
//! the ones listed above it):
//!
//! - `state.rs`: what the parts share: options, [`Shared`](state::Shared), a hook's settings,
//!   task and counters, the events it finished.
//! - `deliver.rs`: one event of a delivered message ([`Delivery`](deliver::Delivery)): finish,
//!   settle, give back.
//! - `holder.rs`: an ordered hook's lease in the pull loop: take it, hand it over, give back on stop.
//! - `consumer.rs`: a hook's consumer on the broker: create or update it, delete it after the grace.
//! - `ack.rs`: after the handler: acknowledgement, retry, hand-over to another version, dead letter.
//! - `pull.rs`: the pull loop of one hook ([`consume`](pull::consume)) and what it keeps across
//!   its sessions ([`Run`](pull::Run)): sessions, drain, retries held until due.
//! - `triage.rs`: what to do with a delivered message: settle it or hold its events in the backlog.
//! - `handover.rs`: an ordered hook's hand-over to another version of it: stop at the event,
//!   give it and the rest back, leave a note for the next holder.
//! - `marks.rs`: an ordered hook's holder's marks of what it may start on an event's last
//!   allowed delivery, and a new holder's reading of them: which events a holder that vanished
//!   may have started ([`crate::fleet::attempts`]).
//! - `feed.rs`: the backlog into the hook's local queue, a new lease holder's catch-up, each
//!   event's handler call.
//! - `tasks.rs`: the worker's start and stop, the hook tasks matched to the registry, its status.
//!
//! Each hook gets one durable pull consumer named after it, shared by every worker that has the
//! hook, and a second one on its retry subject ([`super::retry`]). An ordered hook
//! (`concurrency: 1`) is pulled by one worker at a time (the lease holder, [`super::lease`]) with
//! up to [`WINDOW`](state::WINDOW) events in flight, fed in stream order into the hook's local queue, and its
//! consumer acknowledges cumulatively ([`super::held`]); a hook with `concurrency: N` lets every
//! worker pull, N in flight, explicit acknowledgements. A new consumer starts at the time the
//! hook appeared (its HOOK.yaml written on a running worker, or the worker's start), so events
//! published while it was being created are not missed, and a stream recreated empty by its
//! broker is read from its start.
//!
//! A stream message holds one event or a bundle of them ([`super::envelope`]): its events are
//! run one by one, in order, each with its own retry and dead letter, and the message is
//! acknowledged once every one is finished ([`super::held`]). At most the hook's window of
//! events is in its local queue at once; the rest of what was delivered waits in a backlog,
//! held (with progress signals).
//!
//! An event is acknowledged after its handler finished, with progress signals from the moment
//! it arrives (also while it waits in the hook's local queue, so it is never redelivered while
//! it waits); a failure or a timeout is published to the hook's retry subject with a growing
//! delay and the event finished; on the last allowed delivery (`retries:` + 1) the event is
//! published to the dead-letter subject with its error and delivery count, then acknowledged.
//! The consumer allows one delivery more than that: a worker killed during the last allowed
//! delivery leaves the event unacknowledged, the broker delivers it once more after the ack
//! wait, and that delivery goes to the dead letters without running the handler again.
//!
//! A worker that takes an ordered hook's lease starts nothing and acknowledges nothing until
//! every event the broker counts as pending for the hook is delivered to it ([`pull::CatchUp`]): a
//! dead or late previous holder's events come back in the order their ack waits ran out, and a
//! cumulative acknowledgement must never pass one still on its way. It waits for a previous
//! holder that says it still finishes them; otherwise it gives up on what does not come back
//! within 2 x ack wait + 1 s, with a warning.
//!
//! A removed hook's consumers are deleted after `consumer_grace` when no worker pulls from them.
//!
//! A hook's consumer, lease and dead letters are named by its identity ([`super::identity`]:
//! `id:`, else the name), so a renamed hook keeps its place in the stream; a rename on a running
//! worker is a hand-over inside the hook's task ([`pull::Run::renamed`]), not a stop and a start. Its
//! filter covers the patterns of every live version of the hook ([`super::versions`]), and an event this version
//! does not match goes back when another version does, for a worker that has it: an ordered
//! hook's lease holder stops at it and hands the lease and what it holds over, in order
//! ([`handover`]); an event no live version matches but one that was live when it was accepted
//! did is dead-lettered, never skipped. A worker that stops while it is the last to run its
//! version of a hook and another version is live (a rolling update by restart), or whose edit
//! of the hook drops patterns no other live version has (the host holds the change:
//! `Host::set_change_hold`), first runs, for up to `--retire-drain`, what only its version
//! matches among the events that were in the stream when the stop or edit began (`tasks.rs`,
//! `retire` and `drain_holds`; its status names the version and that bound, so the other
//! versions hand it only those and treat later ones as theirs alone).

mod ack;
mod consumer;
mod deliver;
mod feed;
mod handover;
mod holder;
mod marks;
mod pull;
mod state;
mod tasks;
mod triage;

pub use state::{RETIRE_DRAIN, WorkerOptions};
pub use tasks::Worker;
