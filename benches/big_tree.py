#!/usr/bin/env python3
"""Does one executable hook with a huge tree slow the other hooks' emits? (issue 47, row 1)

An executable hook's tree is checked before each of its starts (listed and `stat`ed, from the
caches). That work used to run on the service's runtime threads; now it runs on the hook's own
starter thread. This bench emits ``agent:ok`` (matched by a tiny executable hook ``ok``) at
``--rate`` events/s over one kept-alive HTTP connection and times each ``POST /v1/events``, in
two cases, alternated over ``--rounds``:

  alone     only the ``agent:ok`` emits
  big-tree  the same, while a second client emits ``agent:big`` at the same rate to an
            executable hook ``big`` whose tree holds ``--entries`` files (in directories of 100; 19,000 by default, as the review's 19,194-entry tree: a hook may hold at most 20,000 files and directories)

    python3 benches/big_tree.py --bin target/release/hermes-hooks [--entries 19000]
        [--rate 100] [--seconds 8] [--rounds 2]

Prints p50/p99/max of the ``agent:ok`` emits per case (median over rounds) and how many
``agent:big`` events the big hook ran. Standard library only.
"""

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HANDLER = "#!/bin/sh\ncat >/dev/null\necho null\n"


def make_hooks(root, entries):
    for name, event in (("ok", "agent:ok"), ("big", "agent:big")):
        d = os.path.join(root, name)
        os.makedirs(d)
        with open(os.path.join(d, "HOOK.yaml"), "w") as f:
            f.write("name: %s\nevents: [\"%s\"]\n" % (name, event))
        h = os.path.join(d, "handler")
        with open(h, "w") as f:
            f.write(HANDLER)
        os.chmod(h, 0o755)
    big = os.path.join(root, "big", "lib")
    for i in range(entries):
        sub = os.path.join(big, "d%03d" % (i // 100))
        if i % 100 == 0:
            os.makedirs(sub)
        with open(os.path.join(sub, "f%03d.txt" % (i % 100)), "w") as f:
            f.write("x")


def start(binary, root, home):
    env = dict(os.environ, HERMES_HOME=home, HERMES_HOOKS_LOG="warn,hermes_hooks=info")
    p = subprocess.Popen([binary, "serve", "--hooks-dir", root, "--listen", "127.0.0.1:0"],
                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    addr = None
    for line in p.stderr:
        m = re.search(r"listening on http://(\S+)", line)
        if m:
            addr = m.group(1)
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        c = http.client.HTTPConnection(host, int(port), timeout=10)
        c.request("GET", "/readyz")
        if c.getresponse().status == 200:
            return p, host, int(port)
        time.sleep(0.1)  # polling readiness, bounded above
    raise SystemExit("the service did not get ready")


def emitter(host, port, event, rate, seconds, times):
    c = http.client.HTTPConnection(host, port, timeout=30)
    body = json.dumps({"event": event, "context": {}}).encode()
    start = time.monotonic()
    n = 0
    while True:
        due = start + n / rate
        now = time.monotonic()
        if now - start >= seconds:
            return
        if due > now:
            time.sleep(due - now)  # pacing the emits
        t = time.perf_counter()
        c.request("POST", "/v1/events", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        times.append(time.perf_counter() - t)
        n += 1


def ran(host, port, hook):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/v1/hooks/" + hook)
    v = json.loads(c.getresponse().read())
    if "counters" not in v:
        c.request("GET", "/v1/hooks")
        skipped = json.loads(c.getresponse().read()).get("skipped")
        raise SystemExit("hook %s is not loaded: %s" % (hook, json.dumps(skipped)[:600]))
    return v["counters"]["ok"] + v["counters"]["failed"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/hermes-hooks")
    ap.add_argument("--entries", type=int, default=19000)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, home = os.path.join(tmp, "hooks"), os.path.join(tmp, "home")
        os.makedirs(home)
        make_hooks(root, a.entries)
        p, host, port = start(a.bin, root, home)
        try:
            results = {"alone": [], "big-tree": []}
            big_ran = []
            for _ in range(a.rounds):
                for case in ("alone", "big-tree"):
                    ok_times = []
                    threads = [threading.Thread(target=emitter, args=(host, port, "agent:ok", a.rate, a.seconds, ok_times))]
                    before = ran(host, port, "big")
                    if case == "big-tree":
                        threads.append(threading.Thread(target=emitter, args=(host, port, "agent:big", a.rate, a.seconds, [])))
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    if case == "big-tree":
                        time.sleep(1)  # let the big hook's last events finish before counting
                        big_ran.append(ran(host, port, "big") - before)
                    results[case].append((pct(ok_times, 0.5), pct(ok_times, 0.99), max(ok_times)))
        finally:
            p.terminate()
            p.wait(30)
    print("| case | agent:ok emit p50 (ms) | p99 (ms) | max (ms) |")
    print("|---|---|---|---|")
    for case, rows in results.items():
        med = [statistics.median(r[i] for r in rows) * 1000 for i in range(3)]
        print("| %s | %.2f | %.2f | %.2f |" % (case, *med))
    print("big hook events run per round (of %d emitted): %s" % (int(a.rate * a.seconds), big_ran))
    print("load average: %s" % (os.getloadavg(),))


if __name__ == "__main__":
    sys.exit(main())
