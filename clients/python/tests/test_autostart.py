"""Autostart (``hermes_hooks._autostart``) and the protocol check, against the real service.

Needs the service binary (``HERMES_HOOKS_BIN``, as ``test_client.py``). Gateways are separate
Python processes here, as in production: the start lock and the lease are ``flock``s that the
kernel releases when a process ends. Every wait polls against a deadline.
"""

import http.server
import json
import logging
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.dirname(HERE)
sys.path.insert(0, CLIENT)

from hermes_hooks import HookRegistry, _autostart, _transport  # noqa: E402

# Absolute: the tests start gateways in other directories (a relative HERMES_HOOKS_BIN, as in
# the README's `HERMES_HOOKS_BIN=target/debug/hermes-hooks`, would not be found there).
BIN = os.path.abspath(os.environ["HERMES_HOOKS_BIN"]) if os.environ.get("HERMES_HOOKS_BIN") else None
#: Seconds a gateway process gets to start the service and deliver (debug build, busy machine).
TIMEOUT = 60.0

GATEWAY = textwrap.dedent("""
    import json, sys
    from hermes_hooks import HookRegistry
    registry = HookRegistry(autostart=True, autostart_timeout=30,
                            serve_args=["--hooks-dir", sys.argv[1]])
    registry.discover_and_load()
    registry.emit_nowait("agent:start", {"gateway": sys.argv[2]})
    flushed = registry.flush(30)
    proc = registry.service_process
    print(json.dumps({"started": proc.pid if proc else None, "flushed": flushed,
                      "hooks": [h["name"] for h in registry.loaded_hooks]}), flush=True)
    sys.stdin.read()  # stay up until the test closes stdin
""")


def _dead(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it no longer serves)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _wait(what: str, check, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: these tests start the real service")
class TwoGateways(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hh-autostart-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.home = os.path.join(self.tmp, "home")
        self.hooks = os.path.join(self.tmp, "hooks")
        self.out = os.path.join(self.tmp, "events.jsonl")
        self.cwd = os.path.join(self.tmp, "gateway-cwd")
        os.makedirs(self.cwd)
        hook = os.path.join(self.hooks, "logger")
        os.makedirs(hook)
        with open(os.path.join(hook, "HOOK.yaml"), "w") as f:
            f.write('name: logger\nevents: ["agent:start"]\n')
        with open(os.path.join(hook, "handler.py"), "w") as f:
            f.write("import json\n"
                    "def handle(event_type, context):\n"
                    "    with open(%r, 'a') as f:\n"
                    "        f.write(json.dumps(context) + '\\n')\n"
                    % self.out)
        os.chmod(self.tmp, 0o700)

    def gateway(self, name: str) -> subprocess.Popen:
        env = dict(os.environ, HERMES_HOME=self.home, HERMES_HOOKS_BIN=BIN,
                   HERMES_HOOKS_AUTOSTART_LINGER="0.5", PYTHONPATH=CLIENT,
                   PYTHONDONTWRITEBYTECODE="1")
        env.pop("HERMES_HOOKS_ADDRESS", None)
        proc = subprocess.Popen([sys.executable, "-c", GATEWAY, self.hooks, name], env=env,
                                cwd=self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.addCleanup(self._reap, proc)
        return proc

    @staticmethod
    def _reap(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()

    def test_two_gateways_at_once_start_one_service_that_stops_after_the_last(self) -> None:
        gateways = [self.gateway("a"), self.gateway("b")]
        reports = []
        for proc in gateways:
            line = proc.stdout.readline()
            if not line:
                self.fail("gateway said nothing: %s" % proc.communicate()[1].decode())
            reports.append(json.loads(line))
        started = [r["started"] for r in reports if r["started"]]
        self.assertEqual(len(started), 1, "exactly one gateway starts the service: %r" % reports)
        pid = started[0]
        self.addCleanup(self._kill, pid)
        for report in reports:
            self.assertTrue(report["flushed"], report)
            self.assertEqual(report["hooks"], ["logger"])
        lines = _wait("both events handled", lambda: self._lines(2))
        self.assertEqual(sorted(line["gateway"] for line in lines), ["a", "b"])
        # The gateway's working directory, its own session, the log under $HERMES_HOME.
        self.assertEqual(os.readlink("/proc/%d/cwd" % pid), os.path.realpath(self.cwd))
        self.assertEqual(os.getsid(pid), pid, "the service leads its own session")
        log_path = os.path.join(self.home, "logs", "hooks.log")
        with open(log_path) as f:
            self.assertIn("listening on", f.read())

        # The first gateway goes (its lease with it): the other keeps the service up past the
        # linger. Then the last goes, and the service stops by itself.
        first = gateways[0]
        first.stdin.close()
        first.wait(TIMEOUT)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            self.assertFalse(_dead(pid), "the service stopped while a gateway still ran")
            time.sleep(0.1)  # sampling a "still running" state
        gateways[1].stdin.close()
        gateways[1].wait(TIMEOUT)
        _wait("the service to stop after the last gateway", lambda: _dead(pid))
        with open(log_path) as f:
            self.assertIn("no gateway has held the lease", f.read())

    def _lines(self, n: int):
        try:
            with open(self.out) as f:
                lines = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return None
        return lines if len(lines) >= n else None

    @staticmethod
    def _kill(pid: int) -> None:
        if not _dead(pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass


class _OtherProtocol(http.server.BaseHTTPRequestHandler):
    """A service that says protocol 2 on every answer."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        body = b'{"status": "ready", "hooks": []}'
        self.send_response(200)
        self.send_header("Hermes-Hooks-Protocol", "2")
        self.send_header("Server", "hermes-hooks/9.0.0")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # BaseHTTPRequestHandler wants a (host, port) client address
        sock, _ = super().get_request()
        return sock, ("local", 0)


class Protocol(unittest.TestCase):
    def test_a_service_of_another_protocol_is_refused_and_not_replaced(self) -> None:
        tmp = tempfile.mkdtemp(prefix="hh-proto-")
        self.addCleanup(shutil.rmtree, tmp, True)
        sock = os.path.join(tmp, "hooks.sock")
        server = _UnixServer(sock, _OtherProtocol)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        registry = HookRegistry(address=sock, autostart=True, binary="/nonexistent/hermes-hooks",
                                hermes_home=tmp, backoff_max=0.05)
        self.addCleanup(registry.close, 0)
        with self.assertLogs("hermes_hooks", logging.WARNING) as logs:
            registry.discover_and_load()
        text = "\n".join(logs.output)
        self.assertIn("speaks protocol 2", text)
        self.assertIn("hermes-hooks/9.0.0", text)
        # Issue 50: what works here (the wheel from maturin, or ./clients/python), not a
        # `pip install hermes-hooks==` that no index answers.
        self.assertIn("maturin build --release", text)
        self.assertIn("pip install ./clients/python", text)
        self.assertNotIn("pip install hermes-hooks", text)
        self.assertIsNone(registry.service_process, "no second service beside it")
        self.assertEqual(registry.loaded_hooks, [])
        registry.emit_nowait("agent:start", {})
        self.assertFalse(registry.flush(0.5))
        self.assertEqual(registry.sent, 0)
        self.assertIn("protocol 2", registry.last_error or "")

    def test_a_service_that_says_no_protocol_speaks_the_first(self) -> None:
        _transport.check_protocol({}, "x")
        _transport.check_protocol({"hermes-hooks-protocol": " 1 "}, "x")
        with self.assertRaises(_transport.IncompatibleService):
            _transport.check_protocol({"hermes-hooks-protocol": "2"}, "x")


class Settings(unittest.TestCase):
    def test_autostart_follows_the_argument_then_the_environment_then_the_shim(self) -> None:
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop(_autostart.ENV, None)
            with mock.patch.object(_autostart, "shim_active", False):
                self.assertFalse(_autostart.wanted(None))
                self.assertTrue(_autostart.wanted(True))
            with mock.patch.object(_autostart, "shim_active", True):
                self.assertTrue(_autostart.wanted(None))
                self.assertFalse(_autostart.wanted(False))
                os.environ[_autostart.ENV] = "0"
                self.assertFalse(_autostart.wanted(None))
            os.environ[_autostart.ENV] = "1"
            self.assertTrue(_autostart.wanted(None))

    def test_the_binary_is_the_argument_the_environment_then_the_bundled_one(self) -> None:
        tmp = tempfile.mkdtemp(prefix="hh-bin-")
        self.addCleanup(shutil.rmtree, tmp, True)
        bundled = os.path.join(tmp, "hermes-hooks")
        with open(bundled, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(bundled, 0o755)
        with mock.patch.dict(os.environ, {_transport.BIN_ENV: "/env/hermes-hooks"}):
            self.assertEqual(_autostart.find_binary("/arg/hh"), "/arg/hh")
            self.assertEqual(_autostart.find_binary(), "/env/hermes-hooks")
            del os.environ[_transport.BIN_ENV]
            with mock.patch("sysconfig.get_path", return_value=tmp):
                self.assertEqual(_autostart.find_binary(), bundled)

    def test_a_relative_binary_in_the_environment_is_taken_from_the_import_directory(self) -> None:
        """Issue 50: the README's ``HERMES_HOOKS_BIN=target/debug/hermes-hooks`` failed once the
        gateway had changed directory; it now names the file relative to where the client was
        imported, and a missing one is reported with the variable and that directory."""
        with mock.patch.object(_autostart, "_IMPORT_CWD", "/checkout"), \
                mock.patch.dict(os.environ, {_transport.BIN_ENV: "target/debug/hermes-hooks"}):
            self.assertEqual(_autostart.find_binary(), "/checkout/target/debug/hermes-hooks")
            os.environ[_transport.BIN_ENV] = "hermes-hooks"
            self.assertEqual(_autostart.find_binary(), "hermes-hooks", "a bare name: PATH")
        tmp = tempfile.mkdtemp(prefix="hh-rel-")
        self.addCleanup(shutil.rmtree, tmp, True)
        address = _transport.parse_address(os.path.join(tmp, "hooks.sock"))
        with mock.patch.object(_autostart, "_IMPORT_CWD", tmp), \
                mock.patch.dict(os.environ, {_transport.BIN_ENV: "target/debug/hermes-hooks"}), \
                self.assertLogs("hermes_hooks", logging.WARNING) as logs:
            proc = _autostart._start(address, tmp, os.path.join(tmp, "lease"), binary=None,
                                     serve_args=[], deadline=time.monotonic() + 1,
                                     log_path=None, env_home=True, headers={},
                                     request_timeout=1.0)
        self.assertIsNone(proc)
        text = "\n".join(logs.output)
        self.assertIn(os.path.join(tmp, "target/debug/hermes-hooks"), text)
        self.assertIn("HERMES_HOOKS_BIN", text)
        self.assertIn("absolute path", text)

    def test_a_remote_tcp_address_is_never_autostarted(self) -> None:
        address = _transport.parse_address("http://192.0.2.1:8787")
        with mock.patch.object(_autostart, "_start") as start:
            self.assertIsNone(_autostart.ensure_service(address, "/nonexistent", headers={}))
        start.assert_not_called()


NEWCOMER = textwrap.dedent("""
    import json, sys
    from hermes_hooks import HookRegistry
    registry = HookRegistry(autostart=True, autostart_timeout=float(sys.argv[2]),
                            serve_args=["--hooks-dir", sys.argv[1]])
    registry.discover_and_load()
    registry.emit_nowait("agent:start", {"gateway": "new"})
    flushed = registry.flush(30)
    proc = registry.service_process
    print(json.dumps({"started": proc.pid if proc else None, "flushed": flushed}), flush=True)
    sys.stdin.read()  # stay up (holding the lease) until the test closes stdin
""")


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: these tests start the real service")
class Draining(unittest.TestCase):
    def test_a_draining_service_is_not_adopted_a_new_one_takes_its_socket_over(self) -> None:
        # Issue 33: the previous gateway's service is draining (a call still running) when a
        # new gateway starts. It used to be adopted after the autostart timeout, and the new
        # gateway's events were lost when it exited.
        tmp = tempfile.mkdtemp(prefix="hh-drain-")
        self.addCleanup(shutil.rmtree, tmp, True)
        os.chmod(tmp, 0o700)
        home, hooks = os.path.join(tmp, "home"), os.path.join(tmp, "hooks")
        out, started, release = (os.path.join(tmp, n) for n in ("out.jsonl", "started", "go"))
        os.makedirs(os.path.join(hooks, "recorder"))
        os.makedirs(home, mode=0o700)
        with open(os.path.join(hooks, "recorder", "HOOK.yaml"), "w") as f:
            f.write('name: recorder\nevents: ["agent:*"]\ntimeout: 120\n')
        with open(os.path.join(hooks, "recorder", "handler.py"), "w") as f:
            f.write(textwrap.dedent("""
                import json, os, time
                def handle(event_type, context):
                    if context.get("hold"):
                        open(%r, "w").close()
                        deadline = time.monotonic() + 60
                        while not os.path.exists(%r) and time.monotonic() < deadline:
                            time.sleep(0.05)  # held until the test releases it
                    with open(%r, "a") as f:
                        f.write(json.dumps(context) + "\\n")
            """ % (started, release, out)))
        sock = os.path.join(home, "hooks.sock")
        env = dict(os.environ, HERMES_HOME=home, HERMES_HOOKS_BIN=BIN, PYTHONPATH=CLIENT,
                   PYTHONDONTWRITEBYTECODE="1")
        env.pop("HERMES_HOOKS_ADDRESS", None)
        with open(os.path.join(tmp, "old.log"), "wb") as log_file:
            old = subprocess.Popen([BIN, "serve", "--socket", sock, "--hooks-dir", hooks,
                                    "--drain-timeout", "60"], env=env, stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=log_file)
        self.addCleanup(self._stop, old)
        address = _transport.parse_address(sock)

        def ready():
            try:
                return _transport.request(address, "GET", "/readyz", None, {}, 5.0)
            except OSError:
                return None
        _wait("the old service ready", lambda: (ready() or (0,))[0] == 200)
        body = json.dumps({"event": "agent:start", "context": {"hold": True}}).encode()
        status, _ = _transport.request(address, "POST", "/v1/events", body,
                                       {"Content-Type": "application/json"}, 5.0)
        self.assertEqual(status, 202)
        _wait("the held call to start", lambda: os.path.exists(started))
        old.terminate()
        _wait("the old service to drain", lambda: b"shutting_down" in (ready() or (0, b""))[1])

        gateway = subprocess.Popen([sys.executable, "-c", NEWCOMER, hooks, "5"], env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        self.addCleanup(TwoGateways._reap, gateway)
        line = gateway.stdout.readline()
        if not line:
            self.fail("gateway said nothing: %s" % gateway.communicate()[1].decode())
        report = json.loads(line)
        if report["started"]:
            self.addCleanup(TwoGateways._kill, report["started"])
        self.assertIsNotNone(report["started"], "a new service is started: %r" % report)
        self.assertTrue(report["flushed"], report)
        self.assertIsNone(old.poll(), "the old one still drains (its call is held)")
        _wait("the new gateway's event handled", lambda: self._has(out, "new"))
        # The old one finishes its call and exits without removing the new one's socket.
        open(release, "w").close()
        old.wait(TIMEOUT)
        _wait("the held call recorded", lambda: self._has(out, None))
        self.assertEqual((ready() or (0,))[0], 200, "the new service still answers")
        gateway.stdin.close()
        gateway.wait(TIMEOUT)

    @staticmethod
    def _has(path: str, gateway):
        try:
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return False
        return any(line.get("gateway") == gateway and (gateway or line.get("hold"))
                   for line in lines)

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


if __name__ == "__main__":
    unittest.main()
