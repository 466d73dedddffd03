"""Python hook workers, binary against binary: memory per hook, and events/s through one hook.

    python3 benches/python_worker.py --bin A=path/to/hermes-hooks --bin B=other/hermes-hooks \
        [--hooks 1,50] [--rounds 3] [--handle sync|async] [--events 0] [--settle 1.0] \
        [--rate 100000]

Memory: for each round and each hook count, every binary in turn (the order alternates between
rounds): `BIN serve` over N trivial Python hooks (a temp HERMES_HOME, 127.0.0.1:0), `--events`
events sent to every hook, then after `--settle` seconds the PSS (/proc/PID/smaps_rollup) of the
service, its Python fork server and its workers. Prints each round and the medians: PSS per hook
(the whole tree / N), the service's, the fork server's, a worker's PSS and private dirty memory,
and the cost of each hook after the first: (total(N) - total(1)) / (N - 1) when 1 is among the
counts.
Events/s (``--rate N``, instead of memory): one trivial Python hook per binary, 2,000 events to
warm up, then N events posted in batches of 1,000 and the time until its counters reach them
(as benches/hooks_scale.rs part 2, pipelined), the binaries alternating each round.
Standard library only; loopback only.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SYNC = "def handle(event, context):\n    return None\n"
ASYNC = "async def handle(event, context):\n    return None\n"


def rollup(pid):
    """Fields of /proc/PID/smaps_rollup in kB (empty if the process is gone)."""
    out = {}
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                p = line.split()
                if len(p) >= 3 and p[2] == "kB":
                    out[p[0].rstrip(":")] = int(p[1])
    except OSError:
        pass
    return out


def tree(root):
    """``root`` and every process under it."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, i = [root], 0
    while i < len(out):
        out.extend(children.get(out[i], []))
        i += 1
    return out


def parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def post(addr, path, body):
    req = urllib.request.Request("http://%s%s" % (addr, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def get(addr, path):
    with urllib.request.urlopen("http://%s%s" % (addr, path), timeout=60) as r:
        return json.loads(r.read())


class Service:
    """``BIN serve`` over ``root`` on 127.0.0.1:0; stopped (SIGTERM) on exit."""

    def __init__(self, binary, root, home):
        env = dict(os.environ, HERMES_HOME=home, HERMES_HOOKS_LOG="info")
        self.proc = subprocess.Popen([binary, "serve", "--hooks-dir", root, "--listen",
                                      "127.0.0.1:0", "--drain-timeout", "0"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ready = threading.Event()
        addr = []

        def read_log():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                if "listening on http://" in line:
                    addr.append(line.split("listening on http://")[1].split()[0])
                if "hooks loaded" in line:
                    ready.set()

        threading.Thread(target=read_log, daemon=True).start()
        if not ready.wait(120):
            self.stop()
            raise SystemExit("%s: no 'hooks loaded' within 120 s" % binary)
        self.addr = addr[0]

    def send(self, n, event="bench:x"):
        """``n`` events in batches of 1,000."""
        ctx = {"platform": "telegram", "user_id": "42", "session_id": "s1", "message": "hello"}
        while n > 0:
            k = min(n, 1000)
            post(self.addr, "/v1/events/batch", {"events": [{"event": event, "context": ctx}] * k})
            n -= k

    def wait_done(self, total, limit=300):
        """Until the hooks' ok + failed counters sum to ``total``."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            hooks = get(self.addr, "/v1/hooks")
            hooks = hooks.get("hooks", hooks) if isinstance(hooks, dict) else hooks
            if sum(h["counters"]["ok"] + h["counters"]["failed"] for h in hooks) >= total:
                return
            time.sleep(0.01)
        raise SystemExit("events not done within %d s" % limit)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def make_hooks(tmp, n, code, yaml="events: ['bench:*']\n"):
    root = os.path.join(tmp, "hooks")
    for i in range(n):
        d = os.path.join(root, "h%03d" % i)
        os.makedirs(d)
        with open(os.path.join(d, "HOOK.yaml"), "w") as f:
            f.write(yaml)
        with open(os.path.join(d, "handler.py"), "w") as f:
            f.write(code)
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    return root, home


def measure(binary, n, code, events, settle):
    """One service over ``n`` hooks; returns kB figures."""
    with tempfile.TemporaryDirectory() as tmp:
        root, home = make_hooks(tmp, n, code)
        with Service(binary, root, home) as svc:
            if events:
                svc.send(events)
                svc.wait_done(events * n)
            time.sleep(settle)
            procs = tree(svc.proc.pid)
            service = rollup(svc.proc.pid)
            zygote, workers = {}, []
            for pid in procs[1:]:
                r = rollup(pid)
                if not r:
                    continue
                # A forked worker keeps the fork server's command line: tell them by parent.
                if b"--zygote" in cmdline(pid) and parent(pid) == svc.proc.pid:
                    zygote = r
                else:
                    workers.append(r)
    total = service.get("Pss", 0) + zygote.get("Pss", 0) + sum(w.get("Pss", 0) for w in workers)
    avg = lambda k: sum(w.get(k, 0) for w in workers) / max(len(workers), 1)
    return {"total": total, "service": service.get("Pss", 0), "zygote": zygote.get("Pss", 0),
            "worker_pss": avg("Pss"), "worker_private": avg("Private_Dirty"),
            "workers": len(workers)}


def rate(binary, code, n):
    """Events/s through one hook: ``n`` events after 2,000 to warm up."""
    with tempfile.TemporaryDirectory() as tmp:
        root, home = make_hooks(tmp, 1, code, "events: ['bench:*']\nqueue: {capacity: 1000000}\n")
        with Service(binary, root, home) as svc:
            svc.send(2000, "bench:warm")
            svc.wait_done(2000)
            t0 = time.monotonic()
            svc.send(n)
            svc.wait_done(2000 + n)
            return n / (time.monotonic() - t0)


def rates(bins, code, n, rounds):
    got = {}
    for rnd in range(rounds):
        for label, path in (bins if rnd % 2 == 0 else bins[::-1]):
            got.setdefault(label, []).append(rate(path, code, n))
            print("round %d  %-8s %.0f events/s" % (rnd + 1, label, got[label][-1]), flush=True)
    base = statistics.median(got[bins[0][0]])
    print("\n| binary | events/s (median) | rounds | vs %s |" % bins[0][0])
    print("|---|---|---|---|")
    for label, _ in bins:
        m = statistics.median(got[label])
        print("| %s | **%.0f** | %s | %.2fx |" % (label, m, ", ".join("%.0f" % x for x in got[label]),
                                                 m / base))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", action="append", required=True, help="LABEL=PATH (repeatable)")
    ap.add_argument("--hooks", default="50", help="hook counts, comma-separated (e.g. 1,50)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--handle", choices=["sync", "async"], default="sync")
    ap.add_argument("--events", type=int, default=0, help="events sent to every hook first")
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--rate", type=int, default=0, help="measure events/s with this many events")
    args = ap.parse_args()
    bins = [b.split("=", 1) if "=" in b else (b, b) for b in args.bin]
    counts = [int(c) for c in args.hooks.split(",")]
    code = SYNC if args.handle == "sync" else ASYNC
    if args.rate:
        return rates(bins, code, args.rate, args.rounds)
    results = {}
    for rnd in range(args.rounds):
        order = bins if rnd % 2 == 0 else bins[::-1]
        for n in counts:
            for label, path in order:
                r = measure(path, n, code, args.events, args.settle)
                results.setdefault((label, n), []).append(r)
                print("round %d  %-8s %3d hooks: %.2f MB per hook (service %.1f, fork server %.1f, "
                      "worker PSS %.2f / private %.2f MB, %d workers)"
                      % (rnd + 1, label, n, r["total"] / n / 1024, r["service"] / 1024,
                         r["zygote"] / 1024, r["worker_pss"] / 1024, r["worker_private"] / 1024,
                         r["workers"]), flush=True)
    med = lambda label, n, k: statistics.median(x[k] for x in results[(label, n)])
    print("\n| binary | hooks | PSS per hook | service | fork server | worker PSS | worker private dirty |")
    print("|---|---|---|---|---|---|---|")
    for label, _ in bins:
        for n in counts:
            print("| %s | %d | **%.2f MB** | %.1f MB | %.1f MB | %.2f MB | %.2f MB |"
                  % (label, n, med(label, n, "total") / n / 1024, med(label, n, "service") / 1024,
                     med(label, n, "zygote") / 1024, med(label, n, "worker_pss") / 1024,
                     med(label, n, "worker_private") / 1024))
    if 1 in counts and len(counts) > 1:
        top = max(counts)
        for label, _ in bins:
            extra = statistics.median((b["total"] - a["total"]) / (top - 1) for a, b in
                                      zip(results[(label, 1)], results[(label, top)]))
            print("%s: each hook after the first costs %.2f MB (1 -> %d hooks)"
                  % (label, extra / 1024, top))


if __name__ == "__main__":
    sys.exit(main())
