//! Event names: validation and the catalogues of events Hermes emits: the gateway's
//! (`agent:start`...) and the agent's (`pre_tool_call`..., issue 49).
//!
//! The catalogues are used by `check` to warn about patterns that can never fire and to suggest
//! the name that was probably meant (`sesion:start` -> `session:start`, `pre_tool_cal` ->
//! `pre_tool_call`).

use thiserror::Error;

/// Longest accepted event name, in characters (Unicode scalar values, as JSON Schema's
/// `maxLength` counts them, so the OpenAPI document can state the limit exactly).
pub const MAX_EVENT_NAME_LEN: usize = 256;

/// The events the gateway emits, with the context keys it sends for each.
pub const KNOWN_EVENTS: &[(&str, &[&str])] = &[
    ("gateway:startup", &["platforms"]),
    (
        "session:start",
        &["platform", "user_id", "session_id", "session_key"],
    ),
    ("session:end", &["platform", "user_id", "session_key"]),
    ("session:reset", &["platform", "user_id", "session_key"]),
    (
        "session:compress",
        &[
            "platform",
            "session_id",
            "old_session_id",
            "in_place",
            "compression_count",
        ],
    ),
    (
        "agent:start",
        &[
            "platform",
            "user_id",
            "chat_id",
            "thread_id",
            "chat_type",
            "session_id",
            "message",
        ],
    ),
    (
        "agent:step",
        &[
            "platform",
            "user_id",
            "session_id",
            "iteration",
            "tool_names",
        ],
    ),
    (
        "agent:end",
        &[
            "platform",
            "user_id",
            "chat_id",
            "thread_id",
            "chat_type",
            "session_id",
            "message",
            "response",
            "model",
            "provider",
        ],
    ),
    ("reaction:added", REACTION_KEYS),
    ("reaction:removed", REACTION_KEYS),
    (
        "command:<name>",
        &["platform", "user_id", "command", "args"],
    ),
    (
        "message:pre_route",
        &[
            "platform",
            "user_id",
            "chat_id",
            "thread_id",
            "chat_type",
            "session_id",
            "session_key",
            "message",
        ],
    ),
];

/// The slash commands hermes-agent 0.19.0's gateway runs, each with the other names it accepts
/// for it. For a command it knows the gateway emits `command:<name>` under the first name here,
/// whichever the user typed: `/reset` arrives as `command:new`. A Hermes plugin may add commands
/// of its own, which get their `command:<name>` too.
pub const GATEWAY_COMMANDS: &[(&str, &[&str])] = &[
    ("agents", &["tasks"]),
    ("approve", &[]),
    ("background", &["bg", "btw"]),
    ("blueprint", &["bp"]),
    ("branch", &["fork"]),
    ("bundles", &[]),
    ("codex-runtime", &["codex_runtime"]),
    ("commands", &[]),
    ("compress", &["compact"]),
    ("curator", &[]),
    ("debug", &[]),
    ("deny", &[]),
    ("fast", &[]),
    ("footer", &[]),
    ("goal", &[]),
    ("help", &[]),
    ("insights", &[]),
    ("kanban", &[]),
    ("learn", &[]),
    ("memory", &[]),
    ("moa", &[]),
    ("model", &[]),
    ("new", &["reset"]),
    ("personality", &[]),
    ("platform", &[]),
    ("profile", &[]),
    ("queue", &["q"]),
    ("reasoning", &[]),
    ("reload-mcp", &["reload_mcp"]),
    ("reload-skills", &["reload_skills"]),
    ("restart", &[]),
    ("resume", &[]),
    ("retry", &[]),
    ("rollback", &[]),
    ("sessions", &[]),
    ("sethome", &["set-home"]),
    ("skills", &[]),
    ("start", &[]),
    ("status", &[]),
    ("steer", &[]),
    ("stop", &[]),
    ("subgoal", &[]),
    ("suggestions", &["suggest"]),
    ("title", &[]),
    ("topic", &[]),
    ("topup", &[]),
    ("undo", &[]),
    ("update", &[]),
    ("usage", &[]),
    ("verbose", &[]),
    ("version", &["v"]),
    ("voice", &[]),
    ("whoami", &[]),
    ("yolo", &[]),
];

/// `command:<name>` of every command in [`GATEWAY_COMMANDS`], as the gateway emits them.
static COMMAND_EVENTS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    GATEWAY_COMMANDS
        .iter()
        .map(|(name, _)| format!("command:{name}"))
        .collect()
});

/// What `check` says of a `command:NAME` pattern (a plain name, no glob) that no built-in
/// command of 0.19.0 emits: another name of a built-in one (which arrives under its first
/// name), or a plugin's command, with the built-in one it may have meant. `None` for any other
/// pattern.
pub(crate) fn command_note(pattern: &str) -> Option<String> {
    let name = pattern.strip_prefix("command:")?;
    if name.is_empty() || name.contains(['*', '?', '[', '{']) {
        return None;
    }
    if GATEWAY_COMMANDS.iter().any(|(n, _)| *n == name) {
        return None;
    }
    if let Some((canonical, _)) = GATEWAY_COMMANDS.iter().find(|(_, a)| a.contains(&name)) {
        return Some(format!(
            "pattern {pattern:?} never fires: /{name} is another name of /{canonical}, which \
             hermes-agent 0.19.0 emits as \"command:{canonical}\"; write that"
        ));
    }
    let near = GATEWAY_COMMANDS
        .iter()
        .map(|(n, _)| (strsim::levenshtein(name, n), *n))
        .min()
        .filter(|(d, _)| *d <= (name.len() / 4).clamp(1, 3))
        .map(|(_, n)| format!("; did you mean \"command:{n}\"?"))
        .unwrap_or_default();
    Some(format!(
        "pattern {pattern:?} is not a built-in command of hermes-agent 0.19.0 (fine for a \
         plugin's command){near}"
    ))
}

/// The agent's events (hermes-agent 0.19.0's `VALID_HOOKS`, named as Hermes names them), which
/// the client's Hermes plugin forwards (issue 49). Their context is the object 0.19.0 gives a
/// shell hook on stdin: [`AGENT_CONTEXT_KEYS`].
pub const AGENT_EVENTS: &[AgentEvent] = &[
    AgentEvent::decides("pre_tool_call"),
    AgentEvent::observes("post_tool_call"),
    AgentEvent::decides("transform_terminal_output"),
    AgentEvent::decides("transform_tool_result"),
    AgentEvent::decides("transform_llm_output"),
    AgentEvent::decides("pre_llm_call"),
    AgentEvent::observes("post_llm_call"),
    AgentEvent::decides("pre_verify"),
    AgentEvent::observes("pre_api_request"),
    AgentEvent::observes("post_api_request"),
    AgentEvent::observes("api_request_error"),
    AgentEvent::observes("on_session_start"),
    AgentEvent::observes("on_session_end"),
    AgentEvent::observes("on_session_finalize"),
    AgentEvent::observes("on_session_reset"),
    AgentEvent::observes("subagent_start"),
    AgentEvent::observes("subagent_stop"),
    AgentEvent::decides("pre_gateway_dispatch"),
    AgentEvent::observes("pre_approval_request"),
    AgentEvent::observes("post_approval_response"),
    AgentEvent::observes("kanban_task_claimed"),
    AgentEvent::observes("kanban_task_completed"),
    AgentEvent::observes("kanban_task_blocked"),
];

/// The context of every agent event: what 0.19.0 writes to a shell hook's stdin (`extra` holds
/// the call's other arguments by name).
pub const AGENT_CONTEXT_KEYS: &[&str] = &[
    "hook_event_name",
    "tool_name",
    "tool_input",
    "session_id",
    "cwd",
    "extra",
];

/// One of the agent's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentEvent {
    /// The name, as Hermes writes it (`pre_tool_call`).
    pub name: &'static str,
    /// Whether Hermes reads the hooks' answers back (a block, a context, a replacement): such an
    /// event goes through the decision path (`/v1/collect`); the others are observed (`emit`).
    pub decides: bool,
}

impl AgentEvent {
    const fn decides(name: &'static str) -> Self {
        Self {
            name,
            decides: true,
        }
    }

    const fn observes(name: &'static str) -> Self {
        Self {
            name,
            decides: false,
        }
    }
}

/// The agent event named `name`, if it is one.
pub fn agent_event(name: &str) -> Option<&'static AgentEvent> {
    AGENT_EVENTS.iter().find(|e| e.name == name)
}

/// The context of an agent event from the arguments Hermes calls its hooks with (`kwargs`),
/// as the client's plugin and 0.19.0's shell-hook runner make it: `tool_name`, `tool_input`
/// (`args` when it is an object), `session_id` (else `parent_session_id`), `cwd`, and every
/// other argument under `extra`.
pub fn agent_context(
    event: &str,
    kwargs: &serde_json::Map<String, serde_json::Value>,
    cwd: &str,
) -> serde_json::Value {
    use serde_json::Value;
    let top = ["tool_name", "args", "session_id", "parent_session_id"];
    let extra: serde_json::Map<String, Value> = kwargs
        .iter()
        .filter(|(k, _)| !top.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let session = [kwargs.get("session_id"), kwargs.get("parent_session_id")]
        .into_iter()
        .flatten()
        .find(|v| !v.is_null() && v.as_str() != Some(""))
        .cloned()
        .unwrap_or_else(|| Value::from(""));
    serde_json::json!({
        "hook_event_name": event,
        "tool_name": kwargs.get("tool_name").cloned().unwrap_or(Value::Null),
        "tool_input": kwargs.get("args").filter(|a| a.is_object()).cloned().unwrap_or(Value::Null),
        "session_id": session,
        "cwd": cwd,
        "extra": extra,
    })
}

const REACTION_KEYS: &[&str] = &[
    "platform",
    "reaction",
    "user_id",
    "item_user_id",
    "item_type",
    "channel_id",
    "message_ts",
    "team_id",
    "event_ts",
    "raw_event",
];

/// Sample names standing for every known event, used to test whether a pattern can ever match.
/// `command:<name>` is represented by every built-in command of 0.19.0 ([`GATEWAY_COMMANDS`]).
pub(crate) fn known_event_samples() -> impl Iterator<Item = &'static str> {
    KNOWN_EVENTS
        .iter()
        .map(|(name, _)| *name)
        .filter(|n| !n.contains('<'))
        .chain(COMMAND_EVENTS.iter().map(String::as_str))
        .chain(AGENT_EVENTS.iter().map(|e| e.name))
}

/// Why an event name was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EventNameError {
    /// The name is the empty string.
    #[error("event name is empty")]
    Empty,
    /// The name is longer than [`MAX_EVENT_NAME_LEN`].
    #[error("event name is {0} characters long; the limit is {MAX_EVENT_NAME_LEN}")]
    TooLong(usize),
    /// The name contains whitespace or a control character.
    #[error("event name {0:?} contains whitespace or a control character")]
    BadCharacter(String),
}

/// Checks that `name` can be an event name: non-empty, at most 256 characters, no whitespace or
/// control characters.
pub fn validate_event_name(name: &str) -> Result<(), EventNameError> {
    if name.is_empty() {
        return Err(EventNameError::Empty);
    }
    // Bytes bound characters from above: count only when it can matter.
    if name.len() > MAX_EVENT_NAME_LEN {
        let chars = name.chars().count();
        if chars > MAX_EVENT_NAME_LEN {
            return Err(EventNameError::TooLong(chars));
        }
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(EventNameError::BadCharacter(name.to_string()));
    }
    Ok(())
}

/// The known event closest to `pattern` by edit distance, if it is close enough to be a typo.
pub(crate) fn suggest(pattern: &str) -> Option<&'static str> {
    let candidates = KNOWN_EVENTS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !n.contains('<'))
        .chain([
            "command:*",
            "agent:*",
            "session:*",
            "reaction:*",
            "gateway:*",
            "message:*",
        ])
        .chain(AGENT_EVENTS.iter().map(|e| e.name));
    let mut best: Option<(usize, &'static str)> = None;
    for c in candidates {
        let d = strsim::levenshtein(pattern, c);
        if best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    let limit = (pattern.len() / 4).clamp(1, 3);
    best.filter(|(d, _)| *d <= limit && *d > 0).map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_names() {
        assert!(validate_event_name("agent:start").is_ok());
        assert!(validate_event_name("a:b:c").is_ok());
        assert_eq!(validate_event_name(""), Err(EventNameError::Empty));
        assert!(matches!(
            validate_event_name("a b"),
            Err(EventNameError::BadCharacter(_))
        ));
        assert!(matches!(
            validate_event_name("a\u{7}"),
            Err(EventNameError::BadCharacter(_))
        ));
        let long = "a".repeat(257);
        assert_eq!(
            validate_event_name(&long),
            Err(EventNameError::TooLong(257))
        );
        // The limit counts characters, not bytes (512 bytes here).
        assert_eq!(validate_event_name(&"é".repeat(256)), Ok(()));
        assert_eq!(
            validate_event_name(&"é".repeat(257)),
            Err(EventNameError::TooLong(257))
        );
    }

    #[test]
    fn suggests_near_misses() {
        assert_eq!(suggest("sesion:start"), Some("session:start"));
        assert_eq!(suggest("agent:strat"), Some("agent:start"));
        assert_eq!(suggest("comand:*"), Some("command:*"));
        assert_eq!(suggest("totally:different"), None);
        // The agent's events (issue 49).
        assert_eq!(suggest("pre_tool_cal"), Some("pre_tool_call"));
        assert_eq!(suggest("post_toolcall"), Some("post_tool_call"));
        assert_eq!(suggest("on_sesion_end"), Some("on_session_end"));
    }

    /// Issue 49: every event of hermes-agent 0.19.0's `VALID_HOOKS` is a valid event name, and
    /// the deciding ones are those whose answers 0.19.0 reads back.
    #[test]
    fn agent_events_are_hermes_names() {
        assert_eq!(AGENT_EVENTS.len(), 23);
        for e in AGENT_EVENTS {
            assert_eq!(validate_event_name(e.name), Ok(()), "{}", e.name);
            assert_eq!(agent_event(e.name), Some(e));
        }
        let deciding: Vec<&str> = AGENT_EVENTS
            .iter()
            .filter(|e| e.decides)
            .map(|e| e.name)
            .collect();
        assert_eq!(
            deciding,
            [
                "pre_tool_call",
                "transform_terminal_output",
                "transform_tool_result",
                "transform_llm_output",
                "pre_llm_call",
                "pre_verify",
                "pre_gateway_dispatch"
            ]
        );
        assert_eq!(agent_event("agent:start"), None);
    }
}
