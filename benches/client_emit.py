#!/usr/bin/env python3
"""Gateway-side cost of ``await registry.emit(...)`` through the Python client.

Measures what the gateway's event loop pays per emit with ``hermes_hooks.HookRegistry`` (from
``clients/python``) talking to a running service, timing each ``await`` with
``time.perf_counter_ns``, then waits for the service to acknowledge everything. Prints one
JSON object (latencies in microseconds): p50/p99 of ``await registry.emit``, the loop thread's
CPU per emit (including the sender wake-ups ``emit`` defers to the loop) and the whole
process's CPU per event (including the sender thread's JSON encoding and socket writes).

    hermes-hooks serve --hooks-dir DIR --socket /tmp/hh.sock &
    python3 benches/client_emit.py /tmp/hh.sock              # or http://127.0.0.1:PORT

Without an address, the client's own default: ``$HERMES_HOOKS_ADDRESS``, else
``$HERMES_HOME/hooks.sock`` (``HERMES_HOME`` defaulting to ``~/.hermes``). When nothing answers
there it says so and exits 2 at once, rather than buffering every event and waiting for the
flush timeouts (issue 50: ``"$HERMES_HOME/hooks.sock"`` with ``HERMES_HOME`` unset is
``/hooks.sock``, and the benchmark seemed to hang).

The hooks behind the service (for BENCHMARKS.md: 10 hooks on agent:start, one sleeping 200 ms)
do not change this figure: emit never waits for them. Nor does a hook that runs inside the
gateway (``runs: gateway``): its sync handler runs on its own thread, so the figure with one such
hook sleeping 200 ms next to nine service hooks is the third table of ``cargo bench --bench
compare``; ``in_gateway`` in the output says what those hooks did meanwhile. ``--pace-us`` inserts an
``asyncio.sleep`` between emits to look like a gateway (emits interleaved with other work)
rather than a tight loop, which is the worst case for contention with the sender thread.
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "clients", "python"))

from hermes_hooks import HookRegistry, _transport  # noqa: E402


def percentile(sorted_values: list, q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, int(round(q / 100.0 * len(sorted_values) + 0.5)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def run(args: argparse.Namespace) -> dict:
    registry = HookRegistry(address=args.address, queue_size=args.queue_size or
                            (args.count + args.warmup), batch_max=args.batch_max)
    registry.discover_and_load()
    context = {"platform": "telegram", "user_id": "1234567", "chat_id": "-100987654",
               "thread_id": "", "chat_type": "group", "session_id": "sess-0001",
               "message": "m" * 200}
    emit = registry.emit
    pace = args.pace_us / 1e6

    for _ in range(args.warmup):
        await emit(args.event, context)
    if not registry.flush(args.flush_timeout):
        print("warning: warm-up events not acknowledged within %.0f s" % args.flush_timeout,
              file=sys.stderr)
    sent_before = registry.sent

    clock = time.perf_counter_ns

    async def phase(do_emit: bool) -> tuple:
        """The same loop with or without the emit; returns (loop-thread CPU ns, samples)."""
        samples = []
        cpu0 = time.thread_time_ns()
        for _ in range(args.count):
            if pace:
                await asyncio.sleep(pace)
            t0 = clock()
            if do_emit:
                await emit(args.event, context)
            samples.append(clock() - t0)
        await asyncio.sleep(0)  # run a wake deferred by the last emit, so it is counted
        return time.thread_time_ns() - cpu0, samples

    proc0 = time.process_time_ns()
    base_cpu, base_samples = await phase(False)
    base_process = time.process_time_ns() - proc0
    proc0 = time.process_time_ns()
    started = clock()
    emit_cpu, samples = await phase(True)
    emitted_s = (clock() - started) / 1e9

    drain_start = time.perf_counter()
    flushed = registry.flush(args.flush_timeout)
    drain_s = time.perf_counter() - drain_start
    process_cpu = time.process_time_ns() - proc0 - base_process
    in_gateway = {name: {"ok": h.ok, "failed": h.failed, "dropped": h.dropped}
                  for name, h in registry._ingateway._hooks.items()}
    registry.close(0)

    us = sorted(s / 1000.0 for s in samples)
    floor = sorted(s / 1000.0 for s in base_samples)
    return {
        "bench": "client_emit",
        "address": registry.address,
        "event": args.event,
        "python": platform.python_version(),
        "count": args.count,
        "warmup": args.warmup,
        "pace_us": args.pace_us,
        "loaded_hooks": len(registry.loaded_hooks),
        "in_gateway": in_gateway,
        "p50_us": round(percentile(us, 50), 2),
        "p90_us": round(percentile(us, 90), 2),
        "p99_us": round(percentile(us, 99), 2),
        "p999_us": round(percentile(us, 99.9), 2),
        "max_us": round(us[-1], 2) if us else None,
        "mean_us": round(statistics.fmean(us), 2) if us else None,
        # The same timing with no emit between the two clock reads (timer cost, cold caches).
        "empty_p50_us": round(percentile(floor, 50), 2),
        "empty_p99_us": round(percentile(floor, 99), 2),
        "emit_loop_s": round(emitted_s, 4),
        # Everything emitting cost the event loop's thread (emit + deferred sender wake-ups),
        # from thread CPU time, minus the same loop without emits.
        "loop_cpu_per_emit_us": round((emit_cpu - base_cpu) / 1000.0 / args.count, 2),
        # Whole gateway process (loop + sender thread encoding and sending) per event, minus
        # the same loop without emits.
        "process_cpu_per_event_us": round(process_cpu / 1000.0 / args.count, 2),
        "acknowledged": registry.sent - sent_before,
        "flushed": flushed,
        "drain_after_loop_s": round(drain_s, 4),
        "dropped": registry.dropped,
        "rejected": registry.rejected,
        "last_error": registry.last_error,
    }


def unreachable(address: "_transport.Address") -> str:
    """Why nothing answers at ``address`` (one connection attempt, 2 s), or ``""``."""
    import socket
    try:
        if address.kind == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2.0)
                s.connect(str(address.path))
        else:
            socket.create_connection((str(address.host), int(address.port or 80)), 2.0).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address", nargs="?", default=None,
                        help="service socket path or http://host:port (default: "
                             "$HERMES_HOOKS_ADDRESS, else $HERMES_HOME/hooks.sock, "
                             "HERMES_HOME defaulting to ~/.hermes)")
    parser.add_argument("--count", type=int, default=10000, help="measured emits (10000)")
    parser.add_argument("--warmup", type=int, default=1000, help="unmeasured emits first (1000)")
    parser.add_argument("--event", default="agent:start", help="event name (agent:start)")
    parser.add_argument("--pace-us", type=float, default=0.0,
                        help="asyncio.sleep between emits, microseconds (0: tight loop)")
    parser.add_argument("--queue-size", type=int, default=0,
                        help="client buffer bound (default: count + warmup, so nothing drops)")
    parser.add_argument("--batch-max", type=int, default=500, help="events per batch (500)")
    parser.add_argument("--flush-timeout", type=float, default=60.0,
                        help="seconds to wait for the service to acknowledge (60)")
    args = parser.parse_args()
    try:
        address = _transport.resolve_address(args.address)
    except ValueError as exc:
        parser.error(str(exc))
    why = unreachable(address)
    if why:
        print("client_emit: no hermes-hooks service answers at %s (%s): start one "
              "(`hermes-hooks serve`, on $HERMES_HOME/hooks.sock, HERMES_HOME defaulting to "
              "~/.hermes) or pass its address (a socket path or http://host:port)"
              % (address, why), file=sys.stderr)
        return 2
    args.address = address
    result = asyncio.run(run(args))
    print(json.dumps(result))
    return 0 if result["flushed"] and not result["dropped"] else 1


if __name__ == "__main__":
    sys.exit(main())
