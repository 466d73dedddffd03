"""What the real gateway showed (issue 36), against the real service: a slow first load is not an
empty hook list; the service's hooks run in the gateway's interpreter.

Needs the service binary (``HERMES_HOOKS_BIN``, as ``test_client.py``). Each gateway is a separate
Python process (the autostart lease is held until the process ends); every wait polls against a
deadline.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from test_autostart import TIMEOUT, _dead, _wait  # noqa: E402  (the same polling helpers)

# Absolute: the tests start gateways in other directories (a relative HERMES_HOOKS_BIN, as in
# the README's `HERMES_HOOKS_BIN=target/debug/hermes-hooks`, would not be found there).
BIN = os.path.abspath(os.environ["HERMES_HOOKS_BIN"]) if os.environ.get("HERMES_HOOKS_BIN") else None

GATEWAY = textwrap.dedent("""
    import json, sys
    from hermes_hooks import HookRegistry
    registry = HookRegistry(autostart=True, autostart_timeout=float(sys.argv[1]))
    registry.discover_and_load()
    names = [h["name"] for h in registry.loaded_hooks]
    registry.emit_nowait("agent:start", {"from": "gateway"})
    flushed = registry.flush(60)
    proc = registry.service_process
    print(json.dumps({"hooks": names, "flushed": flushed, "service": proc.pid if proc else None}),
          flush=True)
""")


@unittest.skipUnless(BIN, "HERMES_HOOKS_BIN is not set: these tests start the real service")
class Issue36(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hh-36-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        os.chmod(self.tmp, 0o700)
        self.home = os.path.join(self.tmp, "home")
        self.out = os.path.join(self.tmp, "handled.json")

    def hook(self, name, handler):
        path = os.path.join(self.home, "hooks", name)
        os.makedirs(path)
        with open(os.path.join(path, "HOOK.yaml"), "w") as f:
            f.write('name: %s\nevents: ["agent:start"]\n' % name)
        with open(os.path.join(path, "handler.py"), "w") as f:
            f.write(handler)

    def gateway(self, python, timeout, **env):
        env = dict(os.environ, HERMES_HOME=self.home, HERMES_HOOKS_BIN=BIN,
                   HERMES_HOOKS_AUTOSTART_LINGER="0.5", PYTHONPATH=CLIENT,
                   PYTHONDONTWRITEBYTECODE="1", **env)
        for name in ("HERMES_HOOKS_ADDRESS", "HERMES_HOOKS_PYTHON", "HERMES_HOOKS_GATEWAY_PYTHON"):
            env.pop(name, None)
        out = subprocess.run([python, "-c", GATEWAY, str(timeout)], env=env, cwd=self.tmp,
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT * 2)
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        report = json.loads([line for line in out.stdout.decode().splitlines()
                             if line.startswith("{")][-1])
        if report["service"]:
            _wait("the autostarted service to stop", lambda: _dead(report["service"]))
        return report, out.stderr.decode()

    def test_a_service_still_loading_does_not_answer_an_empty_hook_list(self):
        # The service's first load takes seconds (a hook that imports slowly); the gateway waits
        # less than that for /readyz. Its loaded_hooks must still name the hook (upstream wires
        # agent:step from it), and the event must reach the hook once the service is ready.
        self.hook("slow", textwrap.dedent("""
            import json, os, time
            time.sleep(5)  # a heavy import
            def handle(event_type, context):
                with open(%r, "w") as f:
                    json.dump(context, f)
        """ % self.out))
        report, stderr = self.gateway(sys.executable, 2)
        self.assertEqual(report["hooks"], ["slow"], stderr)
        self.assertTrue(report["flushed"], stderr)
        with open(self.out) as f:
            self.assertEqual(json.load(f), {"from": "gateway"})

    def test_service_hooks_run_in_the_gateways_interpreter(self):
        # The gateway runs in an interpreter that is not python3 on PATH (a venv started by
        # absolute path): the autostarted service's hooks run in that one, as in the original.
        venv = os.path.join(self.tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        self.hook("where", textwrap.dedent("""
            import json, sys
            def handle(event_type, context):
                with open(%r, "w") as f:
                    json.dump({"prefix": sys.prefix}, f)
        """ % self.out))
        report, stderr = self.gateway(python, 30, PATH="/usr/bin:/bin")
        self.assertTrue(report["flushed"], stderr)
        with open(self.out) as f:
            self.assertEqual(os.path.realpath(json.load(f)["prefix"]), os.path.realpath(venv))

    def test_a_patched_hooks_dir_gets_its_hooks_while_a_service_runs_for_the_default(self):
        # A service runs for $HERMES_HOME/hooks (hook "default-hook"); the gateway (as upstream's
        # TestDiscoverAndLoad does) patches gateway.hooks.HOOKS_DIR to another directory.
        self.hook("default-hook", "def handle(event_type, context):\n    pass\n")
        patched = os.path.join(self.tmp, "patched")
        path = os.path.join(patched, "patched-hook")
        os.makedirs(path)
        with open(os.path.join(path, "HOOK.yaml"), "w") as f:
            f.write('name: patched-hook\nevents: ["agent:start"]\n')
        with open(os.path.join(path, "handler.py"), "w") as f:
            f.write("import json\ndef handle(event_type, context):\n"
                    "    with open(%r, 'w') as f:\n        json.dump(context, f)\n" % self.out)
        sock = os.path.join(self.home, "hooks.sock")
        env = dict(os.environ, HERMES_HOME=self.home, HERMES_HOOKS_LOG="info")
        service = subprocess.Popen([BIN, "serve", "--socket", sock], env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        self.addCleanup(service.wait)
        self.addCleanup(service.kill)
        sys.path.insert(0, CLIENT)
        from hermes_hooks import _transport

        def ready():
            try:
                return _transport.request(_transport.Address("unix", path=sock), "GET",
                                          "/readyz", None, {}, 5)[0] == 200
            except OSError:
                return False
        _wait("the default service", ready)
        script = textwrap.dedent("""
            import json, sys, types
            gateway = types.ModuleType("gateway")
            hooks_module = types.ModuleType("gateway.hooks")
            hooks_module.HOOKS_DIR = sys.argv[1]
            gateway.hooks = hooks_module
            sys.modules["gateway"] = gateway
            sys.modules["gateway.hooks"] = hooks_module
            from hermes_hooks import HookRegistry
            seen = {}
            plain = HookRegistry(autostart=False)
            plain.discover_and_load()
            seen["no_autostart"] = [h["name"] for h in plain.loaded_hooks]
            started = HookRegistry(autostart=True, autostart_timeout=30)
            started.discover_and_load()
            seen["autostart"] = [h["name"] for h in started.loaded_hooks]
            started.emit_nowait("agent:start", {"from": "patched"})
            seen["flushed"] = started.flush(60)
            proc = started.service_process
            seen["service"] = proc.pid if proc else None
            print(json.dumps(seen), flush=True)
        """)
        env = dict(os.environ, HERMES_HOME=self.home, HERMES_HOOKS_BIN=BIN, PYTHONPATH=CLIENT,
                   HERMES_HOOKS_AUTOSTART_LINGER="0.5", PYTHONDONTWRITEBYTECODE="1")
        env.pop("HERMES_HOOKS_ADDRESS", None)
        out = subprocess.run([sys.executable, "-c", script, patched], env=env, cwd=self.tmp,
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT * 2)
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        seen = json.loads([line for line in out.stdout.decode().splitlines()
                           if line.startswith("{")][-1])
        self.assertEqual(seen["no_autostart"], ["patched-hook"], out.stderr.decode())
        self.assertEqual(seen["autostart"], ["patched-hook"], out.stderr.decode())
        self.assertTrue(seen["flushed"])
        self.assertIsNotNone(seen["service"], "a service of its own for the patched directory")
        with open(self.out) as f:
            self.assertEqual(json.load(f), {"from": "patched"})
        _wait("its service to stop", lambda: _dead(seen["service"]))

    def test_a_profiles_hooks_are_listed_right_after_its_first_emit(self):
        # The profile's first use is an emit (its discovery then runs on a thread, here slowed
        # by a hook that takes seconds to import); the gateway reads loaded_hooks right after
        # to decide whether to wire agent:step.
        self.hook("slow", "import time\ntime.sleep(3)\ndef handle(event_type, context):\n"
                          "    pass\n")
        script = textwrap.dedent("""
            import json, sys
            from hermes_hooks.profiles import ProfileHookRegistries
            profiles = ProfileHookRegistries(home=lambda: sys.argv[1], autostart=True,
                                             autostart_timeout=30)
            profiles.emit_nowait("agent:start", {"turn": 1})
            names = [h["name"] for h in profiles.loaded_hooks]
            registry = profiles.registries[sys.argv[1]]
            proc = registry.service_process
            print(json.dumps({"hooks": names, "service": proc.pid if proc else None}), flush=True)
        """)
        env = dict(os.environ, HERMES_HOOKS_BIN=BIN, PYTHONPATH=CLIENT,
                   HERMES_HOOKS_AUTOSTART_LINGER="0.5", PYTHONDONTWRITEBYTECODE="1")
        env.pop("HERMES_HOOKS_ADDRESS", None)
        home = os.path.realpath(self.home)
        out = subprocess.run([sys.executable, "-c", script, home], env=env, cwd=self.tmp,
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT * 2)
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        seen = json.loads([line for line in out.stdout.decode().splitlines()
                           if line.startswith("{")][-1])
        self.assertEqual(seen["hooks"], ["slow"], out.stderr.decode())
        if seen["service"]:
            _wait("its service to stop", lambda: _dead(seen["service"]))


if __name__ == "__main__":
    unittest.main()
