"""Published-hook patterns through the real service and ``clients/python``, with this test
process playing the gateway (the ``gateway`` package of ``fake_gateway/`` on ``sys.path``).

Needs ``HERMES_HOOKS_BIN`` (the binary under test). Each test copies the fixture hooks it needs
into a temporary hook root, starts ``hermes-hooks serve`` on a Unix socket in a temporary
``HERMES_HOME``, and stops it afterwards. Waits poll against a deadline.
"""

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLIENT = os.path.join(ROOT, "clients", "python")
FAKE_GATEWAY = os.path.join(HERE, "fake_gateway")
FIXTURE_HOOKS = os.path.join(HERE, "hooks")
sys.path.insert(0, CLIENT)
sys.path.insert(0, FAKE_GATEWAY)

import gateway.platforms.base as platforms_base  # noqa: E402
import gateway.run as gateway_run  # noqa: E402
import hermes_constants  # noqa: E402
from hermes_hooks import HookRegistry, ProfileHookRegistries  # noqa: E402

# Absolute: the tests start gateways in other directories (a relative HERMES_HOOKS_BIN, as in
# the README's `HERMES_HOOKS_BIN=target/debug/hermes-hooks`, would not be found there).
BIN = os.path.abspath(os.environ["HERMES_HOOKS_BIN"]) if os.environ.get("HERMES_HOOKS_BIN") else None
if not BIN:
    raise unittest.SkipTest("HERMES_HOOKS_BIN is not set: build the binary and point it there")

WAIT = 30.0
_ORIGINAL_SEND = platforms_base.BasePlatformAdapter.send


def _copy_hook(name: str, root: str, new_name: str = None) -> str:
    dst = os.path.join(root, new_name or name)
    shutil.copytree(os.path.join(FIXTURE_HOOKS, name), dst)
    for dirpath, dirnames, filenames in os.walk(dst):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return dst


def _write_hook(root: str, name: str, manifest: str, handler: str) -> str:
    d = os.path.join(root, name)
    os.makedirs(d, 0o755)
    for fname, text in (("HOOK.yaml", manifest), ("handler.py", handler)):
        with open(os.path.join(d, fname), "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(os.path.join(d, fname), 0o644)
    return d


class Service:
    """``hermes-hooks serve`` on ``<home>/hooks.sock`` with ``<home>/hooks`` as root."""

    def __init__(self, home: str, extra=()) -> None:
        self.home = home
        self.sock = os.path.join(home, "hooks.sock")
        self.log_path = os.path.join(home, "service.log")
        env = dict(os.environ, HERMES_HOME=home, HERMES_HOOKS_LOG="info")
        env.pop("HERMES_HOOKS_PYTHON", None)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [BIN, "serve", "--socket", self.sock, "--hooks-dir", os.path.join(home, "hooks")]
                + list(extra), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + WAIT
        probe = HookRegistry(address=self.sock)
        try:
            while probe._fetch("/readyz")[0] != 200:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("service not ready:\n" + self.log())
                time.sleep(0.02)  # polling readiness against the deadline
        finally:
            probe.close(0)

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class GatewayCase(unittest.IsolatedAsyncioTestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="hh-gw-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.home = self.make_home("home")
        self.services = []
        # Each test is a fresh "gateway": undo what earlier tests' hooks patched or imported.
        platforms_base.BasePlatformAdapter.send = _ORIGINAL_SEND
        for name in [m for m in sys.modules if m.startswith("hermes_hook_")]:
            del sys.modules[name]
        hermes_constants.ACTIVE["home"] = None

    def tearDown(self) -> None:
        for s in self.services:
            s.stop()

    async def asyncSetUp(self) -> None:
        asyncio.get_running_loop().slow_callback_duration = 60.0

    def make_home(self, name: str) -> str:
        home = os.path.join(self.tmp, name)
        os.makedirs(os.path.join(home, "hooks"), 0o755)
        os.chmod(home, 0o700)
        return home

    def hooks(self, home: str = None) -> str:
        return os.path.join(home or self.home, "hooks")

    def serve(self, home: str = None, extra=()) -> Service:
        s = Service(home or self.home, extra)
        self.services.append(s)
        return s

    def registry(self, home: str = None, **kw) -> HookRegistry:
        home = home or self.home
        r = HookRegistry(address=os.path.join(home, "hooks.sock"), hermes_home=home, **kw)
        self.addCleanup(r.close, 0)
        return r

    async def eventually(self, predicate, what: str):
        deadline = time.monotonic() + WAIT
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                self.fail("timed out waiting for " + what)
            await asyncio.sleep(0.01)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, HERMES_HOME=self.home)
        return subprocess.run([BIN] + list(args) + ["--hooks-dir", self.hooks()], env=env,
                              capture_output=True, text=True, timeout=60)


class Matching(unittest.TestCase):
    """The client's match order for merging must be the service's (DESIGN 5)."""

    def test_patterns_and_order(self):
        from hermes_hooks._ingateway import InGatewayHooks as Hooks, _Patterns
        self.assertIsNone(_Patterns(["agent"]).match("agent:start"))
        self.assertEqual(_Patterns(["command:*"]).match("command:reset"), "wildcard")
        self.assertEqual(_Patterns(["*"]).match("a:b:c"), "wildcard")
        self.assertEqual(_Patterns(["{agent,session}:st?rt"]).match("session:start"), "wildcard")
        self.assertIsNone(_Patterns(["{agent,session}:start"]).match("gateway:start"))
        self.assertEqual(_Patterns(["x:[ab]"]).match("x:b"), "wildcard")
        self.assertEqual(_Patterns(["agent:start", "agent:*"]).match("agent:start"), "exact")
        hooks = Hooks()
        hooks.load([{"name": "w1", "events": ["agent:*"]}, {"name": "e1", "events": ["agent:end"]},
                    {"name": "w2", "events": ["*"]}, {"name": "e2", "events": ["agent:end"]},
                    {"name": "no", "events": ["agent:start"]}], None)
        self.assertEqual(hooks.match_order("agent:end"), ["e1", "e2", "w1", "w2"])


class InGatewayHooks(GatewayCase):
    async def test_import_time_patch_is_live_in_the_gateway_after_discover_and_load(self):
        hook_dir = _copy_hook("stamp-outgoing", self.hooks())
        self.serve()
        runner = gateway_run.GatewayRunner()
        registry = self.registry()
        registry.discover_and_load()
        # The patch is in place before the gateway goes on: its own adapter sends stamped text.
        self.assertEqual(await runner.adapters["fakechat"].send("c1", "hi"), "hi [stamped]")
        self.assertIn("hermes_hook_stamp-outgoing", sys.modules)
        # Its modules come through its own finder: its directory never goes on sys.path.
        self.assertNotIn(hook_dir, sys.path)
        (entry,) = registry.loaded_hooks
        self.assertEqual((entry["name"], entry["runs"], entry["status"]),
                         ("stamp-outgoing", "gateway", "imported"), entry)
        self.assertEqual(entry["why"], "imports gateway.platforms.base at line 5", entry)
        with open(os.path.join(self.home, "hooks-in-gateway.json"), encoding="utf-8") as f:
            record = json.load(f)
        self.assertEqual(record["pid"], os.getpid())
        self.assertEqual(record["hooks"]["stamp-outgoing"]["sha256"], entry["sha256"])

    async def test_runner_handle_and_a_private_copy_of_the_context(self):
        _copy_hook("runner-peek", self.hooks())
        _copy_hook("context-carry", self.hooks())
        self.serve()
        runner = gateway_run.GatewayRunner()
        registry = self.registry()
        registry.discover_and_load()
        ctx = {"platform": "fakechat", "user_id": "u1", "message": "hi"}
        await registry.emit("agent:start", ctx)
        await registry.emit("agent:end", ctx)
        await self.eventually(lambda: ("runner-peek", "agent:start", ["fakechat"]) in runner.notes,
                              "runner-peek to reach the live runner")
        carry = sys.modules["hermes_hook_context-carry"]
        await self.eventually(lambda: carry.SEEN, "context-carry on agent:end")
        # A sync handler runs on its own thread while the caller goes on: it gets a copy, so
        # what it writes stays its own (issue 20).
        self.assertEqual(carry.SEEN, [None])
        self.assertNotIn("carried", ctx, "the caller's dict was changed")

    async def test_emit_to_a_slow_sync_handler_returns_at_once_and_it_still_runs(self):
        _copy_hook("slow-sync", self.hooks())
        self.serve()
        runner = gateway_run.GatewayRunner()
        registry = self.registry()
        registry.discover_and_load()
        await registry.emit("agent:end", {})  # first emit starts the hook's thread
        await self.eventually(lambda: len(runner.notes) == 1, "the first slow call")
        timings = []
        for _ in range(5):
            t0 = time.perf_counter()
            await registry.emit("agent:end", {})
            timings.append(time.perf_counter() - t0)
        # The handler sleeps 0.5 s per event; emit must not wait for any of it.
        self.assertLess(max(timings), 0.05, timings)
        sys.stderr.write("\nemit with a 0.5 s in-gateway sync handler: max %.1f us\n"
                         % (max(timings) * 1e6))
        await self.eventually(lambda: len(runner.notes) == 6, "all slow calls, in order")
        self.assertEqual(runner.notes, [("slow-sync", "agent:end")] * 6)

    async def test_raising_and_hanging_handlers_never_reach_the_caller(self):
        _copy_hook("raiser", self.hooks())
        _copy_hook("hanger", self.hooks())
        self.serve()
        registry = self.registry()
        registry.discover_and_load()
        with self.assertLogs("hermes_hooks", level="WARNING") as logs:
            t0 = time.perf_counter()
            await registry.emit("agent:end", {})
            self.assertLess(time.perf_counter() - t0, 0.05)
            detailed = await registry.emit_collect_detailed("command:x", {}, timeout=5)
            self.assertEqual(detailed["results"], [])
            errors = {e["hook"]: e["error"] for e in detailed["errors"]}
            self.assertIn("raiser always fails", errors.get("raiser", ""), detailed)
            self.assertIn("timed out", errors.get("hanger", ""), detailed)
            self.assertEqual(await registry.emit_collect("command:x", {}), [])
            # the hanger's emit task times out after its 1 s too
            await self.eventually(
                lambda: sum("hanger" in line and "timed out" in line for line in logs.output) >= 3,
                "the hanger's timeouts to be logged")
        self.assertTrue(any("raiser" in line for line in logs.output), logs.output)

    async def test_a_create_task_watcher_keeps_running_on_the_gateway_loop(self):
        _copy_hook("watcher", self.hooks())
        self.serve()
        runner = gateway_run.GatewayRunner()
        registry = self.registry()
        registry.discover_and_load()
        await registry.emit("gateway:startup", {"platforms": ["fakechat"]})
        await self.eventually(lambda: runner.notes.count(("watcher", "tick")) >= 5,
                              "the watcher to tick on the gateway loop")
        watcher = sys.modules["hermes_hook_watcher"]
        for task in watcher._tasks:
            task.cancel()

    async def test_a_file_changed_after_the_service_read_it_is_not_imported(self):
        hook_dir = _copy_hook("stamp-outgoing", self.hooks())
        self.serve(extra=["--no-watch"])
        with open(os.path.join(hook_dir, "handler.py"), "a", encoding="utf-8") as f:
            f.write("\nEXTRA = 1\n")
        registry = self.registry()
        with self.assertLogs("hermes_hooks", level="ERROR") as logs:
            registry.discover_and_load()
        (entry,) = registry.loaded_hooks
        self.assertEqual(entry["status"], "refused", entry)
        self.assertIn("SHA-256", entry["error"])
        self.assertNotIn("hermes_hook_stamp-outgoing", sys.modules)
        self.assertIs(platforms_base.BasePlatformAdapter.send, _ORIGINAL_SEND)
        self.assertTrue(any("stamp-outgoing" in line for line in logs.output))

    async def test_explicit_trust_lists_only_approved_hooks(self):
        _copy_hook("runner-peek", self.hooks())
        _copy_hook("stamp-outgoing", self.hooks())
        approved = subprocess.run(
            [BIN, "enable", "runner-peek", "--trust", "explicit", "--hooks-dir", self.hooks()],
            env=dict(os.environ, HERMES_HOME=self.home), capture_output=True, text=True)
        self.assertEqual(approved.returncode, 0, approved.stderr)
        self.serve(extra=["--trust", "explicit"])
        registry = self.registry()
        registry.discover_and_load()
        self.assertEqual([h["name"] for h in registry.loaded_hooks], ["runner-peek"])
        self.assertNotIn("hermes_hook_stamp-outgoing", sys.modules)
        self.assertIs(platforms_base.BasePlatformAdapter.send, _ORIGINAL_SEND)

    async def test_a_changed_in_gateway_hook_is_reported_as_needing_a_gateway_restart(self):
        hook_dir = _copy_hook("stamp-outgoing", self.hooks())
        self.serve()
        registry = self.registry()
        registry.discover_and_load()
        quiet = self.cli("list")
        self.assertNotIn("RESTART", quiet.stdout)
        with open(os.path.join(hook_dir, "handler.py"), "a", encoding="utf-8") as f:
            f.write("\n# edited\n")
        listed = self.cli("list")
        self.assertIn("GATEWAY RESTART NEEDED", listed.stdout, listed.stdout + listed.stderr)
        self.assertIn("pid %d" % os.getpid(), listed.stdout)
        checked = self.cli("check")
        self.assertIn("warning stamp-outgoing: changed since the gateway", checked.stdout,
                      checked.stdout)


class DecisionContract(GatewayCase):
    """The gateway's decision events through the client, service and in-gateway hooks mixed."""

    def setUp(self) -> None:
        super().setUp()
        root = self.hooks()
        policy = (
            "def handle(event, ctx):\n"
            "    mode = ctx.get('mode')\n"
            "    if mode == 'deny':\n        return {'decision': 'deny', 'message': 'not you'}\n"
            "    if mode == 'handled':\n        return {'decision': 'handled', 'message': 'done'}\n"
            "    return None\n")
        # exact, service, first in discovery order: always allows
        _write_hook(root, "p0-allow", "events: ['command:deploy']\n",
                    "def handle(event, ctx):\n    return {'decision': 'allow'}\n")
        # exact, in the gateway: deny / handled
        _write_hook(root, "p1-policy", "events: ['command:deploy']\nruns: gateway\n", policy)
        # wildcard, service: rewrite; in deny mode it would say "handled", but comes later
        _write_hook(root, "p2-rewrite", "events: ['command:*']\n",
                    "def handle(event, ctx):\n"
                    "    if ctx.get('mode') == 'rewrite':\n"
                    "        return {'decision': 'rewrite', 'command_name': 'help', 'raw_args': '-v'}\n"
                    "    if ctx.get('mode') == 'deny':\n"
                    "        return {'decision': 'handled', 'message': 'too late'}\n")
        # wildcard, in the gateway, async: says nothing
        _write_hook(root, "p3-quiet", "events: ['command:*']\nruns: gateway\n",
                    "async def handle(event, ctx):\n    return None\n")
        _write_hook(root, "router", "events: ['message:pre_route']\n",
                    "def handle(event, ctx):\n"
                    "    text = ctx.get('message', '')\n"
                    "    if text.startswith('/to '):\n"
                    "        return {'decision': 'switch_session', 'session_id': text[4:]}\n")

    @staticmethod
    async def route_command(registry, name: str, ctx: dict) -> dict:
        """What a gateway does with a slash command: the first decisive result wins."""
        for result in await registry.emit_collect("command:" + name, ctx):
            if isinstance(result, dict) and result.get("decision") in ("deny", "handled",
                                                                          "rewrite"):
                return result
        return {"decision": "allow"}

    async def test_command_decisions_in_match_order(self):
        self.serve()
        registry = self.registry()
        registry.discover_and_load()
        self.assertEqual({h["name"]: h["runs"] for h in registry.loaded_hooks},
                         {"p0-allow": "service", "p1-policy": "gateway", "p2-rewrite": "service",
                          "p3-quiet": "gateway", "router": "service"})
        detailed = await registry.emit_collect_detailed("command:deploy", {"mode": "deny"})
        self.assertEqual([r["hook"] for r in detailed["results"]],
                         ["p0-allow", "p1-policy", "p2-rewrite"], detailed)
        self.assertEqual(await self.route_command(registry, "deploy", {"mode": "deny"}),
                         {"decision": "deny", "message": "not you"})
        self.assertEqual(await self.route_command(registry, "deploy", {"mode": "handled"}),
                         {"decision": "handled", "message": "done"})
        self.assertEqual(await self.route_command(registry, "deploy", {"mode": "rewrite"}),
                         {"decision": "rewrite", "command_name": "help", "raw_args": "-v"})
        self.assertEqual(await self.route_command(registry, "deploy", {}), {"decision": "allow"})
        self.assertEqual(await self.route_command(registry, "other", {"mode": "rewrite"}),
                         {"decision": "rewrite", "command_name": "help", "raw_args": "-v"})

    async def test_pre_route_switch_session(self):
        self.serve()
        registry = self.registry()
        registry.discover_and_load()
        results = await registry.emit_collect("message:pre_route", {"message": "/to s-42"})
        self.assertEqual(results, [{"decision": "switch_session", "session_id": "s-42"}])
        self.assertEqual(await registry.emit_collect("message:pre_route", {"message": "hi"}), [])


class Profiles(GatewayCase):
    async def test_each_profile_gets_only_its_own_events(self):
        homes = {}
        for profile in ("alpha", "beta"):
            home = self.make_home(profile)
            out = os.path.join(self.tmp, profile + ".jsonl")
            _write_hook(self.hooks(home), profile + "-recorder", "events: ['agent:start']\n",
                        "import json\ndef handle(event, ctx):\n"
                        "    with open(%r, 'a') as f:\n"
                        "        f.write(json.dumps(ctx) + '\\n')\n" % out)
            self.serve(home)
            homes[profile] = (home, out)
        registries = ProfileHookRegistries()
        self.addCleanup(registries.close, 0)
        for profile, (home, _) in homes.items():
            hermes_constants.ACTIVE["home"] = home
            registries.discover_and_load()
            self.assertEqual([h["name"] for h in registries.loaded_hooks],
                             [profile + "-recorder"])
            await registries.emit("agent:start", {"profile": profile})
        self.assertEqual(len(registries.registries), 2)

        def lines(path):
            try:
                with open(path) as f:
                    return [json.loads(x) for x in f]
            except FileNotFoundError:
                return []
        for profile, (_, out) in homes.items():
            await self.eventually(lambda: lines(out), profile + "'s event")
        await registries.aclose()
        for profile, (_, out) in homes.items():
            self.assertEqual(lines(out), [{"profile": profile}])


class Shim(GatewayCase):
    def run_gateway(self, **env) -> dict:
        full = dict(os.environ, HERMES_HOME=self.home,
                    PYTHONPATH=os.pathsep.join([CLIENT, FAKE_GATEWAY]), **env)
        for key, value in env.items():
            if value is None:
                full.pop(key)
        proc = subprocess.run(
            [sys.executable, "-m", "hermes_hooks.shim", os.path.join(FAKE_GATEWAY,
                                                                     "gateway_main.py")],
            env=full, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    async def test_the_shim_hands_out_the_clients_classes_only_when_asked(self):
        _copy_hook("stamp-outgoing", self.hooks())
        self.serve()
        sock = os.path.join(self.home, "hooks.sock")
        on = self.run_gateway(HERMES_HOOKS_ADDRESS=sock)
        self.assertEqual(on["registry"], "hermes_hooks.registry.HookRegistry", on)
        self.assertEqual(on["profiles"], "hermes_hooks.profiles.ProfileHookRegistries", on)
        self.assertEqual(on["hooks"], ["stamp-outgoing"], on)
        self.assertEqual(on["sent"], "hello [stamped]", on)
        on_by_setting = self.run_gateway(HERMES_HOOKS_SHIM="1", HERMES_HOOKS_ADDRESS=None)
        self.assertEqual(on_by_setting["registry"], "hermes_hooks.registry.HookRegistry")
        off = self.run_gateway(HERMES_HOOKS_SHIM="0", HERMES_HOOKS_ADDRESS=sock)
        self.assertEqual(off["registry"], "gateway.hooks.HookRegistry", off)
        self.assertEqual(off["sent"], "hello", off)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    unittest.main()
