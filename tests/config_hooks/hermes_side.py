"""Runs config.yaml shell-hook cases under hermes-agent 0.19.0's own runner (issue 58's
side-by-side test, tests/it/script_runner.rs): run with the Python of a venv holding it.

Usage: python hermes_side.py CASES.json. Each case is {"event", "command", "matcher",
"timeout", "kwargs"}: what `invoke_hook` hands the callbacks. For each, prints (one JSON list)
the decision of 0.19.0's callback for the entry (`_make_callback`), what its runner reports of
a run of the command (`_spawn`: returncode, stdout, stderr) and the stdin it gives the command
(`_serialize_payload`), which the test sends to the service as the event's context.
"""

import json
import sys

from agent import shell_hooks


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = []
    for case in cases:
        spec = shell_hooks.ShellHookSpec(event=case["event"], command=case["command"],
                                         matcher=case.get("matcher"),
                                         timeout=case.get("timeout", 10))
        decision = shell_hooks._make_callback(spec)(**case["kwargs"])
        payload = shell_hooks._serialize_payload(spec.event, case["kwargs"])
        ran = shell_hooks._spawn(spec, payload)
        out.append({"decision": decision, "returncode": ran["returncode"],
                    "stdout": ran["stdout"], "stderr": ran["stderr"],
                    "payload": json.loads(payload)})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
