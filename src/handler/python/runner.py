"""hermes-hooks Python worker: hosts one hook's handler.py for the life of the process.

Embedded in the hermes-hooks binary. Started in one of two ways:
    python3 -u runner.py HOOK_DIR HANDLER_PATH HOOK_NAME     a worker started from scratch
    python3 -u runner.py --zygote                            the fork server of one interpreter
The fork server ("zygote") has imported what every worker needs and called gc.freeze(); on the
host's request it forks a worker, which takes its own process group, pipes, environment, working
directory and sys.path, then runs exactly what a worker started from scratch runs. After the fork a
worker needs nothing from the zygote.
A worker owns: importing handler.py as module ``hermes_hook_<name>`` (HOOK_DIR first on sys.path,
every module of the hook's tree through HookFinder, checked against the host's manifest),
and calling ``handle(event, context)`` one event at a time, in order: inside one asyncio event loop
for the whole process when the hook may use one (``needs_loop``: its source mentions asyncio,
``async``/``await`` or the running loop; or ``handle`` is a coroutine function), otherwise in a
plain blocking loop over the pipe, switching to the event loop for good at the first awaitable
``handle`` returns.

Worker protocol: newline-delimited JSON, one compact object per line, UTF-8.
  host -> runner (stdin):   {"hello": 1, "protocol": 1, "files": {"helper.py": "<sha256>", ...}}
                            first line; "files" is what the hook's tree may import (HookFinder)
                            {"id": 7, "event": "agent:start", "context": {...}}
  runner -> host (stdout):  {"ready": true, "pid": 123, "python": "3.11.7"}  or {"ready": false, "error": "..."}
                            {"id": 7, "ok": true, "result": ...}               or {"id": 7, "ok": false, "error": "..."}
The host may send several requests before the first is answered (pipelining): they are read as they
come and handled strictly one after the other; each reply is written when its call ends, so a reply
missing means that call and every later one have not finished, and the call after an unanswered
one has never started.
A newer version of the hook took over (the host sends SIGUSR2): the call in progress finishes, and
every request after it is answered {"id": 8, "ok": false, "skipped": true} without being started
(the host gives those events to the new version).
A fleet lease holder's request also carries "start_by" (CLOCK_MONOTONIC ns, time.monotonic_ns())
and "epoch": once its turn comes past start_by, it and every later request of the same epoch are
answered {"id": 9, "ok": false, "skipped": true, "expired": true} without being started (a worker
stopped with SIGSTOP must not run, on waking, calls whose lease may be another worker's now).
Only this file writes to the protocol descriptors: fd 1 and fd 0 are re-pointed at stderr and
/dev/null, so a handler's print() (or a child process it starts) becomes a log line on stderr and can
neither corrupt the replies nor swallow requests. Tasks and threads a handler starts keep running
between events. On stdin EOF the runner gives pending tasks up to 2 s, then exits 0.

Logging: records of the ``logging`` module at INFO and above reach the service log, one stderr
line each, ``\x1ehermes-log {"level", "levelno", "logger", "msg"}``; the host logs it at the
record's level, tagged with the hook's name and the logger's. The handler is installed as
``logging.lastResort`` with the root logger at INFO, so it only sees records no other handler
took: a hook that configures logging itself (``basicConfig``, its own handlers) keeps its own.

Zygote protocol: fd 0 is a SOCK_SEQPACKET socket to the host, one JSON message per packet.
  host -> zygote:  {"spawn": 3, "dir": ..., "cwd": ..., "handler": ..., "name": ..., "env": {...},
                    "nice": 10, "idle": false}     the worker's CPU priority (absolute nice value)
  zygote -> host:  {"zygote": "ready", "pid": 12, "python": "3.11.7"}          once, at start
                   {"spawned": 3, "pid": 345} + fds [stdin w, stdout r, stderr r, pidfd]
                   {"spawned": 3, "error": "..."}
                   {"exited": 345, "code": 0}    code < 0: killed by signal -code (the zygote reaps)
On EOF (the host is gone) the zygote waits for its workers (their stdin closes too), then exits.
"""
import _imp
import asyncio
import gc
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import logging
import os
import platform
import re
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings

DRAIN_SECONDS = 2.0
#: The bytecode cache the service owns (see use_service_pycache).
PYCACHE_ENV = "HERMES_HOOKS_PYCACHE"
#: The fork server's CPU priority, ``"NICE IDLE"``, applied once it is ready (set by the host).
PRIORITY_ENV = "HERMES_HOOKS_FORK_SERVER_PRIORITY"
READ_CHUNK = 1 << 16

_proto_out = None  # the real stdout's descriptor, for replies only
_proto_in = None  # the real stdin's descriptor, for requests only
_send_lock = threading.Lock()
_retiring = False  # SIGUSR2: a newer version took over; start no further call
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
    """Records nobody else handles go to the service log, from INFO up (see the module doc). Done
    in the fork server already (a forked worker then shares the handler and the loggers' caches
    it clears), in a worker started from scratch here."""
    if isinstance(logging.lastResort, ServiceLogHandler):
        return
    logging.lastResort = ServiceLogHandler(logging.INFO)
    if not logging.root.handlers and logging.root.level == logging.WARNING:
        logging.root.setLevel(logging.INFO)


def take_protocol_fds():
    """Take the protocol descriptors before any other code can write or read them."""
    global _proto_out, _proto_in
    _proto_out = os.dup(1)
    _proto_in = os.dup(0)
    os.dup2(2, 1)  # even C-level writes to fd 1 now land on stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        # One write per line: a print() from a thread cannot be cut by a log line (os.write(2)).
        sys.stderr.reconfigure(line_buffering=True, write_through=False)
    except (AttributeError, ValueError):
        pass
    sys.stdout = sys.stderr
    # sys.stdin stays the interpreter's own object: it reads fd 0, /dev/null from here on, and
    # nothing has read from it (requests come through _proto_in). A new one would be io objects
    # of its own in every forked worker.
    use_service_pycache()


def use_service_pycache():
    """Python never reads or writes a hook's own ``__pycache__``: a planted ``.pyc`` whose header
    matches a source file would run instead of it. The hook's own modules never use bytecode
    (HookFinder compiles the bytes it checked); everything imported from here on (what a hook
    imports lazily, or loads by hand) keeps its cache under the directory the service owns
    (``HERMES_HOOKS_PYCACHE``, set by the host), written even under ``PYTHONDONTWRITEBYTECODE``
    since it is nobody's source tree. The runner's own imports came before, from the usual
    caches. Without the variable no bytecode is written at all."""
    prefix = os.environ.get(PYCACHE_ENV)
    if prefix and os.path.isabs(prefix):
        sys.pycache_prefix = prefix
        sys.dont_write_bytecode = False
    else:
        sys.dont_write_bytecode = True


def drop_own_directory():
    """The runner's directory (the service's cache) is not an import location: a ``csv.py`` left
    there must not shadow the standard library for every hook."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


class VerifiedLoader(importlib.machinery.SourceFileLoader):
    """Executes exactly the bytes it hashed: read once, compared with the manifest, compiled."""

    def __init__(self, fullname, path, finder):
        super().__init__(fullname, path)
        self.finder = finder

    def get_code(self, fullname):
        return compile(self.finder.verified(self.path, fullname), self.path, "exec",
                       dont_inherit=True)


class HookFinder:
    """Imports from a hook's tree only what the host says this version was loaded (and, with
    ``--trust explicit``, approved) with, at the moment of the import: a module imported lazily,
    after an edit, is refused instead of run. First on ``sys.meta_path``; names not found in the
    tree fall through to the usual finders (the standard library, site-packages).

    Nothing in the tree is reachable around it: :meth:`install` also puts :meth:`path_hook`
    first on ``sys.path_hooks``, so every ``sys.path`` entry or package path inside the tree (the
    hook directory itself, a namespace package's directory, a ``vendor/`` a hook appends) is
    searched by :meth:`entry_spec`, never by the plain path finder. A bare directory is a
    namespace package (a regular package elsewhere on ``sys.path`` wins, as in Python); bytecode
    (``__init__.pyc`` too) is refused, an extension module only runs when it is in the manifest,
    loaded through the descriptor that was hashed. A refused import is logged with the hook's
    name and the file."""

    def __init__(self, root, files, hook_name=""):
        self.root = os.path.abspath(root)
        self.files = files
        self.hook_name = hook_name

    def install(self):
        sys.meta_path.insert(0, self)
        sys.path_hooks.insert(0, self.path_hook)
        for entry in list(sys.path_importer_cache):  # finders made before the hook existed
            if isinstance(entry, str) and self.inside(entry):
                del sys.path_importer_cache[entry]

    def inside(self, path):
        path = os.path.abspath(path)
        return path == self.root or path.startswith(self.root + os.sep)

    def refuse(self, fullname, path, why, exc=ImportError):
        """Logs the refusal (hook, file) and returns the ImportError to raise."""
        message = "hermes-hooks: hook %r: %s %s; not imported" % (
            self.hook_name, os.path.relpath(path, self.root), why)
        log_line(logging.WARNING, message)
        return exc(message, name=fullname, path=path)

    def verified(self, path, fullname=None):
        """The bytes of ``path`` when their SHA-256 is the one in the manifest; else ImportError."""
        with open(path, "rb") as f:
            return self.checked(f, path, fullname)

    def checked(self, f, path, fullname=None):
        """The bytes read from the open file ``f`` (of ``path``), checked against the manifest."""
        rel = os.path.relpath(os.path.abspath(path), self.root)
        data = f.read()
        want = self.files.get(rel)
        if want is None:
            raise self.refuse(fullname, path, "is not among the files this version of the hook "
                              "was loaded (and approved) with", FileChanged)
        if hashlib.sha256(data).hexdigest() != want:
            raise self.refuse(fullname, path, "changed since this version of the hook was loaded "
                              "(and approved)", FileChanged)
        return data

    def find_spec(self, fullname, path=None, target=None):
        dirs = [self.root] if path is None else [d for d in path
                                                  if isinstance(d, str) and self.inside(d)]
        for d in dirs:
            spec = self.entry_spec(fullname, d)
            if spec is not None and spec.loader is not None:
                return spec
        # A namespace portion: the path finder gathers them (through path_hook) and lets a
        # regular package elsewhere on sys.path win, as Python does.
        return None

    def path_hook(self, entry):
        """``sys.path_hooks``: the finder of a path entry inside the tree (ImportError: not ours)."""
        if isinstance(entry, str) and self.inside(entry or os.curdir):
            return TreeEntryFinder(self, os.path.abspath(entry or os.curdir))
        raise ImportError("not inside the hook's tree", path=entry)

    def entry_spec(self, fullname, d):
        """What ``fullname`` is in the directory ``d`` of the tree: a checked module or package,
        a namespace portion (a spec without loader), None, or ImportError (bytecode, a file that
        is not in the manifest). Looked for in the plain path finder's order: package, module,
        namespace directory."""
        tail = fullname.rpartition(".")[2]
        base = os.path.join(d, tail)
        is_dir = os.path.isdir(base)
        if is_dir:
            spec = self.file_spec(fullname, os.path.join(base, "__init__"), [base])
            if spec is not None:
                return spec
        spec = self.file_spec(fullname, base, None)
        if spec is None and is_dir and not tail.startswith("__pycache__"):
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [base]
        return spec

    def file_spec(self, fullname, stem, locations):
        """The spec of ``stem`` + a source or extension suffix, checked; bytecode is refused."""
        for suffixes, loader in ((importlib.machinery.SOURCE_SUFFIXES, VerifiedLoader),
                                 (importlib.machinery.EXTENSION_SUFFIXES, VerifiedExtensionLoader)):
            for suffix in suffixes:
                if os.path.isfile(stem + suffix):
                    return importlib.util.spec_from_file_location(
                        fullname, stem + suffix, loader=loader(fullname, stem + suffix, self),
                        submodule_search_locations=locations)
        for suffix in importlib.machinery.BYTECODE_SUFFIXES:
            if os.path.isfile(stem + suffix):
                raise self.refuse(fullname, stem + suffix, "is bytecode; a hook's bytecode is "
                                  "never run", ImportError)
        return None


class TreeEntryFinder:
    """The path entry finder of one directory of a hook's tree (see :class:`HookFinder`)."""

    def __init__(self, finder, path):
        self.finder = finder
        self.path = path

    def find_spec(self, fullname, target=None):
        return self.finder.entry_spec(fullname, self.path)

    def invalidate_caches(self):
        pass

    def iter_modules(self, prefix=""):
        """What ``pkgutil.iter_modules`` lists here (names only: importing them comes back
        through ``find_spec``)."""
        import pkgutil
        return pkgutil.iter_importer_modules(importlib.machinery.FileFinder(self.path), prefix)


#: The descriptors extension modules were loaded from, held for the life of the process: the
#: dynamic loader knows a library by the name it was opened with, so a descriptor number used
#: again would give the next extension module the first one's library.
_extension_fds = []


class VerifiedExtensionLoader(importlib.machinery.ExtensionFileLoader):
    """Loads an extension module of the tree from the descriptor whose bytes were hashed
    (``/proc/self/fd/N``, each module its own ``N``, kept open since a library is never
    unloaded): a file renamed over it after the check is not what runs."""

    def __init__(self, fullname, path, finder):
        super().__init__(fullname, path)
        self.finder = finder

    def create_module(self, spec):
        f = open(self.path, "rb")
        try:
            self.finder.checked(f, self.path, spec.name)
            proc = "/proc/self/fd/%d" % f.fileno()
            if not os.path.exists(proc):  # no /proc: the path, checked just now
                f.close()
                return super().create_module(spec)
            by_fd = importlib.machinery.ModuleSpec(spec.name, self, origin=proc)
            module = _imp.create_dynamic(by_fd)
        except BaseException:
            f.close()
            raise
        _extension_fds.append(f)
        return module


class LineReader:
    """Reads whole lines from a descriptor, a chunk at a time (many pipelined requests per read)."""

    def __init__(self, fd):
        self.fd = fd
        self.rest = b""

    def read_lines(self):
        """The complete lines of the next chunk (maybe none); None at EOF."""
        chunk = os.read(self.fd, READ_CHUNK)
        if not chunk:
            return None
        data = self.rest + chunk
        lines = data.split(b"\n")
        self.rest = lines.pop()
        return lines


#: One encoder for every reply (json.dumps with options builds a new encoder per call).
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def send(obj, check=False):
    """Write one protocol line; if the host is gone there is nobody left to serve. With ``check``,
    an object that is not JSON raises (TypeError, ValueError) before anything is written."""
    if check:
        data = _encode(obj)
    else:
        try:
            data = _encode(obj)
        except (TypeError, ValueError, RecursionError) as exc:
            data = json.dumps({"id": obj.get("id"), "ok": False, "error": describe(exc)})
    write_line(data.encode("utf-8", "replace") + b"\n")  # "replace": a lone surrogate must not break UTF-8


def write_line(line):
    """One ``write`` of the whole line (unbuffered: a reply is out before the next call starts)."""
    with _send_lock:
        try:
            done = os.write(_proto_out, line)
            while done < len(line):  # a pipe may take a long line in parts
                line = line[done:]
                done = os.write(_proto_out, line)
        except OSError:  # BrokenPipeError included: the host is gone
            os._exit(0)


def describe(exc):
    """'TypeName: message', or just the type name when the message is empty."""
    text = str(exc)
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


def log_line(levelno, msg):
    """One record of the service log from the runner itself (logger ``hermes-hooks``)."""
    line = LOG_MARK + json.dumps({"level": logging.getLevelName(levelno), "levelno": levelno,
                                  "logger": "hermes-hooks", "msg": msg[:MAX_LOG_CHARS]})
    try:
        sys.stderr.flush()
        with _log_lock:
            os.write(2, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def log_exception(header, exc, level=logging.ERROR):
    """The header and the traceback as one record of the service log (not one info line per
    traceback line), ERROR unless ``level`` says otherwise; a long traceback keeps its end,
    where the error is."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    room = MAX_LOG_CHARS - len(header) - 20
    if len(tb) > room:
        tb = "[cut] ..." + tb[-max(room, 0):]
    log_line(level, header + "\n" + tb)


def where_in(exc, hook_dir):
    """`` (file, line N)``: the innermost frame of the traceback in the hook's tree, or ''."""
    root = os.path.join(os.path.realpath(hook_dir), "")
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.realpath(frame.filename)
        if path.startswith(root):
            where = " (%s, line %s)" % (os.path.relpath(path, root), frame.lineno)
    return where


class FileChanged(ImportError):
    """A module of the hook's tree is not the one this version was loaded (and approved) with."""


class LoadError(Exception):
    """A hook that cannot load; the message is shown to the operator as is. ``changed``: because
    a file of its tree changed (the host then hands the events to the version loaded from it)."""

    def __init__(self, message, changed=False):
        Exception.__init__(self, message)
        self.changed = changed


def near_miss(module, base):
    """``"; did you mean handle? ..."`` when ``module`` defines a function whose name is close to
    ``handle`` (``handel``, ``handler``, ``Handle``), else ``""`` (issue 50)."""
    import difflib  # only on this error path: not at every worker's start
    names = [n for n, v in vars(module).items()
             if callable(v) and not n.startswith("__") and getattr(v, "__module__", None) == module.__name__]
    close = difflib.get_close_matches("handle", names, n=1, cutoff=0.6)
    close = close or [n for n in names if n.lower().startswith("handle")][:1]
    if not close:
        return ""
    code = getattr(vars(module)[close[0]], "__code__", None)
    line = " (line %d)" % code.co_firstlineno if code is not None else ""
    return "; did you mean handle? %s defines %r%s: rename it to handle" % (base, close[0], line)


def load_handler(hook_dir, handler_path, hook_name, files=None):
    """Import handler.py and return its callable ``handle``; raise LoadError with a readable reason.
    With ``files`` (relative path -> SHA-256, from the host), every module of the hook's tree is
    imported through a :class:`HookFinder` that checks it against them."""
    base = os.path.basename(handler_path)
    module_name = "hermes_hook_" + hook_name  # as written, as the original host names it
    sys.path.insert(0, hook_dir)
    if files is not None:
        finder = HookFinder(hook_dir, files, hook_name)
        finder.install()
        loader = VerifiedLoader(module_name, handler_path, finder)
    else:
        # An explicit loader also accepts a handler file whose name does not end in .py.
        loader = importlib.machinery.SourceFileLoader(module_name, handler_path)
    spec = importlib.util.spec_from_file_location(module_name, handler_path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # SystemExit or KeyboardInterrupt at import time is a load failure too
        sys.modules.pop(module_name, None)
        # The service says the reason once (file, line, message); the traceback is for -v.
        log_exception("hermes-hooks: failed to import %s for hook %r:" % (handler_path, hook_name),
                      exc, logging.DEBUG)
        if isinstance(exc, SyntaxError):
            where = " (%s, line %s)" % (os.path.basename(exc.filename or base), exc.lineno)
            raise LoadError("%s: %s%s" % (type(exc).__name__, exc.msg, where))
        if isinstance(exc, FileChanged):
            raise LoadError(describe(exc), changed=True)
        raise LoadError(describe(exc) + where_in(exc, hook_dir))
    handle = getattr(module, "handle", None)
    if handle is None:
        raise LoadError("no 'handle' function found in %s%s" % (base, near_miss(module, base)))
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


def start_reader(loop, queue, reader):
    """Reads stdin on the event loop (no thread: a thread's stack and malloc arena would be private
    memory in every worker): each readable chunk becomes one list of lines on the queue, however
    many pipelined requests it holds; None marks EOF. While a synchronous handle() runs nothing is
    read; the host keeps reading replies while it writes, so neither side can block the other."""
    def on_readable():
        try:
            lines = reader.read_lines()
        except (OSError, ValueError) as exc:
            sys.stderr.write("hermes-hooks: reading stdin failed: %s\n" % describe(exc))
            lines = None
        if lines is None:
            loop.remove_reader(reader.fd)
            queue.put_nowait(None)
        elif lines:
            queue.put_nowait(lines)

    loop.add_reader(reader.fd, on_readable)


def bad_request(req_id, why):
    sys.stderr.write("hermes-hooks: bad request (id %s): %s\n" % (req_id, why))
    send({"id": req_id, "ok": False, "error": "bad request: " + why})


def retire(signum, frame):
    """SIGUSR2: a newer version of the hook is ready; requests not started yet go to it."""
    global _retiring
    _retiring = True


def skip(line):
    """Answers a request that will not be started here (see ``retire``)."""
    try:
        req_id = json.loads(line.decode("utf-8")).get("id")
    except (ValueError, RecursionError, AttributeError):
        req_id = None
    send({"id": req_id, "ok": False, "skipped": True})


#: The C scanner behind ``json.loads``, called directly (see ``parse_request``).
_scan_json = json.scanner.make_scanner(json.JSONDecoder())


def parse_request(line):
    """``json.loads(line)`` for a request line, without its Python layers in the common case
    (compact UTF-8, as the host writes it): the decode and the C scanner only. Anything else
    (whitespace around the value, an encoded surrogate, an error to describe) goes through
    ``json.loads``, which gives the same value or the error."""
    try:
        text = line.decode("utf-8")
        value, end = _scan_json(text, 0)
        if end == len(text):
            return value
    except (ValueError, StopIteration, RecursionError):
        pass
    return json.loads(line)  # bytes: UTF-8 (an invalid sequence is a ValueError too)


#: The epoch of the fleet lease holding whose start-by bound passed (see the module comment).
_expired_epoch = None


def past_start_by(req, start_by):
    """None when a request may no longer start (its start-by bound passed, or an earlier request
    of its epoch's did: the calls behind it keep their order, none of them starts either); else
    the moment it was let start (monotonic ns), which the handler sees as
    ``context["_fleet"]["admitted_ns"]``."""
    global _expired_epoch
    epoch = req.get("epoch")
    if epoch is not None and epoch == _expired_epoch:
        return None
    now = time.monotonic_ns()
    if not isinstance(start_by, int) or now >= start_by:
        _expired_epoch = epoch
        return None
    return now


def answer(handle, hook_name, line):
    """Handle one request line: sends exactly one reply, now or, when ``handle`` returned an
    awaitable, from the coroutine returned (the caller awaits it before the next request)."""
    try:
        req = parse_request(line)
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
    start_by = req.get("start_by")
    if start_by is not None:
        admitted = past_start_by(req, start_by)
        if admitted is None:
            return send({"id": req_id, "ok": False, "skipped": True, "expired": True})
        fleet = context.get("_fleet") if isinstance(context, dict) else None
        if isinstance(fleet, dict):
            fleet["admitted_ns"] = admitted
    try:
        result = handle(event, context)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # includes SystemExit: reported, never fatal
        return failed(hook_name, event, req_id, exc)
    if result is None and type(req_id) is int:
        # The common answer, without an encoder.
        return write_line(b'{"id":%d,"ok":true,"result":null}\n' % req_id)
    if inspect.isawaitable(result):
        return finish(hook_name, event, req_id, result)
    return reply(req_id, result)


async def finish(hook_name, event, req_id, awaitable):
    try:
        result = await awaitable
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # includes CancelledError: reported, never fatal
        return failed(hook_name, event, req_id, exc)
    reply(req_id, result)


def failed(hook_name, event, req_id, exc):
    note_denial(exc)
    log_exception("hermes-hooks: hook %r failed on event %r (request %s):" % (hook_name, event, req_id), exc)
    send({"id": req_id, "ok": False, "error": describe(exc)})


def reply(req_id, result):
    try:
        send({"id": req_id, "ok": True, "result": result}, check=True)
    except (TypeError, ValueError, RecursionError) as exc:
        send({"id": req_id, "ok": False,
              "error": "TypeError: result of handle() is not JSON serializable: %s" % exc})


#: What in a hook's source may need an event loop running around a synchronous ``handle`` (or
#: while its module is imported): asyncio itself, coroutines, and the calls that reach the running
#: loop. Comments and strings count too: a false alarm only costs the loop's memory.
NEEDS_LOOP = re.compile(rb"asyncio|async\s|await|get_event_loop|get_running_loop|create_task|"
                        rb"ensure_future|run_coroutine_threadsafe")


def needs_loop(hook_dir, handler_path, files):
    """Whether the hook gets the event loop from the start (as in the gateway, which calls every
    handler inside its loop): when its handler or any module of its tree mentions asyncio,
    ``async``/``await`` or a call that reaches the running loop, has an extension module (which
    cannot be read), or the host sent no list of files. Otherwise a synchronous ``handle`` runs
    in a plain loop over the pipe (``serve_blocking``): an event loop dirties about 0.7 MB of the
    memory a forked worker shares with its fork server."""
    if files is None:
        return True
    paths = {os.path.abspath(handler_path)}
    for rel in files:
        if rel.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            return True
        if rel.endswith(".py"):
            paths.add(os.path.abspath(os.path.join(hook_dir, rel)))
    for path in paths:
        try:
            with open(path, "rb") as f:
                if NEEDS_LOOP.search(f.read()):
                    return True
        except OSError:
            pass  # the import reports a missing or unreadable handler
    return False


def answer_lines(handle, hook_name, lines):
    """Answers the request lines in order (a retiring worker skips them) up to the first whose
    ``handle`` returned an awaitable: ``(that answer's coroutine, the lines after it)``, or
    ``(None, [])`` when every line was answered."""
    for i, line in enumerate(lines):
        if not line or line.isspace():
            continue
        if _retiring:
            skip(line)
            continue
        pending = answer(handle, hook_name, line)
        if pending is not None:
            return pending, lines[i + 1:]
    return None, []


def serve_blocking(handle, hook_name, reader, lines):
    """Answers requests in order with no event loop: each line read from the pipe (blocking) is
    answered before the next is read. Returns ``(None, None)`` at EOF; when ``handle`` returned an
    awaitable, returns ``(that answer's coroutine, the request lines after it)``: the caller
    continues on an event loop."""
    while True:
        pending, rest = answer_lines(handle, hook_name, lines)
        if pending is not None:
            return pending, rest
        try:
            lines = reader.read_lines()
        except (OSError, ValueError) as exc:
            sys.stderr.write("hermes-hooks: reading stdin failed: %s\n" % describe(exc))
            lines = None
        if lines is None:
            return None, None


def current_or_new_loop():
    """The loop for a synchronous ``handle``'s first awaitable: the one its code already made
    current, if any (a future it returned is bound to it), else a new one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            loop = asyncio.get_event_loop()  # creates one when none is set, up to CPython 3.13
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
    return loop


def is_async(handle):
    """``handle`` is a coroutine function (or an object whose ``__call__`` is one)."""
    return (inspect.iscoroutinefunction(handle)
            or inspect.iscoroutinefunction(getattr(handle, "__call__", None)))


def load_or_refuse(hook_dir, handler_path, hook_name, files):
    """The loaded ``handle`` (and the "ready" line sent), or None (the refusal sent)."""
    try:
        handle = load_handler(hook_dir, handler_path, hook_name, files)
    except LoadError as exc:
        refusal = {"ready": False, "error": str(exc)}
        if exc.changed:
            refusal["changed"] = True
        send(refusal)
        return None
    send({"ready": True, "pid": os.getpid(), "python": platform.python_version()})
    return handle


async def serve(hook_dir, handler_path, hook_name, reader, early, files, handle=None, first=None):
    """Load the handler (inside the running loop, as the gateway did) unless ``handle`` is given,
    await ``first`` (the answer the blocking loop handed over), then answer requests in order."""
    if handle is None:
        handle = load_or_refuse(hook_dir, handler_path, hook_name, files)
        if handle is None:
            return
    if first is not None:
        await first
    queue = asyncio.Queue()
    if early:
        queue.put_nowait(early)
    start_reader(asyncio.get_running_loop(), queue, reader)
    while True:
        lines = await queue.get()
        if lines is None:
            break
        while lines:
            pending, lines = answer_lines(handle, hook_name, lines)
            if pending is not None:
                await pending
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


def apply_process_env(env):
    """What a fresh interpreter does with its environment at start and a fork inherits stale:
    the time zone (``TZ``) and the locale (``LC_*``, ``LANG``) of the hook's ``env:``."""
    if "TZ" in env and hasattr(time, "tzset"):
        time.tzset()
    if any(k == "LANG" or k.startswith("LC_") for k in env):
        try:
            import locale
            locale.setlocale(locale.LC_CTYPE, "")  # what interpreter start-up sets
        except Exception as exc:  # an unknown locale: the C locale stays, as in a fresh start
            sys.stderr.write("hermes-hooks: locale from env not applied: %s\n" % describe(exc))


def run_worker(hook_dir, handler_path, hook_name):
    """The worker's life, the same whether started from scratch or forked; never returns."""
    take_protocol_fds()
    # The host owns our lifetime (stdin EOF, or a kill on timeout); a Ctrl-C meant for the host must
    # not kill the worker while the host is still draining its queue.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, retire)
    setup_logging()
    reader = LineReader(_proto_in)
    lines = []
    while not lines:  # the hello; EOF before it means the host is gone
        lines = reader.read_lines()
        if lines is None:
            os._exit(0)
    early = lines[1:]  # requests sent right behind the hello
    files = hello_files(lines[0])
    policy = sandbox_of_hello(lines[0])
    if policy is None and _ruleset_fd is not None:
        os.close(take_ruleset_fd())
    if policy is not None:
        refusal = apply_sandbox(policy, hook_dir)
        if refusal is not None:
            sys.stderr.write("hermes-hooks: hook %r cannot start: %s\n" % (hook_name, refusal))
            send({"ready": False, "error": refusal})
            sys.stderr.flush()
            os._exit(0)
    code = 0
    try:
        handle = first = None
        if not needs_loop(hook_dir, handler_path, files):
            handle = load_or_refuse(hook_dir, handler_path, hook_name, files)
            if handle is None:
                os._exit(0)
            if not is_async(handle):
                first, early = serve_blocking(handle, hook_name, reader, early)
                if first is None:
                    sys.stderr.flush()
                    os._exit(0)
        # The event loop from the start, or from the first awaitable a synchronous handle returned.
        loop = asyncio.new_event_loop() if first is None else current_or_new_loop()
        asyncio.set_event_loop(loop)
        keep_tasks_alive(loop)
        loop.run_until_complete(serve(hook_dir, handler_path, hook_name, reader, early, files,
                                      handle, first))
    except BaseException as exc:
        log_exception("hermes-hooks: runner failed:", exc)
        code = 1
    sys.stderr.flush()
    os._exit(code)  # do not wait for non-daemon threads a handler left behind


def hello_files(line):
    """The manifest the host sends in its hello (``"files"``: relative path -> SHA-256), or None."""
    try:
        hello = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    files = hello.get("files") if isinstance(hello, dict) else None
    return files if isinstance(files, dict) else None


# --- the sandbox (``sandbox:`` in HOOK.yaml) ---
#
# A confined hook's worker confines itself after the hello and before the hook is imported, the
# same whether it was forked or started from scratch: the environment keeps only the variables
# the sandbox allows, then no_new_privs and the Landlock rules the host sent (plus this
# interpreter's own directories, read-only) are enforced with raw system calls. What the kernel
# refuses the hook from then on fails with EACCES/EPERM; when such an error leaves ``handle``,
# the service log says what was denied (the path, port or program of the last access the audit
# hook saw) and which key of ``sandbox:`` would allow it.

#: The policy applied (the ``sandbox`` of the hello), or None when the hook is not confined.
_sandbox = None
#: Per thread, the last access the audit hook saw: (event, args).
_last_access = {}
#: Variables the hook looked up and may not see, each logged once.
_env_noted = set()
#: The hook's directory with a trailing separator: a lookup is the hook's when made from there.
_hook_root = None
_AUDITED = frozenset(("open", "socket.connect", "subprocess.Popen", "os.exec", "os.posix_spawn",
                      "os.spawn", "os.system", "os.fork"))
_LANDLOCK_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)


def sandbox_of_hello(line):
    """The ``sandbox`` object of the hello, or None."""
    try:
        hello = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    policy = hello.get("sandbox") if isinstance(hello, dict) else None
    return policy if isinstance(policy, dict) else None


def env_allowed(patterns, key):
    if key == PYCACHE_ENV:
        return True
    return any(key.startswith(p[:-1]) if p.endswith("*") else key == p for p in patterns)


class _SandboxedEnviron(type(os.environ)):
    """``os.environ`` of a confined hook: a lookup of a variable it may not see is logged once."""

    def __getitem__(self, key):
        try:
            return super().__getitem__(key)
        except KeyError:
            if _sandbox is not None and isinstance(key, str) and key not in _env_noted \
                    and not env_allowed(_sandbox.get("env") or (), key) and looked_up_by_hook():
                _env_noted.add(key)
                sandbox_log("the hook looked up the variable %s, which its sandbox withholds: to let "
                            "it see it, add it under `env:` of %s" % (key, _sandbox.get("where")))
            raise


def looked_up_by_hook():
    """Whether the code that looked a variable up (past ``os`` and the mapping methods) is the
    hook's own, not the standard library probing its optional settings."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if _hook_root and name.startswith(_hook_root):
            return True
        if not (name.startswith("<frozen") or name.endswith(("os.py", "_collections_abc.py"))):
            return False
        frame = frame.f_back
    return False


def sandbox_log(msg):
    log_line(logging.WARNING, "sandbox: " + msg)


def _audit(event, args):
    if event in _AUDITED:
        _last_access[threading.get_ident()] = (event, args)


#: ``interpreter_dirs()`` as the fork server found it (its workers inherit it), or None.
_interpreter_dirs = None


def interpreter_dirs():
    """What this interpreter reads once the hook runs: its own directories only (its prefixes,
    where its executable is, its standard library and site-packages, the service's bytecode
    cache), never what ``sys.path`` gained from the environment or the working directory."""
    if _interpreter_dirs is not None:
        return _interpreter_dirs
    import sysconfig
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(sys.executable)}
    paths = sysconfig.get_paths()
    dirs.update(paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    if getattr(sys, "pycache_prefix", None):
        dirs.add(sys.pycache_prefix)
    return sorted(d for d in dirs if d and os.path.isabs(d))


def open_pinned(path):
    """An ``O_PATH`` descriptor of ``path`` (resolved by the service), walked one component at a
    time from ``/`` without following any link: a link there now was made since (by the hook,
    in a directory it can write) and is refused."""
    import stat
    fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        for part in [p for p in path.split("/") if p]:
            if part in (".", ".."):
                raise OSError(22, "%s is not a resolved path" % path)
            nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(40, "%s passes through a symbolic link (%s) made after the sandbox "
                                  "was resolved: delete it" % (path, part))
        return fd
    except BaseException:
        os.close(fd)
        raise


def threads_now():
    """How many threads this process runs (the kernel's count: C threads too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


#: The descriptor of the Landlock ruleset the service built for this worker (the hook's rules and
#: the fork server's interpreter directories, each grant opened without following a link), handed
#: over with the fork request and moved to descriptor 3; None when the worker builds its own.
_ruleset_fd = None


def take_ruleset_fd():
    """The service's ruleset descriptor, at most once (closed by the caller)."""
    global _ruleset_fd
    fd, _ruleset_fd = _ruleset_fd, None
    return fd


#: ``landlock_api()`` once made (by the confined fork server before it forks: importing
#: ``ctypes`` and making its structures took ~3.5 ms of every confined worker's start, issue 46).
_landlock_api = None


def landlock_api():
    """``ctypes``, the C library and the Landlock structures, made once per process."""
    global _landlock_api
    if _landlock_api is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long

        class Attr(ctypes.Structure):
            _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64),
                        ("scoped", ctypes.c_uint64)]

        class Beneath(ctypes.Structure):
            _pack_ = 1
            _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]

        class Port(ctypes.Structure):
            _fields_ = [("allowed", ctypes.c_uint64), ("port", ctypes.c_uint64)]

        _landlock_api = (ctypes, libc, Attr, Beneath, Port)
    return _landlock_api


def _check(r, what):
    if r < 0:
        err = landlock_api()[0].get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def restrict_with(fd):
    """no_new_privs, then the ruleset ``fd`` enforced on this process."""
    ctypes, libc = landlock_api()[:2]
    _check(libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(libc.syscall(ctypes.c_long(446), ctypes.c_int(fd), ctypes.c_uint(0)),
           "landlock_restrict_self")


def landlock_restrict(rules):
    """The Landlock ruleset of ``rules`` built here (the service sent none), then enforced."""
    import stat
    ctypes, libc, Attr, Beneath, Port = landlock_api()
    check = _check

    attr = Attr(rules["handled_fs"], rules["handled_net"], rules["scoped"])
    size = 24 if rules["scoped"] else (16 if rules["handled_net"] else 8)
    fd = libc.syscall(ctypes.c_long(444), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint(0))
    check(fd, "landlock_create_ruleset")
    try:
        paths = [(p, r, False) for p, r in rules["paths"]]
        paths += [(p, r, True) for p, r in rules.get("grants") or ()]
        paths += [(d, rules["read_rights"], False) for d in interpreter_dirs()]
        for path, rights, pinned in paths:
            try:
                pfd = open_pinned(path) if pinned else os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                    rights &= _LANDLOCK_FILE_RIGHTS
                rule = Beneath(rights, pfd)
                check(libc.syscall(ctypes.c_long(445), ctypes.c_int(fd), ctypes.c_uint(1),
                                   ctypes.byref(rule), ctypes.c_uint(0)), "landlock_add_rule %s" % path)
            finally:
                os.close(pfd)
        for port, rights in rules["ports"]:
            rule = Port(rights, port)
            check(libc.syscall(ctypes.c_long(445), ctypes.c_int(fd), ctypes.c_uint(2),
                               ctypes.byref(rule), ctypes.c_uint(0)), "landlock_add_rule port %s" % port)
        restrict_with(fd)
    finally:
        os.close(fd)


def install_filter(program):
    """The service's seccomp filter (``src/sandbox/seccomp.rs``: no Unix socket, so no way to
    the service), installed on this process as sent: ``[[code, jt, jf, k], ...]``. After
    no_new_privs; it holds for every process this one starts."""
    if not program:
        return
    ctypes, libc = landlock_api()[:2]

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    insns = (Insn * len(program))(*[Insn(*i) for i in program])
    prog = Prog(len(program), insns)
    # PR_SET_SECCOMP (22), SECCOMP_MODE_FILTER (2)
    _check(libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(prog), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)), "prctl(PR_SET_SECCOMP)")


def apply_sandbox(policy, hook_dir):
    """Confine this worker to ``policy`` (see above); a reason when it cannot, else None."""
    global _sandbox, _hook_root
    _hook_root = os.path.join(os.path.abspath(hook_dir), "")
    patterns = policy.get("env") or ()
    for key in [k for k in os.environ if not env_allowed(patterns, k)]:
        del os.environ[key]
    os.environ.__class__ = _SandboxedEnviron
    # Landlock confines the calling thread (and what it starts later): a thread already running
    # would stay free, whatever ``best_effort`` says.
    if threads_now() != 1:
        return ("%d threads run before the sandbox, which would not hold for them (nothing may "
                "start a thread before the hook is confined)" % threads_now())
    built = take_ruleset_fd()
    try:
        if policy.get("abi", 0) > 0 and built is not None:
            restrict_with(built)
        elif policy.get("abi", 0) > 0:
            landlock_restrict(policy["rules"])
        else:
            ctypes, libc = landlock_api()[:2]
            if libc.prctl(38, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        install_filter(policy.get("seccomp"))
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
        if not policy.get("best_effort"):
            return "the sandbox could not be applied: %s" % describe(exc)
        sys.stderr.write("hermes-hooks: sandbox applied in part: %s\n" % describe(exc))
    finally:
        if built is not None:
            os.close(built)
    _sandbox = policy
    sys.addaudithook(_audit)
    return None


def note_denial(exc):
    """Log what the sandbox denied when ``exc`` (or what caused it) is a PermissionError."""
    if _sandbox is None:
        return
    err, depth = exc, 0
    while err is not None and not isinstance(err, PermissionError) and depth < 8:
        err, depth = err.__cause__ or err.__context__, depth + 1
    if not isinstance(err, PermissionError):
        note_home_withheld(exc)
        return
    event, args = _last_access.get(threading.get_ident(), (None, ()))
    where = _sandbox.get("where")
    if event == "socket.connect" and isinstance(args[1], tuple) and len(args[1]) >= 2:
        what, key = "a connection to %s port %s" % (args[1][0], args[1][1]), \
            "port %s under `connect:`" % args[1][1]
    elif event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system"):
        what, key = "starting %s" % (args[0] if args else "a program"), "`exec: true`"
    else:
        path = err.filename or (args[0] if event == "open" and args else None)
        mode = args[1] if event == "open" and len(args) > 1 else None
        flags = args[2] if event == "open" and len(args) > 2 else 0
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        if path is None:
            what, key = describe(err), "the access under `read:`, `write:`, `connect:` or `exec:`"
        elif writes:
            what, key = "writing %s" % path, "the path (or a directory above it) under `write:`"
        else:
            what, key = "reading %s" % path, "the path (or a directory above it) under `read:`"
        if "HOME" not in os.environ:
            key += " (HOME is withheld unless `env:` lists it: `~` is then the passwd entry's home)"
    sandbox_log("denied %s (%s): to allow it, add %s of %s" % (what, describe(err), key, where))


def note_home_withheld(err):
    """A confined hook without HOME that failed to find a file under ``~``: ``expanduser`` fell
    back to the passwd entry's home, which is why the file is missing; say so (issue 50)."""
    depth = 0
    while err is not None and not isinstance(err, FileNotFoundError) and depth < 8:
        err, depth = err.__cause__ or err.__context__, depth + 1
    if not isinstance(err, FileNotFoundError):
        return
    if "HOME" in os.environ or not isinstance(err.filename, str):
        return
    home = os.path.expanduser("~")
    if home != "~" and err.filename.startswith(os.path.join(home, "")):
        sandbox_log("%s was not found: the sandbox withholds HOME, so `~` is the passwd entry's "
                    "home %s, not the gateway's; to use the gateway's home, add HOME under `env:` "
                    "(and the path under `read:`) of %s" % (err.filename, home, _sandbox.get("where")))


# --- the fork server ---

def set_priority(nice, idle):
    """The worker's CPU priority (never above the fork server's: the host starts a worker that
    needs more from scratch; but raised while a collect waits for the hook, which the host
    lowers again); a failure is logged and the worker keeps the fork server's."""
    try:
        # Raised by the host (a collect waits for this hook): out of SCHED_IDLE first, or the
        # nice value cannot be raised; the host lowers the worker again once it is ready.
        if not idle and hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) == os.SCHED_IDLE:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        if isinstance(nice, int) and os.getpriority(os.PRIO_PROCESS, 0) != nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        if idle and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as exc:
        sys.stderr.write("hermes-hooks: cannot set the worker's CPU priority: %s\n" % describe(exc))


# The host is gone (killed): its workers die at once, so that no handler finishes an event after
# the broker gave it to another fleet worker (or the local host restarted and ran it again).
ZYGOTE_EXIT_GRACE = 0.0


class Zygote:
    """Forks workers on request, reaps them and reports their exits."""

    def __init__(self, ctl):
        self.ctl = ctl
        self.children = set()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select via the fd
        signal.set_wakeup_fd(wake_w)
        self.wake_w = wake_w

    def tell(self, obj, fds=()):
        data = json.dumps(obj).encode()
        try:
            if fds:
                socket.send_fds(self.ctl, [data], list(fds))
            else:
                self.ctl.send(data)
        except OSError:
            pass  # the host is gone: EOF on the next read ends the loop

    def reap(self):
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.tell({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def spawn(self, req, ruleset=None):
        """Forks the worker of ``req``; ``ruleset``: the descriptor of its Landlock ruleset."""
        global _ruleset_fd
        req_id = req.get("spawn")
        pipes = [os.pipe() for _ in range(3)]
        sys.stderr.flush()  # the worker keeps this object (on its own fd 2): nothing of ours in it
        try:
            pid = os.fork()
        except OSError as exc:
            for r, w in pipes:
                os.close(r)
                os.close(w)
            self.tell({"spawned": req_id, "error": "fork failed: %s" % describe(exc)})
            if ruleset is not None:
                os.close(ruleset)
            return
        if pid == 0:
            code = 70
            try:
                os.setpgid(0, 0)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.dup2(pipes[0][0], 0)
                os.dup2(pipes[1][1], 1)
                os.dup2(pipes[2][1], 2)
                if ruleset is not None:
                    os.dup2(ruleset, 3, inheritable=False)
                    _ruleset_fd = 3
                # The control socket, the other pipes' ends (and the ruleset's first number).
                os.closerange(3 if ruleset is None else 4, 1 << 16)
                set_priority(req.get("nice"), req.get("idle"))
                service_cache = os.environ.get(PYCACHE_ENV)
                env = req.get("env") or {}
                # What this interpreter started with needs no applying again: a confined
                # worker's env repeats the fork server's LANG, which would import `locale` and
                # set it again in every confined worker (issue 46).
                changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
                os.environ.update(env)
                if service_cache:  # the service's, whatever a hook's env says
                    os.environ[PYCACHE_ENV] = service_cache
                apply_process_env(changed)
                os.chdir(req.get("cwd") or req["dir"])
                sys.argv = [sys.argv[0], req["dir"], req["handler"], req["name"]]
                run_worker(req["dir"], req["handler"], req["name"])
            except BaseException as exc:
                try:
                    log_exception("hermes-hooks: forked worker failed to start:", exc)
                except BaseException:
                    pass
            os._exit(code)
        self.children.add(pid)
        try:
            os.setpgid(pid, pid)  # also here, so the group exists before the host can signal it
        except OSError:
            pass
        if ruleset is not None:
            os.close(ruleset)
        ends = [pipes[0][1], pipes[1][0], pipes[2][0]]
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
            os.close(fd)
        pidfd = None
        try:
            pidfd = os.pidfd_open(pid)  # before any reaping, so it names this very process
        except (AttributeError, OSError) as exc:
            self.tell({"spawned": req_id, "pid": pid, "error": "pidfd_open: %s" % describe(exc)})
        else:
            self.tell({"spawned": req_id, "pid": pid}, ends + [pidfd])
        for fd in ends + ([pidfd] if pidfd is not None else []):
            os.close(fd)

    def serve(self):
        while True:
            try:
                ready, _, _ = select.select([self.ctl, self.wake_r], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
            self.reap()
            if self.ctl in ready:
                # A spawn request may carry one descriptor: the worker's Landlock ruleset.
                msg, fds, _, _ = socket.recv_fds(self.ctl, 1 << 20, 1)
                if not msg and not fds:
                    return
                try:
                    req = json.loads(msg)
                except ValueError as exc:
                    sys.stderr.write("hermes-hooks zygote: bad request: %s\n" % exc)
                    req = None
                if isinstance(req, dict) and "spawn" in req:
                    self.spawn(req, fds[0] if fds else None)
                    fds = fds[1:]
                for fd in fds:
                    os.close(fd)

    def finish(self):
        """The host is gone: kill the workers (after ZYGOTE_EXIT_GRACE) and reap them."""
        deadline = time.monotonic() + ZYGOTE_EXIT_GRACE
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.01)
        for pid in list(self.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        while self.children:
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            self.children.discard(pid)


def warm_up():
    """Do once, before the fork, what every worker does first, so the modules it imports lazily and
    the caches it fills are shared by all workers instead of copied into each."""
    for _ in range(WARM_LOOPS):
        warm_loop()
    json.loads(json.dumps({"id": 1, "ok": True, "result": [1.5, "x", None]}))
    platform.python_version()
    re.sub(r"\W", "_", "warm-up")
    warm_import()


#: Event loops the fork server runs before forking. Measured with 50 hooks of an async ``handle``:
#: 10 runs instead of 1 save each worker ~0.1 MB of private memory (CPython has adapted the code
#: the loop runs, instead of each worker writing into it); 30 saved no more.
WARM_LOOPS = 10


def warm_loop():
    """A worker's event loop in small: a queue fed by a reader on a pipe, a task, a wait."""
    r, w = os.pipe()
    fds = [r, w]
    loop = asyncio.new_event_loop()
    try:
        keep_tasks_alive(loop)

        async def run():
            queue = asyncio.Queue()
            start_reader(asyncio.get_running_loop(), queue, LineReader(r))
            os.write(w, b'{"id": 1}\n')
            await queue.get()
            os.close(w)
            fds.remove(w)
            await queue.get()  # EOF
            task = asyncio.ensure_future(asyncio.sleep(0))
            await asyncio.wait({task}, timeout=1)

        loop.run_until_complete(run())
    finally:
        loop.close()
        for fd in fds:
            os.close(fd)


class _StubFinder:
    """Hands ``warm_import`` a handler's source without reading any hook."""

    @staticmethod
    def verified(path, fullname=None):
        return b"def handle(event, context):\n    return None\n"


def warm_import():
    """What loading a hook runs, once, on a module that is not kept: a checked read with its
    SHA-256 (OpenSSL's first digest sets up tables of its own), importlib's spec and module
    set-up, compiling and executing the source."""
    here = os.path.abspath(__file__)
    with open(here, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    HookFinder(os.path.dirname(here), {os.path.basename(here): digest}).verified(here)
    name = "hermes_hook_warm_up"
    spec = importlib.util.spec_from_file_location(
        name, here, loader=VerifiedLoader(name, here, _StubFinder()))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)


def malloc_holes():
    """``(block size, free blocks)`` of pymalloc's partly used pools, read from
    ``sys._debugmallocstats()`` (CPython writes it to C stderr); empty when that is unavailable or
    another allocator runs (``PYTHONMALLOC=malloc``)."""
    if not (hasattr(sys, "_debugmallocstats") and hasattr(os, "memfd_create")):
        return []
    try:
        out = os.memfd_create("hermes-hooks-mallocstats")
    except OSError:
        return []
    chunks = []
    try:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out, 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        os.lseek(out, 0, os.SEEK_SET)
        while True:
            chunk = os.read(out, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        return []
    finally:
        os.close(out)
    text = b"".join(chunks).decode("ascii", "replace")
    holes = []
    for line in text.splitlines():
        cols = line.split()  # class, size, pools, blocks in use, blocks free
        if len(cols) == 5 and all(c.isdigit() for c in cols):
            holes.append((int(cols[1]), int(cols[4])))
    return holes


def fill_pool_holes():
    """Objects filling the free blocks of pymalloc's partly used pools, kept for the fork server's
    life. Without them a worker's first allocations land in those holes, scattered over the
    pages it shares with the fork server, and each such page becomes its own copy; with them they
    go to fresh pools, packed. The blocks are memory the fork server holds anyway."""
    ballast = []
    for size, free in malloc_holes():
        if size <= 16:
            ballast.extend(object() for _ in range(free))  # 16 bytes
        elif size <= 32:
            ballast.extend(float(i) for i in range(free))  # 24 bytes
        elif size > 33:
            ballast.extend(bytes(size - 33) for _ in range(free))  # 33 + n bytes
    return ballast


#: What ``fill_pool_holes`` allocated in the fork server (never read; only held).
_ballast = None


def zygote_main():
    ctl = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    sys.stdout = sys.stderr
    if sys.flags.isolated:
        # The confined fork server (`-I`): found once, not in every confined worker. Not in the
        # default one: `sysconfig` and its data would sit in every worker's memory (issue 47).
        # Before the service's bytecode cache is set, like the runner's own imports: from the
        # interpreter's cache, not compiled again into a new HERMES_HOME's (~10 ms, issue 46).
        global _interpreter_dirs
        _interpreter_dirs = interpreter_dirs()
        landlock_api()
    use_service_pycache()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    zygote = Zygote(ctl)
    priority = os.environ.pop(PRIORITY_ENV, "").split()
    setup_logging()
    warm_up()
    gc.collect()
    global _ballast
    _ballast = fill_pool_holes()
    gc.freeze()  # what the workers share stays shared: the collector never writes to it
    if len(priority) == 2 and all(p.lstrip("-").isdigit() for p in priority):
        # Started at the service's own priority (its start is what a first load waits for); the
        # workers start from the fork server's.
        set_priority(int(priority[0]), priority[1] == "1")
    ready = {"zygote": "ready", "pid": os.getpid(), "python": platform.python_version()}
    if _interpreter_dirs is not None:
        ready["dirs"] = _interpreter_dirs  # the service adds them to each worker's ruleset
    zygote.tell(ready)
    try:
        zygote.serve()
    finally:
        zygote.finish()
    os._exit(0)


def main():
    drop_own_directory()
    if sys.argv[1:] == ["--zygote"]:
        zygote_main()
    if len(sys.argv) != 4:
        sys.stderr.write("usage: runner.py HOOK_DIR HANDLER_PATH HOOK_NAME | runner.py --zygote\n")
        os._exit(2)
    run_worker(*sys.argv[1:])


if __name__ == "__main__":
    main()
