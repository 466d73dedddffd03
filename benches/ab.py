#!/usr/bin/env python3
"""A/B of two builds of hermes-hooks over every row of issue 37's table, in one run.

    python3 benches/ab.py --a /work/ab/cfa75fd/target/release/hermes-hooks \\
        --a-client /work/ab/cfa75fd/clients/python \\
        --b target/release/hermes-hooks [--b-client clients/python] [--rounds 3] [--quick]

Rows (each side started with its default settings: no real-time priority, default scheduling):

  exec c4 / exec c1   a no-op ``#!/bin/sh`` executable hook with ``concurrency: 4`` and ``1``,
                      events/s as a ratio to a naive ``subprocess.run`` loop over the same file
                      in the same run (``benches/hooks_scale.rs``, part ``exec``); and four
                      such loops in four processes at once, the machine's ceiling for four
                      parallel starts (``concurrency: 4`` is shown against it too)
  python events/s     one trivial Python hook, pipelined (the default), sync ``handle``
                      (``hooks_scale``, part ``python``)
  start-up            50 trivial Python hooks, ``serve`` start to "hooks loaded" (``hooks_scale``,
                      part ``startup``, forked workers: the default)
  PSS per hook        the same 50 hooks: PSS of the service and every process under it / 50
  emit p50            gateway-side ``await emit()`` p50 with 10 service hooks at 5,000 events/s,
                      each side with its own ``clients/python`` (``benches/loop_lag.py``, case
                      ``client``; A runs as a ``--variant`` in the same rounds)

The ``hooks_scale`` parts run as one bench process per side and round, alternating A B, B A,
A B... (``HERMES_HOOKS_BIN`` picks the side's binary); ``loop_lag.py`` alternates the two
services within each of its rounds. Prints the medians over rounds and B/A per row as a Markdown
table for BENCHMARKS.md, with the load average before and after. ``--quick`` is a smoke run
(one round, fewer events, shorter emit cases): its figures mean nothing. ``--only startup``
(or another comma-separated list of ``exec``, ``python``, ``startup``, ``emit``) runs only those
rows. About 6-8 minutes with
the defaults on 2 vCPUs; the ``hooks_scale`` bench is built first (``cargo build --release --bench
hooks_scale``, on top of the release build) unless ``--hooks-scale PATH`` names its binary.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: What ``--only`` can pick: the parts of ``hooks_scale`` (``exec``, ``python``, ``startup``: the
#: start-up and PSS rows) and ``loop_lag.py``'s emit row.
PARTS = ("exec", "python", "startup", "emit")

#: (figure key, label, unit format, goal text, higher is better)
ROWS = [
    ("exec_vs_naive_c4", "no-op executable, `concurrency: 4`, vs naive `subprocess.run` loop",
     "%.2fx", ">= 2.5x", True),
    ("exec_vs_naive_c1", "no-op executable, `concurrency: 1`, vs naive loop", "%.2fx", ">= 1.0x",
     True),
    ("exec_events_per_s_c4", "no-op executable, `concurrency: 4`, events/s", "%.0f", "", True),
    ("exec_parallel4_vs_naive", "four naive loops in four processes, vs one (this machine's "
     "ceiling for 4 parallel starts)", "%.2fx", "", True),
    ("exec_c4_vs_parallel4", "no-op executable, `concurrency: 4`, vs four naive loops",
     "%.2fx", "", True),
    ("python_events_per_s_sync", "trivial Python hook, events/s, default settings", "%.0f",
     ">= 100,000", True),
    ("startup_ms_50", "50 trivial Python hooks, start to ready (ms)", "%.0f", "<= 250", False),
    ("pss_mb_per_hook_50", "PSS per trivial Python hook, 50 hooks (MB)", "%.2f", "<= 3.0", False),
    ("emit_us_p50", "gateway-side `await emit()` p50, 10 service hooks, 5,000 ev/s (µs)", "%.2f",
     "<= 1.0", False),
]


def hooks_scale_binary(args: argparse.Namespace) -> str:
    """The built `hooks_scale` bench (built here in the release profile, which the B binary was
    built with anyway, unless given)."""
    if args.hooks_scale:
        return args.hooks_scale
    out = subprocess.run(["cargo", "build", "--release", "--bench", "hooks_scale",
                          "--message-format=json"], cwd=ROOT, check=True,
                         stdout=subprocess.PIPE).stdout
    for line in out.decode().splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and \
                msg.get("target", {}).get("name") == "hooks_scale":
            return msg["executable"]
    raise SystemExit("cargo did not report the hooks_scale bench binary")


def run_hooks_scale(args: argparse.Namespace, bench: str, binary: str) -> dict:
    """One `hooks_scale` run against `binary`; returns its `#ab` figures."""
    env = dict(os.environ, HERMES_HOOKS_BIN=binary, HOOKS_SCALE_AB="1", HOOKS_SCALE_DEFAULTS="1",
               HOOKS_SCALE_ONLY=",".join(p for p in args.parts if p != "emit"), HOOKS_SCALE_SIZES="50",
               HOOKS_SCALE_EVENTS=str(args.events), HOOKS_SCALE_EXEC_EVENTS=str(args.exec_events))
    res = subprocess.run([bench, "--bench"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=900)
    if res.returncode != 0:
        raise SystemExit("hooks_scale failed against %s:\n%s" % (
            binary, res.stderr.decode(errors="replace")[-4000:]))
    figures = {}
    for line in res.stdout.decode().splitlines():
        if line.startswith("#ab "):
            f = json.loads(line[4:])
            figures[f["figure"]] = f["value"]
    return figures


def run_emit(args: argparse.Namespace) -> tuple:
    """`loop_lag.py`, client case only, B as the main service and A as a variant; returns the
    emit p50 (µs) of each side at the base rate, per round."""
    argv = [sys.executable, os.path.join(HERE, "loop_lag.py"), "--bin", args.b,
            "--client", args.b_client, "--variant", "a=%s --client=%s" % (args.a, args.a_client),
            "--cases", "client", "--rounds", str(args.rounds), "--seconds", str(args.emit_seconds),
            "--json"]
    res = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         timeout=1800)
    if res.returncode != 0:
        raise SystemExit("loop_lag.py failed:\n%s" % res.stderr.decode(errors="replace")[-4000:])
    last = res.stdout.decode().strip().splitlines()[-1]
    data = json.loads(last)
    base = min(r["events_per_s"] for r in data["table"])
    per_side = {"a": [], "b": []}
    for i, row in enumerate(data["table"]):
        if row["events_per_s"] != base or not row["case"].startswith("client"):
            continue
        side = "a" if row["case"] == "client:a" else "b"
        per_side[side] = [r["emit_us_p50"] for r in data["raw"][str(i)]
                          if r.get("emit_us_p50") is not None]
    return per_side["a"], per_side["b"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="service binary A (the before)")
    ap.add_argument("--b", required=True, help="service binary B (the after)")
    ap.add_argument("--a-client", required=True,
                    help="A's clients/python directory (for the emit row)")
    ap.add_argument("--b-client", default=os.path.join(ROOT, "clients", "python"),
                    help="B's clients/python directory (default: this tree's)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per side (3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, few events")
    ap.add_argument("--hooks-scale", help="the built hooks_scale bench binary (default: build it)")
    ap.add_argument("--json", action="store_true", help="also print every figure as JSON")
    ap.add_argument("--only", default=",".join(PARTS),
                    help="comma-separated parts to run, of %s (default: all); `startup` is the "
                    "start-up and PSS rows" % ", ".join(PARTS))
    args = ap.parse_args()
    args.parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        ap.error("--only takes parts of %s" % ", ".join(PARTS))
    args.a, args.b = os.path.abspath(args.a), os.path.abspath(args.b)
    args.events, args.exec_events, args.emit_seconds = 100_000, 3000, 4.0
    if args.quick:
        args.rounds, args.events, args.exec_events, args.emit_seconds = 1, 10_000, 300, 1.0
    bench = hooks_scale_binary(args)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    figures = {"a": {}, "b": {}}
    for rnd in range(args.rounds if args.parts != ["emit"] else 0):
        for side in ("a", "b") if rnd % 2 == 0 else ("b", "a"):
            got = run_hooks_scale(args, bench, getattr(args, side))
            for key, value in got.items():
                figures[side].setdefault(key, []).append(value)
            print("round %d %s: %s" % (rnd + 1, side.upper(), json.dumps(got)), file=sys.stderr)
    if "emit" in args.parts:
        emit_a, emit_b = run_emit(args)
        figures["a"]["emit_us_p50"], figures["b"]["emit_us_p50"] = emit_a, emit_b
    load_after = os.getloadavg()
    report(args, figures, load_before, load_after, time.monotonic() - t0)
    if args.json:
        print(json.dumps(figures))


def report(args: argparse.Namespace, figures: dict, load_before: tuple, load_after: tuple,
           took: float) -> None:
    print("A = `%s`, B = `%s`; %d round(s) per side, alternating; medians; load average %.1f "
          "before, %.1f after; %.0f s%s" % (args.a, args.b, args.rounds, load_before[0],
                                           load_after[0], took,
                                           " (--quick: a smoke run, not figures)"
                                           if args.quick else ""))
    print()
    print("| figure | A | B | B/A | goal | B's rounds |")
    print("|---|---|---|---|---|---|")
    for key, label, fmt, goal, _higher in ROWS:
        a, b = figures["a"].get(key, []), figures["b"].get(key, [])
        if not a or not b:
            print("| %s | - | - | - | %s | |" % (label, goal))
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = "%.2f" % (mb / ma) if ma else "-"
        print("| %s | %s | %s | %s | %s | %s |" % (label, fmt % ma, fmt % mb, ratio, goal,
                                                    ", ".join(fmt % v for v in b)))


if __name__ == "__main__":
    main()
