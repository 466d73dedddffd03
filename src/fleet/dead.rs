//! Dead letters: `hermes-hooks dead list` reads the dead-letter stream; `dead replay` publishes
//! the chosen events again for the one hook that failed them, found by its identity (`id:`, so
//! a hook renamed since gets them under its new name), or for the hook `--to` names (a replay
//! copy names its hook, so the other hooks' consumers skip it), and removes them from the
//! dead-letter stream once the event stream has acknowledged the copy. The edge's API
//! (`GET /v1/dead`, `POST /v1/dead/replay`, for the dashboard) does the same work on the edge's
//! own connection ([`page_on`], [`replay_on`]).

use async_nats::jetstream;
use serde::Serialize;

use super::envelope::{DeadLetter, Envelope};
use super::{FleetConfig, FleetError};

/// One dead letter with its place in the dead-letter stream.
#[derive(Debug, Clone, Serialize)]
pub struct DeadEntry {
    /// Sequence in the dead-letter stream (what `dead replay SEQ` takes).
    pub seq: u64,
    /// The record.
    #[serde(flatten)]
    pub letter: DeadLetter,
}

/// Which dead letters to act on.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only this hook's.
    pub hook: Option<String>,
    /// Only these sequences (empty: all that match `hook`).
    pub seqs: Vec<u64>,
    /// Replay into this hook (by its current name) instead of the one that failed them.
    pub to: Option<String>,
}

impl Selection {
    fn wants(&self, e: &DeadEntry) -> bool {
        self.hook.as_deref().is_none_or(|h| h == e.letter.hook)
            && (self.seqs.is_empty() || self.seqs.contains(&e.seq))
    }
}

impl DeadEntry {
    /// What the API shows of it: where it is, which hook failed which event, why, and when
    /// (not the event's context).
    pub fn summary(&self) -> serde_json::Value {
        let l = &self.letter;
        serde_json::json!({
            "seq": self.seq,
            "hook": l.hook,
            "event": l.envelope.event,
            "event_id": l.envelope.id,
            "error": l.error,
            "deliveries": l.deliveries,
            "worker": l.worker,
            "time": l.time,
        })
    }
}

/// Up to a limit of dead letters, oldest first.
#[derive(Debug, Clone, Default)]
pub struct DeadPage {
    /// The letters.
    pub entries: Vec<DeadEntry>,
    /// More letters that the selection picks follow the last one.
    pub more: bool,
}

async fn open(cfg: &FleetConfig) -> Result<jetstream::Context, FleetError> {
    let client = cfg.connect("hermes-hooks dead", true).await?;
    Ok(cfg.jetstream(client))
}

/// Reads the letters `sel` picks, stopping after `limit` + 1 of them (`None`: all).
async fn read(
    stream: &mut jetstream::stream::Stream,
    sel: &Selection,
    limit: Option<usize>,
) -> Result<Vec<DeadEntry>, String> {
    let info = stream.info().await.map_err(|e| e.to_string())?;
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    let mut out = Vec::new();
    if info.state.messages == 0 {
        return Ok(out);
    }
    for seq in first..=last {
        if !sel.seqs.is_empty() && !sel.seqs.contains(&seq) {
            continue;
        }
        // Deleted sequences (replayed letters) are gaps.
        let Ok(msg) = stream.get_raw_message(seq).await else {
            continue;
        };
        match serde_json::from_slice::<DeadLetter>(&msg.payload) {
            Ok(letter) => {
                let e = DeadEntry { seq, letter };
                if sel.wants(&e) {
                    out.push(e);
                    if limit.is_some_and(|l| out.len() > l) {
                        break;
                    }
                }
            }
            Err(e) => tracing::warn!("dead letter {seq} is unreadable: {e}"),
        }
    }
    Ok(out)
}

/// The dead letters that `sel` picks, oldest first.
pub async fn list(cfg: &FleetConfig, sel: &Selection) -> Result<Vec<DeadEntry>, FleetError> {
    let js = open(cfg).await?;
    Ok(page(cfg, &js, sel, None).await?.entries)
}

/// The first `limit` dead letters that `sel` picks, oldest first, over the connection of `js`.
pub async fn page_on(
    cfg: &FleetConfig,
    js: &jetstream::Context,
    sel: &Selection,
    limit: usize,
) -> Result<DeadPage, FleetError> {
    page(cfg, js, sel, Some(limit)).await
}

async fn page(
    cfg: &FleetConfig,
    js: &jetstream::Context,
    sel: &Selection,
    limit: Option<usize>,
) -> Result<DeadPage, FleetError> {
    let mut stream = cfg.dead(js).await?;
    let mut entries = read(&mut stream, sel, limit)
        .await
        .map_err(|why| FleetError::Broker {
            url: cfg.url.clone(),
            what: "read the dead-letter stream",
            why,
        })?;
    let more = limit.is_some_and(|l| entries.len() > l);
    entries.truncate(limit.unwrap_or(usize::MAX));
    Ok(DeadPage { entries, more })
}

/// Publishes the picked dead letters again, each for its own hook, and removes them from the
/// dead-letter stream. Returns what was re-queued.
pub async fn replay(cfg: &FleetConfig, sel: &Selection) -> Result<Vec<DeadEntry>, FleetError> {
    replay_on(cfg, &open(cfg).await?, sel).await
}

/// [`replay`] over the connection of `js`.
pub async fn replay_on(
    cfg: &FleetConfig,
    js: &jetstream::Context,
    sel: &Selection,
) -> Result<Vec<DeadEntry>, FleetError> {
    let mut stream = cfg.dead(js).await?;
    let err = |what: &'static str, why: String| FleetError::Broker {
        url: cfg.url.clone(),
        what,
        why,
    };
    let events = cfg.events(js).await?;
    let entries = read(&mut stream, sel, None)
        .await
        .map_err(|e| err("read the dead-letter stream", e))?;
    let mut done = Vec::new();
    for e in entries {
        // A replay reaches the hook through its consumer: none (the hook was removed, or
        // renamed without an `id:`) means nobody would run it, so the letter stays.
        let key = e.letter.hook_id.clone().unwrap_or(e.letter.hook.clone());
        let target = match &sel.to {
            Some(name) => super::identity::by_name(&events, name).await,
            None => super::identity::by_identity(&events, &key).await,
        };
        let kept = format!(
            "dead letter {} kept; {} re-queued before it",
            e.seq,
            done.len()
        );
        let Some(target) = target else {
            let why = match &sel.to {
                Some(name) => format!("no hook {name:?} in the fleet (no consumer for it)"),
                None => format!(
                    "no consumer for hook {:?} (renamed or removed? a hook renamed with the same `id:` keeps it; or replay with --to NAME)",
                    e.letter.hook
                ),
            };
            return Err(err("replay a dead letter", format!("{why}: {kept}")));
        };
        let subject = cfg.event_subject(&e.letter.envelope.event);
        if !target
            .filters
            .iter()
            .any(|f| super::subject_matches(f, &subject))
        {
            return Err(err(
                "replay a dead letter",
                format!(
                    "hook {:?} does not take event {:?} (none of its patterns matches): {kept}",
                    target.hook, e.letter.envelope.event
                ),
            ));
        }
        let env = Envelope {
            hook: Some(target.hook.clone()),
            ..e.letter.envelope.clone()
        };
        let payload = serde_json::to_vec(&env).unwrap_or_default();
        // The same dead letter replayed twice within the duplicate window is stored once.
        let publish = jetstream::message::PublishMessage::build()
            .payload(payload.into())
            .message_id(format!(
                "replay:{}:{}:{}",
                cfg.dead_stream(),
                e.seq,
                target.hook
            ));
        js.send_publish(cfg.event_subject(&env.event), publish)
            .await
            .map_err(|x| err("publish a replay", x.to_string()))?
            .await
            .map_err(|x| err("store a replay", x.to_string()))?;
        stream
            .delete_message(e.seq)
            .await
            .map_err(|x| err("remove a replayed dead letter", x.to_string()))?;
        done.push(e);
    }
    Ok(done)
}
