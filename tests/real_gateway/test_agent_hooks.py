"""Issue 49 with the real thing: hermes-agent 0.19.0 from PyPI, the agent's hook events hosted by
the service through the client's Hermes plugin (``hermes-hooks`` in ``plugins.enabled``, found
through its ``hermes_agent.plugins`` entry point), in ``hermes chat -q`` and in
``hermes gateway run`` (its ``webhook`` platform).

The fake model provider (``fake_llm.py``) answers the user's message with a ``terminal`` call
of ``rm -rf ...``, then with a reply quoting the tool's result. The hooks, in
``$HERMES_HOME/hooks``: ``gate`` (``pre_tool_call``: blocks ``rm -rf`` with a message),
``ctx`` (``pre_llm_call``: a context), ``slow`` (``post_tool_call``: sleeps 5 s, then writes a
file). In config.yaml's ``hooks:`` block, with ``hooks_auto_accept: true``: a ``pre_tool_call``
shell hook (matcher ``terminal``) that appends its stdin to a file and answers nothing.

Each run must show: the block message reaching the model (the reply quotes it), the context in
the model's request, the turn (from the model's first request to its second) shorter than the
observer's sleep, the observer having run all the same, and the shell hook run exactly once for
the one tool call (Hermes's own shell-hook runner kept off it), with 0.19.0's stdin keys.

The transforms (``test_chat_transforms``, issue 58): a harmless command that runs, a
``transform_tool_result`` hook whose string replaces the result the model sees (another answering
a mapping, which 0.19.0 ignores) and a ``transform_llm_output`` hook whose string replaces the
printed reply.

In a profile (``test_chat_in_a_profile``, ``hermes -p work chat``): the same, with everything in
the profile's home, served by the profile's own service.

Side by side (``test_side_by_side_with_hermes_runner``): the same config.yaml shell gate, once
run by 0.19.0's own runner (the plugin not enabled) and once hosted here: the same decision
reaches the model, the script runs once (started by Hermes, then by the service) and gets
the same stdin keys, ``extra``'s included. Differences, by nature: ids and paths; the script's
parent process and environment (the service's); see docs/hook-authors.md.

Needs ``HERMES_AGENT_VENV`` (a venv made by ``.ci/hermes-agent-venv.sh``, with the client
installed so that its entry point is registered) and ``HERMES_HOOKS_BIN``. Standard library only.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

from test_real_gateway import (HERE, VENV, free_port, model_config, processes_with_home,
                               read_lines, read_text, wait_for)

BLOCK = "HH-GATE: rm -rf refused"
CONTEXT = "HH-CONTEXT: injected by a hook"
COMMAND = "rm -rf /tmp/hh-issue49-nothing-here"
SLEEP = 5.0

HOOKS = {
    "gate": ('events: ["pre_tool_call"]\ntimeout: 5\n',
             "def handle(event, ctx):\n"
             "    cmd = (ctx.get('tool_input') or {}).get('command', '')\n"
             "    if ctx.get('tool_name') == 'terminal' and 'rm -rf' in cmd:\n"
             "        return {'action': 'block', 'message': %r}\n" % BLOCK),
    "ctx": ('events: ["pre_llm_call"]\n',
            "def handle(event, ctx):\n    return {'context': %r}\n" % CONTEXT),
    "slow": ('events: ["post_tool_call"]\ntimeout: 30\n',
             "import json, os, time\n"
             "def handle(event, ctx):\n"
             "    time.sleep(%r)\n"
             "    out = os.path.join(os.environ['HERMES_HOME'], 'slow-done.json')\n"
             "    with open(out, 'w') as f:\n"
             "        json.dump(ctx, f)\n" % SLEEP),
}

TOOL_TAG = "HH-TOOL-TRANSFORMED"
OUTPUT_TAG = "[HH-OUTPUT-TRANSFORMED]"
HARMLESS = "echo hh-tool-ran"


def _recording(name, body):
    """A handler that writes its context to $HERMES_HOME/NAME.json, then runs ``body``."""
    return ("import json, os\n"
            "def handle(event, ctx):\n"
            "    with open(os.path.join(os.environ['HERMES_HOME'], %r), 'w') as f:\n"
            "        json.dump(ctx, f)\n" % (name + ".json")) + body


# Issue 58: the transforms, as 0.19.0 reads them (the first string wins; anything else is no
# opinion). ``odd`` answers a transform with a mapping, which Hermes ignores.
TRANSFORM_HOOKS = {
    "tres": ('events: ["transform_tool_result"]\n',
             _recording("tres", "    return %r + ' ' + ctx['extra'].get('result', '')\n"
                        % TOOL_TAG)),
    "odd": ('events: ["transform_tool_result"]\n',
            "def handle(event, ctx):\n    return {'not': 'a string'}\n"),
    "lout": ('events: ["transform_llm_output"]\n',
             _recording("lout", "    return ctx['extra'].get('response_text', '') + ' ' + %r\n"
                        % OUTPUT_TAG)),
}

SHELL_HOOK = """\
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(sys.stdin.read().replace("\\n", " ") + "\\n")
with open("/proc/%d/cmdline" % os.getppid(), "rb") as parent, open(sys.argv[1] + ".parent", "ab") as f:
    f.write(parent.read().replace(b"\\0", b" ") + b"\\n")
if len(sys.argv) > 2:
    print(json.dumps({"decision": "block", "reason": sys.argv[2]}))
"""
SHELL_BLOCK = "SHELL-GATE-said-no"


def agent_config(llm_port, plugins):
    """The start of a chat's config.yaml: the fake model provider at ``llm_port`` and
    ``plugins.enabled`` (a YAML list)."""
    return model_config(llm_port) + "plugins:\n  enabled: %s\n" % plugins


def agent_env(directory, home):
    """The environment of a ``hermes`` run in ``directory`` with ``home`` as HERMES_HOME."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": directory,
            "HERMES_HOME": home, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
            "HERMES_HOOKS_BIN": os.environ.get("HERMES_HOOKS_BIN", ""),
            "HERMES_HOOKS_AUTOSTART_TIMEOUT": "120"}


def by_service(parent):
    """Whether a script's parent process (its command line) is the service's: a hook's worker
    (`runner-…`) or the fork server that runs a hosted entry's Python scripts (issue 58)."""
    return "runner-" in parent or "script_server.py" in parent


class Home:
    """A run's directory: HERMES_HOME with the hooks and config.yaml, the fake model."""

    def __init__(self, case, gateway, side_by_side=None, profile=None, command=COMMAND,
                 hooks=None):
        self.dir = tempfile.mkdtemp(prefix="hh-agent49-")
        self.root = os.path.join(self.dir, "hermes-home")
        # With a profile, everything is the profile's (``hermes -p NAME``); the root home is
        # empty.
        self.home = os.path.join(self.root, "profiles", profile) if profile else self.root
        self.case = case
        case.addCleanup(self.close)
        self.procs = []
        port_file = os.path.join(self.dir, "llm.port")
        env = dict(os.environ, HH_FAKE_TOOL="terminal",
                   HH_FAKE_ARGS=json.dumps({"command": command}))
        self.procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "fake_llm.py"),
                                            port_file], stdin=subprocess.DEVNULL, env=env))
        llm_port = int(wait_for("the fake model provider", lambda: read_text(port_file), 30))
        self.requests = port_file + ".requests"
        for name, (manifest, handler) in ({} if side_by_side else hooks or HOOKS).items():
            d = os.path.join(self.home, "hooks", name)
            os.makedirs(d)
            for file_name, text in (("HOOK.yaml", manifest), ("handler.py", handler)):
                with open(os.path.join(d, file_name), "w") as f:
                    f.write(text)
        os.makedirs(os.path.join(self.home, "hooks"), exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(self.home, 0o700)
        script = os.path.join(self.dir, "shell_hook.py")
        with open(script, "w") as f:
            f.write(SHELL_HOOK)
        self.shell_out = os.path.join(self.dir, "shell.jsonl")
        self.webhook_port = free_port()
        block = " " + SHELL_BLOCK if side_by_side else ""
        plugins = "[]" if side_by_side == "hermes" else "[hermes-hooks]"
        config = agent_config(llm_port, plugins) + """\
hooks_auto_accept: true
hooks:
  pre_tool_call:
    - command: %s %s %s%s
      matcher: terminal
      timeout: 10
""" % (sys.executable, script, self.shell_out, block)
        if gateway:
            # The webhook platform's own toolset has no terminal: give it one.
            config += """\
platform_toolsets:
  webhook: [terminal]
platforms:
  webhook:
    enabled: true
    extra:
      host: 127.0.0.1
      port: %d
      routes:
        chat:
          secret: INSECURE_NO_AUTH
          prompt: "{text}"
""" % self.webhook_port
        with open(os.path.join(self.home, "config.yaml"), "w") as f:
            f.write(config)

    def env(self):
        return agent_env(self.dir, self.root)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    p.kill()
            p.wait()
        for pid in set(processes_with_home(self.root) + processes_with_home(self.home)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not os.environ.get("HH_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- what happened -----------------------------------------------------------------------

    def check(self, reply):
        case = self.case
        case.assertIn(BLOCK, reply, "the model did not see the block message")
        requests = read_lines(self.requests)
        case.assertGreaterEqual(len(requests), 2, requests)
        first_user = [m for m in requests[0]["messages"] if m.get("role") == "user"][-1]
        case.assertIn(CONTEXT, json.dumps(first_user["content"]), "no context in the request")
        tool_results = [m for m in requests[1]["messages"] if m.get("role") == "tool"]
        case.assertIn(BLOCK, json.dumps(tool_results))
        times = [float(t) for t in read_text(self.requests + ".times").split()]
        turn = times[1] - times[0]
        case.assertLess(turn, SLEEP - 1.0, "the post_tool_call observer held the turn")
        done = os.path.join(self.home, "slow-done.json")
        seen = json.loads(wait_for("the slow observer's file", lambda: read_text(done), 60))
        case.assertEqual(seen["hook_event_name"], "post_tool_call")
        case.assertEqual(seen["tool_name"], "terminal")
        lines = read_lines(self.shell_out)
        case.assertEqual(len(lines), 1, "the config.yaml shell hook ran %d times" % len(lines))
        case.assertTrue(by_service(read_text(self.shell_out + ".parent")),
                        "not run by the service")
        case.assertEqual(sorted(lines[0]), ["cwd", "extra", "hook_event_name", "session_id",
                                            "tool_input", "tool_name"])
        case.assertEqual(lines[0]["tool_input"], {"command": COMMAND})
        return turn


@unittest.skipUnless(VENV, "HERMES_AGENT_VENV is not set (see .ci/hermes-agent-venv.sh)")
@unittest.skipUnless(os.environ.get("HERMES_HOOKS_BIN"), "HERMES_HOOKS_BIN is not set")
class AgentHooks(unittest.TestCase):
    def test_chat_single_query(self):
        """Issue 49, "The real thing in CI", in ``hermes chat -q``."""
        home = Home(self, gateway=False)
        argv = [os.path.join(VENV, "bin", "python"), "-m", "hermes_cli.main", "chat", "-Q",
                "-q", "please clean up"]
        proc = subprocess.run(argv, cwd=home.dir, env=home.env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        home.check(proc.stdout)

    def chat(self, home, profile=None):
        argv = [os.path.join(VENV, "bin", "python"), "-m", "hermes_cli.main"]
        argv += ["-p", profile] if profile else []
        argv += ["chat", "-Q", "-q", "please clean up"]
        proc = subprocess.run(argv, cwd=home.dir, env=home.env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        return proc.stdout

    def test_side_by_side_with_hermes_runner(self):
        """Issue 49: the same config.yaml shell gate run by 0.19.0's own runner (the plugin not
        enabled) and hosted here: the same decision reaches the model, once, and the script
        gets the same stdin keys (``extra`` included); only values that differ by nature
        (ids, paths) differ."""
        seen = {}
        for who in ("hermes", "here"):
            home = Home(self, gateway=False, side_by_side=who)
            reply = self.chat(home)
            self.assertIn(SHELL_BLOCK, reply, who)
            lines = read_lines(home.shell_out)
            self.assertEqual(len(lines), 1, "%s ran the shell hook %d times" % (who, len(lines)))
            seen[who] = lines[0]
            parent = read_text(home.shell_out + ".parent")
            # Who started the script: Hermes itself, or the service (the hook's fork server of
            # Python scripts, issue 58).
            self.assertEqual(by_service(parent), who == "here", parent)
            self.assertEqual("script_server.py" in parent, who == "here", parent)
        hermes, here = seen["hermes"], seen["here"]
        self.assertEqual(sorted(hermes), sorted(here))
        self.assertEqual(sorted(hermes["extra"]), sorted(here["extra"]))
        for key in ("hook_event_name", "tool_name", "tool_input"):
            self.assertEqual(hermes[key], here[key], key)

    def test_chat_in_a_profile(self):
        """Issue 49 in ``hermes -p work chat -q``: the profile's hooks, its config.yaml shell
        hook and its own service (its socket in the profile's home); the root home untouched."""
        home = Home(self, gateway=False, profile="work")
        home.check(self.chat(home, profile="work"))
        self.assertTrue(os.path.exists(os.path.join(home.home, "hooks.sock")))
        self.assertFalse(os.path.exists(os.path.join(home.root, "hooks.sock")))

    def test_chat_transforms(self):
        """Issue 58: in ``hermes chat -q``, a ``transform_tool_result`` hook's string replaces
        the tool's result the model sees (a hook answering a mapping is ignored, as 0.19.0
        reads it), and a ``transform_llm_output`` hook's string replaces the reply printed;
        each hook gets the keys 0.19.0 passes."""
        hooks = dict(TRANSFORM_HOOKS, gate=HOOKS["gate"])
        home = Home(self, gateway=False, command=HARMLESS, hooks=hooks)
        reply = self.chat(home)
        requests = read_lines(home.requests)
        self.assertGreaterEqual(len(requests), 2, requests)
        tool_results = json.dumps([m for m in requests[1]["messages"] if m.get("role") == "tool"])
        self.assertIn(TOOL_TAG, tool_results, "the model did not see the transformed result")
        self.assertIn("hh-tool-ran", tool_results, "the tool did not run")
        self.assertIn(OUTPUT_TAG, reply, "the printed reply was not transformed")
        self.assertIn("fake answer", reply)
        seen = json.loads(read_text(os.path.join(home.home, "tres.json")))
        self.assertEqual(seen["hook_event_name"], "transform_tool_result")
        self.assertEqual(seen["tool_name"], "terminal")
        self.assertEqual(seen["tool_input"], {"command": HARMLESS})
        self.assertIn("hh-tool-ran", seen["extra"]["result"])
        seen = json.loads(read_text(os.path.join(home.home, "lout.json")))
        self.assertEqual(seen["hook_event_name"], "transform_llm_output")
        self.assertTrue(seen["extra"]["response_text"].startswith("fake answer"), seen)
        self.assertNotIn(OUTPUT_TAG, seen["extra"]["response_text"])
        self.assertEqual(seen["extra"]["model"], "hh-fake-model")

    def test_gateway(self):
        """Issue 49, "The real thing in CI", in ``hermes gateway run`` (no launcher)."""
        self.gateway(launcher=False)

    def test_gateway_with_the_launcher(self):
        """The same through ``hermes-hooks-gateway`` (the shim: the gateway's own hooks go to
        the service too, through another registry of the same process)."""
        self.gateway(launcher=True)

    def gateway(self, launcher):
        home = Home(self, gateway=True)
        env = home.env()
        if launcher:
            argv = [os.path.join(VENV, "bin", "hermes-hooks-gateway"), "-m", "hermes_cli.main",
                    "gateway", "run"]
            env["HERMES_HOOKS_SHIM"] = "1"
        else:
            argv = [os.path.join(VENV, "bin", "python"), "-m", "hermes_cli.main", "gateway",
                    "run"]
        console = open(os.path.join(home.dir, "console.out"), "wb")
        self.addCleanup(console.close)
        gw = subprocess.Popen(argv, cwd=home.dir, env=env, stdin=subprocess.DEVNULL,
                              stdout=console, stderr=subprocess.STDOUT, start_new_session=True)
        home.procs.append(gw)
        log = os.path.join(home.home, "logs", "gateway.log")

        def listening():
            if gw.poll() is not None:
                raise AssertionError("the gateway exited: %s" % read_text(console.name)[-3000:])
            return "[webhook] Listening on" in read_text(log)

        wait_for("the gateway's webhook listener", listening, 180)
        req = urllib.request.Request(
            "http://127.0.0.1:%d/webhooks/chat" % home.webhook_port, method="POST",
            data=json.dumps({"text": "please clean up"}).encode(),
            headers={"Content-Type": "application/json", "X-Request-ID": "hh49"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.assertEqual(resp.status, 202)
        marker = "[webhook] Response for webhook:chat:hh49: "

        def answered():
            for line in read_text(log).splitlines():
                if marker in line:
                    return line.split(marker, 1)[1]
            return None

        reply = wait_for("the gateway's answer", answered, 180)
        home.check(reply)
        gw.send_signal(signal.SIGINT)
        try:
            gw.wait(120)
        except subprocess.TimeoutExpired:
            gw.kill()
            gw.wait()


if __name__ == "__main__":
    unittest.main()
