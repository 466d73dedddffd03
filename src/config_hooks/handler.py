"""A command of the `hooks:` block of config.yaml, hosted by hermes-hooks (issues 49, 58).

Written by the service (`src/config_hooks.rs`) into `$HERMES_HOME/config-hooks/<name>/`; the
command and its entries are `entry.py` beside it (code, so its approval covers the command).
One hook runs every entry of one command: its events come through one queue, one at a time,
in the order the service received them, as hermes-agent 0.19.0 runs them inline in the agent's
order (so a script's own state, a cooldown file or a counter, sees what it sees under Hermes).

For each event it does what 0.19.0's own shell-hook runner does for each entry registered on
that event (the behaviour described in docs/hook-authors.md, "Agent events"), entry by entry in
file order: the `matcher` of a tool event must match the whole tool name, the command is split
like a shell line (no shell) and run with the event's context as JSON on stdin, in the agent's
working directory, for at most the entry's `timeout` seconds; its stdout is read as JSON: a
block (either shape) for `pre_tool_call`, a continue for `pre_verify`, `{"context": ...}` for
every other event. A non-zero exit is logged and its stdout still counts; a timeout or a
command that cannot start gives no answer. Several entries on one event each run, and their
answers are combined as Hermes combines its callbacks': the first block (or continue) wins,
contexts are joined by a blank line.

The working directory is the context's `cwd`, which the service writes itself (issue 57): the
directory of the process that sent the event, read from the kernel, over whatever the sender
wrote; without one (a sender on another machine) the command runs in this hook's directory.
"""

import json
import os
import re
import shlex
import subprocess

from entry import HOOK  # beside this file, written by the service
from script_runner import run_command  # beside this file: Python scripts from a fork server

COMMAND = HOOK["command"]
DEFAULT_BLOCK_MESSAGE = "Blocked by shell hook."
TOOL_EVENTS = ("pre_tool_call", "post_tool_call")
#: Events whose first answer counts; the others' answers are contexts, joined.
FIRST_WINS = ("pre_tool_call", "pre_verify")


class Entry:
    """One entry of the command: its event, matcher and timeout, and where it is."""

    def __init__(self, raw):
        self.event = raw["event"]
        self.matcher = raw.get("matcher")
        self.timeout = int(raw.get("timeout") or 60)
        self.at = "hooks.%s[%s]" % (self.event, raw.get("index"))
        self.pattern = None
        if self.matcher:
            try:
                self.pattern = re.compile(self.matcher)
            except re.error as exc:
                print("%s: matcher %r is not a valid regular expression (%s): compared as text"
                      % (self.at, self.matcher, exc))

    def matches(self, tool_name):
        """Whether this entry runs for a call of `tool_name` (only tool events have a matcher)."""
        if not self.matcher:
            return True
        if tool_name is None:
            return False
        if self.pattern is not None:
            return self.pattern.fullmatch(tool_name) is not None
        return tool_name == self.matcher


ENTRIES = [Entry(raw) for raw in HOOK["entries"]]


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


def combine(event, answers):
    """The hook's one answer from its entries' answers (not None), in file order."""
    if not answers:
        return None
    if event in FIRST_WINS:
        return answers[0]
    texts = [a["context"] for a in answers if isinstance(a, dict) and a.get("context")]
    return {"context": "\n\n".join(texts)} if texts else None


def _run(argv, stdin_text, timeout, cwd):
    """Runs the command once (a Python script from its interpreter's fork server, script_runner.py;
    else a process): (returncode, stdout, stderr); raises as `subprocess.run` does."""
    proc = run_command(argv, stdin_text, timeout, cwd)
    return proc.returncode, proc.stdout, proc.stderr


def run_entry(entry, argv, stdin_text, cwd):
    """One entry's run of the command on one event: its answer, or None."""
    try:
        code, stdout, stderr = _run(argv, stdin_text, entry.timeout, cwd)
    except subprocess.TimeoutExpired:
        print("%s: timed out after %ds: %s" % (entry.at, entry.timeout, COMMAND))
        return None
    except FileNotFoundError:
        print("%s: command not found: %s" % (entry.at, COMMAND))
        return None
    except PermissionError:
        print("%s: command not executable: %s" % (entry.at, COMMAND))
        return None
    if code != 0:
        print("%s: exited %d: %s; stderr: %s" % (entry.at, code, COMMAND, (stderr or "")[:400]))
    return parse(entry.event, stdout)


def handle(event_type, context):
    due = [e for e in ENTRIES if e.event == event_type
           and (event_type not in TOOL_EVENTS or e.matches(context.get("tool_name")))]
    if not due:
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
    stdin_text = json.dumps(context, ensure_ascii=False)
    answers = [a for a in (run_entry(e, argv, stdin_text, cwd) for e in due) if a is not None]
    return combine(event_type, answers)
