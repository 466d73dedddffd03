"""Issue 58 row 1 with the real thing: one config.yaml script on several of the agent's events
gets them in the order Hermes (hermes-agent 0.19.0 from PyPI) emits them, hosted by the service
as under Hermes's own runner.

A script of our own (``ORDER_SCRIPT``) is registered in config.yaml's ``hooks:`` block on every
event below; it appends the ``hook_event_name`` of its stdin (0.19.0's shell-hook payload) to a
file, pausing a little first so that two runs of it at once would interleave. One
``hermes chat -q`` runs under Hermes's own runner (the plugin not enabled), one under the plugin
and the service (``hermes-hooks`` in ``plugins.enabled``, the service autostarted); the fake
model provider (``fake_llm.py``) makes one ``terminal`` call, so the turn has two model calls and
one tool call. The two files must hold the same sequence. Before, each (event, command) pair was
a hook of its own with its own worker, so the events came concurrently, out of order
(``pre_llm_call`` before ``on_session_start``, ``on_session_end`` before ``post_llm_call``...).

A second script (``COOLDOWN_SCRIPT``), as a published one does, plays a sound at most once per
``COOLDOWN`` seconds, kept by the age of a file: registered on ``post_llm_call`` and
``on_session_end`` (which Hermes emits milliseconds apart), it plays once in a chat under Hermes;
it must play once here too (before: twice, 1.8 ms apart, both runs finding the file old).

Needs ``HERMES_AGENT_VENV`` (a venv made by ``.ci/hermes-agent-venv.sh``) and
``HERMES_HOOKS_BIN``. Standard library only.
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest

from test_agent_hooks import agent_config, agent_env
from test_real_gateway import HERE, VENV, processes_with_home, read_text, remove_run, wait_for

EVENTS = ("on_session_start", "pre_llm_call", "pre_api_request", "post_api_request",
          "pre_tool_call", "post_tool_call", "post_llm_call", "on_session_end")
COOLDOWN = 30
TOOL_COMMAND = "echo hh-one-order"

ORDER_SCRIPT = """\
import json, sys, time
payload = json.load(sys.stdin)
time.sleep(0.05)  # two runs at once would interleave
with open(sys.argv[1], "a") as f:
    f.write(payload.get("hook_event_name", "?") + "\\n")
"""

COOLDOWN_SCRIPT = """\
import json, os, sys, time
payload = json.load(sys.stdin)
stamp = sys.argv[1] + ".stamp"
try:
    young = time.time() - os.stat(stamp).st_mtime < %d
except FileNotFoundError:
    young = False
if not young:
    time.sleep(0.05)  # the sound
    with open(stamp, "w"):
        pass
    with open(sys.argv[1], "a") as f:
        f.write("played on %%s\\n" %% payload.get("hook_event_name"))
""" % COOLDOWN


class Home:
    """One chat's directory: HERMES_HOME with config.yaml, the scripts, the fake model."""

    def __init__(self, case, plugin):
        self.dir = tempfile.mkdtemp(prefix="hh-order-")
        self.home = os.path.join(self.dir, "hermes-home")
        os.makedirs(os.path.join(self.home, "hooks"))
        os.chmod(self.home, 0o700)
        case.addCleanup(self.close)
        self.procs = []
        port_file = os.path.join(self.dir, "llm.port")
        env = dict(os.environ, HH_FAKE_TOOL="terminal",
                   HH_FAKE_ARGS='{"command": "%s"}' % TOOL_COMMAND)
        self.procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "fake_llm.py"),
                                            port_file], stdin=subprocess.DEVNULL, env=env))
        port = int(wait_for("the fake model provider", lambda: read_text(port_file), 30))
        self.order = os.path.join(self.dir, "order.txt")
        self.played = os.path.join(self.dir, "played.txt")
        hooks = []
        for name, text, out, events in (
                ("order.py", ORDER_SCRIPT, self.order, EVENTS),
                ("cooldown.py", COOLDOWN_SCRIPT, self.played, ("post_llm_call",
                                                               "on_session_end"))):
            script = os.path.join(self.dir, name)
            with open(script, "w") as f:
                f.write(text)
            hooks.append(("%s %s %s" % (sys.executable, script, out), events))
        block = "".join("  %s:\n%s" % (event, "".join(
            "    - command: %s\n" % command for command, events in hooks if event in events))
            for event in EVENTS)
        config = agent_config(port, "[hermes-hooks]" if plugin else "[]") + (
            "hooks_auto_accept: true\nhooks:\n" + block)
        with open(os.path.join(self.home, "config.yaml"), "w") as f:
            f.write(config)

    def chat(self, case):
        argv = [os.path.join(VENV, "bin", "python"), "-m", "hermes_cli.main", "chat", "-Q",
                "-q", "please say hello"]
        proc = subprocess.run(argv, cwd=self.dir, env=agent_env(self.dir, self.home),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=300)
        case.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        case.assertIn("hh-one-order", proc.stdout, "the tool did not run")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        remove_run(self.dir, self.home)


def settled(path, count, timeout=60.0):
    """The lines of ``path`` once it has ``count`` of them and nothing more came for a second
    (the service runs the observers after the chat has returned)."""
    wait_for("%d lines in %s" % (count, path),
             lambda: len(read_text(path).splitlines()) >= count, timeout)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        time.sleep(0.1)  # a run too many would write by now
    return read_text(path).splitlines()


@unittest.skipUnless(VENV, "HERMES_AGENT_VENV is not set (see .ci/hermes-agent-venv.sh)")
@unittest.skipUnless(os.environ.get("HERMES_HOOKS_BIN"), "HERMES_HOOKS_BIN is not set")
class OneOrder(unittest.TestCase):
    def test_one_script_sees_hermess_order(self):
        """The same chat under Hermes's runner and hosted here: the same sequence of events
        reaches the script, and the cooldown script plays once in each."""
        hermes = Home(self, plugin=False)
        hermes.chat(self)
        expected = read_text(hermes.order).splitlines()
        # The turn: every event registered, the session's first and last.
        self.assertEqual(set(expected), set(EVENTS), expected)
        self.assertEqual((expected[0], expected[-1]), ("on_session_start", "on_session_end"))
        self.assertEqual(read_text(hermes.played).splitlines(), ["played on post_llm_call"])

        here = Home(self, plugin=True)
        here.chat(self)
        self.assertTrue(processes_with_home(here.home), "no service ran for the chat")
        got = settled(here.order, len(expected))
        self.assertEqual(got, expected, "the events reached the script in another order")
        self.assertEqual(settled(here.played, 1), ["played on post_llm_call"],
                         "the cooldown script played more than once")


if __name__ == "__main__":
    unittest.main()
