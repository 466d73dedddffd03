# startup-checklist: checks the machine when the gateway starts, without making anyone wait.
#
# What it shows:
# - background work: `handle` schedules the checks with asyncio.create_task() and returns None at
#   once; the task finishes after the call has returned (the hook's worker keeps its event loop
#   running between events). A strong reference to the task is kept until it is done, because
#   asyncio itself holds tasks only weakly;
# - blocking file-system calls moved off the event loop with asyncio.to_thread();
# - the `[SILENT]` convention: when every check passes there is nothing to say, and the log gets
#   `[SILENT]` instead of a report; problems are logged one line each;
# - a report line per startup in $HERMES_HOME/logs/startup-checklist.log, either way.
#
# Checks: free disk space under HERMES_HOME (warns under 1 GiB), HERMES_HOME writable, and the
# environment variables that the other examples installed next to this one need (long-task-alert:
# TELEGRAM_BOT_TOKEN and TELEGRAM_ALERT_CHAT_ID; session-webhook: SESSION_WEBHOOK_URL, and
# SESSION_WEBHOOK_SECRET to sign). Examples that are absent or `enabled: false` are not checked.
#
# Stdlib only, CPython 3.9+. print() lands in the service log under this hook's name.
import asyncio
import os
import re
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERMES_HOME = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes")
REPORT = HERMES_HOME / "logs" / "startup-checklist.log"
HOOK_DIR = Path(os.environ.get("HERMES_HOOK_DIR") or Path(__file__).resolve().parent)
MIN_FREE_BYTES = 1 << 30  # 1 GiB

# Sibling example -> (variables it needs, variables it merely recommends)
EXPECTED_ENV = {
    "long-task-alert": (["TELEGRAM_BOT_TOKEN", "TELEGRAM_ALERT_CHAT_ID"], []),
    "session-webhook": (["SESSION_WEBHOOK_URL"], ["SESSION_WEBHOOK_SECRET"]),
}

_background = set()


def check_disk():
    try:
        free = shutil.disk_usage(str(HERMES_HOME)).free
    except OSError as exc:
        return ["disk: cannot measure free space under %s: %s" % (HERMES_HOME, exc.strerror or exc)]
    if free < MIN_FREE_BYTES:
        return ["disk: only %d MiB free under %s (less than 1 GiB)" % (free >> 20, HERMES_HOME)]
    return []


def check_writable():
    try:
        with tempfile.NamedTemporaryFile(dir=str(HERMES_HOME), prefix=".startup-checklist-"):
            pass
    except OSError as exc:
        return ["home: %s is not writable: %s" % (HERMES_HOME, exc.strerror or exc)]
    return []


def _installed_and_enabled(name):
    manifest = HOOK_DIR.parent / name / "HOOK.yaml"
    try:
        text = manifest.read_text(encoding="utf-8")
    except OSError:
        return False
    return not re.search(r"^enabled:\s*(false|no|off)\b", text, re.MULTILINE | re.IGNORECASE)


def check_env():
    problems = []
    for hook, (needed, recommended) in sorted(EXPECTED_ENV.items()):
        if not _installed_and_enabled(hook):
            continue
        missing = [v for v in needed if not os.environ.get(v)]
        if missing:
            problems.append("env: %s is installed but %s unset (it will skip its work)"
                            % (hook, " and ".join(missing) + (" is" if len(missing) == 1 else " are")))
        elif any(not os.environ.get(v) for v in recommended):
            unset = [v for v in recommended if not os.environ.get(v)]
            problems.append("env: %s is configured but %s unset (recommended)"
                            % (hook, " and ".join(unset) + (" is" if len(unset) == 1 else " are")))
    return problems


CHECKS = [check_disk, check_writable, check_env]


def write_report(line):
    try:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        with REPORT.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as exc:
        print("cannot write %s: %s" % (REPORT, exc.strerror or exc))


def _platforms(value):
    if isinstance(value, dict):
        value = list(value)
    if isinstance(value, (list, tuple)):
        return ",".join(str(p) for p in value) or "-"
    return str(value) if value else "-"


async def run_checks(platforms):
    started = time.monotonic()
    problems = []
    for check in CHECKS:
        try:
            problems += await asyncio.to_thread(check)
        except Exception as exc:  # a broken check is itself a finding, never a crash
            problems.append("%s: failed: %s: %s" % (check.__name__, type(exc).__name__, exc))
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    head = "%s gateway:startup platforms=%s checks=%d in %.0f ms:" % (
        stamp, _platforms(platforms), len(CHECKS), (time.monotonic() - started) * 1000)
    if problems:
        for p in problems:
            print(p)
        await asyncio.to_thread(write_report, "%s %d problem(s): %s" % (head, len(problems), "; ".join(problems)))
    else:
        print("[SILENT]")
        await asyncio.to_thread(write_report, "%s [SILENT]" % head)


async def handle(event_type, context):
    task = asyncio.create_task(run_checks(context.get("platforms")))
    _background.add(task)
    task.add_done_callback(_background.discard)
    return None
