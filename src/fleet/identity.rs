//! A hook's identity in the fleet: HOOK.yaml `id:` when given, else its name. The identity names
//! the hook's durable consumer (its place in the stream), its lease and its dead letters, so a
//! hook renamed (its directory moved, or `name:` changed) with the same `id:` keeps its
//! position, and `dead replay` of its letters reaches it under the new name. Without `id:` a
//! rename makes a new hook (a new consumer from the time it appeared; the old one is deleted
//! after the grace).
//!
//! Also where `dead replay` sends a letter: its hook's identity, or `--to NAME`, found through
//! the consumers' descriptions (`hermes-hooks hook NAME`, kept current by the workers).

use async_nats::jetstream;
use futures_util::StreamExt;

use super::consumer_name;
use crate::discovery::HookSpec;

/// The hook's identity: `id:`, else its name.
pub fn of(spec: &HookSpec) -> String {
    spec.manifest
        .id
        .clone()
        .unwrap_or_else(|| spec.name.clone())
}

/// The description a hook's consumer carries: names the hook as it is called now.
pub fn description(name: &str) -> String {
    format!("hermes-hooks hook {name}")
}

/// A consumer of the event stream that a replay can be sent to.
#[derive(Debug, Clone)]
pub struct Target {
    /// What the replay's envelope names as its hook (an identity or a name; a worker takes
    /// either).
    pub hook: String,
    /// The consumer's filter subjects (a replay must be one of them to reach it).
    pub filters: Vec<String>,
}

/// The consumer for identity `key`, if it exists.
pub async fn by_identity(stream: &jetstream::stream::Stream, key: &str) -> Option<Target> {
    let c = stream
        .get_consumer::<jetstream::consumer::pull::Config>(&consumer_name(key))
        .await
        .ok()?;
    Some(Target {
        hook: key.to_string(),
        filters: of_config(&c.cached_info().config),
    })
}

/// The consumer of the hook now called `name` (its identity may differ), if one exists.
pub async fn by_name(stream: &jetstream::stream::Stream, name: &str) -> Option<Target> {
    if let Some(t) = by_identity(stream, name).await {
        return Some(t);
    }
    let want = description(name);
    let mut infos = stream.consumers();
    while let Some(Ok(info)) = infos.next().await {
        if info.config.description.as_deref() == Some(want.as_str()) {
            return Some(Target {
                hook: name.to_string(),
                filters: of_config(&info.config),
            });
        }
    }
    None
}

/// The filter subjects of a consumer's config, sorted.
pub fn of_config(c: &jetstream::consumer::Config) -> Vec<String> {
    let mut f = c.filter_subjects.clone();
    if !c.filter_subject.is_empty() {
        f.push(c.filter_subject.clone());
    }
    f.sort();
    f
}

#[cfg(test)]
mod tests {
    use super::super::subject_matches;

    #[test]
    fn subjects_match_filters_token_by_token() {
        assert!(subject_matches("hermes.ev.>", "hermes.ev.e.agent.start"));
        assert!(subject_matches(
            "hermes.ev.e.agent.*",
            "hermes.ev.e.agent.start"
        ));
        assert!(!subject_matches("hermes.ev.e.agent.*", "hermes.ev.e.agent"));
        assert!(!subject_matches(
            "hermes.ev.e.boot",
            "hermes.ev.e.agent.start"
        ));
        assert!(subject_matches("hermes.ev.e.boot", "hermes.ev.e.boot"));
        assert!(!subject_matches("hermes.ev.>", "hermes.ev"));
    }
}
