"""Issue 49's figures: the time a tool call's hooks add in Hermes's agent, p50 and p99; issue
58's: a published-style Python gate script, p50 and p95, under 0.19.0's runner and hosted here
(run from a warm fork server), with the same decisions.

Run with the Python of a venv holding hermes-agent 0.19.0 and the client (``.ci/hermes-agent-venv.sh
target/hermes-agent-venv``)::

    HERMES_HOOKS_BIN=target/debug/hermes-hooks target/hermes-agent-venv/bin/python benches/agent_hooks.py

``--python-gate`` runs issue 58's case alone. ``--pace MS`` spaces its timed calls MS
milliseconds apart (a pause between calls, not counted), as an agent's tool calls come between
the model's turns; without it they come back to back, which times the host's CPU a call as
much as a call's latency.

Each case times what the agent's tool path calls, in this process, on Hermes's own functions:
``resolve_pre_tool_block(...)`` (the pre_tool_call decision every tool call goes through) and
``invoke_hook("post_tool_call", ...)``, with Hermes's plugin manager holding either 0.19.0's
own shell-hook callbacks (``register_from_config``) or this project's plugin callbacks
(``hermes_hooks.agent_plugin``) talking to a ``hermes-hooks serve`` started for the case.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "clients", "python"))

BIN = os.environ.get("HERMES_HOOKS_BIN", "target/debug/hermes-hooks")
ARGS = {"command": "ls -la"}

GATE_SH = """#!/bin/sh
input=$(cat)
case "$input" in *'rm -rf'*) echo '{"decision": "block", "reason": "no rm -rf"}';; esac
"""
GATE_PY = """#!%s
import json, sys
call = json.load(sys.stdin)
if "rm -rf" in (call.get("tool_input") or {}).get("command", ""):
    print(json.dumps({"decision": "block", "reason": "no rm -rf"}))
""" % sys.executable
GATE_HANDLER = """def handle(event, ctx):
    if 'rm -rf' in (ctx.get('tool_input') or {}).get('command', ''):
        return {'action': 'block', 'message': 'no rm -rf'}
"""
SLEEP_SH = "#!/bin/sh\ncat > /dev/null\nsleep 1\n"
# Issue 58: a gate in the style of the published ones (a `#!/usr/bin/env python3` script, a
# list of patterns, Claude-Code's block shape, a log line on stderr).
GATE_PUBLISHED = r"""#!/usr/bin/env python3
'''Block dangerous shell commands before the agent runs them (pre_tool_call).'''
import json
import re
import sys

DANGEROUS = [
    (r"\brm\s+-[a-z]*r[a-z]*f", "recursive force delete"),
    (r"\bgit\s+push\s+.*--force", "force push"),
    (r"\bmkfs\.", "formatting a filesystem"),
    (r"\bdd\s+if=.*of=/dev/", "raw disk write"),
    (r">\s*/dev/sd[a-z]", "writing to a disk device"),
]


def main():
    try:
        payload = json.load(sys.stdin)
    except json.JSONDecodeError:
        return 0
    if payload.get("tool_name") != "terminal":
        return 0
    command = (payload.get("tool_input") or {}).get("command", "")
    for pattern, why in DANGEROUS:
        if re.search(pattern, command):
            print("blocked: %s" % why, file=sys.stderr)
            print(json.dumps({"decision": "block", "reason": "Blocked: %s (%s)" % (why, command)}))
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
"""
# The inputs whose decisions must be the same under 0.19.0's runner and here.
DECIDE = ["ls -la", "rm -rf /tmp/x", "git push origin main --force", "echo hi > /dev/sda",
          "mkfs.ext4 /dev/sdb1", "cat README.md"]


def pct(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def report(name, samples, q=0.99):
    us = [x / 1000.0 for x in samples]
    print("%-58s n=%5d  p50 %10.1f us  p%d %10.1f us  mean %10.1f us" % (
        name, len(us), pct(us, 0.5), round(q * 100), pct(us, q), statistics.mean(us)),
        flush=True)
    return pct(us, 0.5)


def decisions():
    """The pre_tool_call decision of each DECIDE command (Hermes's `resolve_pre_tool_block`)."""
    from hermes_cli.plugins import resolve_pre_tool_block
    return [resolve_pre_tool_block("terminal", {"command": c}, task_id="t", session_id="s",
                                   tool_call_id="d%d" % i) for i, c in enumerate(DECIDE)]


def python_gate(results, n=300):
    """Issue 58: the published-style Python gate under 0.19.0's runner and hosted here, p50 and
    p95 a call, and the decisions of both on DECIDE (which must be the same)."""
    block = ("hooks:\n  pre_tool_call:\n    - command: DIR/published_gate.py\n"
             "      matcher: terminal\n")
    # `env python3` finds Hermes's own interpreter first, as in its activated venv (not a
    # version manager's shim, which would add its own start to every run of 0.19.0's runner).
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + path
    try:
        _python_gate(results, n, block)
    finally:
        os.environ["PATH"] = path


def _python_gate(results, n, block):
    seen = {}
    for who in ("up", "ours"):
        case = Case(block)
        registry = None
        if who == "up":
            upstream(case)
        else:
            registry = ours(case)
        time_pre(5)
        seen[who] = decisions()
        results[who + "_published_gate.py"] = report(
            "pre_tool_call published Python gate, %s%s" % (
                "0.19.0's runner" if who == "up" else "here (config.yaml entry)",
                ", %g ms apart" % (pace() * 1000) if pace() else ""),
            time_pre(n, pace()), q=0.95)
        if registry is not None:
            registry.close(0)
        case.close()
    assert seen["up"] == seen["ours"], seen
    assert sum(1 for d in seen["up"] if d) == 4, seen["up"]
    print("published Python gate: the same %d decisions (%d blocks); here vs 0.19.0's runner "
          "at p50: %.1fx" % (len(DECIDE), sum(1 for d in seen["up"] if d),
                             results["up_published_gate.py"] / results["ours_published_gate.py"]),
          flush=True)


class Case:
    """A HERMES_HOME with scripts, a config.yaml hooks: block and hook directories."""

    def __init__(self, hooks_block="", handlers=None):
        self.dir = tempfile.mkdtemp(prefix="hh-bench49-")
        self.home = os.path.join(self.dir, "home")
        os.makedirs(os.path.join(self.home, "hooks"))
        os.chmod(self.home, 0o700)
        for name, source in (handlers or {}).items():
            d = os.path.join(self.home, "hooks", name)
            os.makedirs(d)
            with open(os.path.join(d, "HOOK.yaml"), "w") as f:
                f.write('events: ["pre_tool_call"]\n')
            with open(os.path.join(d, "handler.py"), "w") as f:
                f.write(source)
        for name, text in (("gate.sh", GATE_SH), ("gate.py", GATE_PY), ("sleep.sh", SLEEP_SH),
                           ("published_gate.py", GATE_PUBLISHED)):
            path = os.path.join(self.dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o755)
        with open(os.path.join(self.home, "config.yaml"), "w") as f:
            f.write("hooks_auto_accept: true\n" + hooks_block.replace("DIR", self.dir))
        os.environ["HERMES_HOME"] = self.home
        self.service = None

    def serve(self):
        sock = os.path.join(self.dir, "hooks.sock")
        self.service = subprocess.Popen([BIN, "serve", "--hooks-dir",
                                         os.path.join(self.home, "hooks"), "--socket", sock],
                                        env=dict(os.environ, HERMES_HOME=self.home),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.environ["HERMES_HOOKS_ADDRESS"] = sock
        from hermes_hooks import _transport
        deadline = time.monotonic() + 60
        while True:
            try:
                if _transport.request(_transport.parse_address(sock), "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the service did not get ready")
            time.sleep(0.05)  # waiting for readiness against the deadline above
        return sock

    def close(self):
        if self.service is not None:
            self.service.terminate()
            self.service.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


def fresh_manager():
    """Hermes's plugin manager, empty; 0.19.0's shell-hook registrations forgotten."""
    from hermes_cli import plugins
    from agent import shell_hooks
    plugins._plugin_manager = plugins.PluginManager()
    plugins._plugin_manager._discovered = True
    shell_hooks.reset_for_tests()
    return plugins._plugin_manager


def upstream(case):
    from agent import shell_hooks
    from hermes_cli.config import load_config
    fresh_manager()
    shell_hooks.register_from_config(load_config(), accept_hooks=True)


def ours(case):
    from hermes_hooks import HookRegistry
    from hermes_hooks.agent_plugin import AgentBridge
    sock = case.serve()
    manager = fresh_manager()
    registry = HookRegistry(address=sock, autostart=False)
    registry.discover_and_load()
    bridge = AgentBridge(registry)
    names = bridge.attach(lambda name, fn: manager._hooks.setdefault(name, []).append(fn))
    assert names, "no agent event subscribed"
    return registry


def pace():
    """The pause between timed calls, seconds (``--pace MS``; 0: back to back)."""
    args = sys.argv[1:]
    if "--pace" in args:
        return float(args[args.index("--pace") + 1]) / 1000.0
    return 0.0


def time_pre(n, gap=0.0):
    from hermes_cli.plugins import resolve_pre_tool_block
    out = []
    for i in range(n):
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter_ns()
        block = resolve_pre_tool_block("terminal", ARGS, task_id="t", session_id="s",
                                       tool_call_id="c%d" % i)
        out.append(time.perf_counter_ns() - t0)
        assert block is None, block
    return out


def time_post(n):
    from hermes_cli.plugins import invoke_hook
    out = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        invoke_hook("post_tool_call", tool_name="terminal", args=ARGS, result='{"output": ""}',
                    task_id="t", session_id="s", tool_call_id="c%d" % i, turn_id="u",
                    api_request_id="a", duration_ms=3, status="ok", error_type=None,
                    error_message=None, middleware_trace=[])
        out.append(time.perf_counter_ns() - t0)
    return out


def main():
    results = {}
    if "--python-gate" in sys.argv[1:]:
        python_gate(results)
        # The floor: the same decision made by a persistent handler.py here (no process).
        case = Case(handlers={"gate": GATE_HANDLER})
        registry = ours(case)
        time_pre(100)
        results["handler"] = report("pre_tool_call gate as a persistent handler.py, here",
                                    time_pre(300 if pace() else 1000, pace()), q=0.95)
        registry.close(0)
        case.close()
        print(json.dumps({k: round(v, 1) for k, v in results.items()}))
        return
    case = Case()
    fresh_manager()
    time_pre(200)
    results["none_pre"] = report("no hook: pre_tool_call decision", time_pre(20000))
    results["none_post"] = report("no hook: post_tool_call", time_post(20000))
    case.close()

    post_block = "hooks:\n  post_tool_call:\n    - command: DIR/sleep.sh\n"
    case = Case(post_block)
    upstream(case)
    report("post_tool_call sleeping 1 s, 0.19.0's runner", time_post(5))
    case.close()
    case = Case(post_block)
    registry = ours(case)
    time_post(100)
    results["ours_post"] = report("post_tool_call sleeping 1 s, here (plugin -> service)",
                                  time_post(20000))
    registry.close(0)
    case.close()

    for script in ("gate.sh", "gate.py"):
        block = "hooks:\n  pre_tool_call:\n    - command: DIR/%s\n      matcher: terminal\n" % script
        case = Case(block)
        upstream(case)
        time_pre(5)
        results["up_" + script] = report("pre_tool_call gate %s, 0.19.0's runner" % script,
                                         time_pre(300))
        case.close()
        case = Case(block)
        registry = ours(case)
        time_pre(5)
        results["ours_" + script] = report("pre_tool_call gate %s, here (config.yaml entry)"
                                           % script, time_pre(300))
        registry.close(0)
        case.close()

    python_gate(results)

    case = Case(handlers={"gate": GATE_HANDLER})
    registry = ours(case)
    time_pre(200)
    results["handler"] = report("pre_tool_call gate as a persistent handler.py, here",
                                time_pre(5000))
    registry.close(0)
    case.close()
    print(json.dumps({k: round(v, 1) for k, v in results.items()}))
    print("handler.py vs 0.19.0's runner on gate.py: %.0fx" % (
        results["up_gate.py"] / results["handler"]))


if __name__ == "__main__":
    main()
