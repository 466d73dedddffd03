"""How `handler.py` runs a config.yaml entry's command (issue 58): `run_command`, what
`subprocess.run(argv, input=..., capture_output=True, text=True, timeout=..., cwd=...)` gives,
a Python script's run taken from a warm interpreter.

A command that runs a Python script (`argv[0]` a file whose `#!` line names a python, directly
or through `env`, or `python3 script.py args`) is run by a fork server of that interpreter
(`script_server.py`, started once as the script itself would be: the same `#!` line, `env`,
PATH, environment and working directory): the fork runs the script as `__main__` with the same
`sys.argv`, `sys.path[0]`, working directory, environment, stdin, stdout, stderr and exit code
as a fresh interpreter, about 40 ms sooner. Anything else, or anything that one cannot do the
same (flags before the script or in the `#!` line, `-c`, `-m`, an interpreter that does not
start the server, a script it cannot read), runs as a process of its own, as before.

What differs by nature: the script's parent process (the server, not the hook's worker), its
`/proc/self/cmdline`, and the string-hash seed, which a fork shares with its server (a fresh
interpreter draws one at each start unless `PYTHONHASHSEED` is set).

Standard library only, CPython 3.9+.
"""

import array
import atexit
import locale
import mmap
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "script_server.py")
# The names `env` looks up or a command starts that are a Python interpreter.
_PYTHON = re.compile(r"python[0-9.]*\Z")
_START_TIMEOUT = 30.0
_PER_KEY = 4  # servers at most per interpreter (calls at once beyond it run as processes)
_INT_SIZE = array.array("i").itemsize
_STATUS = 8  # the status page's record: a pid, then its wait status (32 bits each)

_lock = threading.Lock()
_env = (None, None)  # the environment last seen (its bytes), and its key
_heads = {}  # path -> (its stat, what the first bytes of the file said)
_path = (None, None)  # PATH last seen, and its directories
_idle = {}  # key -> [_Server]
_busy = {}  # key -> count
_refused = {}  # key -> why the server could not start (said once)


def run_command(argv, stdin_text, timeout, cwd):
    """`subprocess.run(argv, input=stdin_text, capture_output=True, text=True,
    timeout=timeout, cwd=cwd)`: the same result and the same exceptions."""
    plan = _plan(argv, cwd)
    if plan is not None:
        done = _run_planned(plan, argv, stdin_text, timeout)
        if done is not None:
            return done
    return subprocess.run(argv, input=stdin_text, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


class _Plan:
    __slots__ = ("launch", "executable", "where", "script", "args", "key")

    def __init__(self, launch, executable, where, script, args, shim):
        self.launch = launch  # the server's argv up to its file, as the script's would be
        self.executable = executable
        self.where = where
        self.script = script
        self.args = args
        # A server stands for exactly this start: the same interpreter, found the same way,
        # with the same environment (and directory, when a wrapper may choose by it), at the
        # same CPU priority.
        self.key = (tuple(launch), executable, _environment(), where if shim else None,
                    _priority())


def _priority():
    """The calling thread's scheduling policy and nice value, which a process it starts
    inherits (and so does every fork of a server it starts): the service runs a decision's
    hook in the normal class and the other events' at its workers' (by default `SCHED_IDLE`
    at nice +10), so that a decision's script runs from a server started for decisions, as a
    process of its own would, never from one started idle for an observer's event (it could
    not be raised: an unprivileged process cannot leave `SCHED_IDLE`)."""
    try:
        return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return None


def _environment():
    """The environment as a key (made again only when it changed)."""
    global _env
    data = getattr(os.environ, "_data", None)
    if data is None:
        return frozenset(os.environ.items())
    seen, key = _env
    if seen != data:
        seen = dict(data)
        key = frozenset(seen.items())
        _env = (seen, key)
    return key


def _head(path, read):
    """`read(the file's first 256 bytes)`, kept while the file's stat stays the same."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    kept = _heads.get(path)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    try:
        with open(path, "rb") as f:
            said = read(f.read(256))
    except OSError:
        return None
    if len(_heads) > 64:
        _heads.clear()
    _heads[path] = (stamp, said)
    return said


def _executable(path):
    try:
        return os.path.isfile(path) and os.access(path, os.X_OK)
    except (OSError, ValueError):
        return False


def _exec_path():
    """`os.get_exec_path()`, made again only when PATH changed (it is a function of PATH alone
    for `os.environ`, and sets up a warnings filter each time: a tenth of a call's own work)."""
    global _path
    value = os.environ.get("PATH")
    if _path[0] != value or _path[1] is None:
        _path = (value, os.get_exec_path())
    return _path[1]


def _lookup(name, where):
    """The file `subprocess` would start for `name` (the first executable of PATH, or the path
    itself, relative to `where`); None when unsure or none."""
    if "/" in name:
        path = name if name.startswith("/") else os.path.join(where, name)
        return (path, name) if _executable(path) else None
    for d in _exec_path():
        if not d.startswith("/"):
            return None  # relative to the child's directory: not worth matching
        path = os.path.join(d, name)
        if _executable(path):
            return path, path
    return None


def _is_elf(path):
    return bool(_head(path, lambda head: head.startswith(b"\x7fELF")))


def _shebang(path):
    """(interpreter, optional argument) of a `#!` line as the kernel reads it; None."""
    return _head(path, _parse_shebang)


def _parse_shebang(head):
    if not head.startswith(b"#!") or b"\n" not in head:
        return None
    line = head[2:head.index(b"\n")].strip(b" \t")
    if not line:
        return None
    parts = re.split(rb"[ \t]+", line, 1)
    interp = os.fsdecode(parts[0])
    arg = os.fsdecode(parts[1].strip(b" \t")) if len(parts) > 1 else None
    return interp, arg or None


def _plan(argv, cwd):
    """How a fork server would run `argv`, or None when it cannot be the same."""
    if not argv or any("\0" in a for a in argv):
        return None
    try:
        where = cwd if cwd is not None else os.getcwd()
    except OSError:
        return None
    if _PYTHON.match(os.path.basename(argv[0])):
        # python3 SCRIPT ARGS: no flag, no -c / -m, a script named.
        if len(argv) < 2 or not argv[1] or argv[1].startswith("-"):
            return None
        found = _lookup(argv[0], where)
        if found is None:
            return None
        return _Plan([argv[0]], found[0], where, argv[1], argv[2:], not _is_elf(found[0]))
    found = _lookup(argv[0], where)
    if found is None:
        return None
    path, script = found
    line = _shebang(path)
    if line is None:
        return None
    interp, arg = line
    if not interp.startswith("/") or not _executable(interp):
        return None
    if arg is None and _PYTHON.match(os.path.basename(interp)):
        return _Plan([interp], interp, where, script, argv[1:], not _is_elf(interp))
    if os.path.basename(interp) == "env" and arg and _PYTHON.match(arg):
        python = _lookup(arg, where)
        if python is None:
            return None
        return _Plan([interp, arg], interp, where, script, argv[1:], not _is_elf(python[0]))
    return None


class _Unusable(Exception):
    pass


class _Server:
    """One fork server: started as the script would be, one call at a time."""

    def __init__(self, plan):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(plan.launch + [SERVER], executable=plan.executable,
                                         stdin=theirs, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, cwd=plan.where)
        except OSError as exc:
            ours.close()
            raise _Unusable(str(exc)) from None
        finally:
            theirs.close()
        self.sock = ours
        self.page = None
        try:
            ours.settimeout(_START_TIMEOUT)
            hello, ancillary, _, _ = ours.recvmsg(256, socket.CMSG_SPACE(_INT_SIZE))
            ours.settimeout(None)
        except OSError as exc:
            self.close()
            raise _Unusable("no answer (%s)" % exc) from None
        fd = _received_fd(ancillary)
        if fd is not None:
            # The page where a script's fork writes its exit status before its end (None:
            # the server's wait status, after its end, is waited for).
            try:
                self.page = mmap.mmap(fd, _STATUS)
            except (OSError, ValueError):
                pass
            finally:
                os.close(fd)
        if not hello.startswith(b"ok "):
            self.close()
            said = hello.decode("utf-8", "replace")
            # The server's refusal is "no <why>".
            raise _Unusable(said[3:] if said.startswith("no ") else said or "it exited")
        # An interpreter that prints as it starts (a .pth file, sitecustomize) would print that
        # on each script's stdout or stderr: not the same from a fork.
        said = b""
        for pipe in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(pipe.fileno(), False)
            try:
                said += pipe.read() or b""
            except OSError:
                pass
            pipe.close()
        if said:
            self.close()
            raise _Unusable("the interpreter prints as it starts: %r" % said[:200])

    def close(self):
        self.sock.close()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        if self.page is not None:
            self.page.close()
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def alive(self):
        return self.proc.poll() is None


def _take(plan):
    """An idle server for the plan, started when none (None: run as a process)."""
    key = plan.key
    with _lock:
        if key in _refused:
            return None
        idle = _idle.get(key)
        while idle:
            server = idle.pop()
            if server.alive():
                _busy[key] = _busy.get(key, 0) + 1
                return server
            server.close()
        if _busy.get(key, 0) >= _PER_KEY:
            return None
        _busy[key] = _busy.get(key, 0) + 1
    try:
        return _Server(plan)
    except _Unusable as exc:
        with _lock:
            _busy[key] -= 1
            first = key not in _refused
            _refused[key] = str(exc)
        if first:
            print("Python scripts of %s run as processes: its fork server did not start (%s)"
                  % (" ".join(plan.launch), exc))
        return None


def _give_back(key, server, usable):
    with _lock:
        _busy[key] -= 1
        if usable:
            _idle.setdefault(key, []).append(server)
            return
    server.close()


@atexit.register
def _close_all():
    """At the worker's end: each idle server told (its socket closed: it exits) and waited for."""
    with _lock:
        servers = [s for idle in _idle.values() for s in idle]
        _idle.clear()
    for server in servers:
        server.sock.close()
    for server in servers:
        try:
            server.proc.wait(1)
        except subprocess.TimeoutExpired:
            server.proc.kill()


def _encoding():
    """The text encoding `subprocess` uses when none is given."""
    choose = getattr(subprocess, "_text_encoding", None)
    return choose() if choose else locale.getpreferredencoding(False)


def _run_planned(plan, argv, stdin_text, timeout):
    """The CompletedProcess, or None: the call is to run as a process."""
    if stdin_text is None:
        return None  # the child would read the worker's own stdin
    encoding = _encoding()
    try:
        data = stdin_text.encode(encoding)
    except UnicodeError:
        return None  # subprocess raises it with a process started: that one can do it
    server = _take(plan)
    if server is None:
        return None
    usable = False
    try:
        result = _call(server, plan, data, timeout, argv)
        usable = True
    except _Unusable:
        return None  # the server went before the script started: run it as a process
    except subprocess.TimeoutExpired:
        usable = True
        raise
    finally:
        _give_back(plan.key, server, usable)
    if result is None:
        return None
    code, out, err = result
    return subprocess.CompletedProcess(argv, code, _text(out, encoding), _text(err, encoding))


def _text(data, encoding):
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def _call(server, plan, data, timeout, argv):
    """(returncode, stdout, stderr) of the script run by `server`; None: not run.

    The input is written and the outputs read from the moment the request is sent: the fork
    server's answer (the child's pid, or that it cannot run it) is read on the way."""
    deadline = time.monotonic() + timeout
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if server.page is not None:
        server.page[0:_STATUS] = bytes(_STATUS)  # no status yet
    try:
        request = b"\0".join(os.fsencode(x) for x in [plan.where, plan.script] + plan.args)
        server.sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                         array.array("i", [in_r, out_w, err_w]))])
    except OSError as exc:
        for fd in (in_w, out_r, err_r):
            os.close(fd)
        raise _Unusable(str(exc)) from None
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    child = _Child(server)
    try:
        got = _exchange(child, data, in_w, out_r, err_r, deadline, argv, timeout)
    finally:
        child.close()
    if got is None:
        return None
    return (child.code,) + got


def _received_fd(ancillary):
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and payload:
            fds = array.array("i")
            fds.frombytes(payload[:len(payload) - len(payload) % _INT_SIZE])
            for extra in fds[1:]:
                os.close(extra)
            return fds[0] if fds else None
    return None


class _Child:
    """The forked script, as the server's messages tell it: its pid (and a pidfd to kill it
    by), or that it is not run ("fallback"), then its exit status."""

    def __init__(self, server):
        self.server = server
        self.pid = None
        self.pidfd = None
        self.refused = False
        self.code = None

    def started(self):
        return self.pid is not None or self.refused

    def ended(self):
        return self.code is not None

    def take(self):
        """Reads one message of the server (the socket is readable, or waited on); raises
        `_Unusable` when the server is gone before the script started, OSError after."""
        reply, ancillary, _, _ = self.server.sock.recvmsg(256, socket.CMSG_SPACE(_INT_SIZE))
        fd = _received_fd(ancillary)
        if not reply:
            if self.pid is None:
                raise _Unusable("it ended")
            self.kill()  # on its own now, with no status to be had
            raise OSError("the fork server of %s ended" % self.server.proc.args[0])
        if reply.startswith(b"pid ") and not self.started():
            self.pid, self.pidfd, fd = int(reply[4:]), fd, None
        elif reply.startswith(b"fallback") and not self.started():
            self.refused = True
        elif reply.startswith(b"status ") and self.pid is not None:
            pid, status = reply[7:].split()
            if int(pid) == self.pid:
                self.code = os.waitstatus_to_exitcode(int(status))
        # (else the status of a run before this one)
        if fd is not None:
            os.close(fd)

    def reported(self):
        """Takes the exit status the script wrote before its end, when it did (read once its
        stdout and stderr ended: it writes it before it lets go of them)."""
        page = self.server.page
        if page is None or self.pid is None or self.code is not None:
            return
        if int.from_bytes(page[0:4], sys.byteorder) == self.pid:
            self.code = os.waitstatus_to_exitcode(int.from_bytes(page[4:8], sys.byteorder))

    def wait_for(self, done, remaining):
        """Reads messages until `done()`; socket.timeout after `remaining` seconds."""
        if done():
            return
        self.server.sock.settimeout(remaining)
        try:
            while not done():
                self.take()
        finally:
            self.server.sock.settimeout(None)

    def kill(self):
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            elif self.pid is not None and self.code is None:
                os.kill(self.pid, signal.SIGKILL)
        except (OSError, AttributeError):
            pass

    def close(self):
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _exchange(child, data, in_w, out_r, err_r, deadline, argv, timeout):
    """subprocess's communicate(): the input written while both outputs are read to their
    end, then the child's exit status taken (from the status page when the script wrote it
    there, else the fork server's message after its end), all within the deadline (else it is
    killed and TimeoutExpired raised, as subprocess.run does). None: the server did not run
    it.

    The server's messages (the child's pid, or that it does not run it) are read once the
    outputs have ended, not as they come: they are sent before the script starts (a spare
    that does not run it closes the outputs first), and the call is one wake-up shorter."""
    chunks = {out_r: [], err_r: []}
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    view, offset = memoryview(data), 0
    if data:
        os.set_blocking(in_w, False)
        poller.register(in_w, select.POLLOUT)
    else:
        os.close(in_w)
        in_w = None
    open_fds = set(chunks)
    try:
        while open_fds or in_w is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _expire(child, chunks, out_r, err_r, argv, timeout)
            for fd, _ in poller.poll(remaining * 1000):
                if fd == in_w:
                    try:
                        offset += os.write(in_w, view[offset:offset + 65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        offset = len(data)
                    if offset >= len(data):
                        poller.unregister(in_w)
                        os.close(in_w)
                        in_w = None
                else:
                    chunk = os.read(fd, 32768)
                    if chunk:
                        chunks[fd].append(chunk)
                    else:
                        poller.unregister(fd)
                        open_fds.discard(fd)
        try:
            # (At least a millisecond: a timeout of 0 would make the socket non-blocking.)
            child.wait_for(child.started, max(deadline - time.monotonic(), 0.001))
            if child.refused:
                return None
            child.reported()
            child.wait_for(child.ended, max(deadline - time.monotonic(), 0.001))
        except socket.timeout:
            return _expire(child, chunks, out_r, err_r, argv, timeout)
    finally:
        for fd in [in_w, out_r, err_r]:
            if fd is not None:
                os.close(fd)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r])


def _expire(child, chunks, out_r, err_r, argv, timeout):
    """The timeout: the child killed and waited for, TimeoutExpired raised (None: it turned
    out the server did not run it)."""
    child.wait_for(child.started, None)
    if child.refused:
        return None
    child.kill()
    child.wait_for(child.ended, None)
    raise subprocess.TimeoutExpired(argv, timeout,
                                    output=b"".join(chunks[out_r]) or None,
                                    stderr=b"".join(chunks[err_r]) or None)
