"""agent-logger: one JSON line per agent event (agent:start, agent:step, agent:end) in
$HERMES_HOME/logs/agent-activity.jsonl. A plain sync handler matched by the wildcard pattern agent:*."""
import json
import os
from datetime import datetime, timezone
from pathlib import Path

LOG = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes") / "logs" / "agent-activity.jsonl"
PREVIEW_CHARS = 80


def preview(text):
    if text is None:
        return None
    text = " ".join(str(text).split())  # one line, collapsed whitespace
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"


def handle(event_type, context):
    entry = {
        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "event": event_type,
        "platform": context.get("platform"),
        "user_id": context.get("user_id"),
        "session_id": context.get("session_id"),
        "message": preview(context.get("message")),
    }
    if event_type == "agent:step":
        entry["iteration"] = context.get("iteration")
        entry["tool_names"] = context.get("tool_names")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")
