"""The Hermes plugin of issue 49 (``hermes_hooks.agent_plugin``): the context it builds, how it
reads hooks' answers by hermes-agent 0.19.0's rules, which events it registers, and, with the
service binary (``HERMES_HOOKS_BIN``), the whole path: a fake Hermes plugin context registers
the callbacks, which then decide through the real service.

Run: ``HERMES_HOOKS_BIN=target/debug/hermes-hooks python3 -m unittest
clients/python/tests/test_agent_plugin.py -v`` (without the variable, the service cases are
skipped and say so).
"""

import json
import os
import shutil
import sys
import tempfile
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # test_client's Service

from hermes_hooks import HookRegistry, agent_plugin  # noqa: E402
from hermes_hooks.agent_plugin import (AGENT_EVENTS, DECIDING, AgentBridge, context,  # noqa: E402
                                       decide, subscribed)

BIN = os.environ.get("HERMES_HOOKS_BIN")


class _Opaque:
    """Stands for an object that is not data (the gateway's MessageEvent, its runner)."""

    def __str__(self) -> str:
        return "<opaque runner>"

    def __reduce__(self):  # pickling it would be a defect: fail loudly
        raise AssertionError("pickled")


class ContextTest(unittest.TestCase):
    def test_the_shell_hook_shape(self) -> None:
        ctx = context("pre_tool_call", {"tool_name": "terminal", "args": {"command": "ls"},
                                        "session_id": "s1", "task_id": "t", "tool_call_id": "c"})
        self.assertEqual(sorted(ctx), ["cwd", "extra", "hook_event_name", "session_id",
                                       "tool_input", "tool_name"])
        self.assertEqual(ctx["hook_event_name"], "pre_tool_call")
        self.assertEqual(ctx["tool_input"], {"command": "ls"})
        self.assertEqual(ctx["extra"], {"task_id": "t", "tool_call_id": "c"})
        self.assertEqual(ctx["cwd"], os.getcwd())

    def test_parent_session_and_non_object_args(self) -> None:
        ctx = context("subagent_stop", {"parent_session_id": "p", "args": ["x"]})
        self.assertEqual(ctx["session_id"], "p")
        self.assertIsNone(ctx["tool_input"])
        self.assertIsNone(ctx["tool_name"])
        self.assertEqual(ctx["extra"], {})

    def test_objects_are_described_not_pickled(self) -> None:
        """The encoding the collect uses (and the client's sender): ``str()`` of an object."""
        ctx = context("pre_gateway_dispatch", {"event": _Opaque(), "gateway": _Opaque()})
        text = json.dumps(ctx, default=str)
        self.assertIn('"gateway": "<opaque runner>"', text)


class DecideTest(unittest.TestCase):
    """0.19.0's rules for each deciding event, over the hooks' answers in match order."""

    def test_pre_tool_call_first_block_wins_either_shape(self) -> None:
        self.assertEqual(decide("pre_tool_call", [("a", None), ("b", {"decision": "allow"}),
                                                  ("c", {"decision": "block", "reason": "no"}),
                                                  ("d", {"action": "block", "message": "late"})]),
                         {"action": "block", "message": "no"})
        self.assertEqual(decide("pre_tool_call", [("a", {"action": "block", "reason": "why"})]),
                         {"action": "block", "message": "why"})
        # No message: named after the hook (as a shell hook gets a default message).
        self.assertEqual(decide("pre_tool_call", [("gate", {"action": "block"})]),
                         {"action": "block", "message": "Blocked by hook gate."})
        self.assertEqual(decide("pre_tool_call", [("a", {"action": "approve", "message": "m",
                                                         "rule_key": " k "})]),
                         {"action": "approve", "message": "m", "rule_key": "k"})
        self.assertIsNone(decide("pre_tool_call", [("a", "block"), ("b", {"context": "x"})]))

    def test_pre_llm_call_joins_every_context(self) -> None:
        self.assertEqual(decide("pre_llm_call", [("a", {"context": "one"}), ("b", None),
                                                 ("c", "two"), ("d", {"context": "  "}),
                                                 ("e", {"other": 1})]),
                         {"context": "one\n\ntwo"})
        self.assertIsNone(decide("pre_llm_call", [("a", {"context": ""})]))

    def test_pre_verify(self) -> None:
        self.assertEqual(decide("pre_verify", [("a", {"action": "continue"}),
                                               ("b", {"decision": "block", "reason": " test it "})]),
                         {"action": "continue", "message": "test it"})
        self.assertIsNone(decide("pre_verify", [("a", {"action": "stop", "message": "x"})]))

    def test_pre_gateway_dispatch_first_decisive(self) -> None:
        self.assertEqual(decide("pre_gateway_dispatch", [("a", {"action": "maybe"}),
                                                         ("b", {"action": "rewrite", "text": "t"}),
                                                         ("c", {"action": "skip"})]),
                         {"action": "rewrite", "text": "t"})

    def test_transforms(self) -> None:
        self.assertEqual(decide("transform_tool_result", [("a", {"x": 1}), ("b", ""), ("c", "z")]),
                         "")
        self.assertEqual(decide("transform_llm_output", [("a", ""), ("b", "new")]), "new")
        self.assertEqual(decide("transform_terminal_output", [("a", "out")]), "out")

    def test_observers_have_no_answer(self) -> None:
        self.assertIsNone(decide("post_tool_call", [("a", {"action": "block", "message": "x"})]))


class SubscribedTest(unittest.TestCase):
    def test_only_events_some_hook_matches(self) -> None:
        hooks = [{"name": "a", "events": ["pre_tool_call", "agent:start"]},
                 {"name": "b", "events": ["*_llm_call"]},
                 {"name": "c", "events": ["post_tool_call"], "enabled": False}]
        self.assertEqual(subscribed(hooks), ["pre_tool_call", "pre_llm_call", "post_llm_call"])
        self.assertEqual(subscribed([{"events": ["*"]}]), list(AGENT_EVENTS))
        self.assertEqual(subscribed([]), [])

    def test_catalogue(self) -> None:
        self.assertEqual(len(AGENT_EVENTS), 23)
        self.assertTrue(DECIDING <= set(AGENT_EVENTS))


class ShellHookNameTest(unittest.TestCase):
    def test_the_services_names(self) -> None:
        """The service names the hook of a config.yaml command the same way, one per command
        whatever its events (src/config_hooks.rs pins this string too)."""
        self.assertEqual(agent_plugin.shell_hook_name("gate.sh"), "shell-514cad42d2")
        self.assertNotEqual(agent_plugin.shell_hook_name("other.sh"), "shell-514cad42d2")


class FakeCtx:
    """What the plugin uses of Hermes's ``PluginContext``."""

    def __init__(self) -> None:
        self.hooks = {}  # type: dict

    def register_hook(self, name: str, callback) -> None:
        self.hooks.setdefault(name, []).append(callback)


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: these cases drive the real service")
class ThroughTheServiceTest(unittest.TestCase):
    """The callbacks Hermes would call, deciding through a real ``hermes-hooks serve``."""

    def setUp(self) -> None:
        from test_client import Service  # the same process helper as the client's tests
        self.tmp = tempfile.mkdtemp(prefix="hh-agent-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.home = os.path.join(self.tmp, "home")
        self.hooks_dir = os.path.join(self.tmp, "hooks")
        os.mkdir(self.home, 0o700)
        os.mkdir(self.hooks_dir, 0o755)
        self.sock = os.path.join(self.tmp, "hooks.sock")
        self.out = os.path.join(self.tmp, "seen.jsonl")
        env = mock.patch.dict(os.environ, {"HERMES_HOME": self.home})
        env.start()
        self.addCleanup(env.stop)
        self.Service = Service

    def hook(self, name: str, events: list, body: str, timeout: int = 5) -> None:
        d = os.path.join(self.hooks_dir, name)
        os.mkdir(d, 0o755)
        for file_name, text in (
                ("HOOK.yaml", "events: %s\ntimeout: %d\n" % (json.dumps(events), timeout)),
                ("handler.py", "import json, time\nOUT = %r\ndef handle(event, context):\n%s\n"
                 % (self.out, "\n".join("    " + line for line in body.splitlines())))):
            path = os.path.join(d, file_name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, 0o644)

    def restart(self) -> None:
        self.service.stop()
        self.service = self.Service(self.tmp, self.home, self.hooks_dir, ["--socket", self.sock],
                                    self.sock)

    def bridge(self, fail_closed=()) -> tuple:
        self.service = self.Service(self.tmp, self.home, self.hooks_dir, ["--socket", self.sock],
                                    self.sock)
        self.addCleanup(lambda: self.service.stop())
        registry = HookRegistry(address=self.sock, autostart=False)
        self.addCleanup(registry.close, 0)
        registry.discover_and_load()
        bridge = AgentBridge(registry, fail_closed)
        self.addCleanup(bridge.close)
        ctx = FakeCtx()
        bridge.attach(ctx.register_hook)
        return bridge, ctx

    def test_gate_context_and_observer(self) -> None:
        """Issue 49, build bullet 1: a pre_tool_call gate blocks with its message, a
        pre_llm_call context comes back joined, an observer that sleeps does not hold the
        call, and only the subscribed events get a callback."""
        self.hook("gate", ["pre_tool_call"],
                  "cmd = (context.get('tool_input') or {}).get('command', '')\n"
                  "if 'rm -rf' in cmd:\n"
                  "    return {'decision': 'block', 'reason': 'no rm -rf: ' + context['tool_name']}\n"
                  "return None")
        self.hook("ctx-a", ["pre_llm_call"], "return {'context': 'A says hi'}")
        self.hook("ctx-b", ["pre_*"], "return {'context': 'B: ' + event}" )
        self.hook("slow", ["post_tool_call"],
                  "time.sleep(1.5)\n"
                  "with open(OUT, 'a') as f:\n"
                  "    f.write(json.dumps(context) + '\\n')")
        bridge, ctx = self.bridge()
        self.assertEqual(sorted(ctx.hooks), sorted(["pre_tool_call", "pre_llm_call",
                                                    "pre_verify", "pre_api_request",
                                                    "pre_gateway_dispatch",
                                                    "pre_approval_request", "post_tool_call"]))
        pre_tool = ctx.hooks["pre_tool_call"][0]
        answer = pre_tool(tool_name="terminal", args={"command": "rm -rf /tmp/x"},
                          session_id="s", task_id="", tool_call_id="c1")
        self.assertEqual(answer, {"action": "block", "message": "no rm -rf: terminal"})
        self.assertIsNone(pre_tool(tool_name="terminal", args={"command": "ls"}, session_id="s"))
        answer = ctx.hooks["pre_llm_call"][0](session_id="s", user_message="hi",
                                              conversation_history=[], is_first_turn=True,
                                              model="m", platform="cli", sender_id="")
        # Exact-pattern hooks first (discovery order), then the wildcard one.
        self.assertEqual(answer, {"context": "A says hi\n\nB: pre_llm_call"})
        started = time.perf_counter()
        self.assertIsNone(ctx.hooks["post_tool_call"][0](
            tool_name="terminal", args={"command": "ls"}, result='{"output": ""}',
            session_id="s", status="ok", duration_ms=3, runner=_Opaque()))
        self.assertLess(time.perf_counter() - started, 0.05, "the observer held the call")
        deadline = time.monotonic() + 20
        while not os.path.exists(self.out) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the slow observer's line against the deadline
        with open(self.out, encoding="utf-8") as f:
            seen = json.loads(f.readline())
        self.assertEqual(seen["hook_event_name"], "post_tool_call")
        self.assertEqual(seen["extra"]["runner"], "<opaque runner>")
        self.assertEqual(seen["extra"]["status"], "ok")

    def test_contexts_that_json_refuses(self) -> None:
        """NaN, keys that are not text and cycles still reach the hook, made JSON."""
        self.hook("echo", ["pre_llm_call"], "return {'context': json.dumps(context['extra'])}")
        bridge, ctx = self.bridge()
        loop = []
        loop.append(loop)
        answer = ctx.hooks["pre_llm_call"][0](session_id="s", score=float("nan"),
                                              table={1: "one"}, loop=loop)
        seen = json.loads(answer["context"])
        self.assertIsNone(seen["score"])
        self.assertEqual(seen["table"], {"1": "one"})

    def test_a_restarted_service_between_decisions(self) -> None:
        """The keep-alive connection of a deciding callback outlives no service: after a
        restart, the next call reconnects and decides."""
        self.hook("gate", ["pre_tool_call"], "return {'action': 'block', 'message': 'no'}")
        bridge, ctx = self.bridge()
        call = ctx.hooks["pre_tool_call"][0]
        self.assertEqual(call(tool_name="terminal", args={}), {"action": "block", "message": "no"})
        self.restart()
        self.assertEqual(call(tool_name="terminal", args={}), {"action": "block", "message": "no"})

    def test_fail_open_and_closed(self) -> None:
        """A gate that times out: no decision (open) by default; a block when pre_tool_call
        fails closed. A service that is gone: the same."""
        self.hook("hung", ["pre_tool_call"], "time.sleep(30)", timeout=1)
        bridge, ctx = self.bridge()
        call = ctx.hooks["pre_tool_call"][0]
        self.assertIsNone(call(tool_name="terminal", args={}, session_id="s"))
        closed = AgentBridge(bridge.registry, ["pre_tool_call", "pre_llm_call"])
        self.addCleanup(closed.close)
        answer = closed.callback("pre_tool_call")(tool_name="terminal", args={}, session_id="s")
        self.assertEqual(answer["action"], "block")
        self.assertIn("hung", answer["message"])
        gone = HookRegistry(address=os.path.join(self.tmp, "nobody.sock"), autostart=False)
        self.addCleanup(gone.close, 0)
        answer = AgentBridge(gone, ["pre_tool_call"]).callback("pre_tool_call")(tool_name="x")
        self.assertEqual(answer["action"], "block")
        self.assertIn("unreachable", answer["message"])
        self.assertIsNone(AgentBridge(gone).callback("pre_tool_call")(tool_name="x"))


class RegisterTest(unittest.TestCase):
    def test_register_never_raises(self) -> None:
        tmp = tempfile.mkdtemp(prefix="hh-agent-reg-")
        self.addCleanup(shutil.rmtree, tmp, True)
        env = {"HERMES_HOME": tmp, "HERMES_HOOKS_AUTOSTART": "0",
               "HERMES_HOOKS_ADDRESS": os.path.join(tmp, "none.sock")}
        with mock.patch.dict(os.environ, env), mock.patch.object(agent_plugin, "_bridge", None):
            ctx = FakeCtx()
            agent_plugin.register(ctx)  # no service, no hooks on disk
            self.assertEqual(ctx.hooks, {})
            if agent_plugin._bridge is not None:
                agent_plugin._bridge.registry.close(0)


if __name__ == "__main__":
    unittest.main()
