"""The fork server of a config.yaml entry's Python scripts (issue 58): written by hermes-hooks
beside `handler.py`, started by `script_runner.py` with the interpreter a script would run on,
exactly as the script itself would be started (`python3 script_server.py` through the same
`#!` line, `env` and PATH), its stdin the control socket.

It imports next to nothing, then forks a spare child that reads a request from the runner
(the script, its arguments, its working directory, and three descriptors: the script's
stdin, stdout and stderr). The spare tells the server, changes to the directory, reads the
script, tells the runner its pid (with a pidfd), drops what the server added to the
interpreter and runs the script as `__main__` as a fresh `python3 script.py` would; the server
forks the next spare and says the script's wait status when it has ended. A script that ends
by itself (its last line, `sys.exit`, an exception) writes its exit status in a page shared
with the runner before its process ends, then lets go of its stdio: the runner has its answer
without waiting for the end of the process (unmapping the fork: about a millisecond). One
request at a time; the runner starts another server when it needs two at once.

Standard library only, CPython 3.9+. It must never print: its stdout is /dev/null, its stderr
the hook's log.
"""

import os
import sys

# What the interpreter imported before this file ran: what a script started afresh finds.
_FRESH = frozenset(sys.modules)

import _signal  # noqa: E402  (C modules: `socket`, `signal` would import much more)
import _socket  # noqa: E402
import atexit as _atexit  # noqa: E402
import gc as _gc  # noqa: E402
import mmap as _mmap  # noqa: E402
import select as _select  # noqa: E402
import warnings as _warnings  # noqa: E402

# This server's own: dropped from sys.modules in a fork (unless a fresh start has them).
_OWN = frozenset(("_signal", "_socket", "atexit", "gc", "mmap", "select", "warnings")) - _FRESH

# What the scripts commonly import, imported once here so that a fork finds them loaded: pure
# imports whose only trace is their entry in sys.modules (under `-v` or `-X importtime`, which
# would print them, the server does not start). Measured on a JSON gate (`json.load` of stdin,
# a `json.dumps` out) run 100 times in a row on the 2-core test machine: p50 4-7 ms a call
# with `json` (and the `re` it imports) preloaded, 19-28 ms without (the fork imports it then).
_PRELOAD = ("json",)

_INT = 4  # sizeof(int): one descriptor in SCM_RIGHTS
# How long a spare waits for a request before it rehearses (`_rehearse`), in ms: calls back to
# back (a benchmark's loop: one every 3-6 ms through the service on the test machine) come
# sooner, and the CPU is then better left to the running script and the spare free for the
# next request (its first step, a collection, cannot stop halfway); an agent's tool calls come
# seconds apart.
_REHEARSE_AFTER_MS = 20
# How long the server waits for a spare's request before it takes the calls as coming apart and
# waits for the script's end instead (`_serve`).
_SPACED_AFTER_MS = 20
# The regular expressions the scripts compiled, told by their forks and compiled here for the
# forks after them (`_tell_patterns`, `_learn`): at most this many a fork tells, this many in
# all (`re` keeps 512), none longer than this, in an area of this size shared with the forks.
_PATTERNS_TOLD = 64
_PATTERNS_KEPT = 256
_PATTERN_MAX = 4096
_PATTERNS_AREA = 1 << 16
_STATUS = 8  # the status page's record: the script's pid, then its wait status (32 bits each)
_MAX_REQUEST = 1 << 20


def _unsupported():
    """Why this interpreter cannot stand in for a fresh one (None: it can)."""
    # 3.9 and 3.10 are not stood in for: a fork there differs from a fresh start in what a
    # script can see (atexit functions registered by a script that imports atexit itself do
    # not run, `__main__.__annotations__`, a warning's category); the script runs as its own
    # process, as Hermes runs it.
    if sys.implementation.name != "cpython" or sys.version_info < (3, 11):
        return "not CPython 3.11+"
    if sys.flags.inspect or sys.flags.interactive:
        return "-i"
    if sys.flags.verbose or "importtime" in getattr(sys, "_xoptions", {}):
        return "-v or -X importtime"
    return None


def _fds(ancillary):
    out = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            for i in range(0, len(data) - len(data) % _INT, _INT):
                out.append(int.from_bytes(data[i:i + _INT], sys.byteorder, signed=True))
    return out


def _close(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _read_script(path):
    """The script's source as `python3 path` would open it from the current directory; None
    when a fresh start would do something else with it (not a regular file, a zip archive,
    compiled code) or could not open it."""
    if path.endswith((".pyc", ".pyo")):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000) == 0o100000:
            return None
        chunks, want = [], st.st_size + 1
        while True:  # (to its end, as the interpreter reads it: a file may grow meanwhile)
            chunk = os.read(fd, want)
            if not chunk:
                break
            chunks.append(chunk)
            want = 1 << 16
        source = b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
    if b"PK\x05\x06" in source:  # a zip archive's end: Python would import __main__ from it
        return None
    return source


def _serve(sock):
    """Runs until the runner goes; returns only in a forked child, with its job.

    A spare child is forked ahead of each request and reads it from the runner itself, so that
    neither a fork nor this server is on the request's way; the server says each script's wait
    status when its process has ended. When requests come back to back (one within
    `_SPACED_AFTER_MS` of the script before's end, or before it), the server watches the
    spare's channel, on which the spare tells it the request it took, and forks the next spare
    at once, while that one runs the script; it waits for the scripts' ends (a pidfd each) at
    the same time, never in `waitpid`: a script's process ends about a millisecond after it
    told the runner its status (unmapping its copy of the interpreter), by when the next
    request may have come. When requests come apart (an agent's tool calls), the server
    watches the spare's pidfd only: the request wakes nobody but the spare (woken by it, the
    server took the CPU the script starts on: 0.4-0.8 ms of a call, measured with calls 100 ms
    apart), and the next spare is forked after the script's end, the request read from the
    channel then."""
    compiled = {}
    pid, chan = _fork_spare(sock, compiled, ())
    if pid == 0:
        return chan
    spare = _pidfd(pid)
    # The scripts not yet waited for: their pid, by the pidfd that reads once it has ended (a
    # negative key: no pidfd, waited for in `waitpid` at once).
    running = {}
    soon = False  # the last script ended less than `_SPACED_AFTER_MS` ago
    while True:
        poller = _select.poll()
        watch = chan is not None and (soon or bool(running) or spare < 0)
        if watch:
            poller.register(chan.fileno(), _select.POLLIN)
        elif chan is not None:
            poller.register(spare, _select.POLLIN)
        for key in running:
            poller.register(key, _select.POLLIN)
        idle = chan is not None and not running
        ready = {fd for fd, _ in poller.poll(_SPACED_AFTER_MS if idle and soon else None)}
        if not ready:
            soon = False  # no request soon after the last script's end: the next comes apart
            continue
        ended = {key for key in running if key in ready}
        if chan is not None and (chan.fileno() if watch else spare) in ready:
            data = _take_request(chan)
            chan = None
            if not data:  # the spare ended without a request: the runner is gone
                for child in running.values():
                    os.waitpid(child, 0)
                os._exit(0)
            _precompile(data, compiled)
            running[spare] = pid
            if watch:
                pid, chan = _fork_spare(sock, compiled, running)
                if pid == 0:
                    return chan
                spare = _pidfd(pid)
            else:
                ended.add(spare)  # its pidfd read: the script has ended
        for key in [k for k in running if k < 0 or k in ended]:
            child = running.pop(key)
            _, status = os.waitpid(child, 0)
            if key >= 0:
                os.close(key)
            sock.sendall(b"status %d %d" % (child, status))
            _learn()
        if chan is None:
            pid, chan = _fork_spare(sock, compiled, running)
            if pid == 0:
                return chan
            spare = _pidfd(pid)
        soon = not running


def _pidfd(pid):
    """A descriptor of the child `pid` that reads once it has ended; -pid where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -pid


def _take_request(chan):
    """The request a spare sent on its channel (b"": none), the channel closed."""
    try:
        return chan.recv(_MAX_REQUEST)
    except OSError:
        return b""
    finally:
        chan.close()


def _fork_spare(sock, compiled, pidfds):
    """(pid, the channel to it) in the server; (0, its job) in the spare, once it has one.
    `pidfds`: the server's descriptors of its children, which the spare closes."""
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    drop = _dropped()
    fds = None if _SERVER_FDS is None else _SERVER_FDS + tuple(k for k in pidfds if k >= 0)
    pid = os.fork()
    if pid:
        theirs.close()
        return pid, ours
    ours.close()
    _prepare(sock, theirs, fds, drop)
    return 0, _take_job(sock, theirs, compiled)


def _dropped():
    """The modules a spare drops: the server's own, which a fresh start has not loaded (found
    again only when the server has loaded another since)."""
    global _DROP
    if _DROP[0] != len(sys.modules):
        _DROP = (len(sys.modules),
                 tuple(n for n in sys.modules if n not in _FRESH and n not in _LOADED))
    return _DROP[1]


def _open_fds():
    """The server's descriptors as it starts serving (None: not known), which it keeps; the
    others it opens are its children's pidfds and spares' channels."""
    try:
        return tuple(int(n) for n in os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return None


def _prepare(sock, chan, fds, drop):
    """In a spare, before its request: what does not depend on it (the server's descriptors
    `fds` and modules `drop` let go of), done while nobody waits. Both are found by the
    server: listed here, they would make a fork write to (and copy) a page of the server's
    for each module's name and more (100 pages a fork, 0.3 ms of it)."""
    keep = {0, 1, 2, sock.fileno(), chan.fileno()}
    if fds is None:
        try:
            fds = [int(n) for n in os.listdir("/proc/self/fd")]
        except OSError:
            fds = []
    _close([fd for fd in fds if fd not in keep])
    for name in drop:
        sys.modules.pop(name, None)
    global _STDIO
    _STDIO = _stdio_ahead()


def _stdio_ahead():
    """The script's sys.stdin, sys.stdout and sys.stderr as `_become` makes them, made ahead
    on a pipe in place of 0, 1 and 2 for a moment: what the runner sends is a pipe each, and
    a stream keeps only what it read of its descriptor as it was made (not seekable, not a
    terminal, a pipe's block size), the same for any pipe. None when it cannot."""
    unbuffered = bool(getattr(sys.__stdout__, "write_through", False))
    saved = []
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        saved = [os.dup(fd) for fd in (0, 1, 2)]
        for target, fd in enumerate((r, w, w)):
            os.dup2(fd, target)
        return (_stdio(0, "<stdin>", sys.__stdin__, False, unbuffered),
                _stdio(1, "<stdout>", sys.__stdout__, True, unbuffered),
                _stdio(2, "<stderr>", sys.__stderr__, True, unbuffered))
    except Exception:  # noqa: B902 (made when the script starts instead, as before)
        return None
    finally:
        if len(saved) == 3:
            for target, fd in enumerate(saved):
                os.dup2(fd, target)
        _close(saved + [r, w])


def _rehearse(sock):
    """In a spare that has had no request for 20 ms: the server's garbage collected and
    everything frozen, then what `_become`, a JSON gate and `_end` will do that does not
    depend on the request, done once on objects thrown away (`_exercise`), step by step until
    a request comes. A fork writes to a page of the server's memory only once (copying it:
    about 4 us a page on the test machine): those copies are made here, while nobody waits,
    and the script's own collections at its end go through the script's objects only (a
    collection of everything was 0.4 ms of a call). Not when requests come back to back: the
    spare is forked as the previous script starts, and the rehearsal would take the CPU from
    it. Nothing of it is left for the script to see."""
    poller = _select.poll()
    poller.register(sock.fileno(), _select.POLLIN)
    if poller.poll(_REHEARSE_AFTER_MS):
        return
    _gc.collect()
    _gc.freeze()
    _exercise(1, lambda: bool(poller.poll(0)))
    _gc.freeze()


def _exercise(times, stop=None):
    """What `_become`, a JSON gate and `_end` run, on objects thrown away: stdio on /dev/null
    (read to its end, written and flushed), a path resolved, a module made, JSON decoded and
    encoded, regular expressions compiled (by the compiler itself: `re`'s cache untouched) and
    searched; between steps, an end when `stop()` says so. Nothing of it is left for a script
    to see."""
    json = sys.modules.get("json")
    compiler = sys.modules.get("re._compiler") or sys.modules.get("sre_compile")
    unbuffered = bool(getattr(sys.__stdout__, "write_through", False))
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for _ in range(times):
            _stdio(null, "<exercise>", sys.__stdin__, False, unbuffered).read()
            for old in (sys.__stdout__, sys.__stderr__):
                out = _stdio(null, "<exercise>", old, True, unbuffered)
                print("exercise", file=out)
                out.flush()
            if stop and stop():
                return
            os.path.dirname(os.path.realpath(__file__))
            type(sys)("__main__").__dict__.update(__builtins__=sys.modules["builtins"])
            sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", __file__)
            if json is not None:
                json.loads(json.dumps({"tool_name": "terminal", "tool_input": {"command": "ls"},
                                       "n": [1, 2.5, None, True, "\u00e9"]}))
            if stop and stop():
                return
            if compiler is not None:
                for pattern in (r"\brm\s+-[a-z]*r[a-z]*f", r"(?i)^git\s+push\s+.*--force\b",
                                r">\s*/dev/sd[a-z]|\bmkfs\.(\w+)$"):
                    compiler.compile(pattern, 0).search("ls -la /tmp && echo ok")
    except Exception:  # noqa: S110 (an exercise only)
        pass
    finally:
        os.close(null)


def _request(data):
    fields = [os.fsdecode(f) for f in data.split(b"\0")]
    return fields[0], fields[1], fields[2:]


def _precompile(data, compiled):
    """The script of a request compiled in the server, for the spares forked after it (a
    spare uses it only when the file still holds the same source)."""
    cwd, script, _ = _request(data)
    try:
        os.chdir(cwd)
        filename = script if script.startswith("/") else os.getcwd() + "/" + script
    except OSError:
        return
    source = _read_script(script)
    if source is None or (filename, source) in compiled:
        return
    # Not kept when compiling warns (a fresh start prints that on the script's stderr: the
    # script's fork compiles it again there).
    with _warnings.catch_warnings(record=True) as warned:
        _warnings.simplefilter("always")
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return
    if warned:
        return
    if len(compiled) >= 16:
        compiled.clear()
    compiled[(filename, source)] = code


def _take_job(sock, chan, compiled):
    """In a spare: reads its request from the runner (rehearsing while none comes), tells the
    server, then does what the interpreter does before the script's first line (its directory,
    its file, its code), and tells the runner its pid. A request it cannot do exactly is sent
    back ("fallback"): the runner starts a process."""
    _rehearse(sock)
    try:
        data, ancillary, flags, _ = sock.recvmsg(_MAX_REQUEST, _socket.CMSG_SPACE(3 * _INT))
    except OSError:
        os._exit(0)
    fds = _fds(ancillary)
    if not data:  # the runner is gone: so is the server, once this channel closes
        os._exit(0)
    try:
        chan.sendall(data)  # the server forks the next spare now
    except OSError:
        pass
    chan.close()
    if len(fds) != 3 or flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC):
        _close(fds)
        sock.sendall(b"fallback bad request")
        os._exit(0)

    def refuse(why):
        _close(fds)
        sock.sendall(b"fallback " + why)
        os._exit(0)

    cwd, script, argv = _request(data)
    try:
        os.chdir(cwd)
        filename = script if script.startswith("/") else os.getcwd() + "/" + script
    except OSError:
        refuse(b"no directory")
    source = _read_script(script)
    if source is None:
        refuse(b"unreadable")
    if b"\0" in source:  # the interpreter's file reader says it its own way
        refuse(b"null bytes")
    code = compiled.get((filename, source))  # None: compiled when it runs
    compiled.clear()
    pidfd = []
    try:
        pidfd = [os.pidfd_open(os.getpid())]
    except (AttributeError, OSError):
        pass
    sock.sendmsg([b"pid %d" % os.getpid()],
                 [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                   pidfd[0].to_bytes(_INT, sys.byteorder))] if pidfd else [])
    _close(pidfd)
    return fds, sock, script, filename, source, code, argv


def _stdio(fd, name, old, write, unbuffered):
    """A new sys.std*, made on `fd` as the interpreter makes it at start (create_stdio)."""
    import io
    buf = io.open(fd, "wb" if write else "rb", 0 if unbuffered and write else -1, closefd=False)
    raw = buf if unbuffered and write else buf.raw
    raw.name = name
    line_buffering = not unbuffered and (raw.isatty() or fd == 2)
    stream = io.TextIOWrapper(buf, old.encoding, old.errors, "\n", line_buffering, unbuffered)
    stream.mode = "w" if write else "r"
    return stream


def _is_pipe(fd):
    try:
        return os.fstat(fd).st_mode & 0o170000 == 0o010000
    except OSError:
        return False


def _become(job):
    """In the child: the process a fresh `python3 SCRIPT ARGS` would be, up to its first
    line of code."""
    global _ME
    fds, sock, script, filename, source, code, argv = job
    _ME = os.getpid()
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
    sock.close()
    _close([fd for fd in fds if fd > 2])
    if _STDIO is not None and all(_is_pipe(fd) for fd in (0, 1, 2)):
        sys.stdin, sys.stdout, sys.stderr = _STDIO
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = _STDIO
    else:
        unbuffered = bool(getattr(sys.__stdout__, "write_through", False))
        sys.stdin = sys.__stdin__ = _stdio(0, "<stdin>", sys.__stdin__, False, unbuffered)
        sys.stdout = sys.__stdout__ = _stdio(1, "<stdout>", sys.__stdout__, True, unbuffered)
        sys.stderr = sys.__stderr__ = _stdio(2, "<stderr>", sys.__stderr__, True, unbuffered)
    sys.argv = [script] + argv
    if hasattr(sys, "orig_argv"):
        # The interpreter's own arguments (whatever a wrapper on the way added), then the
        # script's in place of this file's.
        sys.orig_argv = sys.orig_argv[:-1] + [script] + argv
    if _PATH0 is not None:
        try:
            sys.path[0] = os.path.dirname(os.path.realpath(script))
        except (OSError, ValueError):
            sys.path[0] = ""
    main = type(sys)("__main__")
    main.__dict__["__annotations__"] = {}
    main.__dict__.update(__builtins__=sys.modules["builtins"], __file__=filename,
                         __cached__=None)
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", filename)
    main.__loader__ = loader
    if sys.version_info < (3, 10):
        del main.__dict__["__annotations__"]
    sys.modules["__main__"] = main
    if code is None:
        code = compile(source, filename, "exec", dont_inherit=True)
    return main, code


def _run(job):
    """Runs the script and ends the process as a fresh interpreter would end."""
    try:
        main, code = _become(job)
    except SyntaxError as e:
        _report(e, None, None)
        _forget_file(sys.modules["__main__"])
        _end(1)
    try:
        exec(code, main.__dict__)
    except SystemExit as e:
        _end(_exit_code(e))
    except BaseException as e:  # noqa: B036 (the script's own exception, reported as Python does)
        _report(e, e.__traceback__, code)
        _forget_file(main)
        _end(1, interrupted=isinstance(e, KeyboardInterrupt))
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except Exception:  # noqa: S110 (a fresh interpreter ignores it here too)
            pass
    _forget_file(main)
    _end(0)


def _exit_code(exc):
    """The exit status of an uncaught SystemExit, its message (not a number) on stderr."""
    code = getattr(exc, "code", exc)
    if code is None:
        return 0
    if isinstance(code, int):
        return (code if -(1 << 63) <= code < (1 << 63) else -1) & 0xFF
    try:
        sys.stderr.write(str(code))
        sys.stderr.write("\n")
    except Exception:  # noqa: S110
        pass
    return 1


def _flush_std():
    """The interpreter's last flush of sys.stdout and sys.stderr: False when one failed."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception as e:  # noqa: B902
            ok = False
            if stream is sys.stdout and sys.stderr is not None:
                try:
                    sys.stderr.write("Exception ignored in: %r\n%s: %s\n"
                                     % (stream, type(e).__name__, e))
                    sys.stderr.flush()
                except Exception:  # noqa: S110
                    pass
    return ok


def _end(code, interrupted=False):
    """The interpreter's finalization, for what a script can see of it: its threads joined,
    its atexit functions, stdio flushed (status 120 when that fails), its module's objects and
    its garbage finalized; then the exit, without tearing down the modules the server had
    loaded (a fork would copy every page of them to do it, and nothing of the script is left
    there). An uncaught KeyboardInterrupt ends by SIGINT, as it does in a fresh interpreter."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:  # noqa: B036,S110 (a fresh interpreter ignores it too)
            pass
    _atexit._run_exitfuncs()
    ok = _flush_std()
    _gc.collect()
    main = sys.modules.get("__main__")
    if main is not None:
        main.__dict__.clear()
    _gc.collect()
    ok = _flush_std() and ok
    if interrupted:
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGINT)
    else:
        _report_exit((code if ok else 120) << 8)
        _tell_patterns()
    os._exit(code if ok else 120)


def _report_exit(status):
    """The script's wait status told to the runner before the process ends, so that its end
    (unmapping a copy of this interpreter: about a millisecond) is not on the call's way: the
    status written in the page shared with the runner, then the script's stdin, stdout and
    stderr let go of (/dev/null in their place), which the runner reads as their end and the
    moment to read the page. Nothing the script can see is left to happen: what a fresh
    interpreter does before its exit is done (its threads joined, its atexit functions run,
    stdio flushed); a daemon thread, which a fresh interpreter stops before its last flush,
    writes to /dev/null from here. Not told by a process the script forked (that one is not
    the runner's child), nor without a page: the runner then waits for the server's wait
    status (as it does when the script died of a signal or called `os._exit`)."""
    if _PAGE is None or _ME != os.getpid():
        return
    try:
        _PAGE[4:8] = status.to_bytes(4, sys.byteorder)
        _PAGE[0:4] = _ME.to_bytes(4, sys.byteorder)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError, OverflowError):
        pass


def _warm():
    """The keys of what `re` has compiled and kept here (what a fork need not compile, nor
    tell)."""
    cache = getattr(sys.modules.get("re"), "_cache", None)
    try:
        return frozenset(cache) if isinstance(cache, dict) else frozenset()
    except RuntimeError:  # changed while read (a thread of the script's)
        return frozenset()


def _tell_patterns():
    """In a script's fork, after its exit status is told (off the call's way): the regular
    expressions it compiled through `re` that this server had not, written in the area
    shared with the server (`_learn` compiles them there for the forks after it: a published
    gate's list of patterns cost its every run 0.2-0.4 ms of compiling). Best effort: an area
    not yet read is written over."""
    if _PATTERNS is None or _ME != os.getpid():
        return
    try:
        told = []
        for key in list(getattr(sys.modules.get("re"), "_cache", None) or ()):
            if len(told) >= _PATTERNS_TOLD:
                break
            if key in _WARM or not isinstance(key, tuple) or len(key) != 3:
                continue
            kind, pattern, flags = key
            if kind in (str, bytes) and type(pattern) is kind and type(flags) is int \
                    and 0 <= flags < 1 << 31 and len(pattern) <= _PATTERN_MAX:
                told.append(_pattern_record(kind is bytes, pattern, flags))
        data = b"".join(told)
        if not data or len(data) > _PATTERNS_AREA - 4:
            return
        _PATTERNS[4:4 + len(data)] = data
        _PATTERNS[0:4] = len(data).to_bytes(4, sys.byteorder)
    except Exception:  # noqa: S110 (a hint for later runs only)
        pass


def _pattern_record(is_bytes, pattern, flags):
    """One regular expression as `_tell_patterns` writes it: its kind (1: bytes), its flags
    and its length (32 bits each), then the pattern (UTF-8, a lone surrogate kept)."""
    raw = pattern if is_bytes else pattern.encode("utf-8", "surrogatepass")
    return b"".join(n.to_bytes(4, "little") for n in (int(is_bytes), flags, len(raw))) + raw


def _pattern_records(data):
    """The (is bytes, pattern, flags) written by `_pattern_record`, read back with every bound
    checked; a record that does not read stops the reading."""
    at, out = 0, []
    while at + 12 <= len(data) and len(out) < _PATTERNS_TOLD:
        kind, flags, size = (int.from_bytes(data[at + i:at + i + 4], "little")
                             for i in (0, 4, 8))
        raw = data[at + 12:at + 12 + size]
        if kind > 1 or flags >= 1 << 31 or size > 4 * _PATTERN_MAX or len(raw) != size:
            break
        at += 12 + size
        if kind:
            out.append((True, raw, flags))
            continue
        try:
            out.append((False, raw.decode("utf-8", "surrogatepass"), flags))
        except UnicodeError:
            break
    return out


def _learn():
    """In the server, after a script's fork ended: the regular expressions it told compiled
    and kept in `re`'s cache, so that the forks after it find them compiled, as a fresh
    interpreter finds the ones the standard library compiled at import. What the script sees
    is the same: `re` gives the same pattern (the cache's key is the pattern, its type and its
    flags); one whose compiling warns is not kept (a fresh run prints that warning on the
    script's stderr). Read from an area the forks write: checked, never trusted."""
    global _WARM, _PATTERNS_LEFT, _REFUSED
    if _PATTERNS is None:
        return
    size = int.from_bytes(_PATTERNS[0:4], sys.byteorder)
    if not size:
        return
    _PATTERNS[0:4] = bytes(4)
    re = sys.modules.get("re")
    compiler = sys.modules.get("re._compiler")
    if size > _PATTERNS_AREA - 4 or re is None or compiler is None or _PATTERNS_LEFT <= 0:
        return
    for is_bytes, pattern, flags in _pattern_records(_PATTERNS[4:4 + size]):
        if _PATTERNS_LEFT <= 0:
            break
        kind = bytes if is_bytes else str
        if flags & re.DEBUG or (kind, pattern, flags) in _WARM:
            continue
        _PATTERNS_LEFT -= 1
        with _warnings.catch_warnings(record=True) as warned:
            _warnings.simplefilter("always")
            try:
                compiler.compile(pattern, flags)  # not kept: only to see whether it warns
            except Exception:  # noqa: B902 (an error: the script's run raises it again)
                warned = True
        try:
            if not warned:
                re.compile(pattern, flags)
                continue
        except Exception:  # noqa: B902,S110
            pass
        # Not kept: told no more (the forks leave out what `_WARM` has), tried no more.
        _REFUSED = _REFUSED | {(kind, pattern, flags)}
    _WARM = _warm() | _REFUSED
    _gc.freeze()  # out of the forks' collections, as everything loaded before


def _forget_file(main):
    main.__dict__.pop("__file__", None)
    main.__dict__.pop("__cached__", None)


def _report(exc, tb, code):
    """An uncaught exception as the interpreter reports it: its traceback from the script's
    own frame, through `sys.excepthook`, with `sys.last_*` set."""
    while tb is not None and tb.tb_frame.f_code is not code:
        tb = tb.tb_next
    exc = exc.with_traceback(tb)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException:  # noqa: B036
        sys.__excepthook__(type(exc), exc, tb)


def _status_page():
    """(a memfd, the page it maps) for the scripts' exit statuses, shared with the runner (it
    is sent the memfd) and inherited by every fork; (None, None) where there is no memfd."""
    try:
        fd = os.memfd_create("hermes-hooks-script-status", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None, None
    try:
        os.ftruncate(fd, _mmap.PAGESIZE)
        return fd, _mmap.mmap(fd, _mmap.PAGESIZE)
    except (OSError, ValueError):
        os.close(fd)
        return None, None


def _patterns_area():
    """The area (a shared memfd mapping, inherited by every fork; its descriptor closed) in
    which a script's fork tells the server the regular expressions it compiled; None without
    one."""
    try:
        fd = os.memfd_create("hermes-hooks-script-patterns", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None
    try:
        os.ftruncate(fd, _PATTERNS_AREA)
        return _mmap.mmap(fd, _PATTERNS_AREA)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _start():
    """Checks the interpreter, preloads, says ok (with the status page's memfd): (the control
    socket, whether sys.path[0] is the script's directory, the modules a fork keeps, the status
    page)."""
    why = _unsupported()
    # The control socket is this server's stdin: moved off 0, which becomes /dev/null (a
    # script's stdin is put there).
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if why:
        sock.sendall(b"no " + why.encode())
        os._exit(0)
    for name in _PRELOAD:
        try:
            __import__(name)
        except Exception:  # noqa: S110 (not preloaded: the script imports it itself)
            pass
    # The code run for each script, run here first: the interpreter specializes a function's
    # code after its first few calls, writing to it, which each fork would otherwise do (and
    # copy those pages) again.
    _exercise(12)
    loaded = frozenset(sys.modules) - _OWN
    # What is loaded now stays, out of the collector's way: a fork's collections and its end
    # then touch (and copy) none of it.
    _gc.freeze()
    # A fresh interpreter's sys.path[0] is the script's directory (this file's, here), unless
    # -P / PYTHONSAFEPATH (or -I) left it out.
    here = os.path.dirname(os.path.realpath(__file__))
    path0 = 0 if sys.path and sys.path[0] == here else None
    fd, page = _status_page()
    rights = [] if fd is None else [
        (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd.to_bytes(_INT, sys.byteorder))]
    sock.sendmsg([b"ok %d.%d" % sys.version_info[:2]], rights)
    if fd is not None:
        os.close(fd)
    return sock, path0, loaded, page


if __name__ == "__main__":
    _ME = None  # in a fork that runs a script: its pid
    _STDIO = None  # in a spare: the script's stdio, made ahead (`_stdio_ahead`)
    _SOCK, _PATH0, _LOADED, _PAGE = _start()
    _PATTERNS, _PATTERNS_LEFT, _REFUSED = _patterns_area(), _PATTERNS_KEPT, frozenset()
    _WARM = _warm()
    _DROP = (None, ())  # (the count of sys.modules, the modules a spare drops): `_dropped`
    _SERVER_FDS = _open_fds()
    try:
        _JOB = _serve(_SOCK)
    except OSError:  # the runner went away
        os._exit(0)
    _run(_JOB)
