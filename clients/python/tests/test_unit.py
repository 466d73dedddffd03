"""Client behaviour that needs no hermes-hooks binary: addresses, validation, JSON safety, the
buffer bound, and the sender's answers to each status code (against a scripted HTTP server
on a Unix socket that records what arrives and on how many connections).

Run: ``python3 -m unittest discover -s clients/python/tests -v``.
"""

import asyncio
import datetime
import json
import os
import shutil
import socket
import socketserver
import sys
import tempfile
import threading
import time
import unittest
import warnings
from http.server import BaseHTTPRequestHandler
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hermes_hooks import HookRegistry, check_event_name, parse_address, resolve_address  # noqa: E402
from hermes_hooks import _ingateway, _transport  # noqa: E402
from hermes_hooks.registry import encode_event  # noqa: E402

TIMEOUT = 20.0


def setUpModule() -> None:
    # No test may write the operator's real ~/.hermes (the in-gateway record among others): every
    # registry that names no home gets a temporary HERMES_HOME.
    home = tempfile.mkdtemp(prefix="hh-unit-home-")
    patch = mock.patch.dict(os.environ, {"HERMES_HOME": home})
    patch.start()
    unittest.addModuleCleanup(shutil.rmtree, home, True)
    unittest.addModuleCleanup(patch.stop)


def eventually(predicate, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(0.01)


class AddressTest(unittest.TestCase):
    def test_socket_paths(self) -> None:
        self.assertEqual(parse_address("/run/hooks.sock").path, "/run/hooks.sock")
        self.assertEqual(parse_address("unix:/run/hooks.sock").path, "/run/hooks.sock")
        self.assertEqual(parse_address("unix:///run/hooks.sock").path, "/run/hooks.sock")
        with mock.patch.dict(os.environ, {"HOME": "/home/op"}):
            self.assertEqual(parse_address("~/.hermes/hooks.sock").path,
                             "/home/op/.hermes/hooks.sock")
        self.assertEqual(parse_address("/run/hooks.sock").serve_args(),
                         ["--socket", "/run/hooks.sock"])

    def test_tcp(self) -> None:
        addr = parse_address("http://127.0.0.1:8787")
        self.assertEqual((addr.kind, addr.host, addr.port), ("tcp", "127.0.0.1", 8787))
        self.assertEqual(str(addr), "http://127.0.0.1:8787")
        self.assertEqual(addr.serve_args(), ["--listen", "127.0.0.1:8787"])
        self.assertEqual(parse_address("http://[::1]:9000/").serve_args(), ["--listen", "[::1]:9000"])

    def test_malformed(self) -> None:
        for bad in ["", "   ", "https://host:1", "http://host:1/prefix", "http://:80",
                    "http://host:notaport", "unix:", None, 12]:
            with self.assertRaises(ValueError, msg=repr(bad)):
                parse_address(bad)
        with self.assertRaises(ValueError):
            HookRegistry(address="ftp://x:1")

    def test_resolution_order(self) -> None:
        env = {"HERMES_HOME": "/srv/hermes"}
        with mock.patch.dict(os.environ, env):
            os.environ.pop("HERMES_HOOKS_ADDRESS", None)
            self.assertEqual(resolve_address().path, "/srv/hermes/hooks.sock")
            self.assertEqual(HookRegistry().address, "/srv/hermes/hooks.sock")
            os.environ["HERMES_HOOKS_ADDRESS"] = "http://127.0.0.1:1234"
            self.assertEqual(HookRegistry().address, "http://127.0.0.1:1234")
            self.assertEqual(HookRegistry(address="/tmp/x.sock").address, "/tmp/x.sock")
        with mock.patch.dict(os.environ, {"HOME": "/home/op"}):
            os.environ.pop("HERMES_HOME", None)
            os.environ.pop("HERMES_HOOKS_ADDRESS", None)
            self.assertEqual(resolve_address().path, "/home/op/.hermes/hooks.sock")

    def test_settings_checked(self) -> None:
        for kwargs in ({"queue_size": 0}, {"batch_max": 0}, {"batch_max": 10001},
                       {"collect_timeout": 0}):
            with self.assertRaises(ValueError, msg=kwargs):
                HookRegistry(address="/tmp/x.sock", **kwargs)


class EventTest(unittest.TestCase):
    def test_event_names(self) -> None:
        for good in ["agent:start", "command:reset", "a", "x" * 256, "sessión:start", "é" * 256]:
            self.assertIsNone(check_event_name(good), good)
        for bad in ["", "agent start", "agent:\tstart", "agent:\x00", "agent:\x85", "x" * 257,
                    "é" * 257, None, 3, b"agent:start"]:
            self.assertIsNotNone(check_event_name(bad), repr(bad))

    def test_contexts_become_json(self) -> None:
        class Odd:
            def __str__(self) -> str:
                return "odd"

        class Unprintable:
            def __str__(self) -> str:
                raise RuntimeError("no")

        loop = {"name": "loop"}
        loop["self"] = loop
        ctx = {"when": datetime.datetime(2026, 1, 2, 3, 4, 5), "tags": {"a"}, "pair": (1, 2),
               "raw": b"\xff\x00ok", "nan": float("nan"), "odd": Odd(), 1: "int key",
               ("t", 1): "tuple key", "loop": loop, "bad": Unprintable()}
        data = encode_event("agent:start", ctx)
        decoded = json.loads(data.decode("utf-8"), parse_constant=lambda c: self.fail(c))
        got = decoded["context"]
        self.assertEqual(decoded["event"], "agent:start")
        self.assertEqual(got["when"], "2026-01-02T03:04:05")
        self.assertEqual(got["tags"], ["a"])
        self.assertEqual(got["pair"], [1, 2])
        self.assertIsNone(got["nan"])
        self.assertEqual(got["odd"], "odd")
        self.assertEqual(got["1"], "int key")
        self.assertEqual(got["loop"]["self"], "<circular reference>")
        self.assertIn("Unprintable", got["bad"])


class NoServiceTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hh-unit-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.sock = os.path.join(self.tmp, "absent.sock")

    def registry(self, **kwargs) -> HookRegistry:
        registry = HookRegistry(address=self.sock, **kwargs)
        self.addCleanup(registry.close, 0)
        return registry

    def test_emit_never_raises(self) -> None:
        registry = self.registry()
        registry.discover_and_load()
        self.assertEqual(registry.loaded_hooks, [])
        bad = [(["list"], {}), ({"a": 1}, {}), ("agent:start", 5), ("agent:start", "text"),
               (None, None), ("bad name", {})]
        for event, ctx in bad:
            self.assertFalse(registry.emit_nowait(event, ctx))  # type: ignore[arg-type]
            self.assertIsNone(asyncio.run(registry.emit(event, ctx)))  # type: ignore[arg-type]
        self.assertEqual(registry.rejected, 2 * len(bad))
        self.assertTrue(registry.emit_nowait("agent:start", {"x": object()}))
        self.assertEqual(registry.pending, 1)

    def test_the_buffering_warning_names_the_ways_out(self) -> None:
        registry = self.registry()
        with self.assertLogs("hermes_hooks", level="WARNING") as logs:
            registry.emit_nowait("agent:start", {})
            eventually(lambda: any("buffering" in line for line in logs.output), "the warning")
        said = next(line for line in logs.output if "buffering" in line)
        for way in ("hermes-hooks serve", "HERMES_HOOKS_SHIM=1", "autostart=True"):
            self.assertIn(way, said)

    def test_bound_drops_oldest(self) -> None:
        registry = self.registry(queue_size=10)
        results = [registry.emit_nowait("agent:start", {"i": i}) for i in range(50)]
        self.assertEqual(registry.dropped, 40)
        self.assertEqual(registry.pending, 10)
        self.assertTrue(results[-1], "the newest event is kept")

    def test_await_emit_keeps_the_bound_and_the_drop_count(self) -> None:
        # ``await emit`` appends without the lock while there is room (the room the sender
        # precomputes): the bound, the drop count and the order must be those of emit_nowait.
        registry = self.registry(queue_size=10)

        async def burst() -> None:
            for i in range(50):
                await registry.emit("agent:start", {"i": i})

        asyncio.run(burst())
        self.assertEqual(registry.pending + registry.dropped, 50, registry.stats())
        self.assertLessEqual(registry.pending, 10, registry.stats())
        kept = [ctx["i"] for _, ctx in list(registry._queue)]
        self.assertEqual(kept, sorted(kept), "oldest first")
        self.assertEqual(kept[-1], 49, "the newest event is kept")
        registry.close(0)
        asyncio.run(registry.emit("agent:start", {"late": True}))
        self.assertEqual(registry.pending + registry.dropped, 51, "an emit after close is dropped")

    def test_bound_by_bytes_drops_oldest(self) -> None:
        registry = self.registry(queue_bytes=40000, batch_max=5)
        blob = "x" * 1000  # about 1,030 bytes per event as JSON
        self.assertTrue(registry.emit_nowait("agent:step", {"i": -1, "blob": blob}))
        # Once the sender has encoded (and failed to send) its batch, it knows the event size.
        eventually(lambda: registry.last_error, "a first failed send")
        results = [registry.emit_nowait("agent:step", {"i": i, "blob": blob}) for i in range(200)]
        self.assertLessEqual(registry.pending_bytes, 40000, registry.stats())
        self.assertGreater(registry.pending, 30, registry.stats())
        self.assertEqual(registry.pending + registry.dropped, 201, registry.stats())
        self.assertTrue(results[-1], "the newest event is kept")
        self.assertEqual(registry.stats()["pending_bytes"], registry.pending_bytes)

    def test_flush_and_close_without_service(self) -> None:
        registry = self.registry()
        self.assertTrue(registry.flush(0), "nothing buffered: flushed")
        registry.emit_nowait("agent:start")
        start = time.monotonic()
        self.assertFalse(registry.flush(0.2))
        self.assertLess(time.monotonic() - start, 5)
        self.assertFalse(registry.close(0.1))
        self.assertFalse(registry.close(0.1), "close is idempotent")
        self.assertFalse(registry.emit_nowait("agent:start"))
        self.assertEqual(registry.dropped, 1)

    def test_collect_without_service(self) -> None:
        registry = self.registry()
        self.assertEqual(asyncio.run(registry.emit_collect("message:pre_route", {})), [])
        detailed = asyncio.run(registry.emit_collect_detailed("bad name"))
        self.assertIn("whitespace", detailed["error"])
        detailed = asyncio.run(registry.emit_collect_detailed("a:b", "not a dict"))  # type: ignore
        self.assertIn("dict", detailed["error"])

    @unittest.skipUnless(hasattr(os, "fork"), "needs fork")
    def test_forked_child_starts_empty(self) -> None:
        registry = self.registry()
        registry.emit_nowait("agent:start", {"parent": True})
        with warnings.catch_warnings():  # 3.12+: "multi-threaded, fork() may deadlock"
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # child: report through the exit status, never run the parent's tests
            ok = registry.pending == 0 and registry.emit_nowait("agent:start", {"child": True})
            os._exit(0 if ok and registry.pending == 1 else 1)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.WEXITSTATUS(status), 0)
        self.assertEqual(registry.pending, 1)


def _sync_hooks(specs):
    """InGatewayHooks over sync handlers on event ``x`` (no import): ``specs`` is a list of
    (name, handle); returns the registry's in-gateway part."""
    hooks = _ingateway.InGatewayHooks()
    for name, handle in specs:
        hooks._hooks[name] = _ingateway._Hook({"name": name}, handle, None)
    hooks._order = [(name, _ingateway._Patterns(["x"])) for name, _ in specs]
    return hooks


class AgentEndOutcomeTest(unittest.TestCase):
    """Issue 50: a hook that learned a run's outcome by walking its caller's frames to the
    gateway's ``agent_result`` took failed and interrupted runs for answered here (its handler
    runs off the message path). ``emit`` now adds the outcome to ``agent:end``'s context, from
    the gateway's frame, as the gateway's ``_handle_message_with_agent`` has it."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hh-outcome-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.registry = HookRegistry(address=os.path.join(self.tmp, "absent.sock"))
        self.addCleanup(self.registry.close, 0)
        self.seen = []  # type: list
        self.registry._handlers["agent:end"] = [lambda e, c: self.seen.append(c)]

    def gateway_turn(self, agent_result, context, nowait=False):
        """As the gateway: a local ``agent_result``, then ``agent:end`` with the response."""
        registry = self.registry

        async def _handle_message_with_agent():
            agent_result = dict(agent_result_given)  # noqa: F841 - read through the frame
            if nowait:
                registry.emit_nowait("agent:end", context)
            else:
                await registry.emit("agent:end", context)

        agent_result_given = agent_result
        n = len(self.seen)
        asyncio.run(_handle_message_with_agent())
        eventually(lambda: len(self.seen) > n, "the in-process handler")
        return self.seen[-1]

    def test_failed_interrupted_and_answered_runs_say_so(self) -> None:
        ctx = self.gateway_turn({"failed": True, "error": "provider 500"}, {"response": ""})
        self.assertEqual((ctx["outcome"], ctx["failed"], ctx["interrupted"], ctx["error"]),
                         ("failed", True, False, "provider 500"))
        ctx = self.gateway_turn({"interrupted": True, "api_calls": 1}, {"response": "x"},
                                nowait=True)
        self.assertEqual((ctx["outcome"], ctx["interrupted"]), ("interrupted", True))
        self.assertNotIn("error", ctx)
        ctx = self.gateway_turn({"api_calls": 2, "final_response": "hi"}, {"response": "hi"})
        self.assertEqual((ctx["outcome"], ctx["failed"]), ("answered", False))
        self.assertEqual(ctx["response"], "hi")

    def test_a_context_with_an_outcome_or_no_agent_result_is_left_alone(self) -> None:
        given = {"response": "x", "outcome": "custom"}
        self.assertEqual(self.gateway_turn({"failed": True}, given), given)
        self.registry.emit_nowait("agent:end", {"response": "y"})
        eventually(lambda: self.seen and self.seen[-1].get("response") == "y", "the handler")
        self.assertNotIn("outcome", self.seen[-1], "no agent_result in the caller's frames")


class InGatewayLaneTest(unittest.TestCase):
    """Sync in-gateway handlers share one thread; one that overruns gets its own (issue 22)."""

    def test_ten_sync_hooks_share_one_thread_and_keep_their_order(self) -> None:
        seen = []
        threads = set()

        def make(name):
            def handle(event, context):
                threads.add(threading.current_thread().name)
                seen.append((name, context["i"]))
            return handle
        hooks = _sync_hooks([("h%d" % n, make("h%d" % n)) for n in range(10)])
        for i in range(100):
            hooks.dispatch("x", {"i": i})
        eventually(lambda: len(seen) == 1000, "every call")
        self.assertEqual(threads, {"hermes-hook-in-gateway"})
        for n in range(10):
            self.assertEqual([i for name, i in seen if name == "h%d" % n], list(range(100)))

    def test_a_slow_hook_gets_its_own_thread_and_delays_only_itself(self) -> None:
        seen = []
        release = threading.Event()
        self.addCleanup(release.set)

        def fast(event, context):
            seen.append(("fast", context["i"]))

        def slow(event, context):
            if context["i"] == 1:
                release.wait(TIMEOUT)  # blocks until the test has seen the others go on
            seen.append(("slow", context["i"]))
        hooks = _sync_hooks([("slow", slow), ("fast", fast)])
        with self.assertLogs("hermes_hooks", level="WARNING") as logs:
            started = time.monotonic()
            for i in range(5):
                hooks.dispatch("x", {"i": i})
            # The fast hook's events do not wait for the blocked call (handed over after
            # DETACH_AFTER), and the slow hook's later events wait for it, in order.
            eventually(lambda: [i for name, i in seen if name == "fast"] == list(range(5)),
                       "the fast hook's events while the slow one blocks")
            self.assertLess(time.monotonic() - started, TIMEOUT / 2)
            self.assertEqual([i for name, i in seen if name == "slow"], [0])
            release.set()
            eventually(lambda: [i for name, i in seen if name == "slow"] == list(range(5)),
                       "the slow hook's events, in order")
        self.assertTrue(any("slow has run for over" in line for line in logs.output), logs.output)
        # Later events of the slow hook go to its own thread, the others stay on the shared one.
        hooks.dispatch("x", {"i": 5})
        eventually(lambda: ("slow", 5) in seen and ("fast", 5) in seen, "the next event")
        self.assertIsNotNone(hooks._hooks["slow"].lane)
        self.assertIsNone(hooks._hooks["fast"].lane)


class InGatewayRecordTest(unittest.TestCase):
    """The record of in-gateway imports is the gateway's: a process that imported nothing
    writes none, and none replaces the record of another running process (issue 38)."""

    def setUp(self) -> None:
        self.home = tempfile.mkdtemp(prefix="hh-record-")
        self.addCleanup(shutil.rmtree, self.home, True)
        self.path = os.path.join(self.home, _ingateway.RECORD_FILE)

    def test_nothing_imported_writes_no_record(self) -> None:
        _ingateway.InGatewayHooks().load([{"name": "a", "runs": "service"}], self.home)
        self.assertEqual(os.listdir(self.home), [])

    def test_the_record_of_another_running_process_is_kept(self) -> None:
        other = {"pid": os.getppid(), "hooks": {"g": {"sha256": "ab", "handler": "/h.py"}}}
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(other, f)
        with self.assertLogs("hermes_hooks", level="WARNING"):
            _ingateway.InGatewayHooks().load([], self.home)
        with open(self.path, encoding="utf-8") as f:
            self.assertEqual(json.load(f), other)

    def test_the_record_of_a_gone_process_is_replaced(self) -> None:
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump({"pid": 2 ** 22 + 12345, "hooks": {"g": {}}}, f)
        _ingateway.InGatewayHooks().load([], self.home)
        with open(self.path, encoding="utf-8") as f:
            self.assertEqual(json.load(f), {"pid": os.getpid(), "hooks": {}})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1
            self.server.open_sockets.append(self.connection)

    def _reply(self, status: int, payload: object, chunked: bool = False) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(body) // 2
            for part in (body[:half], body[half:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.readyz += 1
            ready = self.server.readyz > self.server.not_ready_for
        if self.path == "/readyz" and ready:
            return self._reply(200, {"ready": True})
        self._reply(503, {"error": {"code": "not_ready", "message": "loading hooks"}})

    def do_POST(self) -> None:
        server = self.server
        data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.auth.append(self.headers.get("Authorization"))
        if self.path == "/v1/collect":
            server.collect_requests.append(data)
            return self._reply(200, {"results": [{"hook": "h1", "result": {"allow": True}},
                                                 {"hook": "h2", "result": 7}],
                                     "errors": [{"hook": "h3", "error": "boom"}]}, chunked=True)
        events = data["events"]
        with server.lock:
            if server.readyz <= server.not_ready_for:
                server.early_batches += 1
            status = server.script.pop(0) if server.script else 202
            server.attempts.append(len(events))
        if status == 202:
            bad = [i for i, e in enumerate(events) if e["event"] in server.poison]
            if bad:
                return self._reply(400, {"error": {"code": "bad_event",
                                                   "message": "events[%d] invalid" % bad[0]}})
            with server.lock:
                server.events.extend(events)
            return self._reply(202, {"queued": [1] * len(events)})
        self._reply(status, {"error": {"code": "scripted", "message": "status %d" % status}})


class ScriptedServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Answers batches with the statuses in ``script`` (then 202), records events and the
    number of connections."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        super().__init__(path, _Handler)
        self.lock = threading.Lock()
        self.script = []  # type: list
        self.poison = set()  # type: set
        self.events = []  # type: list
        self.attempts = []  # type: list
        self.auth = []  # type: list
        self.collect_requests = []  # type: list
        self.connections = 0
        self.readyz = 0  # GET /readyz requests seen
        self.early_batches = 0  # batches that arrived before /readyz said 200
        self.not_ready_for = 0  # how many of them answer 503 before the service is "ready"
        self.open_sockets = []  # type: list
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def get_request(self):
        sock, _ = super().get_request()
        return sock, ("unix-peer", 0)

    def stop(self) -> None:
        """Like a service going away: stop listening and cut the open connections."""
        if self.thread.is_alive():
            self.shutdown()
        self.server_close()
        with self.lock:
            for sock in self.open_sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class SenderTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hh-unit-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.sock = os.path.join(self.tmp, "s.sock")
        self.server = ScriptedServer(self.sock)
        self.addCleanup(self.server.stop)

    def registry(self, **kwargs) -> HookRegistry:
        kwargs.setdefault("backoff_initial", 0.01)
        kwargs.setdefault("backoff_max", 0.05)
        registry = HookRegistry(address=self.sock, **kwargs)
        self.addCleanup(registry.close, 0)
        return registry

    def ids(self) -> list:
        with self.server.lock:
            return [e["context"]["i"] for e in self.server.events]

    def test_one_keep_alive_connection_and_order(self) -> None:
        registry = self.registry(batch_max=50, token="s3cret")
        for i in range(2000):
            registry.emit_nowait("agent:step", {"i": i})
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual(self.ids(), list(range(2000)))
        self.assertEqual(registry.sent, 2000)
        self.assertLessEqual(max(self.server.attempts), 50)
        self.assertEqual(self.server.connections, 1, "all batches on one connection")
        self.assertEqual(set(self.server.auth), {"Bearer s3cret"})

    def test_context_is_copied_at_emit(self) -> None:
        registry = self.registry()
        ctx = {"i": 0, "note": "as emitted"}
        registry.emit_nowait("agent:step", ctx)
        ctx["note"] = "changed by the gateway afterwards"
        ctx["extra"] = True
        self.assertTrue(registry.flush(TIMEOUT))
        with self.server.lock:
            self.assertEqual(self.server.events[0]["context"], {"i": 0, "note": "as emitted"})

    def test_big_events_batched_by_bytes(self) -> None:
        registry = self.registry()
        blob = "y" * 300000  # four of these pass the sender's 1 MiB batch target
        for i in range(12):
            registry.emit_nowait("agent:step", {"i": i, "blob": blob})
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual(self.ids(), list(range(12)))
        self.assertLessEqual(max(self.server.attempts), 4, self.server.attempts)
        self.assertEqual(registry.pending_bytes, 0)

    def test_waits_for_readiness_on_each_new_connection(self) -> None:
        self.server.not_ready_for = 3  # a service still loading its hooks
        registry = self.registry()
        for i in range(5):
            registry.emit_nowait("agent:step", {"i": i})
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual(self.ids(), list(range(5)))
        self.assertEqual(self.server.readyz, 4)
        self.assertEqual(self.server.early_batches, 0, "a batch sent before ready")
        self.assertEqual(self.server.connections, 1)

    def test_503_and_500_are_retried_without_loss(self) -> None:
        self.server.script = [503, 503, 500, 502]
        registry = self.registry()
        for i in range(20):
            registry.emit_nowait("agent:step", {"i": i})
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual(sorted(set(self.ids())), list(range(20)))
        self.assertEqual((registry.sent, registry.rejected, registry.dropped), (20, 0, 0))

    def test_persistent_500_isolates_then_rejects(self) -> None:
        self.server.script = [500] * 3 + [202] + [500] * 3
        registry = self.registry()
        for i in range(2):
            registry.emit_nowait("agent:step", {"i": i})
        # Whatever the batching, three 500s in a row for one batch make the client stop
        # retrying it: it is split (or, alone, rejected); nothing is retried forever.
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual(registry.sent + registry.rejected, 2)
        self.assertGreaterEqual(registry.rejected, 1)

    def test_400_costs_only_the_bad_event(self) -> None:
        self.server.poison = {"poison:event"}
        registry = self.registry(validate_events=False)
        self.server.script = [503]  # hold the first batch so the rest accumulate
        for i in range(30):
            registry.emit_nowait("agent:step" if i != 17 else "poison:event", {"i": i})
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual(self.ids(), [i for i in range(30) if i != 17])
        self.assertEqual((registry.sent, registry.rejected), (29, 1))

    def test_401_rejects_the_batch(self) -> None:
        self.server.script = [401]
        registry = self.registry()
        registry.emit_nowait("agent:step", {"i": 0})
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual(registry.rejected, 1)
        self.assertIn("401", registry.last_error)
        registry.emit_nowait("agent:step", {"i": 1})
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual(self.ids(), [1])

    def test_server_gone_and_back(self) -> None:
        registry = self.registry()
        registry.emit_nowait("agent:step", {"i": 0})
        self.assertTrue(registry.flush(TIMEOUT))
        self.server.stop()
        os.unlink(self.sock)
        for i in range(1, 100):
            registry.emit_nowait("agent:step", {"i": i})
        eventually(lambda: not registry.connected, "the client to see the outage")
        first = self.server
        self.server = ScriptedServer(self.sock)
        self.addCleanup(self.server.stop)
        self.assertTrue(registry.flush(TIMEOUT))
        self.assertEqual([e["context"]["i"] for e in first.events] + self.ids(), list(range(100)))
        self.assertTrue(registry.connected)

    def test_collect_parses_chunked_answer(self) -> None:
        registry = self.registry(collect_timeout=2.5)
        self.assertEqual(asyncio.run(registry.emit_collect("command:deploy", {"args": "x"})),
                         [{"allow": True}, 7])
        request = self.server.collect_requests[0]
        self.assertEqual(request, {"event": "command:deploy", "context": {"args": "x"},
                                   "timeout_ms": 2500})
        detailed = asyncio.run(registry.emit_collect_detailed("command:deploy"))
        self.assertEqual(detailed["errors"], [{"hook": "h3", "error": "boom"}])
        self.assertIsNone(detailed["error"])

    def test_discover_and_load_reads_hooks(self) -> None:
        def fake(address, method, path, body=None, headers=None, timeout=5.0, peer=None):
            self.assertEqual((method, path), ("GET", "/v1/hooks"))
            return 200, json.dumps({
                "hooks": [{"name": "h", "events": ["agent:*"], "path": "/x/h", "kind": "python",
                           "description": None}],
                "skipped": [{"dir": "/x/b", "name": "b", "reason": "no events"}]}).encode()

        registry = self.registry()
        with mock.patch.object(_transport, "request", fake):
            registry.discover_and_load()
        self.assertEqual(registry.loaded_hooks, [{"name": "h", "description": "",
                                                  "events": ["agent:*"], "path": "/x/h",
                                                  "kind": "python"}])
        self.assertEqual(registry.skipped[0]["reason"], "no events")


if __name__ == "__main__":
    unittest.main()
