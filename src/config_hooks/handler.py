"""A shell hook of the `hooks:` block of config.yaml, hosted by hermes-hooks (issue 49).

Written by the service (`src/config_hooks.rs`) into `$HERMES_HOME/config-hooks/<name>/`; the
entry it runs is `entry.py` beside it (code, so its approval covers the command). It does for one entry what hermes-agent 0.19.0's own
shell-hook runner does (the behaviour described in docs/hook-authors.md, "Agent events"):
the `matcher` of a tool event must match the whole tool name, the command is split like a shell
line (no shell) and run with the event's context as JSON on stdin, in the agent's working
directory, for at most `timeout` seconds; its stdout is read as JSON: a block (either shape) for
`pre_tool_call`, a continue for `pre_verify`, `{"context": ...}` for every other event. A
non-zero exit is logged and its stdout still counts; a timeout or a command that cannot start
gives no answer.

The working directory is the context's `cwd`, which the service writes itself (issue 57): the
directory of the process that sent the event, read from the kernel, over whatever the sender
wrote; without one (a sender on another machine) the command runs in this hook's directory.
"""

import json
import os
import re
import shlex
import subprocess

from entry import ENTRY  # beside this file, written by the service
from script_runner import run_command  # beside this file: Python scripts from a fork server

EVENT = ENTRY["event"]
COMMAND = ENTRY["command"]
MATCHER = ENTRY.get("matcher")
TIMEOUT = int(ENTRY.get("timeout") or 60)
DEFAULT_BLOCK_MESSAGE = "Blocked by shell hook."

try:
    _PATTERN = re.compile(MATCHER) if MATCHER else None
except re.error as exc:
    print("matcher %r is not a valid regular expression (%s): compared as text" % (MATCHER, exc))
    _PATTERN = None


def matches(tool_name):
    """Whether this entry runs for a call of `tool_name` (only tool events have a matcher)."""
    if not MATCHER:
        return True
    if tool_name is None:
        return False
    if _PATTERN is not None:
        return _PATTERN.fullmatch(tool_name) is not None
    return tool_name == MATCHER


def _message(first, second):
    text = first or second
    return text if isinstance(text, str) and text else DEFAULT_BLOCK_MESSAGE


def parse(event, stdout):
    """The answer in Hermes's shape, from the command's stdout; None: no answer."""
    stdout = (stdout or "").strip()
    if not stdout:
        return None
    try:
        data = json.loads(stdout)
    except ValueError:
        print("stdout was not JSON, ignored: %s" % stdout[:200])
        return None
    if not isinstance(data, dict):
        return None
    if event == "pre_tool_call":
        if data.get("action") == "block":
            return {"action": "block", "message": _message(data.get("message"), data.get("reason"))}
        if data.get("decision") == "block":
            return {"action": "block", "message": _message(data.get("reason"), data.get("message"))}
        return None
    if event == "pre_verify":
        action = str(data.get("action") or data.get("decision") or "").strip().lower()
        message = data.get("message") or data.get("reason")
        if action in ("continue", "block") and isinstance(message, str) and message.strip():
            return {"action": "continue", "message": message.strip()}
        return None
    text = data.get("context")
    if isinstance(text, str) and text.strip():
        return {"context": text}
    return None


def handle(event_type, context):
    if EVENT in ("pre_tool_call", "post_tool_call") and not matches(context.get("tool_name")):
        return None
    try:
        argv = shlex.split(os.path.expanduser(COMMAND))
    except ValueError as exc:
        print("command %r cannot be split: %s" % (COMMAND, exc))
        return None
    if not argv:
        return None
    cwd = context.get("cwd")
    cwd = cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None
    try:
        proc = run_command(argv, json.dumps(context, ensure_ascii=False), TIMEOUT, cwd)
    except subprocess.TimeoutExpired:
        print("timed out after %ds: %s" % (TIMEOUT, COMMAND))
        return None
    except FileNotFoundError:
        print("command not found: %s" % COMMAND)
        return None
    except PermissionError:
        print("command not executable: %s" % COMMAND)
        return None
    if proc.returncode != 0:
        print("exited %d: %s; stderr: %s" % (proc.returncode, COMMAND, (proc.stderr or "")[:400]))
    return parse(EVENT, proc.stdout)
