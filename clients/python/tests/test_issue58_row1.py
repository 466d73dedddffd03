"""Issue 58 row 1, the plugin's part: one hook per config.yaml command.

* The service hosts every entry of one command as one hook (``shell-DIGEST``), on the events
  whose (event, command) has consent; the plugin hands an entry over to it only when that hook
  lists the entry's event, so each (event, matcher, command) still runs exactly once.

Run: ``python3 -m unittest clients/python/tests/test_issue58_row1.py -v`` (no service needed).
"""

import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hermes_hooks import agent_plugin  # noqa: E402
from test_issue57 import fake_hermes  # noqa: E402

PET = "python3 pet.py"
GATE = "sh gate.sh"


class HandOverByCommandTest(unittest.TestCase):
    """The hand-over reads the hook of a command and the events it lists."""

    config = {"hooks": {
        "on_session_start": [{"command": PET}],
        "pre_tool_call": [{"command": PET, "matcher": "terminal"}, {"command": GATE},
                          {"command": PET, "matcher": "write_.*"}],
        "on_session_end": [{"command": PET}],
    }}

    def hand_over(self, hooks, disabled=(), events=None):
        modules, shell_hooks = fake_hermes(self.config)
        with mock.patch.dict(sys.modules, modules):
            agent_plugin.hand_over_shell_hooks(hooks, disabled, events)
        return shell_hooks._registered

    def test_only_the_events_the_hook_lists(self) -> None:
        pet = agent_plugin.shell_hook_name(PET)
        # on_session_end has no consent: the service's hook does not list it; Hermes keeps it.
        taken = self.hand_over([{"name": pet, "events": ["on_session_start", "pre_tool_call"]}])
        self.assertEqual(taken, {("on_session_start", None, PET),
                                 ("pre_tool_call", "terminal", PET),
                                 ("pre_tool_call", "write_.*", PET)})

    def test_only_the_events_the_plugin_forwards(self) -> None:
        pet = agent_plugin.shell_hook_name(PET)
        taken = self.hand_over([{"name": pet, "events": ["on_session_start", "pre_tool_call"]}],
                               events=["pre_tool_call"])
        self.assertEqual(taken, {("pre_tool_call", "terminal", PET),
                                 ("pre_tool_call", "write_.*", PET)})

    def test_turned_off_by_its_events_or_by_name(self) -> None:
        pet = agent_plugin.shell_hook_name(PET)
        gate = agent_plugin.shell_hook_name(GATE)
        off = [{"name": pet, "code": "disabled", "events": ["on_session_end"]}]
        self.assertEqual(self.hand_over([], off), {("on_session_end", None, PET)})
        # An older service's skipped entry lists no events: the whole command.
        taken = self.hand_over([], [gate])
        self.assertEqual(taken, {("pre_tool_call", None, GATE)})

    def test_an_older_services_hook_per_entry(self) -> None:
        """A service before issue 58 names the hook of each entry ``shell-EVENT-DIGEST``; what
        it hosts is handed over all the same (and nothing else)."""
        old = agent_plugin._entry_hook_name("pre_tool_call", "terminal", PET)
        self.assertEqual(agent_plugin._entry_hook_name("pre_tool_call", None, "gate.sh"),
                         "shell-pre_tool_call-866f3f28b5")
        taken = self.hand_over([{"name": old, "events": ["pre_tool_call"]}])
        self.assertEqual(taken, {("pre_tool_call", "terminal", PET)})


if __name__ == "__main__":
    unittest.main()
