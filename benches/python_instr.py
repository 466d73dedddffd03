#!/usr/bin/env python3
"""Instructions per event on the two Python paths of issue 37, counted with callgrind (the
count does not depend on the machine's load, unlike a time):

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python3 benches/python_instr.py emit CLIENT_DIR N        # N x await registry.emit
    python3 benches/python_instr.py runner RUNNER_PY N [--depth 64] [--under valgrind ...]

``emit``: N ``await registry.emit("agent:step", ctx)`` (a 10-key, ~400-byte context) on an
asyncio loop, with the client from CLIENT_DIR and no service (the sender thread waits in a long
backoff, so it adds nothing); ``emit-noop`` the same loop awaiting an empty coroutine (the floor).
``runner``: the worker of one trivial sync hook (``RUNNER_PY``, started from scratch as the
service would) fed N requests in pipelined batches of ``--depth``, each batch's answers read
before the next is written; ``--under`` runs the worker under a command (valgrind ...) and this
driver outside it. Run each with N = 0 as well: (count(N) - count(0)) / N is the cost of one
event. Without valgrind, ``runner`` prints the worker's events/s (the driver's own cost
included). Standard library only.
"""
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile

CONTEXT = {"platform": "telegram", "user_id": "1234567", "chat_id": "-1009876543210",
           "thread_id": "", "chat_type": "group", "session_id": "sess-0001-00000001",
           "step": 1, "tool": "web_search", "message": "what is the weather like " * 6}


def emit(client_dir: str, n: int, noop: bool) -> None:
    sys.path.insert(0, client_dir)
    from hermes_hooks import HookRegistry  # noqa: E402

    async def main() -> None:
        home = tempfile.mkdtemp(prefix="hh-instr-")
        registry = HookRegistry(address=os.path.join(home, "absent.sock"), autostart=False,
                                queue_size=10 ** 7, queue_bytes=1 << 34, backoff_initial=100,
                                backoff_max=100)
        call = registry.emit
        if noop:
            async def call(event, context):  # noqa: F811
                return None
        await registry.emit("agent:step", CONTEXT)  # the name is validated once, the sender starts
        await asyncio.sleep(0.5)  # the sender's first attempt fails; it waits 100 s
        for _ in range(n):
            await call("agent:step", CONTEXT)
        os._exit(0)

    asyncio.run(main())


def runner(runner_py: str, n: int, depth: int, under: list) -> None:
    import time
    hook = tempfile.mkdtemp(prefix="hh-instr-hook-")
    handler = os.path.join(hook, "handler.py")
    with open(handler, "wb") as f:
        f.write(b"def handle(event, context):\n    return None\n")
    with open(handler, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    ctx = json.dumps({"platform": "telegram", "user_id": "42", "session_id": "s1",
                      "message": "hello"}, separators=(",", ":")).encode()
    worker = subprocess.Popen(under + [sys.executable, "-u", runner_py, hook, handler, "h"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    worker.stdin.write(b'{"hello":1,"protocol":1,"files":{"handler.py":"%s"}}\n' % digest.encode())
    rest = b""

    def read_lines(k: int) -> list:
        nonlocal rest
        got = []
        while len(got) < k:
            chunk = os.read(worker.stdout.fileno(), 1 << 16)
            if not chunk:
                raise SystemExit("the worker exited")
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            got.extend(lines)
        return got

    ready = read_lines(1)[0]
    if b'"ready":true' not in ready:
        raise SystemExit("the worker refused: %r" % ready)
    next_id = 0

    def batch(k: int) -> None:
        nonlocal next_id
        worker.stdin.write(b"".join(b'{"id":%d,"event":"bench:x","context":%s}\n'
                                    % (next_id + i + 1, ctx) for i in range(k)))
        next_id += k
        read_lines(k)

    for _ in range(2000 // depth):
        batch(depth)
    started = time.perf_counter()
    for _ in range(n // depth):
        batch(depth)
    if n:
        print("%.0f events/s" % (n // depth * depth / (time.perf_counter() - started)))
    worker.stdin.close()
    worker.wait()


def main() -> None:
    args = sys.argv[1:]
    under = []
    if "--under" in args:
        at = args.index("--under")
        under, args = args[at + 1:], args[:at]
    depth = 64
    if "--depth" in args:
        at = args.index("--depth")
        depth = int(args[at + 1])
        del args[at:at + 2]
    if len(args) != 3 or args[0] not in ("emit", "emit-noop", "runner"):
        raise SystemExit(__doc__)
    if args[0] == "runner":
        runner(args[1], int(args[2]), depth, under)
    else:
        emit(args[1], int(args[2]), args[0] == "emit-noop")


if __name__ == "__main__":
    main()
