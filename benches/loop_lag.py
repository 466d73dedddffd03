#!/usr/bin/env python3
"""How much the hooks disturb the gateway's asyncio event loop (loop lag), per host, in one run.

The gateway's loop runs a monitor task, ``await asyncio.sleep(0.001)`` in a loop, whose overshoot
is the loop lag (how late the loop gets back to a ready task), while an emitter task sends
``agent:step`` events with a 400-byte gateway context in bursts (default: 100 every 20 ms, 5,000
events/s), timing each ``await registry.emit(...)``. Cases, each in a fresh process, interleaved
over ``--rounds`` rounds:

  none       the monitor alone (no emits): the machine's own floor
  original   the original in-gateway host (``benches/baseline_host.py``) with 10 trivial sync
             hooks (``def handle(e, c): return None``) awaited inline
  client     ``clients/python`` -> ``hermes-hooks serve`` (Unix socket) with 10 trivial Python
             hooks on ``agent:step``
  frozen     the same client while the service is frozen (SIGSTOP) for the whole measurement:
             the client buffers (and drops the oldest past its bound)
  thaw       the service was frozen until the client's buffer was full (10,000 events) and
             goes on at the start of the measurement: the client sends its backlog meanwhile
  ingateway  the same 10 trivial hooks with ``runs: gateway``: the client imports them into this
             process and calls them off the message path (one thread per sync hook); their cost
             is the hooks' own, the machinery around them must add no lag beyond the original's

at the base rate and at 4x the rate (bursts of 100 every 5 ms, 20,000 events/s).

    python3 benches/loop_lag.py --bin target/release/hermes-hooks [--seconds 4] [--rounds 3]

(``cargo bench --bench loop_lag`` runs it with the release binary.) Prints a table: for each case
the median over rounds of emit p50/p99/max (us) and loop lag p50/p99/max (ms), the worst round's
max, and the ratios client/original; ``--json`` prints the raw figures too.
"""

import argparse
import asyncio
import gc
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EVENT = "agent:step"
TRIVIAL_SYNC = "def handle(event_type, context):\n    return None\n"


def gateway_context(i: int) -> dict:
    """A fresh gateway context per event, about 400 bytes as JSON."""
    return {"platform": "telegram", "user_id": "1234567", "chat_id": "-1009876543210",
            "thread_id": "", "chat_type": "group", "session_id": "sess-0001-%08d" % i,
            "step": i, "tool": "web_search",
            "message": "what is the weather like in Lisbon tomorrow and should I bring an "
                       "umbrella to the harbour walk? " * 2 + "x" * 30}


def percentile(sorted_values: list, q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, int(round(q / 100.0 * len(sorted_values) + 0.5)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# ---------------------------------------------------------------------------- one case (child)

async def workload(emit, seconds: float, burst: int, interval: float, warmup: float,
                   after_warmup=None) -> dict:
    """Runs the monitor and the emitter together; returns emit and lag samples (seconds)."""
    stop = False
    measuring = False
    lags = []
    emits = []
    clock = time.perf_counter

    async def monitor() -> None:
        while not stop:
            t0 = clock()
            await asyncio.sleep(0.001)
            lag = clock() - t0 - 0.001
            if measuring:
                lags.append(lag)

    async def emitter() -> None:
        i = 0
        nxt = clock()
        while not stop:
            if emit is not None:
                contexts = [gateway_context(i + k) for k in range(burst)]
                for ctx in contexts:
                    t0 = clock()
                    await emit(EVENT, ctx)
                    dt = clock() - t0
                    if measuring:
                        emits.append(dt)
                i += burst
            nxt += interval
            await asyncio.sleep(max(0.0, nxt - clock()))

    gc_pauses = []
    gc_started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[0] = clock()
        elif measuring:
            gc_pauses.append((clock() - gc_started[0], info.get("generation")))

    # A long-running gateway has long since collected its start-up garbage; a fresh process
    # would pay for it in its first collections, during the measurement.
    gc.collect()
    gc.callbacks.append(on_gc)
    tasks = [asyncio.ensure_future(monitor()), asyncio.ensure_future(emitter())]
    await asyncio.sleep(warmup)
    if after_warmup is not None:
        await after_warmup()
    measuring = True
    await asyncio.sleep(seconds)
    measuring = False
    stop = True
    await asyncio.gather(*tasks)
    gc.callbacks.remove(on_gc)
    return {"lags": lags, "emits": emits, "gc": gc_pauses}


def summarize(samples: dict) -> dict:
    lags = sorted(samples["lags"])
    emits = sorted(samples["emits"])
    over = sum(1 for v in lags if v > 0.001)
    out = {"lag_n": len(lags), "emit_n": len(emits),
           # Stalls of the loop longer than 1 ms, per 10,000 monitor wake-ups.
           "lag_over_1ms_per_10k": round(over * 1e4 / max(1, len(lags)), 1)}
    for name, values, scale in (("lag_ms", lags, 1e3), ("emit_us", emits, 1e6)):
        for q, key in ((50, "p50"), (99, "p99"), (99.9, "p999")):
            out["%s_%s" % (name, key)] = round(percentile(values, q) * scale, 3) if values else None
        out["%s_max" % name] = round(values[-1] * scale, 3) if values else None
    # The gateway's own garbage collections during the measurement: how many, the longest.
    pauses = samples.get("gc", [])
    out["gc_collections"] = len(pauses)
    out["gc_max_ms"] = round(max(p for p, _ in pauses) * 1e3, 3) if pauses else 0.0
    out["gc_full"] = sum(1 for _, gen in pauses if gen == 2)
    return out


def run_case(args: argparse.Namespace) -> dict:
    interval = args.interval_ms / 1000.0
    rt = False
    if args.rt:
        # Real-time priority for this (gateway) process and the threads it starts: on a shared
        # machine the other processes' load would otherwise dominate the lag of every case.
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            rt = True
        except (OSError, AttributeError) as exc:
            sys.stderr.write("loop_lag: no SCHED_FIFO (%s); measuring at normal priority\n" % exc)
    extra = {}
    if args.case == "none":
        samples = asyncio.run(workload(None, args.seconds, args.burst, interval, args.warmup))
    elif args.case == "original":
        sys.path.insert(0, HERE)
        import baseline_host  # noqa: E402  (the original host, re-created)

        hooks = tempfile.mkdtemp(prefix="loop-lag-original-")
        try:
            for i in range(10):
                d = os.path.join(hooks, "hook-%02d" % i)
                os.makedirs(d)
                with open(os.path.join(d, "HOOK.yaml"), "w") as f:
                    f.write("name: trivial-%02d\nevents: [\"%s\"]\n" % (i, EVENT))
                with open(os.path.join(d, "handler.py"), "w") as f:
                    f.write(TRIVIAL_SYNC)
            registry = baseline_host.HookRegistry(hooks)
            registry.discover_and_load()
            assert len(registry.loaded_hooks) == 10, registry.loaded_hooks
            samples = asyncio.run(workload(registry.emit, args.seconds, args.burst, interval,
                                           args.warmup))
        finally:
            shutil.rmtree(hooks, True)
    else:
        sys.path.insert(0, args.client)
        from hermes_hooks import HookRegistry  # noqa: E402

        registry = HookRegistry(address=args.address,
                                hermes_home=os.path.dirname(os.path.abspath(args.address)))
        registry.discover_and_load()
        assert len(registry.loaded_hooks) == 10, registry.loaded_hooks
        if args.case == "ingateway":
            assert all(h.get("runs") == "gateway" for h in registry.loaded_hooks), \
                registry.loaded_hooks

        async def freeze() -> None:
            if args.case in ("frozen", "thaw"):
                await registry.aflush(10.0)
                os.kill(args.service_pid, signal.SIGSTOP)
            if args.case == "thaw":
                # Let the buffer fill (the emitter keeps going), then measure the drain.
                deadline = time.monotonic() + 30
                while registry.pending < 10000 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                os.kill(args.service_pid, signal.SIGCONT)

        samples = asyncio.run(workload(registry.emit, args.seconds, args.burst, interval,
                                       args.warmup, freeze))
        stats = registry.stats()
        if args.case == "frozen":
            os.kill(args.service_pid, signal.SIGCONT)
        extra = {"flushed": registry.flush(30.0), "stats_at_end": stats,
                 "sent": registry.sent, "dropped": registry.dropped}
        registry.close(0)
    out = summarize(samples)
    out["rt"] = rt
    out.update(extra)
    return out


# ---------------------------------------------------------------------------- driver

def write_service_hooks(root: str, runs: str = "service") -> None:
    for i in range(10):
        d = os.path.join(root, "hook%02d" % i)
        os.makedirs(d)
        with open(os.path.join(d, "HOOK.yaml"), "w") as f:
            f.write("events: [\"%s\"]\nruns: %s\n" % (EVENT, runs))
        with open(os.path.join(d, "handler.py"), "w") as f:
            f.write(TRIVIAL_SYNC)


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process's own threads, 0 if it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def descendants(pid: int) -> list:
    """Every live process below ``pid`` (the fork server and its workers, executables)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cpu_split(pid: int) -> tuple:
    """(the service's own threads, its hook processes) in CPU seconds so far."""
    return proc_cpu(pid), sum(proc_cpu(p) for p in descendants(pid))


def ready(sock_path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(sock_path)
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def child(args: argparse.Namespace, case: str, burst: int, interval_ms: float,
          address: str, pid: int, client: str = "") -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--case", case, "--burst", str(burst),
            "--interval-ms", str(interval_ms), "--seconds", str(args.seconds),
            "--warmup", str(args.warmup), "--address", address, "--service-pid", str(pid),
            "--client", client or args.client]
    if args.rt:
        argv.append("--rt")
    before = cpu_split(pid)
    try:
        res = subprocess.run(argv, capture_output=True, timeout=args.seconds + 120)
    finally:
        os.kill(pid, signal.SIGCONT)  # never leave the service frozen
    after = cpu_split(pid)
    if res.returncode != 0:
        raise SystemExit("case %s failed:\n%s" % (case, res.stderr.decode(errors="replace")))
    out = json.loads(res.stdout)
    sent = out.get("sent") or 0
    if case == "client" and sent:
        # CPU the service spent per event sent during this case (warm-up and flush included):
        # its own threads, and its hook processes (10 workers: per event, all hooks together).
        out["service_us_per_event"] = round((after[0] - before[0]) * 1e6 / sent, 2)
        out["workers_us_per_event"] = round((after[1] - before[1]) * 1e6 / sent, 2)
    return out


def start_service(args: argparse.Namespace, tmp: str, runs: str, name: str = "",
                  command: tuple = ()) -> tuple:
    """A service on its own socket over 10 trivial hooks that run in the service or (`runs:
    gateway`) in the gateway's process, imported there by the client. ``command``: another
    binary (or wrapper) and extra ``serve`` arguments, for a ``--variant``."""
    home = os.path.join(tmp, name or runs)
    hooks = os.path.join(home, "hooks")
    write_service_hooks(hooks, runs)
    sock = os.path.join(home, "hooks.sock")
    log = open(os.path.join(home, "service.log"), "wb")
    binary, extra = (command[0], list(command[1:])) if command else (args.bin, [])
    service = subprocess.Popen([binary, "serve", "--drain-timeout", "0", "--hooks-dir", hooks,
                                "--socket", sock] + args.serve_arg + extra,
                               env=dict(os.environ, HERMES_HOME=home),
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    return service, sock, log


def stop_service(service: subprocess.Popen, log) -> None:
    service.send_signal(signal.SIGCONT)
    service.terminate()
    try:
        service.wait(10)
    except subprocess.TimeoutExpired:
        service.kill()
        service.wait()
    log.close()


def driver(args: argparse.Namespace) -> None:
    if not args.bin:
        raise SystemExit("--bin PATH (the hermes-hooks binary) is needed")
    load_before = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="loop-lag-")
    service, sock, log = start_service(args, tmp, "service")
    gw_service, gw_sock, gw_log = start_service(args, tmp, "gateway")
    fast = args.interval_ms / 4.0
    plan = [("none", "monitor alone (no emits)", args.burst, args.interval_ms),
            ("original", "original host, 10 trivial sync hooks", args.burst, args.interval_ms),
            ("client", "clients/python -> hermes-hooks", args.burst, args.interval_ms),
            ("frozen", "clients/python, service frozen", args.burst, args.interval_ms),
            ("thaw", "clients/python, backlog after a freeze", args.burst, args.interval_ms),
            ("ingateway", "clients/python, 10 hooks with runs: gateway", args.burst,
             args.interval_ms),
            ("original", "original host, 10 trivial sync hooks", args.burst, fast),
            ("client", "clients/python -> hermes-hooks", args.burst, fast),
            ("frozen", "clients/python, service frozen", args.burst, fast),
            ("thaw", "clients/python, backlog after a freeze", args.burst, fast),
            ("ingateway", "clients/python, 10 hooks with runs: gateway", args.burst, fast)]
    if args.cases:
        wanted = set(args.cases.split(","))
        plan = [p for p in plan if p[0] in wanted or p[0] in ("none", "original")]
    # A/B: the client case against each variant's service too, in the same rounds.
    variants = {}
    clients = {}
    for spec in args.variant:
        name, _, command = spec.partition("=")
        words = shlex.split(command)
        # --client=DIR in a variant: that variant's gateway uses another client checkout.
        clients[name] = next((w.split("=", 1)[1] for w in words if w.startswith("--client=")),
                             "")
        words = [w for w in words if not w.startswith("--client=")]
        if not words or words[0].startswith("-"):
            words.insert(0, args.bin)
        variants[name] = start_service(args, tmp, "service", "variant-" + name, tuple(words))
    for at, (case, label, burst, interval) in reversed(list(enumerate(plan))):
        if case == "client":
            plan[at + 1:at + 1] = [("client:" + name, "%s [%s]" % (label, name), burst, interval)
                                   for name in variants]
    services = [(service, sock, log), (gw_service, gw_sock, gw_log)] + list(variants.values())
    results = {i: [] for i in range(len(plan))}
    try:
        deadline = time.monotonic() + 60
        for svc, path, svc_log in services:
            while not ready(path):
                if svc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("service did not become ready; see %s" % svc_log.name)
                time.sleep(0.05)  # polling readiness against a deadline
        for _ in range(args.rounds):
            for i, (case, _, burst, interval) in enumerate(plan):
                if case == "ingateway":
                    results[i].append(child(args, case, burst, interval, gw_sock, gw_service.pid))
                elif case.startswith("client:"):
                    name = case.split(":", 1)[1]
                    svc, path, _ = variants[name]
                    results[i].append(child(args, "client", burst, interval, path, svc.pid,
                                            clients[name]))
                else:
                    results[i].append(child(args, case, burst, interval, sock, service.pid))
    finally:
        for svc, _, svc_log in services:
            stop_service(svc, svc_log)
        shutil.rmtree(tmp, True)

    keys = ["emit_us_p50", "emit_us_p99", "emit_us_max", "lag_ms_p50", "lag_ms_p99", "lag_ms_p999",
            "lag_ms_max", "lag_over_1ms_per_10k", "service_us_per_event", "workers_us_per_event"]
    table = []
    for i, (case, label, burst, interval) in enumerate(plan):
        runs = results[i]
        row = {"case": case, "label": label, "events_per_s": int(round(burst * 1000 / interval)),
               "rounds": len(runs)}
        for k in keys:
            vals = [r[k] for r in runs if r.get(k) is not None]
            row[k] = round(statistics.median(vals), 3) if vals else None
        row["lag_ms_max_worst"] = max(r["lag_ms_max"] for r in runs)
        row["emit_us_max_worst"] = max((r["emit_us_max"] or 0) for r in runs) if burst else None
        if case != "none" and case != "original":
            row["dropped"] = [r.get("dropped") for r in runs]
        table.append(row)
    report(args, table, results, load_before, os.getloadavg())
    if args.json:
        print(json.dumps({"table": table, "raw": results}))


#: Goals of issue 22, as ratios case / original host at the same rate (lag p99, lag max).
GOALS = {"client": (1.0, 1.5), "ingateway": (1.25, None)}
#: Goal for the client's emit p50, microseconds.
EMIT_P50_GOAL_US = 2.0


def report(args: argparse.Namespace, table: list, results: dict, load_before: tuple,
           load_after: tuple) -> None:
    """Prints the figures as the Markdown tables BENCHMARKS.md holds, then the ratios to the
    original host (below 1: less lag than the original) against the goals."""
    rt = all(r.get("rt") for runs in results.values() for r in runs)

    def num(v: object, digits: int) -> str:
        return "-" if v is None else "%.*f" % (digits, v)

    print("loop lag of the gateway's asyncio loop, %s events in bursts of %d; Python %s, %d CPUs, "
          "gateway %s; median of %d rounds x %.0f s (cases alternate within each round; worst "
          "round's max in brackets); load average %.1f before, %.1f after"
          % (EVENT, args.burst, platform.python_version(), os.cpu_count() or 0,
             "under SCHED_FIFO (--rt)" if rt else "at normal priority", args.rounds, args.seconds,
             load_before[0], load_after[0]))
    if args.serve_arg:
        print("service started with: %s" % " ".join(args.serve_arg))
    print()
    print("| host | ev/s | emit p50 / p99 / max (µs) | lag p50 | lag p99 | lag p99.9 "
          "| lag max [worst] | stalls > 1 ms per 10k |")
    print("|---|---|---|---|---|---|---|---|")
    for row in table:
        emit = "—" if row["emit_us_p50"] is None else "%s / %s / %s" % (
            num(row["emit_us_p50"], 1), num(row["emit_us_p99"], 1), num(row["emit_us_max"], 0))
        rate = "—" if row["case"] == "none" else "{:,}".format(row["events_per_s"])
        print("| %s | %s | %s | %s | %s | %s | %s [%s] | %s |" % (
            row["label"], rate, emit, num(row["lag_ms_p50"], 3), num(row["lag_ms_p99"], 3),
            num(row["lag_ms_p999"], 3), num(row["lag_ms_max"], 2), num(row["lag_ms_max_worst"], 2),
            num(row["lag_over_1ms_per_10k"], 1)))
    print()
    print("Ratios case / original host at the same rate, same run (below 1: less lag than the "
          "original); goals of issue 22 in brackets:")
    print()
    print("| case | ev/s | lag p99 | lag max | emit p50 (µs) | service threads / hook processes "
          "(CPU µs per event) |")
    print("|---|---|---|---|---|---|")
    misses = []
    for rate in sorted({r["events_per_s"] for r in table if r["case"] == "original"}):
        orig = next(r for r in table if r["case"] == "original" and r["events_per_s"] == rate)
        for row in table:
            if row["events_per_s"] != rate or row["case"] in ("none", "original"):
                continue
            p99 = row["lag_ms_p99"] / orig["lag_ms_p99"]
            mx = row["lag_ms_max"] / orig["lag_ms_max"]
            kind = row["case"].split(":")[0]
            goal_p99, goal_max = GOALS.get(kind, (None, None))
            cells = []
            for value, goal in ((p99, goal_p99), (mx, goal_max)):
                if goal is None:
                    cells.append("%.2fx" % value)
                else:
                    ok = value <= goal
                    cells.append("%s%.2fx%s [≤ %gx]" % ("" if ok else "**", value,
                                                          "" if ok else "**", goal))
                    if not ok:
                        misses.append("%s at %d ev/s: %.2fx > %gx" % (row["case"], rate,
                                                                         value, goal))
            emit = row["emit_us_p50"]
            emit_cell = num(emit, 1)
            if kind in GOALS and emit is not None:
                emit_cell += " [≤ %.0f]" % EMIT_P50_GOAL_US
                if emit > EMIT_P50_GOAL_US:
                    misses.append("%s emit p50 at %d ev/s: %.1f µs" % (row["case"], rate, emit))
            cpu = "—"
            if row.get("service_us_per_event") is not None:
                cpu = "%s / %s" % (num(row["service_us_per_event"], 1),
                                   num(row["workers_us_per_event"], 1))
            print("| %s | {:,} | %s | %s | %s | %s |".format(rate) % (
                row["label"], cells[0], cells[1], emit_cell, cpu))
    print()
    print("goals: " + ("all met" if not misses else "missed: " + "; ".join(misses)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("HERMES_HOOKS_BIN"),
                    help="hermes-hooks binary (default $HERMES_HOOKS_BIN)")
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per case (4)")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first (1)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over all cases (3)")
    ap.add_argument("--burst", type=int, default=100, help="events per burst (100)")
    ap.add_argument("--interval-ms", type=float, default=20.0,
                    help="ms between bursts at the base rate (20); the fast rate is 4x")
    ap.add_argument("--client", default=os.path.join(ROOT, "clients", "python"),
                    help="directory holding the hermes_hooks package (default clients/python; "
                         "another checkout's to compare versions)")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    ap.add_argument("--rt", action="store_true",
                    help="run each case's gateway process under SCHED_FIFO (needs root or "
                         "CAP_SYS_NICE): isolates the figures from other load on the machine")
    ap.add_argument("--cases", help="comma-separated cases to run besides none and original "
                    "(default: all of client, frozen, thaw, ingateway)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an extra argument for `hermes-hooks serve` (repeatable), e.g. "
                         "--serve-arg=--worker-nice=0 to compare with the workers at the "
                         "service's priority")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=BIN [ARG...]",
                    help="A/B in one run: also run the client case against a service started "
                         "as BIN serve ... ARG... (another build, a wrapper script, other serve "
                         "options; an ARG --client=DIR gives that variant's gateway another "
                         "client checkout; BIN may be left out), alternating with the others "
                         "in every round (repeatable); rows labelled [NAME]")
    ap.add_argument("--case", choices=["none", "original", "client", "frozen", "thaw",
                                       "ingateway"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--service-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args)))
    else:
        driver(args)


if __name__ == "__main__":
    main()
