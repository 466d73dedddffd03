"""The drop-in ``HookRegistry`` against the real ``hermes-hooks`` service.

Needs the service binary: ``HERMES_HOOKS_BIN=target/debug/hermes-hooks python3 -m unittest
discover -s clients/python/tests -v``. Each test gets its own temporary ``HERMES_HOME``, hook
directory and Unix socket, starts ``hermes-hooks serve`` on them, and stops it afterwards. Hooks
are small ``handler.py`` files that append one JSON line per event to a file of the test, or
return a value for ``emit_collect``. Every wait polls against a deadline.
"""

import asyncio
import contextlib
import datetime
import http.client
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hermes_hooks import HookRegistry  # noqa: E402

# Absolute: the tests start gateways in other directories (a relative HERMES_HOOKS_BIN, as in
# the README's `HERMES_HOOKS_BIN=target/debug/hermes-hooks`, would not be found there).
BIN = os.path.abspath(os.environ["HERMES_HOOKS_BIN"]) if os.environ.get("HERMES_HOOKS_BIN") else None
if not BIN:
    raise unittest.SkipTest("HERMES_HOOKS_BIN is not set: these tests drive the real hermes-hooks "
                            "service; build it and set HERMES_HOOKS_BIN=target/debug/hermes-hooks")

#: Seconds a service gets to answer /readyz, and events get to reach a handler (debug builds
#: on a busy 2-core machine: generous, but only ever waited for in full on failure).
READY_TIMEOUT = 30.0
DELIVERY_TIMEOUT = 30.0
#: Upper bound for one ``await registry.emit(...)`` with no service at all.
EMIT_LIMIT_S = float(os.environ.get("HERMES_HOOKS_TEST_EMIT_LIMIT_MS", "5")) / 1000.0


def setUpModule() -> None:
    if not (os.path.isfile(BIN) and os.access(BIN, os.X_OK)):
        raise RuntimeError("HERMES_HOOKS_BIN=%r is not an executable file" % BIN)
    # No test may write the operator's real ~/.hermes (the in-gateway record among others): every
    # registry that names no home gets a temporary HERMES_HOME.
    home = tempfile.mkdtemp(prefix="hh-client-home-")
    patch = mock.patch.dict(os.environ, {"HERMES_HOME": home})
    patch.start()
    unittest.addModuleCleanup(shutil.rmtree, home, True)
    unittest.addModuleCleanup(patch.stop)


def _probe(address: str, path: str = "/readyz") -> int:
    """Status of ``GET path`` at a socket path or ``http://host:port``; 0 when nobody answers.
    Deliberately independent of the client under test."""
    try:
        if address.startswith("http://"):
            host, _, port = address[len("http://"):].rpartition(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2)
            sock.connect(address)
            conn = http.client.HTTPConnection("localhost", timeout=2)
            conn.sock = sock
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """One ``hermes-hooks serve`` process; output goes to a log file shown on failure."""

    def __init__(self, tmp: str, home: str, hooks_dir: str, listen_args: list,
                 address: str) -> None:
        self.address = address
        self.log_path = os.path.join(tmp, "service-%d.log" % time.monotonic_ns())
        argv = [BIN, "serve", "--hooks-dir", hooks_dir] + listen_args
        env = dict(os.environ, HERMES_HOME=home)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=env)
        deadline = time.monotonic() + READY_TIMEOUT
        while _probe(address) != 200:
            if self.proc.poll() is not None:
                raise AssertionError("hermes-hooks serve exited with %s before ready:\n%s"
                                     % (self.proc.returncode, self.log_tail()))
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("hermes-hooks serve not ready at %s after %.0f s:\n%s"
                                     % (address, READY_TIMEOUT, self.log_tail()))
            time.sleep(0.02)  # polling readiness against the deadline above

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, limit: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-limit:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"


class ServiceCase(unittest.IsolatedAsyncioTestCase):
    """Temp HERMES_HOME, hook root and socket; helpers to write hooks and read what they saw."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hh-client-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.home = os.path.join(self.tmp, "home")
        self.hooks_dir = os.path.join(self.tmp, "hooks")
        os.mkdir(self.home, 0o700)
        os.mkdir(self.hooks_dir, 0o755)
        self.sock = os.path.join(self.tmp, "hooks.sock")
        self.services = []  # type: list

    async def asyncSetUp(self) -> None:
        # The tests block the loop on purpose (starting services, flush); no debug warnings.
        asyncio.get_running_loop().slow_callback_duration = 60.0

    def tearDown(self) -> None:
        for service in self.services:
            service.stop()

    # -- hooks

    def add_hook(self, name: str, events: list, handler_source: str,
                 description: str = None) -> str:
        hook_dir = os.path.join(self.hooks_dir, name)
        os.mkdir(hook_dir, 0o755)
        manifest = "name: %s\nevents: %s\n" % (name, json.dumps(events))
        if description is not None:
            manifest += "description: %s\n" % json.dumps(description)
        for file_name, text in (("HOOK.yaml", manifest), ("handler.py", handler_source)):
            path = os.path.join(hook_dir, file_name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, 0o644)
        return hook_dir

    def add_logger_hook(self, name: str, events: list, out: str, description: str = None) -> str:
        source = (
            "import json\n"
            "OUT = %r\n"
            "NAME = %r\n"
            "def handle(event, context):\n"
            "    with open(OUT, 'a', encoding='utf-8') as f:\n"
            "        f.write(json.dumps({'hook': NAME, 'event': event, 'context': context}) + '\\n')\n"
        ) % (out, name)
        return self.add_hook(name, events, source, description)

    def add_result_hook(self, name: str, events: list, body: str, is_async: bool = False) -> str:
        source = "%sdef handle(event, context):\n    %s\n" % ("async " if is_async else "", body)
        return self.add_hook(name, events, source)

    # -- service and registry

    def start_service(self, listen: str = None) -> Service:
        if listen is None:
            service = Service(self.tmp, self.home, self.hooks_dir, ["--socket", self.sock],
                              self.sock)
        else:
            service = Service(self.tmp, self.home, self.hooks_dir, ["--listen", listen],
                              "http://" + listen)
        self.services.append(service)
        return service

    def registry(self, **kwargs) -> HookRegistry:
        registry = HookRegistry(**kwargs)
        self.addCleanup(registry.close, 0)
        return registry

    # -- observing

    @staticmethod
    def read_lines(path: str) -> list:
        try:
            with open(path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    async def eventually(self, predicate, what: str, timeout: float = DELIVERY_TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                logs = "\n".join(s.log_tail() for s in self.services)
                self.fail("timed out after %.0f s waiting for %s\nservice log:\n%s"
                          % (timeout, what, logs))
            await asyncio.sleep(0.02)

    async def wait_lines(self, path: str, count: int) -> list:
        await self.eventually(lambda: len(self.read_lines(path)) >= count,
                              "%d handler lines in %s" % (count, os.path.basename(path)))
        return self.read_lines(path)


class DropInTest(ServiceCase):
    async def test_emit_reaches_the_handler_like_the_original(self) -> None:
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:*"], out)
        self.start_service()

        registry = self.registry(address=self.sock)
        registry.discover_and_load()
        ctx = {"platform": "telegram", "user_id": "42", "chat_id": "7", "thread_id": "",
               "chat_type": "dm", "session_id": "s1", "message": "hi",
               "when": datetime.datetime(2026, 1, 2, 3, 4, 5)}
        self.assertIsNone(await registry.emit("agent:start", ctx))
        ctx["message"] = "changed after emit"  # the gateway reuses its dict
        await registry.emit("agent:end")

        lines = await self.wait_lines(out, 2)
        self.assertEqual([line["event"] for line in lines], ["agent:start", "agent:end"])
        self.assertEqual(lines[0]["context"], dict(ctx, message="hi", when="2026-01-02T03:04:05"))
        self.assertEqual(lines[1]["context"], {}, "emit without context passes {}")
        self.assertTrue(registry.flush(DELIVERY_TIMEOUT))
        self.assertEqual((registry.sent, registry.dropped, registry.rejected, registry.pending),
                         (2, 0, 0, 0))
        self.assertTrue(registry.connected)

    async def test_emit_nowait_from_another_thread(self) -> None:
        out = os.path.join(self.tmp, "cmd.jsonl")
        self.add_logger_hook("command-audit", ["command:*"], out)
        self.start_service()
        registry = self.registry(address=self.sock)
        registry.discover_and_load()

        loop = asyncio.get_running_loop()
        queued = await loop.run_in_executor(
            None, registry.emit_nowait, "command:reset", {"command": "reset", "args": ""})
        self.assertTrue(queued)
        lines = await self.wait_lines(out, 1)
        self.assertEqual(lines[0]["event"], "command:reset")

    async def test_loaded_hooks_lists_the_services_hooks(self) -> None:
        out = os.path.join(self.tmp, "x.jsonl")
        agent_dir = self.add_logger_hook("agent-logger", ["agent:*", "session:start"], out,
                                         description="logs agent events")
        self.add_logger_hook("command-audit", ["command:*"], out)
        self.add_hook("broken", [], "def handle(event, context):\n    pass\n")  # no events
        self.start_service()

        registry = self.registry(address=self.sock)
        self.assertEqual(registry.loaded_hooks, [])
        registry.discover_and_load()

        hooks = registry.loaded_hooks
        self.assertEqual([h["name"] for h in hooks], ["agent-logger", "command-audit"])
        first = hooks[0]
        self.assertEqual(first["description"], "logs agent events")
        self.assertEqual(first["events"], ["agent:*", "session:start"])
        self.assertEqual(hooks[1]["description"], "", "missing description reads as ''")
        path = os.path.realpath(first["path"])
        self.assertTrue(path == os.path.realpath(agent_dir)
                        or path.startswith(os.path.realpath(agent_dir) + os.sep),
                        "path %r should be the hook directory %r" % (first["path"], agent_dir))
        broken = [s for s in registry.skipped
                  if s.get("name") == "broken" or os.path.basename(str(s.get("dir"))) == "broken"]
        self.assertEqual(len(broken), 1, registry.skipped)
        self.assertTrue(broken[0].get("reason"), broken)

    async def test_env_address_and_token(self) -> None:
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:start"], out)
        self.start_service()
        with mock.patch.dict(os.environ, {"HERMES_HOOKS_ADDRESS": self.sock,
                                          "HERMES_HOOKS_TOKEN": "not-needed-on-the-socket"}):
            registry = self.registry()
        self.assertEqual(registry.address, self.sock)
        registry.discover_and_load()
        self.assertEqual(len(registry.loaded_hooks), 1)
        await registry.emit("agent:start", {"n": 1})
        await self.wait_lines(out, 1)

    async def test_tcp_with_a_token_proves_the_service_first(self) -> None:
        # Issue 35: over TCP the client sends its token only to a process that proved it holds
        # it (POST /v1/proof); against the real service the listing, the sender's batches and
        # emit_collect all go through.
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:start"], out)
        self.add_result_hook("decide", ["message:pre_route"], "return {'ok': True}")
        token_file = os.path.join(self.tmp, "token")
        with open(token_file, "w") as f:
            f.write("tcp-s3cret\n")
        listen = "127.0.0.1:%d" % _free_port()
        self.services.append(Service(self.tmp, self.home, self.hooks_dir,
                                     ["--listen", listen, "--token-file", token_file],
                                     "http://" + listen))
        registry = self.registry(address="http://" + listen, token="tcp-s3cret")
        registry.discover_and_load()
        self.assertEqual(sorted(h["name"] for h in registry.loaded_hooks),
                         ["agent-logger", "decide"])
        await registry.emit("agent:start", {"over": "tcp"})
        await self.wait_lines(out, 1)
        self.assertEqual(await registry.emit_collect("message:pre_route", {}), [{"ok": True}])
        # A wrong token is no proof either: nothing is listed from the service.
        wrong = self.registry(address="http://" + listen, token="not-the-token")
        wrong.discover_and_load()
        self.assertNotIn("decide", [h["name"] for h in wrong.loaded_hooks])

    async def test_tcp_address(self) -> None:
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:start"], out)
        self.add_result_hook("decide", ["message:pre_route"], "return {'ok': True}")
        listen = "127.0.0.1:%d" % _free_port()
        self.start_service(listen=listen)

        registry = self.registry(address="http://" + listen)
        registry.discover_and_load()
        self.assertEqual(sorted(h["name"] for h in registry.loaded_hooks),
                         ["agent-logger", "decide"])
        await registry.emit("agent:start", {"over": "tcp"})
        lines = await self.wait_lines(out, 1)
        self.assertEqual(lines[0]["context"], {"over": "tcp"})
        self.assertEqual(await registry.emit_collect("message:pre_route", {}), [{"ok": True}])


class CollectTest(ServiceCase):
    async def test_results_in_match_order_none_dropped_errors_reported(self) -> None:
        # Directory order a-wild, b-none, c-exact, d-boom: the exact-pattern hooks must still
        # come before the wildcard one.
        self.add_result_hook("a-wild", ["message:*"], "return {'by': 'wild'}", is_async=True)
        self.add_result_hook("b-none", ["message:pre_route"], "return None")
        self.add_result_hook("c-exact", ["message:pre_route"],
                             "return {'by': 'exact', 'user': context.get('user_id')}")
        self.add_result_hook("d-boom", ["message:pre_route"], "raise ValueError('boom')")
        self.start_service()
        registry = self.registry(address=self.sock)
        registry.discover_and_load()

        results = await registry.emit_collect("message:pre_route",
                                              {"platform": "slack", "user_id": "u1"})
        self.assertEqual(results, [{"by": "exact", "user": "u1"}, {"by": "wild"}])

        detailed = await registry.emit_collect_detailed("message:pre_route", {"user_id": "u2"})
        self.assertIsNone(detailed["error"])
        self.assertEqual([r["hook"] for r in detailed["results"]], ["c-exact", "a-wild"])
        self.assertEqual([e["hook"] for e in detailed["errors"]], ["d-boom"])
        self.assertIn("boom", detailed["errors"][0]["error"])

        self.assertEqual(await registry.emit_collect("message:pre_route"),
                         [{"by": "exact", "user": None}, {"by": "wild"}],
                         "context defaults to {}")
        self.assertEqual(await registry.emit_collect("session:start", {}), [],
                         "no matching hook: []")


class OutageTest(ServiceCase):
    async def test_service_restart_in_the_middle_of_a_stream(self) -> None:
        out = os.path.join(self.tmp, "steps.jsonl")
        self.add_logger_hook("step-logger", ["agent:step"], out)
        service = self.start_service()
        registry = self.registry(address=self.sock, backoff_max=0.5)
        registry.discover_and_load()

        for i in range(200):
            await registry.emit("agent:step", {"i": i})
        # Stop it while the stream is flowing: once the first batch was acknowledged.
        await self.eventually(lambda: registry.sent > 0, "a first acknowledged batch")
        service.stop()
        for i in range(200, 400):
            await registry.emit("agent:step", {"i": i})  # must not raise
        await self.eventually(lambda: not registry.connected,
                              "the client to notice the service is gone")
        self.assertIsNotNone(registry.last_error)
        self.assertGreater(registry.pending, 0)

        self.start_service()
        await self.eventually(
            lambda: {line["context"]["i"] for line in self.read_lines(out)} == set(range(400)),
            "all 400 events delivered after the restart")
        self.assertTrue(await registry.aflush(DELIVERY_TIMEOUT))
        self.assertEqual(registry.dropped, 0)
        self.assertEqual(registry.rejected, 0)
        self.assertTrue(registry.connected)
        firsts = []
        for line in self.read_lines(out):
            if line["context"]["i"] not in firsts:
                firsts.append(line["context"]["i"])
        self.assertEqual(firsts, list(range(400)), "delivered in emit order")

    async def test_service_absent(self) -> None:
        registry = self.registry(address=os.path.join(self.tmp, "nobody-here.sock"))
        registry.discover_and_load()  # must not raise
        self.assertEqual(registry.loaded_hooks, [])

        slowest = 0.0
        for i in range(100):
            start = time.perf_counter()
            await registry.emit("agent:start", {"i": i})
            elapsed = time.perf_counter() - start
            slowest = max(slowest, elapsed)
            self.assertLess(elapsed, EMIT_LIMIT_S, "emit #%d took %.2f ms" % (i, elapsed * 1e3))

        start = time.perf_counter()
        self.assertEqual(await registry.emit_collect("message:pre_route", {"user_id": "1"}), [])
        self.assertLess(time.perf_counter() - start, 5.0)  # the service is absent: no wait at all
        detailed = await registry.emit_collect_detailed("message:pre_route")
        self.assertEqual((detailed["results"], detailed["errors"]), ([], []))
        self.assertTrue(detailed["error"])

        await self.eventually(lambda: registry.last_error is not None, "a recorded send error")
        self.assertFalse(registry.connected)
        self.assertEqual((registry.pending, registry.dropped, registry.sent), (100, 0, 0))

    async def test_queue_bound_drops_and_counts(self) -> None:
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:start"], out)
        registry = self.registry(address=self.sock, queue_size=10)
        registry.discover_and_load()
        for i in range(50):
            await registry.emit("agent:start", {"i": i})
        self.assertEqual(registry.dropped, 40)
        self.assertEqual(registry.pending, 10)

        self.start_service()
        self.assertTrue(await registry.aflush(DELIVERY_TIMEOUT))
        self.assertEqual(registry.sent, 10)
        lines = await self.wait_lines(out, 10)
        seen = [line["context"]["i"] for line in lines]
        self.assertEqual(len(seen), 10, seen)
        self.assertEqual(len(set(seen)), 10, seen)

    async def test_frozen_service_costs_emit_nothing(self) -> None:
        out = os.path.join(self.tmp, "steps.jsonl")
        self.add_logger_hook("step-logger", ["agent:step"], out)
        service = self.start_service()
        registry = self.registry(address=self.sock, queue_size=200)
        registry.discover_and_load()
        await registry.emit("agent:step", {"i": -1})
        self.assertTrue(await registry.aflush(DELIVERY_TIMEOUT))

        service.proc.send_signal(signal.SIGSTOP)  # alive, connected, and answering nothing
        self.addCleanup(service.proc.send_signal, signal.SIGCONT)
        ctx = {"platform": "telegram", "message": "m" * 300}
        for i in range(1000):
            start = time.perf_counter()
            await registry.emit("agent:step", dict(ctx, i=i))
            elapsed = time.perf_counter() - start
            self.assertLess(elapsed, EMIT_LIMIT_S, "emit #%d took %.2f ms" % (i, elapsed * 1e3))
            if i % 100 == 99:
                await asyncio.sleep(0.01)  # the sender runs meanwhile; it must not block emit
        self.assertLessEqual(registry.pending, 200, registry.stats())
        self.assertEqual(registry.pending + registry.dropped, 1000, registry.stats())
        self.assertEqual(registry.sent, 1)

        service.proc.send_signal(signal.SIGCONT)
        self.assertTrue(await registry.aflush(DELIVERY_TIMEOUT), registry.stats())
        lines = await self.wait_lines(out, registry.sent)
        self.assertEqual(lines[-1]["context"]["i"], 999, "the newest event is delivered")

    async def test_ten_thousand_emits_without_service(self) -> None:
        registry = self.registry(address=os.path.join(self.tmp, "nobody-here.sock"))
        ctx = {"platform": "telegram", "user_id": "42", "message": "x" * 200}
        for i in range(10000):
            await registry.emit("agent:step", ctx)
        self.assertEqual(registry.pending, 10000)
        self.assertEqual(registry.dropped, 0)
        self.assertFalse(registry.close(0))


class RejectionTest(ServiceCase):
    async def test_invalid_events_refused_on_the_client(self) -> None:
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:start"], out)
        self.start_service()
        registry = self.registry(address=self.sock)
        registry.discover_and_load()

        await registry.emit("bad name", {})
        await registry.emit("", {})
        await registry.emit("agent:start", ["not", "a", "dict"])  # type: ignore[arg-type]
        await registry.emit(None, {})  # type: ignore[arg-type]
        await registry.emit("agent:start", {"good": True})
        self.assertEqual(registry.rejected, 4)
        self.assertTrue(registry.flush(DELIVERY_TIMEOUT))
        self.assertEqual(registry.sent, 1)
        lines = await self.wait_lines(out, 1)  # acknowledged is not yet handled: wait for it
        self.assertEqual([line["context"] for line in lines], [{"good": True}])

    async def test_one_bad_event_costs_only_itself(self) -> None:
        # Client-side checks off: the service's 400 for the batch makes the client halve it
        # until the bad event is alone; the ten good ones are delivered.
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:start"], out)
        registry = self.registry(address=self.sock, validate_events=False)
        for i in range(5):
            registry.emit_nowait("agent:start", {"i": i})
        registry.emit_nowait("bad name", {"i": -1})
        for i in range(5, 10):
            registry.emit_nowait("agent:start", {"i": i})
        self.start_service()  # after the emits: the bad event most likely shares a batch
        self.assertTrue(await registry.aflush(DELIVERY_TIMEOUT))
        self.assertEqual((registry.sent, registry.rejected), (10, 1))
        lines = await self.wait_lines(out, 10)
        self.assertEqual([line["context"]["i"] for line in lines], list(range(10)))


class ConsoleTest(ServiceCase):
    def test_the_shim_says_each_gateway_hook_once_and_no_other(self) -> None:
        """Issue 60 row 9: under the shim the gateway's console printed each ``[hooks] Loaded
        hook ...`` line three times (the gateway's registry, the agent plugin's, and the
        plugin's reload each took the service's list), the agent's hooks and config.yaml's
        shell hooks among them; the original prints each of its hooks once."""
        from hermes_hooks import _autostart
        self.add_result_hook("gw", ["agent:start"], "return None")
        self.add_result_hook("everything", ["*"], "return None")
        self.add_result_hook("agent-only", ["pre_tool_call"], "return None")
        gate = os.path.join(self.tmp, "gate.sh")
        with open(gate, "w") as f:
            f.write("#!/bin/sh\ncat >/dev/null\n")
        os.chmod(gate, 0o755)
        with open(os.path.join(self.home, "config.yaml"), "w") as f:
            f.write("hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - command: %s\n"
                    % gate)
        self.start_service()
        console = io.StringIO()
        with mock.patch.object(_autostart, "shim_active", True), \
                contextlib.redirect_stdout(console):
            gateway = self.registry(address=self.sock, autostart=False)
            gateway.discover_and_load()
            plugin = self.registry(address=self.sock, autostart=False)
            plugin.discover_and_load()
            plugin._refresh_hooks()
        names = sorted(h["name"] for h in gateway.loaded_hooks)
        self.assertEqual(len(names), 4, names)  # the service hosts all four
        lines = sorted(line for line in console.getvalue().splitlines()
                       if line.startswith("[hooks] Loaded hook"))
        self.assertEqual(lines, [
            "[hooks] Loaded hook 'everything' for events: ['*']",
            "[hooks] Loaded hook 'gw' for events: ['agent:start']",
        ], console.getvalue())


class LifecycleTest(ServiceCase):
    async def test_close_delivers_then_drops_later_emits(self) -> None:
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:start"], out)
        self.start_service()
        registry = self.registry(address=self.sock)
        registry.discover_and_load()
        for i in range(100):
            await registry.emit("agent:start", {"i": i})
        self.assertTrue(await registry.aclose(DELIVERY_TIMEOUT))
        self.assertEqual(registry.sent, 100)
        await registry.emit("agent:start", {"i": 100})  # after close: dropped, no raise
        self.assertEqual(registry.dropped, 1)
        await self.wait_lines(out, 100)

    async def test_autostart_starts_the_service(self) -> None:
        out = os.path.join(self.tmp, "agent.jsonl")
        self.add_logger_hook("agent-logger", ["agent:start"], out)
        with mock.patch.dict(os.environ, {"HERMES_HOME": self.home}):
            registry = self.registry(address=self.sock, autostart=True, binary=BIN,
                                     serve_args=["--hooks-dir", self.hooks_dir],
                                     autostart_timeout=READY_TIMEOUT,
                                     autostart_log=os.path.join(self.tmp, "autostart.log"))
            registry.discover_and_load()
        proc = registry.service_process
        self.assertIsNotNone(proc, "no service was started")
        self.addCleanup(self._stop_process, proc)
        self.assertEqual(_probe(self.sock), 200)
        self.assertEqual([h["name"] for h in registry.loaded_hooks], ["agent-logger"])
        await registry.emit("agent:start", {"auto": True})
        lines = await self.wait_lines(out, 1)
        self.assertEqual(lines[0]["context"], {"auto": True})

    @staticmethod
    def _stop_process(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    unittest.main()
