"""The Python fork server alone, runner against runner: memory of N forked workers.

    python3 benches/runner_fork_pss.py --runner A=old/runner.py --runner B=src/handler/python/runner.py \
        [--hooks 50] [--rounds 3] [--handle sync|async] [--events 0]

Plays the host's part of the zygote protocol (runner.py's module doc) without the service, so a
change to runner.py is measured without building the binary: starts ``python3 -u RUNNER --zygote``,
asks it for N workers of trivial hooks (handler.py in temp directories), says hello to each and
waits for "ready", sends each ``--events`` requests, then after 1 s reads the PSS and private
dirty memory (/proc/PID/smaps_rollup) of the fork server and every worker. The runners alternate
in order each round; prints each round and the medians. (The service's own share is not in these
figures: benches/python_worker.py measures the whole tree.)
"""
import argparse
import array
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SYNC = "def handle(event, context):\n    return None\n"
ASYNC = "async def handle(event, context):\n    return None\n"


def rollup(pid):
    out = {}
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            p = line.split()
            if len(p) >= 3 and p[2] == "kB":
                out[p[0].rstrip(":")] = int(p[1])
    return out


def recv_with_fds(sock):
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(8 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return json.loads(msg), list(fds)


def run(runner, n, code, events):
    """kB figures for one fork server and its ``n`` workers."""
    with tempfile.TemporaryDirectory() as tmp:
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, HERMES_HOOKS_PYCACHE=os.path.join(tmp, "pycache"))
        zygote = subprocess.Popen([sys.executable, "-u", os.path.abspath(runner), "--zygote"],
                                  stdin=child, stderr=subprocess.DEVNULL, env=env, cwd=tmp)
        child.close()
        workers = []
        try:
            json.loads(host.recv(65536))  # ready
            digest = hashlib.sha256(code.encode()).hexdigest()
            for i in range(n):
                d = os.path.join(tmp, "h%03d" % i)
                os.makedirs(d)
                with open(os.path.join(d, "handler.py"), "w") as f:
                    f.write(code)
                host.send(json.dumps({"spawn": i, "dir": d, "cwd": d, "name": "h%03d" % i,
                                      "handler": os.path.join(d, "handler.py"), "env": {},
                                      "nice": None, "idle": False}).encode())
                while True:
                    msg, fds = recv_with_fds(host)
                    if "spawned" in msg:
                        break
                stdin, stdout, stderr, pidfd = fds
                os.close(pidfd)
                out = os.fdopen(stdout, "rb")
                hello = {"hello": 1, "protocol": 1, "files": {"handler.py": digest}}
                os.write(stdin, (json.dumps(hello) + "\n").encode())
                line = out.readline()
                if b'"ready":true' not in line.replace(b" ", b""):
                    raise SystemExit("worker %d: %r" % (i, line))
                workers.append((msg["pid"], stdin, out, stderr))
            for _, stdin, out, _ in workers:
                for k in range(events):
                    os.write(stdin, b'{"id": %d, "event": "agent:start", "context": {}}\n' % (k + 1))
                    out.readline()
            time.sleep(1.0)
            z = rollup(zygote.pid)
            ws = [rollup(pid) for pid, _, _, _ in workers]
        finally:
            host.close()
            for _, stdin, out, stderr in workers:  # (a trivial hook logs nothing: stderr unread)
                os.close(stdin)
                os.close(stderr)
                out.close()
            zygote.wait(30)
    avg = lambda k: sum(w[k] for w in ws) / len(ws)
    return {"per_hook": (z["Pss"] + sum(w["Pss"] for w in ws)) / n, "zygote": z["Pss"],
            "worker_pss": avg("Pss"), "worker_private": avg("Private_Dirty")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runner", action="append", required=True, help="LABEL=PATH (repeatable)")
    ap.add_argument("--hooks", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--handle", choices=["sync", "async"], default="sync")
    ap.add_argument("--events", type=int, default=0)
    args = ap.parse_args()
    runners = [r.split("=", 1) if "=" in r else (r, r) for r in args.runner]
    code = SYNC if args.handle == "sync" else ASYNC
    got = {}
    for rnd in range(args.rounds):
        for label, path in (runners if rnd % 2 == 0 else runners[::-1]):
            r = run(path, args.hooks, code, args.events)
            got.setdefault(label, []).append(r)
            print("round %d  %-12s fork server + workers: %.2f MB per hook (worker PSS %.2f, "
                  "private dirty %.2f MB)" % (rnd + 1, label, r["per_hook"] / 1024,
                                             r["worker_pss"] / 1024, r["worker_private"] / 1024),
                  flush=True)
    med = lambda label, k: statistics.median(x[k] for x in got[label]) / 1024
    print("\n| runner | fork server + workers, per hook | fork server | worker PSS | worker private dirty |")
    print("|---|---|---|---|---|")
    for label, _ in runners:
        print("| %s | **%.2f MB** | %.1f MB | %.2f MB | %.2f MB |"
              % (label, med(label, "per_hook"), med(label, "zygote"), med(label, "worker_pss"),
                 med(label, "worker_private")))


if __name__ == "__main__":
    main()
