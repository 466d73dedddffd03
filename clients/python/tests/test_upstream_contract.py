"""The original ``gateway.hooks`` contract, in our own words (issue 19): the in-process registry
(``_handlers``, ``_register_builtin_hooks``), ``loaded_hooks`` read from disk while the service
is unreachable and refreshed when it answers, a patched ``gateway.hooks.HOOKS_DIR``, and
``emit_collect`` that never fails open by default.

Run: ``python3 -m unittest discover -s clients/python/tests -v``.
"""

import asyncio
import json
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
from http.server import BaseHTTPRequestHandler
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hermes_hooks import HookRegistry, ProfileHookRegistries  # noqa: E402
from hermes_hooks import _upstream  # noqa: E402

TIMEOUT = 20.0


def eventually(predicate, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(0.01)


def write_hook(root: str, name: str, manifest: str, handler: str = None) -> str:
    path = os.path.join(root, name)
    os.makedirs(path)
    with open(os.path.join(path, "HOOK.yaml"), "w") as f:
        f.write(manifest)
    if handler is not None:
        with open(os.path.join(path, "handler.py"), "w") as f:
            f.write(handler)
    return path


class _Answers(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _reply(self, status: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/readyz":
            return self._reply(200, {"ready": True})
        if self.path == "/v1/hooks":
            return self._reply(200, {"hooks": self.server.hooks, "skipped": []})
        self._reply(404, {"error": {"code": "not_found", "message": self.path}})

    def do_POST(self) -> None:
        data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/collect":
            self.server.collects.append(data)
            return self._reply(200, self.server.collect_answer)
        self._reply(202, {"queued": [1] * len(data.get("events", []))})


class FakeService(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A service that lists ``hooks``, accepts every batch and answers every collect with
    ``collect_answer`` (recording the requests)."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        super().__init__(path, _Answers)
        self.hooks = []  # type: list
        self.collects = []  # type: list
        self.collect_answer = {"results": [], "errors": []}  # type: dict
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def get_request(self):
        sock, _ = super().get_request()
        return sock, ("unix-peer", 0)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hh-contract-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.sock = os.path.join(self.tmp, "hooks.sock")
        self.home = os.path.join(self.tmp, "home")
        self.hooks = os.path.join(self.home, "hooks")
        os.makedirs(self.hooks)

    def registry(self, **kwargs) -> HookRegistry:
        kwargs.setdefault("backoff_initial", 0.01)
        kwargs.setdefault("backoff_max", 0.05)
        registry = HookRegistry(address=self.sock, hermes_home=self.home, **kwargs)
        self.addCleanup(registry.close, 0)
        return registry


class InProcessRegistryTest(Base):
    def test_starts_empty_and_builtins_register_first(self) -> None:
        registry = self.registry()
        self.assertEqual(registry._handlers, {})
        calls = []
        with mock.patch.object(registry, "_register_builtin_hooks",
                               side_effect=lambda: calls.append("builtins")):
            registry.discover_and_load()
        self.assertEqual(calls, ["builtins"])

    def test_collect_runs_them_in_match_order_and_survives_their_failures(self) -> None:
        registry = self.registry()
        seen = []

        def boom(event, context):
            raise RuntimeError("broken built-in")

        async def later(event, context):
            await asyncio.sleep(0.01)
            return "async wildcard"

        registry._handlers["deploy:*"] = [later, lambda e, c: None]
        registry._handlers["deploy:prod"] = [boom, lambda e, c: seen.append(c) or "exact"]
        detailed = asyncio.run(registry.emit_collect_detailed("deploy:prod"))
        self.assertEqual([r["result"] for r in detailed["results"]], ["exact", "async wildcard"])
        self.assertEqual(len(detailed["errors"]), 1)
        self.assertIn("broken built-in", detailed["errors"][0]["error"])
        self.assertEqual(seen, [{}])  # no context given: an empty dict, as the original
        self.assertEqual(asyncio.run(registry.emit_collect("other:event")), [])

    def test_emit_starts_them_without_waiting(self) -> None:
        registry = self.registry()
        release = threading.Event()
        ran = []

        def slow(event, context):
            release.wait(TIMEOUT)
            ran.append((event, context))

        registry._handlers["job:done"] = [slow]

        async def go() -> float:
            start = time.perf_counter()
            await registry.emit("job:done", {"n": 1})
            return time.perf_counter() - start

        self.assertLess(asyncio.run(go()), 1.0)
        self.assertEqual(ran, [])
        release.set()
        eventually(lambda: ran == [("job:done", {"n": 1})], "the handler to run")

    def test_merged_with_the_service_in_one_match_order(self) -> None:
        server = FakeService(self.sock)
        self.addCleanup(server.stop)
        server.hooks = [{"name": "svc-exact", "events": ["deploy:prod"]},
                        {"name": "svc-wild", "events": ["deploy:*"]}]
        server.collect_answer = {"results": [{"hook": "svc-exact", "result": "S-exact"},
                                             {"hook": "svc-wild", "result": "S-wild"}],
                                 "errors": []}
        registry = self.registry()
        registry.discover_and_load()
        registry._handlers["deploy:*"] = [lambda e, c: "P-wild"]
        registry._handlers["deploy:prod"] = [lambda e, c: "P-exact"]
        self.assertEqual(asyncio.run(registry.emit_collect("deploy:prod", {})),
                         ["P-exact", "S-exact", "P-wild", "S-wild"])


class DiskListTest(Base):
    def test_service_down_lists_the_hooks_on_disk_by_the_original_rules(self) -> None:
        write_hook(self.hooks, "b-ok", "name: b-ok\ndescription: fine\nevents: [agent:start]\n",
                   "def handle(e, c):\n    pass\n")
        write_hook(self.hooks, "a-async", "events:\n  - agent:step\n",
                   "async def handle(e, c):\n    pass\n")
        os.makedirs(os.path.join(self.hooks, "no-manifest"))
        write_hook(self.hooks, "no-handler", "events: [agent:start]\n")
        write_hook(self.hooks, "no-events", "events: []\n", "def handle(e, c): pass\n")
        write_hook(self.hooks, "no-handle", "events: [agent:start]\n", "def other(): pass\n")
        write_hook(self.hooks, "off", "events: [agent:start]\nenabled: false\n",
                   "def handle(e, c): pass\n")
        registry = self.registry()
        registry.discover_and_load()
        hooks = registry.loaded_hooks
        self.assertEqual([h["name"] for h in hooks], ["a-async", "b-ok"])
        self.assertEqual(hooks[1]["events"], ["agent:start"])
        self.assertEqual(hooks[1]["description"], "fine")
        self.assertEqual(hooks[1]["path"], os.path.join(self.hooks, "b-ok"))
        self.assertEqual(hooks[1]["source"], "disk")

    def test_a_patched_gateway_hooks_dir_is_honoured(self) -> None:
        elsewhere = os.path.join(self.tmp, "elsewhere")
        os.makedirs(elsewhere)
        write_hook(elsewhere, "moved", "events: [agent:start]\n", "def handle(e, c): pass\n")
        fake = types.ModuleType("gateway.hooks")
        fake.HOOKS_DIR = __import__("pathlib").Path(elsewhere)
        with mock.patch.dict(sys.modules, {"gateway.hooks": fake}):
            registry = self.registry()
            registry.discover_and_load()
        self.assertEqual([h["name"] for h in registry.loaded_hooks], ["moved"])

    def test_refreshed_from_the_service_when_it_answers(self) -> None:
        write_hook(self.hooks, "on-disk", "events: [agent:start]\n", "def handle(e, c): pass\n")
        registry = self.registry()
        registry.discover_and_load()
        self.assertEqual([h["name"] for h in registry.loaded_hooks], ["on-disk"])
        server = FakeService(self.sock)
        self.addCleanup(server.stop)
        server.hooks = [{"name": "on-disk", "events": ["agent:start"], "kind": "python"},
                        {"name": "from-service", "events": ["agent:end"], "kind": "exec"}]
        registry.emit_nowait("agent:start", {})
        eventually(lambda: [h["name"] for h in registry.loaded_hooks]
                   == ["on-disk", "from-service"], "the service's list")
        self.assertNotIn("source", registry.loaded_hooks[0])

    def test_mini_yaml_reads_the_manifest_keys_without_pyyaml(self) -> None:
        self.assertEqual(_upstream._mini_yaml(
            "name: x  # comment\nevents: ['a:b', \"c:*\"]\nenabled: no\n"),
            {"name": "x", "events": ["a:b", "c:*"], "enabled": False})
        self.assertEqual(_upstream._mini_yaml("events:\n  - a\n  - 'b:c'\n")["events"],
                         ["a", "b:c"])


class NeverFailsOpenTest(Base):
    def test_no_deadline_by_default_and_a_given_one_is_sent(self) -> None:
        server = FakeService(self.sock)
        self.addCleanup(server.stop)
        server.collect_answer = {"results": [], "errors": [
            {"hook": "slow-policy", "error": "timed out after 30s", "timed_out": True}]}
        registry = self.registry()
        self.assertIsNone(registry.collect_timeout)
        detailed = asyncio.run(registry.emit_collect_detailed("command:deploy", {}))
        self.assertNotIn("timeout_ms", server.collects[0])
        self.assertTrue(detailed["errors"][0]["timed_out"])
        asyncio.run(registry.emit_collect("command:deploy", {}, timeout=0.25))
        self.assertEqual(server.collects[1]["timeout_ms"], 250)
        short = self.registry(collect_timeout=2.0)
        asyncio.run(short.emit_collect("command:deploy", {}))
        self.assertEqual(server.collects[2]["timeout_ms"], 2000)

    def test_an_in_process_decision_gets_its_own_timeout(self) -> None:
        registry = self.registry()

        async def slow_deny(event, context):
            await asyncio.sleep(0.3)
            return {"decision": "deny"}

        registry._handlers["command:*"] = [slow_deny]
        self.assertEqual(asyncio.run(registry.emit_collect("command:stop", {})),
                         [{"decision": "deny"}])
        detailed = asyncio.run(registry.emit_collect_detailed("command:stop", {}, timeout=0.05))
        self.assertEqual(detailed["results"], [])
        self.assertTrue(detailed["errors"][0]["timed_out"], detailed)


class SmallerItemsTest(Base):
    def test_profiles_honour_the_address_variable(self) -> None:
        with mock.patch.dict(os.environ, {"HERMES_HOOKS_ADDRESS": self.sock}):
            profiles = ProfileHookRegistries(home=lambda: self.home, request_timeout=0.2)
        self.addCleanup(profiles.close, 0)
        self.assertEqual(profiles.registry_for(self.home).address, self.sock)

    def test_a_profiles_first_emit_never_waits_for_a_wedged_service(self) -> None:
        wedged = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(wedged.close)
        wedged.bind(self.sock)
        wedged.listen(64)  # accepts connections into the backlog, never answers
        profiles = ProfileHookRegistries(home=lambda: self.home, address=self.sock,
                                         request_timeout=3.0)
        self.addCleanup(profiles.close, 0)

        async def first_emit() -> float:
            start = time.perf_counter()
            await profiles.emit("agent:start", {"n": 1})
            return time.perf_counter() - start

        self.assertLess(asyncio.run(first_emit()), 1.0)
        self.assertEqual(len(profiles.registries), 1)

    def test_shim_runs_a_program_given_with_dash_c(self) -> None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        out = subprocess.run(
            [sys.executable, "-m", "hermes_hooks.shim", "-c",
             "import sys; print(sys.argv[1:], __name__)", "x", "y"],
            cwd=self.tmp, env=dict(os.environ, PYTHONPATH=here, HERMES_HOOKS_SHIM="1"),
            capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "['x', 'y'] __main__")


if __name__ == "__main__":
    unittest.main()
