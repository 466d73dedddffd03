"""Issue 58, the client's rows (2, 3, 4, 5, 6, 7): what the agent plugin and ``agent:end`` got wrong
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
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hermes_hooks import _outcome, agent_plugin  # noqa: E402

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


def _socket_fds() -> int:
    """This process's open sockets (every connection the plugin holds is one)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd).startswith("socket:"):
                count += 1
        except OSError:
            pass  # closed while listed
    return count


def _eventually(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)  # polling against the deadline above


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: these cases drive the real service")
@unittest.skipUnless(os.path.isdir("/proc/self/fd"), "counts descriptors in /proc/self/fd")
class Row4ConnectionsAreBounded(_PluginCase):
    """Row 4: 300 ``pre_tool_call`` calls, each on a short-lived thread, left 300 connections
    open in the agent (and on the service), some still open after 75 s idle: the bridge kept
    one per thread forever. Now they share a few, closed after a short idle time."""

    def test_short_lived_threads_leave_no_connections(self) -> None:
        self.hook("gate", ["pre_tool_call"], "return None")
        with mock.patch.object(agent_plugin, "POOL_IDLE_SECONDS", 1.0, create=True):
            bridge, ctx = self.bridge()
        call = ctx.hooks["pre_tool_call"][0]
        self.assertIsNone(call(tool_name="terminal", args={}, session_id="s"))
        before = _socket_fds()
        answers = []
        for i in range(300):
            t = threading.Thread(target=lambda: answers.append(
                call(tool_name="terminal", args={"i": 1}, session_id="s")))
            t.start()
            t.join()
        self.assertEqual(answers, [None] * 300)
        self.assertLessEqual(_socket_fds(), before + 1, "a connection per thread")
        # Idle: the kept connections close by themselves, well before the service's 60 s cut.
        _eventually(lambda: _socket_fds() <= before - 1, "the idle connection to close", 10)

    def test_threads_at_once_share_a_bounded_pool(self) -> None:
        """Many threads deciding at once each get a connection; afterwards at most the pool's
        bound stays open, and every answer is right (the pool is thread-safe)."""
        self.hook("gate", ["pre_tool_call"],
                  "time.sleep(0.01)\n"
                  "return {'action': 'block', 'message': str(context['tool_input']['i'])}")
        bridge, ctx = self.bridge()
        call = ctx.hooks["pre_tool_call"][0]
        before = _socket_fds()
        answers = {}
        barrier = threading.Barrier(24)

        def run(i: int) -> None:
            barrier.wait()
            for j in range(5):
                answer = call(tool_name="terminal", args={"i": i * 100 + j}, session_id="s")
                answers[(i, j)] = answer["message"]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(answers, {(i, j): str(i * 100 + j) for i in range(24) for j in range(5)})
        self.assertLessEqual(_socket_fds(), before + getattr(agent_plugin, "POOL_IDLE_MAX", 8))


class _HermesWithRunner:
    """The parts of Hermes (0.19.0) the plugin meets when it hands config.yaml's entries over,
    in our own words: the configured entries (``agent.shell_hooks``), the set of entries its
    runner registered and the plugin manager's callbacks, which its runner adds to as it
    registers an entry (a closure over the entry, running its command with the context on
    stdin) and which :meth:`fire` calls in turn, as its ``invoke_hook`` does."""

    class Spec:
        def __init__(self, event: str, command: str, matcher=None) -> None:
            self.event, self.command, self.matcher = event, command, matcher

    def __init__(self, config: dict) -> None:
        import types
        self.config = config
        self.hooks = {}  # type: dict
        shell_hooks = types.ModuleType("agent.shell_hooks")
        shell_hooks._registered = set()
        shell_hooks._registered_lock = threading.Lock()
        shell_hooks.iter_configured_hooks = lambda cfg: [
            self.Spec(event, e["command"], e.get("matcher"))
            for event, entries in (cfg.get("hooks") or {}).items() for e in entries]
        self.shell_hooks = shell_hooks
        agent = types.ModuleType("agent")
        agent.shell_hooks = shell_hooks
        hermes_cli = types.ModuleType("hermes_cli")
        config_mod = types.ModuleType("hermes_cli.config")
        config_mod.load_config = lambda: self.config
        plugins_mod = types.ModuleType("hermes_cli.plugins")
        manager = types.SimpleNamespace(_hooks=self.hooks)
        plugins_mod.get_plugin_manager = lambda: manager
        hermes_cli.config, hermes_cli.plugins = config_mod, plugins_mod
        self.modules = {"agent": agent, "agent.shell_hooks": shell_hooks,
                        "hermes_cli": hermes_cli, "hermes_cli.config": config_mod,
                        "hermes_cli.plugins": plugins_mod}

    def register_hook(self, name: str, callback) -> None:  # the plugin's PluginContext
        self.hooks.setdefault(name, []).append(callback)

    def register_entry(self, spec) -> None:
        """What the runner does with an entry approved at its prompt."""
        def runner(**kwargs):
            subprocess.run(shlex.split(spec.command), input=json.dumps(kwargs, default=str),
                           text=True, timeout=30, check=False)
        with self.shell_hooks._registered_lock:
            key = (spec.event, spec.matcher, spec.command)
            if key not in self.shell_hooks._registered:
                self.shell_hooks._registered.add(key)
                self.hooks.setdefault(spec.event, []).append(runner)

    def fire(self, event: str, **kwargs) -> list:
        return [r for r in (cb(**kwargs) for cb in self.hooks.get(event, [])) if r is not None]


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: this case drives the real service")
class Row5ApprovedDuringASessionRunsOnce(_PluginCase):
    """Row 5: config.yaml entry ``c2`` is added and approved at Hermes's prompt during a session
    while ``c1`` is hosted: Hermes's runner registers ``c2`` and the service, seeing the
    allowlist change, hosts it too. Before, the plugin handed entries over only when it
    registered, so ``c2`` ran twice per event (the service's worker and Hermes's runner)."""

    def write_config(self, commands: list) -> None:
        self.config["hooks"]["pre_tool_call"] = [{"command": c} for c in commands]
        with open(os.path.join(self.home, "config.yaml"), "w") as f:
            f.write("hooks:\n  pre_tool_call:\n%s" % "".join(
                "    - command: %s\n" % json.dumps(c) for c in commands))
        with open(os.path.join(self.home, "shell-hooks-allowlist.json"), "w") as f:
            json.dump({"approvals": [{"event": "pre_tool_call", "command": c}
                                     for c in commands]}, f)

    def test_an_entry_approved_during_a_session_runs_once(self) -> None:
        ran = os.path.join(self.tmp, "ran")
        c1 = "sh -c 'cat > /dev/null'"
        c2 = "sh -c 'cat > /dev/null; echo c2 >> %s'" % ran
        self.config = {"hooks": {}}
        self.write_config([c1])
        hermes = _HermesWithRunner(self.config)
        service = self.Service(self.tmp, self.home, self.hooks_dir, ["--socket", self.sock],
                               self.sock)
        self.addCleanup(service.stop)
        env = {"HERMES_HOOKS_ADDRESS": self.sock, "HERMES_HOOKS_AUTOSTART": "0"}
        with mock.patch.dict(os.environ, env), mock.patch.dict(sys.modules, hermes.modules), \
                mock.patch.object(agent_plugin, "_bridge", None):
            agent_plugin.register(hermes)
            bridge = agent_plugin._bridge
            self.addCleanup(bridge.registry.close, 0)
            self.addCleanup(bridge.close)
            self.assertIn(("pre_tool_call", None, c1), hermes.shell_hooks._registered)
            # During the session: c2 added, approved at the prompt, registered by the runner.
            self.write_config([c1, c2])
            hermes.register_entry(hermes.Spec("pre_tool_call", c2))
            name = agent_plugin.shell_hook_name(c2)
            deadline = time.monotonic() + 30
            while name not in {h.get("name") for h in _hooks_of(self.sock)}:
                self.assertLess(time.monotonic(), deadline, "the service did not host c2")
                time.sleep(0.02)  # polling the service's own reload against the deadline
            for calls in (1, 2):
                hermes.fire("pre_tool_call", tool_name="terminal", args={"command": "ls"},
                            session_id="s1", task_id="", tool_call_id="c%d" % calls)
                with open(ran) as f:
                    self.assertEqual(f.read().count("c2"), calls,
                                     "c2 ran in the service and in Hermes's runner")


def _hooks_of(sock: str) -> list:
    """The hooks the service at ``sock`` lists (``GET /v1/hooks``)."""
    from hermes_hooks import _transport
    status, raw = _transport.request(_transport.parse_address(sock), "GET", "/v1/hooks", None,
                                     {}, timeout=10.0)
    return json.loads(raw.decode("utf-8")).get("hooks", []) if status == 200 else []


class _OneShotServer:
    """A scripted service on a Unix socket that records each request (its connection number and
    body) and answers by ``script``: ``script(n)`` for the n-th request (from 1) says what to do
    after reading it: ``"answer"`` (keep-alive), ``"answer-then-close"`` or ``"cut"`` (close
    without answering, as a service that dies or drops the connection after reading)."""

    ANSWER = json.dumps({"results": [{"hook": "gate", "result": {"action": "block",
                                                                  "message": "scripted"}}],
                         "errors": []}).encode()

    def __init__(self, path: str, script) -> None:
        self.path = path
        self.script = script
        self.requests = []  # type: list
        self.connections = 0
        self.closed = threading.Event()  # set when the server closed a connection itself
        self.lock = threading.Lock()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                number = self.connections
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        rfile = conn.makefile("rb")
        try:
            while True:
                head = rfile.readline()
                if not head:
                    return
                length = 0
                while True:
                    line = rfile.readline()
                    if line in (b"\r\n", b""):
                        break
                    key, _, value = line.decode("latin-1").partition(":")
                    if key.strip().lower() == "content-length":
                        length = int(value)
                body = rfile.read(length)
                with self.lock:
                    self.requests.append((number, json.loads(body.decode())))
                    what = self.script(len(self.requests))
                if what == "cut":
                    return
                if what == "slow":
                    time.sleep(0.2)  # many requests in flight at once, on as many connections
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(self.ANSWER), self.ANSWER))
                if what == "answer-then-close":
                    return
        finally:
            rfile.close()
            conn.close()
            self.closed.set()


class PoolWithoutTheService(unittest.TestCase):
    """Row 4's pool on its own (it runs without the service binary too): connections in use at
    once are what the callers need, at most ``max_idle`` stay, and those close once idle."""

    def test_bound_and_idle_close(self) -> None:
        from hermes_hooks import _transport
        tmp = tempfile.mkdtemp(prefix="hh-i58-pool-")
        self.addCleanup(shutil.rmtree, tmp, True)
        path = os.path.join(tmp, "s.sock")
        server = _OneShotServer(path, lambda n: "slow")
        self.addCleanup(server.stop)
        pool = _transport.KeepAlivePool(_transport.parse_address(path), 10.0, max_idle=3,
                                        idle_seconds=0.5)
        self.addCleanup(pool.close)
        barrier = threading.Barrier(10)
        statuses = []

        def run() -> None:
            barrier.wait()
            statuses.append(pool.request("POST", "/v1/collect", b"{}", {})[0])

        threads = [threading.Thread(target=run) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(statuses, [200] * 10)
        self.assertGreater(server.connections, 3, "the requests were in flight at once")
        self.assertEqual(pool.opened, server.connections)
        self.assertEqual(pool.idle_count(), 3)
        # Reused, not reopened; then closed by the reaper when idle.
        pool.request("POST", "/v1/collect", b"{}", {})
        self.assertEqual(pool.opened, server.connections)
        _eventually(lambda: pool.idle_count() == 0, "the idle connections to close", 10)
        _eventually(lambda: server.closed.is_set(), "the server to see them closed", 10)


class Row6NoResendAfterSending(unittest.TestCase):
    """Row 6: after a ``ConnectionError`` on a reused connection the plugin sent the collect
    again, though the service may have read it and run the hooks: a decision could run twice.
    Now a collect is sent again only when it certainly did not leave (see
    ``_transport.KeepAlivePool``)."""

    def setUp(self) -> None:
        from hermes_hooks import HookRegistry
        self.tmp = tempfile.mkdtemp(prefix="hh-i58-6-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.sock = os.path.join(self.tmp, "s.sock")
        self.registry = HookRegistry(address=self.sock, autostart=False)
        self.addCleanup(self.registry.close, 0)

    def serve(self, script) -> "_OneShotServer":
        server = _OneShotServer(self.sock, script)
        self.addCleanup(server.stop)
        return server

    def bridge(self, fail_closed=()):
        from hermes_hooks.agent_plugin import AgentBridge
        bridge = AgentBridge(self.registry, fail_closed)
        self.addCleanup(bridge.close)
        return bridge.callback("pre_tool_call")

    def test_a_collect_cut_after_it_was_read_is_not_sent_again(self) -> None:
        server = self.serve(lambda n: "cut" if n == 2 else "answer")
        call = self.bridge()
        self.assertEqual(call(tool_name="t", args={"n": 1})["message"], "scripted")
        with mock.patch("sys.stderr", io.StringIO()):
            self.assertIsNone(call(tool_name="t", args={"n": 2}), "fails open, once")
        self.assertEqual([body["context"]["tool_input"]["n"] for _, body in server.requests],
                         [1, 2], "the second collect was sent twice")
        # Fail closed: the same cut blocks, still without a second copy.
        call = self.bridge(["pre_tool_call"])
        self.assertEqual(call(tool_name="t", args={"n": 3})["message"], "scripted")
        server.script = lambda n: "cut"
        self.assertEqual(call(tool_name="t", args={"n": 4})["action"], "block")
        self.assertEqual([body["context"]["tool_input"]["n"] for _, body in server.requests],
                         [1, 2, 3, 4])

    def test_a_connection_closed_while_idle_is_replaced_before_sending(self) -> None:
        """The case that may be retried: the service closed the kept-alive connection while it
        was idle; the plugin sees it before writing, and the collect goes once, on a new one."""
        server = self.serve(lambda n: "answer-then-close" if n == 1 else "answer")
        call = self.bridge()
        self.assertEqual(call(tool_name="t", args={"n": 1})["message"], "scripted")
        server.closed.wait(10)
        self.assertEqual(call(tool_name="t", args={"n": 2})["message"], "scripted")
        self.assertEqual(server.requests, [(1, mock.ANY), (2, mock.ANY)])

    def test_a_first_write_that_took_nothing_is_sent_on_a_new_connection(self) -> None:
        """Closed so late that the idle check misses it: the first write fails with no byte
        taken (EPIPE on a Unix socket), which is still certain not to have arrived."""
        from hermes_hooks import _transport
        server = self.serve(lambda n: "answer-then-close" if n == 1 else "answer")
        call = self.bridge()
        self.assertEqual(call(tool_name="t", args={"n": 1})["message"], "scripted")
        server.closed.wait(10)
        with mock.patch.object(_transport.KeepAliveConnection, "idle_closed",
                               lambda self: False):
            self.assertEqual(call(tool_name="t", args={"n": 2})["message"], "scripted")
        self.assertEqual([(c, b["context"]["tool_input"]["n"]) for c, b in server.requests],
                         [(1, 1), (2, 2)])


class _AsHermesLogs:
    """Logging as under Hermes: the root logger has handlers (its log files), so a WARNING
    reaches no terminal (without one, Python's last-resort handler would print it)."""

    def __enter__(self):
        import logging
        self.records = []  # type: list
        self.handler = logging.Handler()
        self.handler.emit = self.records.append  # type: ignore[assignment]
        logging.getLogger().addHandler(self.handler)
        return self

    def __exit__(self, *exc) -> None:
        import logging
        logging.getLogger().removeHandler(self.handler)


def _fail_open_lines(text: str) -> list:
    return [line for line in text.splitlines() if "fail open" in line]


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: these cases drive the real service")
class Row7FailOpenIsSaidInTheTerminal(_PluginCase):
    """Row 7: a gate that failed open (service down, hook failing) said so only in WARNING lines
    of ``logs/agent.log``. Now one line in the terminal per session, naming the hook and the
    cause, not one per call."""

    def test_a_failing_hook_is_said_once_per_session(self) -> None:
        self.hook("gate", ["pre_tool_call"], "raise KeyError(context['tool_input']['n'])")
        self.hook("ctx", ["pre_llm_call"], "time.sleep(3)", timeout=1)
        bridge, ctx = self.bridge()
        stderr = io.StringIO()
        with _AsHermesLogs() as logs, mock.patch("sys.stderr", stderr):
            for n in range(20):
                self.assertIsNone(ctx.hooks["pre_tool_call"][0](
                    tool_name="terminal", args={"n": n}, session_id="s1"))
            lines = _fail_open_lines(stderr.getvalue())
            self.assertEqual(len(lines), 1, stderr.getvalue())
            self.assertIn("pre_tool_call", lines[0])
            self.assertIn("hook gate", lines[0])
            self.assertIn("KeyError", lines[0])
            self.assertEqual(len(logs.records), 20, "each call is still logged")
            # Another session is told again; a hook timing out is its own line.
            ctx.hooks["pre_tool_call"][0](tool_name="terminal", args={"n": 0}, session_id="s2")
            ctx.hooks["pre_llm_call"][0](session_id="s2", user_message="hi")
            ctx.hooks["pre_llm_call"][0](session_id="s2", user_message="hi")
        lines = _fail_open_lines(stderr.getvalue())
        self.assertEqual(len(lines), 3, stderr.getvalue())
        self.assertIn("hook ctx", lines[2])
        self.assertIn("timed out", lines[2])

    def test_a_service_that_is_gone_is_said_once(self) -> None:
        self.hook("gate", ["pre_tool_call"], "return None")
        bridge, ctx = self.bridge()
        self.service.stop()
        stderr = io.StringIO()
        with _AsHermesLogs(), mock.patch("sys.stderr", stderr):
            for n in range(10):
                self.assertIsNone(ctx.hooks["pre_tool_call"][0](
                    tool_name="terminal", args={}, session_id="s1"))
        lines = _fail_open_lines(stderr.getvalue())
        self.assertEqual(len(lines), 1, stderr.getvalue())
        self.assertIn("hook gate", lines[0])
        self.assertIn("unreachable", lines[0])

    def test_failing_closed_is_no_fail_open_line(self) -> None:
        self.hook("gate", ["pre_tool_call"], "raise KeyError('x')")
        bridge, ctx = self.bridge(fail_closed=["pre_tool_call"])
        stderr = io.StringIO()
        with _AsHermesLogs(), mock.patch("sys.stderr", stderr):
            answer = ctx.hooks["pre_tool_call"][0](tool_name="terminal", args={}, session_id="s")
        self.assertEqual(answer["action"], "block")
        self.assertEqual(_fail_open_lines(stderr.getvalue()), [])

    def test_inside_the_interactive_cli_it_goes_through_hermes_printer(self) -> None:
        """``hermes chat``'s screen (prompt_toolkit running): the CLI's own ``_cprint``, which
        prints above the input area (a fake of Hermes's ``cli`` module and of prompt_toolkit's
        ``get_app_or_none``)."""
        import types
        self.hook("gate", ["pre_tool_call"], "raise KeyError('x')")
        bridge, ctx = self.bridge()
        printed = []
        cli = types.ModuleType("cli")
        cli._cprint = printed.append  # type: ignore[attr-defined]
        app = types.SimpleNamespace(_is_running=True)
        pt_app = types.ModuleType("prompt_toolkit.application")
        pt_app.get_app_or_none = lambda: app  # type: ignore[attr-defined]
        stderr = io.StringIO()
        with _AsHermesLogs(), mock.patch("sys.stderr", stderr), \
                mock.patch.dict(sys.modules, {"cli": cli, "prompt_toolkit.application": pt_app}):
            for _ in range(3):
                ctx.hooks["pre_tool_call"][0](tool_name="terminal", args={}, session_id="s")
        self.assertEqual(len(_fail_open_lines("\n".join(printed))), 1, printed)
        self.assertEqual(stderr.getvalue(), "")


if __name__ == "__main__":
    unittest.main()
