//! Log records of Python workers: the runner sends each `logging` record at INFO and above as
//! one stderr line `\x1ehermes-log {"level", "levelno", "logger", "msg"}`; this module turns such
//! a line into a service log line at the matching level (ERROR and CRITICAL -> error, WARNING ->
//! warn, INFO -> info, below -> debug), tagged with the hook's name and the record's level and
//! logger name. Any other stderr line (print, tracebacks written by hand) stays an info line.

use serde::Deserialize;

/// What starts a structured record line (ASCII record separator, then a tag).
pub const MARK: &str = "\u{1e}hermes-log ";

#[derive(Debug, Deserialize)]
struct Record {
    #[serde(default)]
    level: String,
    #[serde(default)]
    levelno: i64,
    #[serde(default)]
    logger: String,
    #[serde(default)]
    msg: String,
}

/// Logs one stderr line of `hook`'s worker; `suffix` is appended (e.g. a "line cut" note).
pub fn log_line(hook: &str, text: &str, suffix: &str) {
    let record = text
        .strip_prefix(MARK)
        .and_then(|json| serde_json::from_str::<Record>(json).ok());
    let Some(r) = record else {
        // A blank line a hook prints (print() with nothing, a spacer) is not worth a log line.
        if text.trim().is_empty() && suffix.is_empty() {
            return;
        }
        tracing::info!(target: "hook", hook = %hook, "{text}{suffix}");
        return;
    };
    let (level, logger, msg) = (r.level.as_str(), r.logger.as_str(), r.msg.as_str());
    match r.levelno {
        n if n >= 40 => {
            tracing::error!(target: "hook", hook = %hook, level, logger, "{msg}{suffix}")
        }
        n if n >= 30 => {
            tracing::warn!(target: "hook", hook = %hook, level, logger, "{msg}{suffix}")
        }
        n if n >= 20 => {
            tracing::info!(target: "hook", hook = %hook, level, logger, "{msg}{suffix}")
        }
        _ => tracing::debug!(target: "hook", hook = %hook, level, logger, "{msg}{suffix}"),
    }
}
