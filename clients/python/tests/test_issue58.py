"""Issue 58, the client's rows (2, 3, 4, 6, 7): what the agent plugin and ``agent:end`` got wrong
against hermes-agent 0.19.0, each row with a test that failed before its fix.

The plugin cases drive the real service (``HERMES_HOOKS_BIN``, as ``test_agent_plugin.py``;
without it they are skipped and say so) over real Unix sockets; the retry case (row 6) uses a
scripted server that counts what arrives.

Run: ``HERMES_HOOKS_BIN=target/debug/hermes-hooks python3 -m unittest
clients/python/tests/test_issue58.py -v``.
"""

import io
import json
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hermes_hooks import _outcome  # noqa: E402

BIN = os.environ.get("HERMES_HOOKS_BIN")


def _agent_end(agent_result):
    """``agent:end``'s context as the client builds it from the gateway's local
    ``agent_result`` (the frame walk of :mod:`hermes_hooks._outcome`)."""
    agent_result = dict(agent_result)  # noqa: F841 - read through the frame
    return _outcome.with_outcome({"response": "x"}, 0)


class Row2ErrorIsNotAnswered(unittest.TestCase):
    """Row 2: a provider's HTTP 400 reached ``agent:end`` as ``outcome: "answered", failed:
    false, error: "HTTP 400 ..."``. 0.19.0 counts a run with an ``error`` (or ``partial``, or
    ``completed: False``) as not completed (``_should_clear_resume_pending_after_turn``)."""

    def test_an_error_without_failed_is_a_failed_run(self) -> None:
        # The gateway's result for a turn that has a final response carries no ``failed``.
        ctx = _agent_end({"final_response": "HTTP 400 bad request", "api_calls": 1,
                          "completed": None, "interrupted": False, "partial": False,
                          "error": "HTTP 400: model not found"})
        self.assertEqual((ctx["outcome"], ctx["failed"], ctx["error"]),
                         ("failed", True, "HTTP 400: model not found"))
        ctx = _agent_end({"failed": False, "error": "HTTP 400"})
        self.assertEqual((ctx["outcome"], ctx["failed"]), ("failed", True))

    def test_partial_or_not_completed_is_failed_and_a_clean_run_answered(self) -> None:
        self.assertEqual(_agent_end({"partial": True})["outcome"], "failed")
        self.assertEqual(_agent_end({"completed": False, "api_calls": 1})["outcome"], "failed")
        ctx = _agent_end({"interrupted": True, "error": "stopped"})
        self.assertEqual((ctx["outcome"], ctx["failed"], ctx["interrupted"]),
                         ("interrupted", False, True))
        ctx = _agent_end({"completed": True, "api_calls": 2, "error": None})
        self.assertEqual((ctx["outcome"], ctx["failed"]), ("answered", False))
        self.assertNotIn("error", ctx)


class _PluginCase(unittest.TestCase):
    """A temporary home, hook root and socket; ``bridge`` starts the real service over them and
    registers the plugin's callbacks on a fake Hermes context (as ``test_agent_plugin``)."""

    def setUp(self) -> None:
        from test_client import Service  # the same process helper as the client's tests
        self.Service = Service
        self.tmp = tempfile.mkdtemp(prefix="hh-i58-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.home = os.path.join(self.tmp, "home")
        self.hooks_dir = os.path.join(self.tmp, "hooks")
        os.mkdir(self.home, 0o700)
        os.mkdir(self.hooks_dir, 0o755)
        self.sock = os.path.join(self.tmp, "hooks.sock")
        env = mock.patch.dict(os.environ, {"HERMES_HOME": self.home})
        env.start()
        self.addCleanup(env.stop)

    def hook(self, name: str, events: list, body: str, timeout: int = 5) -> None:
        d = os.path.join(self.hooks_dir, name)
        os.mkdir(d, 0o755)
        for file_name, text in (
                ("HOOK.yaml", "events: %s\ntimeout: %d\n" % (json.dumps(events), timeout)),
                ("handler.py", "import json, time\ndef handle(event, context):\n%s\n"
                 % "\n".join("    " + line for line in body.splitlines()))):
            path = os.path.join(d, file_name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, 0o644)

    def bridge(self, fail_closed=()):
        from hermes_hooks import HookRegistry
        from hermes_hooks.agent_plugin import AgentBridge
        from test_agent_plugin import FakeCtx
        self.service = self.Service(self.tmp, self.home, self.hooks_dir,
                                    ["--socket", self.sock], self.sock)
        self.addCleanup(lambda: self.service.stop())
        registry = HookRegistry(address=self.sock, autostart=False)
        self.addCleanup(registry.close, 0)
        registry.discover_and_load()
        bridge = AgentBridge(registry, fail_closed)
        self.addCleanup(bridge.close)
        ctx = FakeCtx()
        bridge.attach(ctx.register_hook)
        return bridge, ctx


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: these cases drive the real service")
class Row3FailClosedIsNotOutvoted(_PluginCase):
    """Row 3: ``fail_closed: [pre_tool_call]``, hook ``a`` raises, hook ``b`` approves: the
    bridge returned b's approve (Hermes then goes to its approval prompt, which a stored
    "always" rule answers yes). A matching hook that errs closes the event."""

    def test_an_erring_hook_blocks_whatever_another_answered(self) -> None:
        self.hook("a-raises", ["pre_tool_call"], "raise RuntimeError('gate broken')")
        self.hook("b-approves", ["pre_tool_call"], "return {'action': 'approve', 'message': 'ok'}")
        self.hook("c-rewrites", ["pre_gateway_dispatch"], "return {'action': 'rewrite', 'text': 't'}")
        self.hook("d-raises", ["pre_gateway_dispatch"], "raise RuntimeError('dispatch gate broken')")
        bridge, ctx = self.bridge(fail_closed=["pre_tool_call", "pre_gateway_dispatch"])
        answer = ctx.hooks["pre_tool_call"][0](tool_name="terminal", args={"command": "ls"},
                                               session_id="s")
        self.assertEqual(answer["action"], "block", answer)
        self.assertIn("a-raises", answer["message"])
        answer = ctx.hooks["pre_gateway_dispatch"][0](event="m", gateway="g", session_store=None)
        self.assertEqual(answer["action"], "skip", answer)
        self.assertIn("d-raises", answer["reason"])

    def test_without_fail_closed_the_others_answer_counts(self) -> None:
        """The documented fail-open behaviour stays: the approve of the hook that answered."""
        self.hook("a-raises", ["pre_tool_call"], "raise RuntimeError('gate broken')")
        self.hook("b-approves", ["pre_tool_call"], "return {'action': 'approve', 'message': 'ok'}")
        bridge, ctx = self.bridge()
        with mock.patch("sys.stderr", io.StringIO()):
            answer = ctx.hooks["pre_tool_call"][0](tool_name="terminal", args={}, session_id="s")
        self.assertEqual(answer, {"action": "approve", "message": "ok"})

    def test_a_block_from_another_hook_is_kept(self) -> None:
        self.hook("a-raises", ["pre_tool_call"], "raise RuntimeError('gate broken')")
        self.hook("b-blocks", ["pre_tool_call"], "return {'action': 'block', 'message': 'no'}")
        bridge, ctx = self.bridge(fail_closed=["pre_tool_call"])
        answer = ctx.hooks["pre_tool_call"][0](tool_name="terminal", args={}, session_id="s")
        self.assertEqual(answer, {"action": "block", "message": "no"})


if __name__ == "__main__":
    unittest.main()
