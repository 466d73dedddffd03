"""Issue 57 row 7: an operator who turns a config.yaml shell hook off here (``disable NAME
--trust explicit``, the dashboard) keeps it off in Hermes too. The service lists the entry as
``revoked``; before, it listed it as ``not_approved``, the plugin handed over only ``disabled``
entries, and Hermes registered its own runner for the command, which then ran.

Run: ``HERMES_HOOKS_BIN=target/debug/hermes-hooks python3 -m unittest
clients/python/tests/test_issue57.py -v``.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # test_client's Service

from hermes_hooks import agent_plugin  # noqa: E402

BIN = os.environ.get("HERMES_HOOKS_BIN")

COMMAND = "sh -c 'cat > /dev/null'"


class _Spec:
    def __init__(self, event, command, matcher=None):
        self.event, self.command, self.matcher = event, command, matcher


def fake_hermes(config):
    """The two modules of Hermes the plugin reads when it hands shell hooks over: the
    configured entries and the set of (event, matcher, command) Hermes will not register."""
    shell_hooks = types.ModuleType("agent.shell_hooks")
    shell_hooks._registered = set()
    shell_hooks._registered_lock = threading.Lock()
    shell_hooks.iter_configured_hooks = lambda cfg: [
        _Spec(event, entry["command"], entry.get("matcher"))
        for event, entries in (cfg.get("hooks") or {}).items() for entry in entries]
    agent = types.ModuleType("agent")
    agent.shell_hooks = shell_hooks
    hermes_cli = types.ModuleType("hermes_cli")
    config_mod = types.ModuleType("hermes_cli.config")
    config_mod.load_config = lambda: config
    hermes_cli.config = config_mod
    return {"agent": agent, "agent.shell_hooks": shell_hooks, "hermes_cli": hermes_cli,
            "hermes_cli.config": config_mod}, shell_hooks


class FakeCtx:
    def __init__(self):
        self.hooks = {}

    def register_hook(self, name, callback):
        self.hooks.setdefault(name, []).append(callback)


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: this case drives the real service")
class RevokedStaysOffTest(unittest.TestCase):
    def test_a_revoked_config_hook_is_not_run_by_hermes_either(self):
        from test_client import Service
        tmp = tempfile.mkdtemp(prefix="hh-57-")
        self.addCleanup(shutil.rmtree, tmp, True)
        home = os.path.join(tmp, "home")
        hooks_dir = os.path.join(tmp, "hooks")
        os.mkdir(home, 0o700)
        os.mkdir(hooks_dir, 0o755)
        sock = os.path.join(tmp, "hooks.sock")
        config = {"hooks": {"pre_tool_call": [{"command": COMMAND}]}}
        with open(os.path.join(home, "config.yaml"), "w") as f:
            f.write("hooks:\n  pre_tool_call:\n    - command: %s\n" % json.dumps(COMMAND))
        with open(os.path.join(home, "shell-hooks-allowlist.json"), "w") as f:
            json.dump({"approvals": [{"event": "pre_tool_call", "command": COMMAND}]}, f)
        env = {"HERMES_HOME": home, "HERMES_HOOKS_AUTOSTART": "0",
               "HERMES_HOOKS_ADDRESS": sock}
        with mock.patch.dict(os.environ, env):
            service = Service(tmp, home, hooks_dir, ["--socket", sock, "--trust", "explicit"],
                              sock)
            self.addCleanup(service.stop)
            name = agent_plugin.shell_hook_name(COMMAND)
            out = subprocess.run([BIN, "disable", name, "--trust", "explicit", "--hooks-dir",
                                  hooks_dir], env=dict(os.environ), capture_output=True,
                                 text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr + out.stdout)
            modules, shell_hooks = fake_hermes(config)
            with mock.patch.dict(sys.modules, modules), \
                    mock.patch.object(agent_plugin, "_bridge", None):
                agent_plugin.register(FakeCtx())
                bridge = agent_plugin._bridge
                self.addCleanup(lambda: bridge and bridge.registry.close(0))
                skipped = {s.get("name"): s.get("code") for s in bridge.registry.skipped}
                self.assertEqual(skipped.get(name), "revoked", skipped)
                self.assertIn(("pre_tool_call", None, COMMAND), shell_hooks._registered,
                              "Hermes would run the revoked command itself")


if __name__ == "__main__":
    unittest.main()
