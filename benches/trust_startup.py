#!/usr/bin/env python3
"""What the trust path (issue 20) costs a Python hook: start-up and per event, before/after.

Drives ``runner.py`` directly, as the service does, in one run with alternating A/B rounds:

  before   the runner of ``--before-rev`` (default ``main``), hello without a manifest, no
           bytecode prefix (main's set-up: ``sys.dont_write_bytecode``)
  after    this tree's runner, hello with the manifest of the hook's files (every import from the
           hook's tree hashed and compiled from the bytes read), ``HERMES_HOOKS_PYCACHE`` (``sys.pycache_prefix``) in a
           cache directory (warmed by one unmeasured start)

for a hook whose handler imports ``--helpers`` helper modules (about 60 lines each), started two
ways: ``fresh`` (``python3 -u runner.py DIR HANDLER NAME``) and ``forked`` (a spawn request to the
runner's fork server, over SOCK_SEQPACKET as the service does; the fork server is started once per
runner). Start-up is the time from the request (process spawn or fork request) to the ready line;
per event is ``--events`` pipelined requests to a trivial sync ``handle``, timed to the last reply.

    python3 benches/trust_startup.py [--rounds 15] [--forked-factor 10] [--helpers 0,20]
                                     [--events 20000]

Forked starts get ``--forked-factor`` times the rounds of fresh ones (they are ~50x cheaper and
the figures noisier). Prints medians over rounds, the rounds, and the after/before ratios.
"""

import argparse
import hashlib
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

HELPER = "".join(
    "def f%d(x):\n    y = x * %d\n    if y > 10:\n        return y - 1\n    return [y, %r]\n\n" % (i, i, "s" * i)
    for i in range(12))


def make_hook(base, helpers):
    d = os.path.join(base, "hook%d" % helpers)
    os.makedirs(d)
    names = ["helper_%d" % i for i in range(helpers)]
    with open(os.path.join(d, "handler.py"), "w") as f:
        f.write("".join("import %s\n" % n for n in names))
        f.write("\ndef handle(event, context):\n    return None\n")
    for n in names:
        with open(os.path.join(d, n + ".py"), "w") as f:
            f.write(HELPER)
    files = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            files[name] = hashlib.sha256(f.read()).hexdigest()
    return d, files


def hello(files):
    msg = {"hello": 1, "protocol": 1}
    if files is not None:
        msg["files"] = files
    return (json.dumps(msg) + "\n").encode()


def read_line(fd, buf):
    while b"\n" not in buf[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise RuntimeError("worker closed its stdout")
        buf[0] += chunk
    line, _, buf[0] = buf[0].partition(b"\n")
    return line


def events(stdin_fd, stdout_fd, n, buf):
    reqs = b"".join(b'{"id":%d,"event":"x:go","context":{"a":1,"b":"two"}}\n' % (i + 1)
                    for i in range(n))
    t0 = time.perf_counter()
    view = memoryview(reqs)
    got = 0
    os.set_blocking(stdin_fd, False)
    while got < n:
        w = [stdin_fd] if len(view) else []
        r, w, _ = select.select([stdout_fd], w, [])
        if w:
            try:
                view = view[os.write(stdin_fd, view[:1 << 16]):]
            except BlockingIOError:
                pass
        if r:
            chunk = os.read(stdout_fd, 1 << 16)
            if not chunk:
                raise RuntimeError("worker closed its stdout")
            got += chunk.count(b"\n")
    return n / (time.perf_counter() - t0)


def run_fresh(runner, d, files, env, n_events):
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-u", runner, d, os.path.join(d, "handler.py"), "bench"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         cwd=d, env=env)
    p.stdin.write(hello(files))
    p.stdin.flush()
    buf = [b""]
    ready = read_line(p.stdout.fileno(), buf)
    start = time.perf_counter() - t0
    assert json.loads(ready).get("ready") is True, ready
    rate = events(p.stdin.fileno(), p.stdout.fileno(), n_events, buf)
    p.stdin.close()
    p.wait()
    return start, rate


class Zygote:
    def __init__(self, runner, env):
        self.host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-u", runner, "--zygote"], stdin=child,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=os.path.dirname(runner), env=env)
        child.close()
        assert json.loads(self.host.recv(65536)).get("zygote") == "ready"
        self.seq = 0

    def spawn(self, d, files, n_events):
        self.seq += 1
        t0 = time.perf_counter()
        self.host.send(json.dumps({"spawn": self.seq, "dir": d, "handler": os.path.join(
            d, "handler.py"), "name": "bench", "env": {}}).encode())
        while True:
            msg, fds, _, _ = socket.recv_fds(self.host, 65536, 8)
            m = json.loads(msg)
            if m.get("spawned") == self.seq:
                break
            for fd in fds:
                os.close(fd)
        stdin_fd, stdout_fd, stderr_fd, pidfd = fds
        os.write(stdin_fd, hello(files))
        buf = [b""]
        ready = read_line(stdout_fd, buf)
        start = time.perf_counter() - t0
        assert json.loads(ready).get("ready") is True, ready
        rate = events(stdin_fd, stdout_fd, n_events, buf)
        os.close(stdin_fd)
        select.select([pidfd], [], [], 10)
        for fd in (stdout_fd, stderr_fd, pidfd):
            os.close(fd)
        return start, rate

    def close(self):
        self.host.close()
        self.proc.wait()


def imports(hooks, runner, rounds):
    """In one process, alternating: importing a hook's handler and helpers the way main did
    (SourceFileLoader, no bytecode written, hook directory on sys.path) and through the runner's
    HookFinder (read, hash, compare, compile). The cleanest figure of the trust path's own cost."""
    import importlib.machinery
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_runner", runner)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.dont_write_bytecode = True
    print()
    print("| helpers | rounds | import, plain (before) | checked (after) | ratio |")
    print("|---|---|---|---|---|")
    for h, (d, files) in hooks.items():
        names = ["hermes_hook_bench"] + ["helper_%d" % i for i in range(h)]
        times = {"before": [], "after": []}
        for rnd in range(rounds):
            for case in (("before", "after") if rnd % 2 == 0 else ("after", "before")):
                for n in names:
                    sys.modules.pop(n, None)
                finder = mod.HookFinder(d, files) if case == "after" else None
                t0 = time.perf_counter()
                sys.path.insert(0, d)
                if finder is not None:
                    sys.meta_path.insert(0, finder)
                    loader = mod.VerifiedLoader(names[0], os.path.join(d, "handler.py"), finder)
                else:
                    loader = importlib.machinery.SourceFileLoader(
                        names[0], os.path.join(d, "handler.py"))
                sp = importlib.util.spec_from_file_location(
                    names[0], os.path.join(d, "handler.py"), loader=loader)
                m = importlib.util.module_from_spec(sp)
                sp.loader.exec_module(m)
                times[case].append(time.perf_counter() - t0)
                sys.path.remove(d)
                if finder is not None:
                    sys.meta_path.remove(finder)
        b = statistics.median(times["before"]) * 1e3
        a = statistics.median(times["after"]) * 1e3
        print("| %d | %d | %.2f ms | %.2f ms | %.2f |" % (h, rounds, b, a, a / b))


def git_runner(rev):
    """runner.py as of ``rev`` (it moved into handler/python/ with issue 23)."""
    for path in ("src/handler/python/runner.py", "src/handler/runner.py"):
        try:
            return subprocess.check_output(["git", "-C", ROOT, "show", "%s:%s" % (rev, path)],
                                           stderr=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            continue
    raise SystemExit("no runner.py in %s" % rev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before-rev", default="main",
                    help="the revision whose runner is 'before' (issue 20 measured cfa75fd)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--helpers", default="0,20")
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--forked-factor", type=int, default=10,
                    help="rounds of forked starts per round of fresh starts")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hh-trust-bench-")
    try:
        before = os.path.join(tmp, "before", "runner.py")
        after = os.path.join(tmp, "after", "runner.py")
        os.makedirs(os.path.dirname(before))
        os.makedirs(os.path.dirname(after), mode=0o700)
        with open(before, "wb") as f:
            f.write(git_runner(args.before_rev))
        shutil.copy(next(p for p in (os.path.join(ROOT, "src", "handler", "python", "runner.py"),
                                     os.path.join(ROOT, "src", "handler", "runner.py"))
                         if os.path.exists(p)), after)
        env_before = dict(os.environ)
        env_before.pop("PYTHONPYCACHEPREFIX", None)
        env_after = dict(env_before, HERMES_HOOKS_PYCACHE=os.path.join(tmp, "after", "pycache"))
        hooks = {h: make_hook(tmp, h) for h in (int(x) for x in args.helpers.split(","))}
        # The service's cache is warm in steady state: one unmeasured start fills it.
        for d, files in hooks.values():
            run_fresh(after, d, files, env_after, 10)
        cases = {"before": (before, None, env_before), "after": (after, True, env_after)}
        zygotes = {k: Zygote(r, e) for k, (r, _, e) in cases.items()}
        results = {}
        for rnd in range(args.rounds * args.forked_factor):
            order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
            for h, (d, files) in hooks.items():
                # A forked start is ~50x cheaper: it gets more rounds (the machine is noisy).
                modes = ("fresh", "forked") if rnd % args.forked_factor == 0 else ("forked",)
                for mode in modes:
                    for case in order:
                        runner, with_files, env = cases[case]
                        manifest = files if with_files else None
                        if mode == "fresh":
                            s, r = run_fresh(runner, d, manifest, env, args.events)
                        else:
                            s, r = zygotes[case].spawn(d, manifest, args.events)
                        results.setdefault((h, mode, case), []).append((s, r))
        for z in zygotes.values():
            z.close()
        print("| helpers | start | rounds | start-up before | after | ratio | paired | min before "
              "| min after | events/s before | after | ratio | paired |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for h in hooks:
            for mode in ("fresh", "forked"):
                b = results[(h, mode, "before")]
                a = results[(h, mode, "after")]
                sb = statistics.median(x[0] for x in b) * 1e3
                sa = statistics.median(x[0] for x in a) * 1e3
                rb = statistics.median(x[1] for x in b)
                ra = statistics.median(x[1] for x in a)
                # Paired: the median of each round's after/before (both ran back to back).
                ps = statistics.median(y[0] / x[0] for x, y in zip(b, a))
                pr = statistics.median(y[1] / x[1] for x, y in zip(b, a))
                print("| %d | %s | %d | %.1f ms | %.1f ms | %.2f | %.2f | %.1f ms | %.1f ms | %s | %s "
                      "| %.2f | %.2f |"
                      % (h, mode, len(a), sb, sa, sa / sb, ps, min(x[0] for x in b) * 1e3,
                         min(x[0] for x in a) * 1e3, format(int(rb), ","), format(int(ra), ","),
                         ra / rb, pr))
        imports(hooks, after, args.rounds * args.forked_factor)
    finally:
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
