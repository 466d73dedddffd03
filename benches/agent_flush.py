"""Issue 58 row 1: what the agent plugin's flush before a decision costs.

The plugin sends observer events through the client's buffer (``/v1/events/batch``, a
background thread) and decisions through ``/v1/collect``; before a collect it now waits for the
observers buffered so far to reach the service (``AgentBridge.flush_observers``), so that one
hook gets its events in Hermes's order. This times, against a ``hermes-hooks serve`` started for
the run (a Python hook on ``pre_tool_call`` answering nothing, a config.yaml command on
``post_tool_call``), in this process, the plugin's own callbacks:

* ``flush_observers()`` with nothing buffered, and right after one observer;
* a ``pre_tool_call`` decision with nothing buffered, and right after a ``post_tool_call``
  observer, each with the flush and without it (as before).

Standard library and the client only (no hermes-agent needed)::

    HERMES_HOOKS_BIN=target/debug/hermes-hooks python3 benches/agent_flush.py
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from agent_hooks import Case, report  # noqa: E402  (which also puts the client on sys.path)


def main():
    from hermes_hooks import HookRegistry, agent_plugin
    case = Case(hooks_block="hooks:\n  post_tool_call:\n    - command: /bin/true\n",
                handlers={"gate": "def handle(event, ctx):\n    return None\n"})
    try:
        sock = case.serve()
        registry = HookRegistry(address=sock, autostart=False)
        registry.discover_and_load()
        bridge = agent_plugin.AgentBridge(registry)
        callbacks = {}
        bridge.attach(lambda name, fn: callbacks.setdefault(name, fn))
        gate, observe = callbacks["pre_tool_call"], callbacks["post_tool_call"]
        call = {"tool_name": "terminal", "args": {"command": "ls"}, "session_id": "s"}

        calls = 200000
        started = time.perf_counter_ns()
        for _ in range(calls):
            bridge.flush_observers()
        each = (time.perf_counter_ns() - started) / calls
        print("%-58s n=%6d  mean %10.3f us" % ("flush_observers, nothing buffered", calls,
                                              each / 1000.0), flush=True)
        samples = []
        for _ in range(600):
            observe(result="x", **call)
            t0 = time.perf_counter_ns()
            bridge.flush_observers()
            samples.append(time.perf_counter_ns() - t0)
        report("flush_observers right after one observer", samples[100:])

        flush = agent_plugin.AgentBridge.flush_observers
        for before in (False, True):
            for with_flush in (True, False):
                agent_plugin.AgentBridge.flush_observers = (
                    flush if with_flush else (lambda self: True))
                samples = []
                for _ in range(600):
                    if before:
                        observe(result="x", **call)
                    t0 = time.perf_counter_ns()
                    gate(**call)
                    samples.append(time.perf_counter_ns() - t0)
                    registry.flush(5)
                report("decision%s, %s" % (" after one observer" if before else "",
                                           "with the flush" if with_flush else "no flush (before)"),
                       samples[100:])
        agent_plugin.AgentBridge.flush_observers = flush
        bridge.close()
        registry.close(1)
    finally:
        case.close()


if __name__ == "__main__":
    main()
