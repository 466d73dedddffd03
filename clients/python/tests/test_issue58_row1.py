"""Issue 58 row 1, the plugin's part: one hook per config.yaml command, and one order.

* The service hosts every entry of one command as one hook (``shell-DIGEST``), on the events
  whose (event, command) has consent; the plugin hands an entry over to it only when that hook
  lists the entry's event, so each (event, matcher, command) still runs exactly once.
* Observer events travel through the client's buffer (``/v1/events/batch``, a background
  thread), decisions through ``/v1/collect``: a decision now waits (briefly) for the observers
  buffered before it, so the hook gets them in Hermes's order; a service found down costs it
  no wait.

Run: ``python3 -m unittest clients/python/tests/test_issue58_row1.py -v`` (no service needed:
a scripted one stands in).
"""

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hermes_hooks import HookRegistry, agent_plugin  # noqa: E402
from test_issue57 import fake_hermes  # noqa: E402
from test_upstream_contract import FakeService, _Answers  # noqa: E402

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


class _Ordered(_Answers):
    """The contract tests' scripted service, answering a batch ``batch_delay`` s after it
    came and recording in one list ``(what, time)`` as it answers a batch (its events queued)
    and as it receives a collect."""

    def do_POST(self) -> None:
        if self.path != "/v1/events/batch":
            self.server.seen.append(("collect:pre_tool_call", time.monotonic()))
            return super().do_POST()
        data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.server.batch_delay)
        self.server.seen.extend(("batch:" + e["event"], time.monotonic())
                                for e in data["events"])
        self._reply(202, {"queued": [1] * len(data["events"])})


def scripted_service(path: str, batch_delay: float) -> FakeService:
    """A service on the Unix socket ``path`` with one hook on ``post_llm_call`` and
    ``pre_tool_call`` (:class:`_Ordered`)."""
    server = FakeService(path)
    server.RequestHandlerClass = _Ordered
    server.hooks = [{"name": "one", "events": ["post_llm_call", "pre_tool_call"]}]
    server.batch_delay = batch_delay
    server.seen = []  # type: list
    return server


class FlushBeforeDecisionTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hh-i58r1-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.sock = os.path.join(self.tmp, "hooks.sock")

    def bridge(self):
        from test_agent_plugin import FakeCtx
        registry = HookRegistry(address=self.sock, autostart=False)
        self.addCleanup(registry.close, 0)
        registry.discover_and_load()
        bridge = agent_plugin.AgentBridge(registry)
        self.addCleanup(bridge.close)
        ctx = FakeCtx()
        bridge.attach(ctx.register_hook)
        return bridge, ctx

    def test_an_observer_emitted_first_reaches_the_service_first(self) -> None:
        """The batch holding ``post_llm_call`` is answered (its events queued) 0.3 s after it
        arrives; the ``pre_tool_call`` collect called right after the observer must arrive
        after that, not overtake it (before: ~0.3 s ahead)."""
        server = scripted_service(self.sock, batch_delay=0.3)
        self.addCleanup(server.stop)
        bridge, ctx = self.bridge()
        ctx.hooks["post_llm_call"][0](session_id="s", assistant_response="hi")
        ctx.hooks["pre_tool_call"][0](tool_name="terminal", args={}, session_id="s")
        self.assertEqual([what for what, _ in server.seen], ["batch:post_llm_call",
                                                      "collect:pre_tool_call"])

    def test_a_service_found_down_costs_no_wait(self) -> None:
        """With the service gone (the sender backing off, ``connected`` false) a decision does
        not wait for the buffer: it fails open at once, as before."""
        server = scripted_service(self.sock, batch_delay=0.0)
        bridge, ctx = self.bridge()
        server.stop()
        os.unlink(self.sock)
        ctx.hooks["post_llm_call"][0](session_id="s", assistant_response="hi")
        deadline = time.monotonic() + 10
        while bridge.registry.connected is not False:
            self.assertLess(time.monotonic(), deadline, "the sender never found it down")
            time.sleep(0.01)  # the sender's first try, against the deadline
        ctx.hooks["post_llm_call"][0](session_id="s", assistant_response="again")
        started = time.monotonic()
        with mock.patch("sys.stderr"):
            answer = ctx.hooks["pre_tool_call"][0](tool_name="terminal", args={}, session_id="s")
        self.assertIsNone(answer)
        self.assertLess(time.monotonic() - started, agent_plugin.FLUSH_BOUND / 2)

    def test_nothing_buffered_is_a_length_read(self) -> None:
        server = scripted_service(self.sock, batch_delay=0.0)
        self.addCleanup(server.stop)
        bridge, _ = self.bridge()
        self.assertTrue(bridge.flush_observers())
        calls = 20000
        started = time.perf_counter()
        for _ in range(calls):
            bridge.flush_observers()
        per_call = (time.perf_counter() - started) / calls
        self.assertLess(per_call, 50e-6, "%.2f us a call" % (per_call * 1e6))


if __name__ == "__main__":
    unittest.main()
