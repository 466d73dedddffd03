"""Starting the hermes-hooks service with the gateway (``autostart``).

With ``HookRegistry(autostart=True)``, or by default when the gateway runs through the shim
(``hermes-hooks-gateway``, ``HERMES_HOOKS_SHIM=1``; ``HERMES_HOOKS_AUTOSTART=0`` turns it off),
``discover_and_load`` calls :func:`ensure_service`, which:

1. **Takes the lease**: a shared ``flock`` on ``<socket>.lease`` (next to the service's socket,
   ``$HERMES_HOME/hooks.sock.lease`` by default), held until the gateway process ends (the
   kernel releases it however the process ends, SIGKILL included). An autostarted service runs
   with ``serve --gateway-lease <that file> --linger N`` and stops by itself, draining its
   queues, once no gateway has held the lease for ``N`` seconds (``HERMES_HOOKS_AUTOSTART_LINGER``,
   default 30). So a gateway restart finds the service still running and keeps it (no second
   copy, no gap in the hooks' module state), and the last gateway's exit leaves no orphan: the
   service goes ``N`` seconds later.
2. **Looks for a service** at the address (``GET /readyz``). One that answers is used as it is,
   whoever started it (systemd, a shell, another gateway), except one that is shutting down
   (503 ``shutting_down``: its linger ran out just before this gateway came, or it was told to
   stop): that one takes no more events, so a new one is started as in 3, which takes the
   socket over while the old one finishes its drain; one of another protocol version is
   refused with a clear error and not replaced; a service that accepts connections but does not
   answer in time is left alone (never a second copy beside a hung one).
3. **Starts one when nobody listens**, under an exclusive ``flock`` on ``<socket>.lock``, so two
   gateways starting at once start one service: the second waits for the lock, then finds the
   first one's service answering. The service is the bundled binary (see :func:`find_binary`),
   run as ``hermes-hooks serve --socket <socket>`` (``--listen`` for a loopback TCP address) in
   its own session and process group (``setsid``: the gateway's terminal signals and process
   group kills do not reach it), with the gateway's environment (so the same
   ``HERMES_HOOKS_TRUST`` trust mode, ``HERMES_HOOKS_LOG``...), the same ``HERMES_HOME`` and the
   gateway's working directory, its output appended to ``$HERMES_HOME/logs/hooks.log``, and
   the gateway's interpreter (``sys.executable``) as ``HERMES_HOOKS_GATEWAY_PYTHON``: the
   service's Python hooks run in it by default, as they did in the original host, also when the
   gateway was started by absolute path with its venv's ``bin`` not on ``PATH``. It
   waits (``autostart_timeout``, 5 s) for ``/readyz`` before letting the other gateway in.

A TCP address that is not loopback is never autostarted (the service is elsewhere).
Standard library only.
"""

import fcntl
import ipaddress
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from typing import Dict, List, Optional, Sequence

from . import _transport

log = logging.getLogger("hermes_hooks")

#: ``1``/``0`` (``true``/``false``, ``yes``/``no``, ``on``/``off``): autostart for registries
#: built without an ``autostart`` argument (default: on under the shim, off otherwise).
ENV = "HERMES_HOOKS_AUTOSTART"
#: Seconds an autostarted service keeps running after the last gateway went (default 30).
LINGER_ENV = "HERMES_HOOKS_AUTOSTART_LINGER"
DEFAULT_LINGER = 30.0
#: Seconds a registry waits for the service it autostarted to be ready (default 5).
TIMEOUT_ENV = "HERMES_HOOKS_AUTOSTART_TIMEOUT"
#: The gateway's interpreter, handed to the service it starts (its hooks' default interpreter).
GATEWAY_PYTHON_ENV = "HERMES_HOOKS_GATEWAY_PYTHON"
#: The binary's name in the environment's ``bin`` directory (where the wheel puts it).
BINARY_NAME = "hermes-hooks"
#: Where the autostarted service's output goes, under ``$HERMES_HOME``.
LOG_NAME = os.path.join("logs", "hooks.log")

#: The working directory when this module was imported: a relative ``$HERMES_HOOKS_BIN``
#: (``target/debug/hermes-hooks``) names a file relative to it, so a gateway that changes its
#: directory later still finds the binary (issue 50).
try:
    _IMPORT_CWD = os.getcwd()  # type: Optional[str]
except OSError:  # pragma: no cover - started in a directory since removed
    _IMPORT_CWD = None

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")

#: Set by the shim's ``install()``: registries built without ``autostart=`` start the service.
shim_active = False

# Lease files held by this process, by path -> descriptor: opened once, held until it ends.
_leases = {}  # type: Dict[str, int]
_leases_lock = threading.Lock()


def wanted(autostart: Optional[bool]) -> bool:
    """Whether a registry autostarts: its argument when given, else ``$HERMES_HOOKS_AUTOSTART``,
    else whether the shim is active."""
    if autostart is not None:
        return bool(autostart)
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in _ON:
        return True
    if setting in _OFF:
        return False
    return shim_active


def find_binary(explicit: Optional[str] = None) -> Optional[str]:
    """The ``hermes-hooks`` executable to start: ``explicit`` (``binary=``), else
    ``$HERMES_HOOKS_BIN``, else the one the wheel installed into this environment's ``bin``
    directory (the scripts directory of this interpreter's install scheme, the interpreter's own
    directory, the user scheme's for ``pip install --user``), else ``hermes-hooks`` on ``PATH``.
    """
    if explicit:
        return explicit
    given = os.environ.get(_transport.BIN_ENV)
    if given:
        return resolve_relative(given)
    dirs = []  # type: List[str]
    try:
        dirs.append(sysconfig.get_path("scripts"))
    except KeyError:  # pragma: no cover - an unusual install scheme
        pass
    dirs.append(os.path.dirname(os.path.abspath(sys.executable)))
    try:
        dirs.append(sysconfig.get_path("scripts", "%s_user" % os.name))
    except KeyError:  # pragma: no cover
        pass
    for directory in dirs:
        candidate = os.path.join(directory, BINARY_NAME)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(BINARY_NAME)


def resolve_relative(given: str) -> str:
    """``given`` (``$HERMES_HOOKS_BIN``) as an absolute path when it is a relative one with a
    directory part: relative to the directory this client was imported in, not to whatever
    the working directory is when the service starts. A bare name is looked up on ``PATH``."""
    if os.path.isabs(given) or os.sep not in given or _IMPORT_CWD is None:
        return given
    return os.path.join(_IMPORT_CWD, given)


def ready_timeout(given: Optional[float] = None) -> float:
    """Seconds to wait for an autostarted service's ``/readyz``: ``given``, else
    ``$HERMES_HOOKS_AUTOSTART_TIMEOUT`` (0 to 600), else 5."""
    if given is not None:
        return float(given)
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        value = float(text) if text else 5.0
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 600.0:
        log.warning("hermes-hooks: %s=%r is not a number of seconds from 0 to 600; using 5",
                    TIMEOUT_ENV, text)
        return 5.0
    return value


def linger() -> float:
    """``$HERMES_HOOKS_AUTOSTART_LINGER`` seconds (0 to a day), default 30."""
    text = os.environ.get(LINGER_ENV, "").strip()
    if not text:
        return DEFAULT_LINGER
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 86400.0:
        log.warning("hermes-hooks: %s=%r is not a number of seconds from 0 to 86400; using %g",
                    LINGER_ENV, text, DEFAULT_LINGER)
        return DEFAULT_LINGER
    return value


def _base(address: _transport.Address, home: str) -> str:
    """The path the lock and lease files are named after: the socket, or for TCP a name in
    ``home`` made of the port."""
    if address.kind == "unix":
        return os.path.abspath(str(address.path))
    return os.path.join(home, "hooks-tcp-%d" % int(address.port or 0))


def _local(address: _transport.Address) -> bool:
    if address.kind == "unix":
        return True
    host = str(address.host)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def hold_lease(path: str) -> bool:
    """Takes a shared lock on the lease file ``path`` for the rest of this process's life
    (once per path). Returns whether it is held."""
    with _leases_lock:
        if path in _leases:
            return True
        try:
            fd = _open(path)
        except OSError as exc:
            log.warning("hermes-hooks: cannot open the lease %s (%s): an autostarted service "
                        "will not stop when the gateways go", path, exc)
            return False
        try:
            # The service holds an exclusive lock only for the instant of a look: this waits
            # microseconds at most.
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as exc:
            os.close(fd)
            log.warning("hermes-hooks: cannot lock the lease %s (%s)", path, exc)
            return False
        _leases[path] = fd
        return True


class ShuttingDown(Exception):
    """The service at the address is draining (``/readyz``: 503 ``shutting_down``): it takes
    no more events, so it is not adopted; a new one is started, which takes its socket over."""


def _probe(address: _transport.Address, headers: Dict[str, str], timeout: float,
           deadline: float) -> Optional[BaseException]:
    """``None`` when a service answers at ``address`` (of a compatible protocol), else the error
    (:class:`~hermes_hooks._transport.IncompatibleService` for the wrong protocol,
    :class:`ShuttingDown` for one that is stopping: its linger ran out, or it was told to
    stop). A service that is still loading its hooks (``/readyz`` 503 ``not_ready``: another
    gateway just started it) is waited for until ``deadline``."""
    pause = 0.02
    while True:
        try:
            status, body = _transport.request(address, "GET", "/readyz", None, headers, timeout)
        except Exception as exc:  # OSError, http.client.HTTPException
            return exc
        if status == 503 and b'"shutting_down"' in (body or b""):
            return ShuttingDown("the service at %s is shutting down" % (address,))
        if status != 503 or time.monotonic() >= deadline:
            return None
        time.sleep(pause)  # polling the service's readiness or its end, with a deadline
        pause = min(pause * 2, 0.2)


def _nobody_listening(exc: BaseException) -> bool:
    # A missing socket or a refused connection: nobody serves there; a draining service will
    # not serve again (the new one takes its socket over). A timeout is a hung service, which
    # must not be answered with a second one.
    return isinstance(exc, (FileNotFoundError, ConnectionRefusedError, ShuttingDown))


def _lock_exclusive(fd: int, deadline: float) -> bool:
    """``flock(LOCK_EX)`` on ``fd``, giving up at ``deadline`` (polled: flock has no timeout)."""
    pause = 0.01
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(pause, remaining))  # another gateway is starting the service
            pause = min(pause * 2, 0.1)


def ensure_service(address: _transport.Address, home: str, *, headers: Dict[str, str],
                   binary: Optional[str] = None, serve_args: Sequence[str] = (),
                   timeout: float = 5.0, log_path: Optional[str] = None,
                   env_home: bool = False, request_timeout: float = 5.0
                   ) -> Optional["subprocess.Popen[bytes]"]:
    """Makes sure a service answers at ``address``, starting the bundled one when nobody listens
    (see the module docstring). Returns the process when this call started it. Never raises."""
    if not _local(address):
        log.info("hermes-hooks: autostart skipped: %s is not a local address", address)
        return None
    base = _base(address, home)
    try:
        os.makedirs(os.path.dirname(base), mode=0o700, exist_ok=True)
    except OSError as exc:
        log.warning("hermes-hooks: autostart: cannot create %s: %s", os.path.dirname(base), exc)
        return None
    lease = base + ".lease"
    hold_lease(lease)
    deadline = time.monotonic() + timeout
    exc = _probe(address, headers, request_timeout, deadline)
    if exc is None:
        return None
    if not _nobody_listening(exc):
        _report_unusable(address, exc)
        return None
    lock_path = base + ".lock"
    try:
        fd = _open(lock_path)
    except OSError as err:
        log.warning("hermes-hooks: autostart: cannot open %s: %s", lock_path, err)
        return None
    try:
        if not _lock_exclusive(fd, deadline):
            log.warning("hermes-hooks: autostart: another process held %s for %.1f s; not "
                        "starting a second service", lock_path, timeout)
            return None
        exc = _probe(address, headers, request_timeout, deadline)  # another gateway's?
        if exc is None:
            return None
        if not _nobody_listening(exc):
            _report_unusable(address, exc)
            return None
        return _start(address, home, lease, binary=binary, serve_args=serve_args,
                      deadline=deadline, log_path=log_path, env_home=env_home,
                      headers=headers, request_timeout=request_timeout)
    finally:
        os.close(fd)  # releases the start lock


def _report_unusable(address: _transport.Address, exc: BaseException) -> None:
    if isinstance(exc, _transport.IncompatibleService):
        log.error("hermes-hooks: %s; not starting another service beside it", exc)
    else:
        log.warning("hermes-hooks: the service at %s does not answer (%s); not starting a "
                    "second one beside it", address, exc)


def _start(address: _transport.Address, home: str, lease: str, *, binary: Optional[str],
           serve_args: Sequence[str], deadline: float, log_path: Optional[str], env_home: bool,
           headers: Dict[str, str], request_timeout: float
           ) -> Optional["subprocess.Popen[bytes]"]:
    """Starts the service (the start lock is held) and waits for ``/readyz`` until ``deadline``."""
    path = find_binary(binary)
    if not path:
        log.warning("hermes-hooks: autostart wanted but no hermes-hooks binary found (install "
                    "the hermes-hooks wheel, pass binary=, set %s, or put hermes-hooks on PATH)",
                    _transport.BIN_ENV)
        return None
    if os.sep in path and not os.path.isfile(path):
        log.warning("hermes-hooks: autostart wanted but %s is not a file (from %s; a relative "
                    "path is taken from the directory the client was imported in, %s): set "
                    "%s to the binary's absolute path", path,
                    "binary=" if binary else _transport.BIN_ENV, _IMPORT_CWD, _transport.BIN_ENV)
        return None
    argv = [path, "serve"] + address.serve_args() + [
        "--gateway-lease", lease, "--linger", "%g" % linger()] + list(serve_args)
    log_path = log_path or os.path.join(home, LOG_NAME)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), mode=0o700, exist_ok=True)
        env = dict(os.environ, HERMES_HOME=home) if env_home else dict(os.environ)
        # Hooks run in the gateway's own interpreter, as in the original host, even when the
        # gateway was started by absolute path with its venv's bin not on PATH (issue 36).
        env[GATEWAY_PYTHON_ENV] = sys.executable
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    close_fds=True, start_new_session=True, env=env,
                                    cwd=os.getcwd())
    except OSError as exc:
        log.warning("hermes-hooks: autostart of %s failed: %s", argv, exc)
        return None
    log.info("hermes-hooks: started %s (pid %d, log %s)", " ".join(argv), proc.pid, log_path)
    pause = 0.01
    while True:
        try:
            status, _ = _transport.request(address, "GET", "/readyz", None, headers,
                                           request_timeout)
        except Exception:
            status = 0
        if status == 200:
            return proc
        if proc.poll() is not None:
            log.warning("hermes-hooks: autostarted service exited with status %s; see %s",
                        proc.returncode, log_path)
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log.warning("hermes-hooks: autostarted service not ready in time; see %s (it goes "
                        "on starting: events wait in the buffer)", log_path)
            return proc
        time.sleep(min(pause, remaining))  # polling readiness against a deadline
        pause = min(pause * 2, 0.2)


def _held_leases() -> List[str]:
    """The lease files this process holds (for tests)."""
    with _leases_lock:
        return sorted(_leases)


def _reset_for_tests() -> None:
    """Lets go of every lease (tests only)."""
    with _leases_lock:
        for fd in _leases.values():
            os.close(fd)
        _leases.clear()


