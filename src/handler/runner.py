"""hermes-hooks Python worker: hosts one hook's handler.py for the life of the process.

Embedded in the hermes-hooks binary and started once per Python hook as
    python3 -u runner.py HOOK_DIR HANDLER_PATH HOOK_NAME
It owns: importing handler.py as module ``hermes_hook_<name>`` (HOOK_DIR first on sys.path), one
asyncio event loop for the whole process, and calling ``handle(event, context)`` one event at a time.

Protocol: newline-delimited JSON, one compact object per line, UTF-8.
  host -> runner (stdin):   {"hello": 1, "protocol": 1}                      first line, content ignored
                            {"id": 7, "event": "agent:start", "context": {...}}
  runner -> host (stdout):  {"ready": true, "pid": 123, "python": "3.11.7"}  or {"ready": false, "error": "..."}
                            {"id": 7, "ok": true, "result": ...}               or {"id": 7, "ok": false, "error": "..."}
Only this file writes to the protocol descriptors: fd 1 and fd 0 are re-pointed at stderr and
/dev/null, so a handler's print() (or a child process it starts) becomes a log line on stderr and can
neither corrupt the replies nor swallow requests. Tasks and threads a handler starts keep running
between events. On stdin EOF the runner gives pending tasks up to 2 s, then exits 0.

Logging: records of the ``logging`` module at INFO and above reach the service log, one stderr
line each, ``\x1ehermes-log {"level", "levelno", "logger", "msg"}``; the host logs it at the
record's level, tagged with the hook's name and the logger's. The handler is installed as
``logging.lastResort`` with the root logger at INFO, so it only sees records no other handler
took: a hook that configures logging itself (``basicConfig``, its own handlers) keeps its own.
"""
import asyncio
import importlib.machinery
import importlib.util
import inspect
import json
import logging
import os
import platform
import re
import signal
import sys
import threading
import time
import traceback

DRAIN_SECONDS = 2.0

# --- take the protocol descriptors before any other code can write or read them ---
_proto_out = os.fdopen(os.dup(1), "wb")
_proto_in = os.fdopen(os.dup(0), "rb")
os.dup2(2, 1)  # even C-level writes to fd 1 now land on stderr
_devnull = os.open(os.devnull, os.O_RDONLY)
os.dup2(_devnull, 0)
os.close(_devnull)
try:
    sys.stderr.reconfigure(line_buffering=True)
except (AttributeError, ValueError):
    pass
sys.stdout = sys.stderr
sys.stdin = open(os.devnull, "r")
# No __pycache__ in hook directories: they may be read-only, and new files there would wake the
# host's hot-reload watcher.
sys.dont_write_bytecode = True
_send_lock = threading.Lock()
_log_lock = threading.Lock()
LOG_MARK = "\x1ehermes-log "
#: Longest message sent per record (the host cuts longer stderr lines, which would break the JSON).
MAX_LOG_CHARS = 3500


class ServiceLogHandler(logging.Handler):
    """Sends each record to the service log as one structured stderr line."""

    def emit(self, record):
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
            if len(msg) > MAX_LOG_CHARS:
                msg = msg[:MAX_LOG_CHARS] + " [cut]"
            line = LOG_MARK + json.dumps({"level": record.levelname, "levelno": record.levelno,
                                          "logger": record.name, "msg": msg})
            data = (line + "\n").encode("utf-8", "replace")
            with _log_lock:
                os.write(2, data)
        except Exception:
            self.handleError(record)


def setup_logging():
    """Records nobody else handles go to the service log, from INFO up (see the module doc)."""
    logging.lastResort = ServiceLogHandler(logging.INFO)
    if not logging.root.handlers and logging.root.level == logging.WARNING:
        logging.root.setLevel(logging.INFO)


def send(obj):
    """Write one protocol line; if the host is gone there is nobody left to serve."""
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    line = data.encode("utf-8", "replace") + b"\n"  # "replace": a lone surrogate must not break UTF-8
    with _send_lock:
        try:
            _proto_out.write(line)
            _proto_out.flush()
        except (BrokenPipeError, ValueError, OSError):
            os._exit(0)


def describe(exc):
    """'TypeName: message', or just the type name when the message is empty."""
    text = str(exc)
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


def log_exception(header, exc):
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    sys.stderr.write(header + "\n" + "".join(lines))
    sys.stderr.flush()


class LoadError(Exception):
    """A hook that cannot load; the message is shown to the operator as is."""


def load_handler(hook_dir, handler_path, hook_name):
    """Import handler.py and return its callable ``handle``; raise LoadError with a readable reason."""
    base = os.path.basename(handler_path)
    module_name = "hermes_hook_" + re.sub(r"\W", "_", hook_name)
    sys.path.insert(0, hook_dir)
    # An explicit loader also accepts a handler file whose name does not end in .py.
    loader = importlib.machinery.SourceFileLoader(module_name, handler_path)
    spec = importlib.util.spec_from_file_location(module_name, handler_path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # SystemExit or KeyboardInterrupt at import time is a load failure too
        sys.modules.pop(module_name, None)
        log_exception("hermes-hooks: failed to import %s for hook %r:" % (handler_path, hook_name), exc)
        if isinstance(exc, SyntaxError):
            where = " (%s, line %s)" % (os.path.basename(exc.filename or base), exc.lineno)
            raise LoadError("%s: %s%s" % (type(exc).__name__, exc.msg, where))
        raise LoadError(describe(exc))
    handle = getattr(module, "handle", None)
    if handle is None:
        raise LoadError("no 'handle' function found in %s" % base)
    if not callable(handle):
        raise LoadError("'handle' in %s is not callable" % base)
    return handle


def keep_tasks_alive(loop):
    """asyncio holds tasks only weakly; keep strong references so fire-and-forget work is not GC'd."""
    live = set()

    def factory(loop, coro, **kwargs):
        task = asyncio.Task(coro, loop=loop, **kwargs)
        live.add(task)
        task.add_done_callback(live.discard)
        return task

    loop.set_task_factory(factory)


def start_reader(loop, queue):
    """Daemon thread: stdin lines -> queue on the loop; None marks EOF."""
    def put(item):
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # loop already closed
            pass

    def run():
        try:
            for line in iter(_proto_in.readline, b""):
                put(line)
        except (OSError, ValueError) as exc:
            sys.stderr.write("hermes-hooks: reading stdin failed: %s\n" % describe(exc))
        put(None)

    threading.Thread(target=run, name="hermes-stdin", daemon=True).start()


def bad_request(req_id, why):
    sys.stderr.write("hermes-hooks: bad request (id %s): %s\n" % (req_id, why))
    send({"id": req_id, "ok": False, "error": "bad request: " + why})


async def answer(handle, hook_name, line):
    """Handle one request line and send exactly one reply."""
    try:
        req = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # ValueError includes UnicodeDecodeError
        return bad_request(None, "invalid JSON: %s" % exc)
    req_id = req.get("id") if isinstance(req, dict) else None
    if req_id is None:
        return bad_request(None, "expected an object with an 'id'")
    event = req.get("event")
    if not isinstance(event, str):
        return bad_request(req_id, "'event' must be a string")
    context = req.get("context")
    if context is None:
        context = {}
    try:
        result = handle(event, context)
        if inspect.isawaitable(result):
            result = await result
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # includes SystemExit and CancelledError: reported, never fatal
        log_exception("hermes-hooks: hook %r failed on event %r (request %s):" % (hook_name, event, req_id), exc)
        send({"id": req_id, "ok": False, "error": describe(exc)})
        return
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        send({"id": req_id, "ok": False,
              "error": "TypeError: result of handle() is not JSON serializable: %s" % exc})
        return
    send({"id": req_id, "ok": True, "result": result})


async def serve(hook_dir, handler_path, hook_name):
    """Load the handler (inside the running loop, as the gateway did), then answer requests in order."""
    try:
        handle = load_handler(hook_dir, handler_path, hook_name)
    except LoadError as exc:
        sys.stderr.write("hermes-hooks: hook %r cannot load: %s\n" % (hook_name, exc))
        send({"ready": False, "error": str(exc)})
        return
    send({"ready": True, "pid": os.getpid(), "python": platform.python_version()})
    queue = asyncio.Queue()
    start_reader(asyncio.get_running_loop(), queue)
    while True:
        line = await queue.get()
        if line is None:
            break
        if line.strip():
            await answer(handle, hook_name, line)
    # stdin closed: give the work handlers started (and the work that work starts) a short grace.
    deadline = time.monotonic() + DRAIN_SECONDS
    while True:
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            break
        await asyncio.wait(pending, timeout=left)
    if pending:
        sys.stderr.write("hermes-hooks: exiting with %d unfinished task(s)\n" % len(pending))


def main():
    if len(sys.argv) != 4:
        sys.stderr.write("usage: runner.py HOOK_DIR HANDLER_PATH HOOK_NAME\n")
        os._exit(2)
    hook_dir, handler_path, hook_name = sys.argv[1:]
    # The host owns our lifetime (stdin EOF, or a kill on timeout); a Ctrl-C meant for the host must
    # not kill the worker while the host is still draining its queue.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging()
    if not _proto_in.readline():  # the hello; EOF before it means the host is gone
        os._exit(0)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    keep_tasks_alive(loop)
    code = 0
    try:
        loop.run_until_complete(serve(hook_dir, handler_path, hook_name))
    except BaseException as exc:
        log_exception("hermes-hooks: runner failed:", exc)
        code = 1
    sys.stderr.flush()
    os._exit(code)  # do not wait for non-daemon threads a handler left behind


if __name__ == "__main__":
    main()
