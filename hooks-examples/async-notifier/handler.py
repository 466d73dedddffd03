"""async-notifier: an async handler. It awaits simulated I/O, then hands the slow part to a background
task that writes $HERMES_HOME/logs/async-notifier.log after handle() has returned. The module-level
counter lives as long as the hook's worker, so it counts sessions across events."""
import asyncio
import os
from datetime import datetime, timezone
from pathlib import Path

LOG = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes") / "logs" / "async-notifier.log"

sessions_seen = 0
_background = set()  # asyncio keeps only weak references to tasks: hold them until they finish


async def notify_later(line):
    await asyncio.sleep(0.5)  # e.g. a slow webhook call we do not want the event to wait for
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a", encoding="utf-8") as f:
        f.write(line + "\n")


async def handle(event_type, context):
    global sessions_seen
    sessions_seen += 1
    await asyncio.sleep(0.1)  # simulated I/O, e.g. looking the user up
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    line = "%s %s platform=%s user=%s session=%s (session #%d seen by this worker)" % (
        stamp, event_type, context.get("platform"), context.get("user_id"),
        context.get("session_id") or context.get("session_key"), sessions_seen)
    task = asyncio.create_task(notify_later(line))
    _background.add(task)
    task.add_done_callback(_background.discard)
    return {"sessions_seen": sessions_seen}
