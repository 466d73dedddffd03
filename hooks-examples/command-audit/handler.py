"""command-audit: records every slash command (command:<name>) as one JSON line in
$HERMES_HOME/logs/command-audit.jsonl."""
import json
import os
from datetime import datetime, timezone
from pathlib import Path

LOG = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes") / "logs" / "command-audit.jsonl"


def handle(event_type, context):
    entry = {
        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        # "command:reset" -> "reset" when the context does not name the command itself
        "command": context.get("command") or event_type.split(":", 1)[-1],
        "user_id": context.get("user_id"),
        "platform": context.get("platform"),
        "args": context.get("args"),
    }
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")
