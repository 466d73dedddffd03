"""Issue 58: a config.yaml entry's Python script on the fork server alone, without the agent,
the service or the hook's Python worker: `script_runner.run_command` (src/config_hooks/, what
the hook's `handler.py` calls) on the published-style gate of `benches/agent_hooks.py`, p50 and
p95 a call, back to back or ``--pace MS`` apart.

    python3 benches/script_fork_path.py [--pace MS] [--calls N] [--src DIR]

``--src DIR`` takes `script_runner.py` and `script_server.py` from DIR (another version, for an
A/B: ``git show REV:src/config_hooks/script_server.py > DIR/script_server.py``, the same for
the runner). Standard library only; the script runs on this interpreter (its `#!` line).
"""

import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def option(name, default):
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args else default


def main():
    src = option("--src", os.path.join(os.path.dirname(HERE), "src", "config_hooks"))
    pace = float(option("--pace", "0")) / 1000.0
    calls = int(option("--calls", "300" if pace else "1000"))
    sys.path.insert(0, os.path.abspath(src))
    sys.path.insert(1, HERE)
    from agent_hooks import GATE_PUBLISHED
    from script_runner import run_command

    work = tempfile.mkdtemp(prefix="hh-fork-path-")
    try:
        gate = os.path.join(work, "published_gate.py")
        with open(gate, "w") as f:
            f.write(GATE_PUBLISHED.replace("#!/usr/bin/env python3", "#!" + sys.executable, 1))
        os.chmod(gate, 0o755)
        call = json.dumps({"tool_name": "terminal", "tool_input": {"command": "ls -la"},
                           "session_id": "s", "cwd": work})
        for _ in range(30):  # the server started, its patterns learned
            run_command([gate], call, 60, work)
        took = []
        for _ in range(calls):
            if pace:
                time.sleep(pace)
            start = time.perf_counter_ns()
            done = run_command([gate], call, 60, work)
            took.append(time.perf_counter_ns() - start)
            assert done.returncode == 0 and done.stdout == "", done
        took.sort()
        print("fork path, %s: n=%d  p50 %8.1f us  p95 %8.1f us" % (
            "%g ms apart" % (pace * 1000) if pace else "back to back", calls,
            took[calls // 2] / 1000, took[int(calls * 0.95)] / 1000), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
