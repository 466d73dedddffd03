"""``HookRegistry``: the gateway's hook registry, backed by the hermes-hooks service.

Same surface as the gateway's original ``gateway.hooks.HookRegistry``: ``discover_and_load()``,
``loaded_hooks``, ``async emit(event_type, context=None)``, ``async emit_collect(event_type,
context=None)``. See the package docstring for the guarantees.

Path of an event: ``emit`` validates the name, copies the context (shallow) and appends it to a
deque bounded by count and by bytes (without a lock when there is room: see ``emit``); if the
sender thread is idle, its wake-up is scheduled on the event loop (``call_soon``) -> the sender takes the events a few at a time
(``_ENCODE_CHUNK``), encodes them to JSON (``default=``: anything becomes a string) and sleeps
briefly between chunks, up to ``batch_max`` events or ``_BATCH_BYTES`` -> ``POST
/v1/events/batch`` over one keep-alive connection -> on 202 they are counted ``sent``; on a
connection error or 503 the same batch is retried after a backoff; on 400/413 the batch is halved
until the bad event is alone, and that one is counted ``rejected``.

Why the sender works in small pieces: in the gateway's process it competes with the event loop
for the GIL, and CPython takes the GIL from a thread that does not give it up only after
``sys.getswitchinterval()`` (5 ms; never changed here: it is the whole interpreter's setting).
A sender that encoded a whole batch at once held the GIL for milliseconds and the loop stalled
that long (measured: loop lag p99 2.4 ms at 20,000 events/s, against 0.6 ms for the original
in-process host). Now every GIL hold of the sender is short: one chunk of encoding (about 30 us),
then ``time.sleep(_ENCODE_NAP)``, which releases the GIL long enough for a waiting loop to take
it (a bare release is retaken before the waiting thread wakes); then a join bounded by
``_BATCH_BYTES`` and socket I/O, which runs without the GIL. Encoding in ``emit`` instead was
measured too: it keeps the sender lighter but costs every emit ~2 us on the loop's own thread,
which in a burst of emits is lag itself (p99 0.5 ms against 0.3 ms this way).
``benches/loop_lag.py`` measures it.
"""

import asyncio
import atexit
import collections
import collections.abc
import datetime
import decimal
import enum
import hashlib
import http.client
import json
import logging
import math
import os
import subprocess
import threading
import time
import uuid
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _autostart, _ingateway, _outcome, _transport, _trusted, _upstream

log = logging.getLogger("hermes_hooks")

#: Longest event name the service accepts, in characters (code points, as JSON Schema counts).
MAX_EVENT_NAME_CHARS = 256
#: Most events the service takes in one ``/v1/events/batch`` request.
MAX_BATCH_EVENTS = 10000
#: Largest encoded event the client sends (the service's body limit is 16 MiB); a bigger one
#: is counted ``rejected``.
MAX_BATCH_BYTES = 8 * 1024 * 1024
#: Body size the sender stops filling a batch at: joining a batch holds the GIL (a memcpy of
#: this size, about 0.1 ms), so it stays well under the service's limit.
_BATCH_BYTES = 1024 * 1024
#: Default bound on the bytes buffered (queued + in flight), beside the bound on events.
DEFAULT_QUEUE_BYTES = 32 * 1024 * 1024
#: Events the sender encodes per GIL hold (a 400-byte context takes about 2 us)...
_ENCODE_CHUNK = 16
#: ...and the sleep after each chunk, which lets a thread waiting for the GIL take it.
_ENCODE_NAP = 0.0001
#: Encoded size assumed for a buffered event before the sender has measured any (bytes).
_INITIAL_EVENT_BYTES = 512
#: How many distinct valid event names are remembered to skip re-validation.
_NAME_CACHE_MAX = 4096
#: Consecutive 5xx answers (other than 502/503/504) for the same batch before it is split.
_MAX_SERVER_ERRORS = 3

# Outcomes of one batch request.
_OK, _RETRY, _SPLIT, _REJECT = "ok", "retry", "split", "reject"
# ``_enqueue`` result: buffered, and the idle sender needs a wake.
_WAKE = "wake"
#: The event whose context gets the run's outcome (a global: checked on every emit).
_AGENT_END = _outcome.EVENT
#: Seconds an idle sender sleeps before looking at the buffer anyway: the safety net for a
#: wake scheduled on an event loop that stopped before running it.
_IDLE_RECHECK = 1.0
#: With no deadline from the caller, how long ``emit_collect`` waits for the service's answer:
#: the service itself answers within the matching hooks' own timeouts (at most 301 s), this is
#: only the bound on a service that stopped answering.
_SERVICE_ANSWER_BOUND = 310.0


class _RateLimited:
    """Logs the first occurrence of a kind of message, then at most one per ``interval``
    seconds, saying how many were suppressed in between (a dead service must not flood logs)."""

    def __init__(self, interval: float = 30.0) -> None:
        self.interval = interval
        self._last = {}  # type: Dict[str, float]
        self._suppressed = collections.Counter()  # type: collections.Counter

    def quiet(self, key: str) -> bool:
        """True (and counted as suppressed) when a ``key`` message was logged too recently:
        lets a hot path skip building the message."""
        last = self._last.get(key)
        if last is not None and time.monotonic() - last < self.interval:
            self._suppressed[key] += 1
            return True
        return False

    def __call__(self, key: str, level: int, msg: str, *args: Any) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] += 1
            return
        self._last[key] = now
        skipped = self._suppressed.pop(key, 0)
        if skipped:
            msg += " (%d similar messages suppressed)"
            args = args + (skipped,)
        log.log(level, msg, *args)


def check_event_name(name: object) -> Optional[str]:
    """Why the service would reject ``name`` (DESIGN 5), or ``None`` when it is acceptable."""
    if not isinstance(name, str):
        return "event name must be a string, not %s" % type(name).__name__
    if not name:
        return "event name is empty"
    if len(name) > MAX_EVENT_NAME_CHARS:
        return "event name is longer than %d characters" % MAX_EVENT_NAME_CHARS
    for ch in name:
        if ch.isspace() or ch < " " or "\x7f" <= ch <= "\x9f":
            return "event name %r contains whitespace or a control character" % name
    return None


def _json_default(obj: Any) -> Any:
    """Makes any context value JSON-safe: the gateway's contexts are not checked by anyone."""
    if isinstance(obj, (datetime.datetime, datetime.date, datetime.time)):
        return obj.isoformat()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).decode("utf-8", "replace")
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (decimal.Decimal, uuid.UUID)):
        return str(obj)
    if isinstance(obj, collections.abc.Mapping):
        return dict(obj)
    return str(obj)


def _sanitize(obj: Any, depth: int = 0, seen: Optional[set] = None) -> Any:
    """Slow path when ``json.dumps`` failed: NaN/inf -> null, non-string keys -> strings,
    reference cycles and very deep nesting -> short strings."""
    if seen is None:
        seen = set()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    if depth > 64:
        return "<nested too deep>"
    if isinstance(obj, (dict, list, tuple, set, frozenset, collections.abc.Mapping)):
        if id(obj) in seen:
            return "<circular reference>"
        seen.add(id(obj))
        try:
            if isinstance(obj, collections.abc.Mapping):
                return {k if isinstance(k, str) else _safe_str(k): _sanitize(v, depth + 1, seen)
                        for k, v in obj.items()}
            return [_sanitize(v, depth + 1, seen) for v in obj]
        finally:
            seen.discard(id(obj))
    try:
        return _sanitize(_json_default(obj), depth + 1, seen)
    except Exception:
        return _safe_str(obj)


def _safe_str(obj: Any) -> str:
    try:
        return str(obj)
    except Exception:
        return "<unprintable %s>" % type(obj).__name__


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), default=_json_default, allow_nan=False)


def encode_event(event_type: str, context: Dict[str, Any]) -> bytes:
    """One ``{"event", "context"}`` object as compact JSON bytes, as the sender encodes it;
    never raises for odd values."""
    return _event_prefix(event_type) + _encode_context(context) + b"}"


def _context_encoder() -> Any:
    """``encode(obj) -> str``, compact JSON as ``_dumps`` makes it, with the C encoder built once
    instead of on every call (``json.dumps`` with options builds a ``JSONEncoder`` and a C
    encoder per call: 3.6 us against 1.8 us for a 400-byte context). ``reset()`` clears the
    circular-reference markers a failed call may leave behind."""
    markers = {}  # type: Dict[int, Any]
    make = getattr(json.encoder, "c_make_encoder", None)
    escape = getattr(json.encoder, "c_encode_basestring_ascii", None)
    c_encode = None
    if make is not None and escape is not None:
        try:
            c_encode = make(markers, _json_default, escape, None, ":", ",", False, False, False)
        except Exception:  # pragma: no cover - another interpreter's signature
            c_encode = None
    if c_encode is None:  # pragma: no cover - CPython without the _json accelerator
        py = json.JSONEncoder(separators=(",", ":"), default=_json_default, allow_nan=False)

        def encode(obj: Any) -> str:
            return py.encode(obj)
    else:
        join = "".join

        def encode(obj: Any) -> str:
            return join(c_encode(obj, 0))
    encode.reset = markers.clear  # type: ignore[attr-defined]
    return encode


_encode_json = _context_encoder()


def _event_prefix(event_type: Any) -> bytes:
    """``{"event":NAME,"context":`` for one event name."""
    try:
        name = _dumps(event_type)
    except (TypeError, ValueError, RecursionError):
        name = _dumps(_sanitize(event_type))
    return b'{"event":' + name.encode("utf-8") + b',"context":'


def _encode_context(context: Dict[str, Any]) -> bytes:
    """The context as compact JSON bytes (the fast encoder, else the forgiving slow path)."""
    try:
        return _encode_json(context).encode("utf-8")
    except Exception:  # TypeError, ValueError (NaN, cycle), RecursionError, a dict mutated...
        _encode_json.reset()
        return _dumps(_sanitize(context)).encode("utf-8")


def _still_loading(body: bytes) -> bool:
    """Whether a ``GET /v1/hooks`` answer says the service's first load still runs."""
    try:
        return json.loads(body.decode("utf-8")).get("ready") is False
    except (ValueError, AttributeError):
        return False


def _error_detail(status: int, body: bytes) -> str:
    """``"400 bad_request: message"`` from the service's ``{"error": {"code", "message"}}``."""
    try:
        err = json.loads(body.decode("utf-8"))["error"]
        return "%d %s: %s" % (status, err.get("code", "?"), err.get("message", ""))
    except Exception:
        text = body[:200].decode("utf-8", "replace").strip()
        return "%d %s" % (status, text or http.client.responses.get(status, ""))


async def _nothing() -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    return [], []


def _hook_entry(raw: Any) -> Dict[str, Any]:
    """A ``loaded_hooks`` entry: the original's keys (name, description, events, path) first,
    then whatever else the service reports (kind, root, status, counters...)."""
    raw = raw if isinstance(raw, dict) else {}
    entry = {
        "name": raw.get("name", ""),
        "description": raw.get("description") or "",
        "events": list(raw.get("events") or []),
        "path": raw.get("path", ""),
    }
    for key, value in raw.items():
        entry.setdefault(key, value)
    return entry


# The "[hooks] Loaded hook ..." lines this process has printed. The gateway's registry, the
# agent plugin's and its reload at Hermes's start each take the service's list: the console says
# each hook once, as the original does (issue 60 row 9: it said each three times).
_announced = set()  # type: set
_announced_lock = threading.Lock()


def _announce(line: str, hook: Dict[str, Any]) -> None:
    """Print ``line`` on the console the first time this process sees it, for a hook the
    original gateway would have loaded: not a shell hook of config.yaml (the service writes
    those under ``config-hooks``), and one with an event the gateway emits (``ns:name``, or a
    pattern starting with a wildcard); a hook only on the agent's events (``pre_tool_call``,
    no colon) is the agent's, which Hermes does not list there."""
    root = os.path.basename(os.path.normpath(str(hook.get("root") or "")))
    gateway = any(":" in e or e[:1] in ("*", "?", "[", "{")
                  for e in hook.get("events") or [] if isinstance(e, str))
    if root == "config-hooks" or not gateway:
        return
    with _announced_lock:
        if line in _announced:
            return
        _announced.add(line)
    print(line, flush=True)


# Registries alive in this process, for the exit flush and the fork reset.
_live = weakref.WeakSet()  # type: weakref.WeakSet


def _at_exit() -> None:
    for registry in list(_live):
        try:
            registry._close_at_exit()
        except Exception:  # pragma: no cover - never let exit handling raise
            pass


def _after_fork_in_child() -> None:
    for registry in list(_live):
        registry._reset_after_fork()


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class HookRegistry:
    """Drop-in for the gateway's ``HookRegistry``, sending events to the hermes-hooks service.

    Usage, exactly as with the original::

        registry = HookRegistry()
        registry.discover_and_load()

        async def on_message(ctx):            # in the gateway's coroutines
            await registry.emit("agent:start", ctx)
            decisions = await registry.emit_collect("message:pre_route", ctx)

    Counters (read them any time, from any thread): ``sent`` (events the service acknowledged
    with 202), ``dropped`` (events discarded because the buffer was full, or emitted after
    ``close()``), ``rejected`` (events the client or the service refused as invalid: bad event
    name, context not a mapping, 4xx answer), ``pending`` (buffered + in flight),
    ``pending_bytes`` (their size as JSON), ``connected`` (the service answered the last batch
    request; ``None`` until the first batch was sent, the sender connects lazily) and ``last_error`` (text of the last send failure, kept after recovery).

    When the buffer is full (``queue_size`` events or ``queue_bytes`` bytes) the **oldest**
    buffered events are dropped to make room (the service side's default overflow policy too):
    after an outage the hooks get the most recent events. Events already in the batch being sent
    are never dropped; that batch takes at most half the buffer, so new events still find
    room.
    """

    def __init__(self, address: Any = None, token: Optional[str] = None, queue_size: int = 10000,
                 batch_max: int = 500, collect_timeout: Optional[float] = None,
                 autostart: Optional[bool] = None, *,
                 binary: Optional[str] = None, serve_args: Sequence[str] = (),
                 autostart_timeout: Optional[float] = None, autostart_log: Optional[str] = None,
                 request_timeout: float = 5.0, backoff_initial: float = 0.05,
                 backoff_max: float = 5.0, exit_flush_timeout: float = 1.0,
                 validate_events: bool = True, queue_bytes: int = DEFAULT_QUEUE_BYTES,
                 hermes_home: Optional[str] = None, collect_fail_closed: Any = None) -> None:
        """
        :param address: Unix socket path or ``http://host:port``; default
            ``$HERMES_HOOKS_ADDRESS``, else ``$HERMES_HOME/hooks.sock``. ``ValueError`` if
            malformed: the only exception this class raises, at construction.
        :param token: bearer token; default ``$HERMES_HOOKS_TOKEN``.
        :param queue_size: most events buffered (queued + in flight) while the service is slow
            or down; beyond it the oldest are dropped and counted.
        :param batch_max: most events per ``/v1/events/batch`` request (1..10,000).
        :param collect_timeout: seconds ``emit_collect`` gives the handlers by default (sent as
            ``timeout_ms``; the call itself gives up one second later). Default ``None``: as
            long as the matching hooks' own timeouts allow, so a decision never fails open
            (the original host awaited every handler); a call's ``timeout=`` is still honoured.
        :param autostart: start ``hermes-hooks serve`` from ``discover_and_load`` when no service
            answers at the address (see ``hermes_hooks._autostart``); default
            ``$HERMES_HOOKS_AUTOSTART``, else on when the shim is active.
        :param binary: the ``hermes-hooks`` executable for autostart; default
            ``$HERMES_HOOKS_BIN``, else the one the wheel installed beside this interpreter,
            else ``hermes-hooks`` on ``PATH``.
        :param serve_args: extra ``serve`` arguments for autostart (``["--hooks-dir", d]``...).
        :param autostart_timeout: seconds to wait for ``/readyz`` after starting the service;
            default ``$HERMES_HOOKS_AUTOSTART_TIMEOUT``, else 5.
        :param autostart_log: file receiving the started service's output; default
            ``$HERMES_HOME/logs/hooks.log``.
        :param request_timeout: socket timeout for each batch request and for
            ``discover_and_load``'s request.
        :param backoff_initial, backoff_max: reconnect delays, doubling from the first to the second.
        :param exit_flush_timeout: at interpreter exit, seconds spent delivering what is still
            buffered (0: don't wait).
        :param validate_events: check event names on the client (the service's rules) so one bad
            name is refused alone instead of costing a round of batch splitting.
        :param queue_bytes: most bytes buffered (queued + in flight, as JSON; for events not
            encoded yet, the average encoded size so far), beside ``queue_size``: past either
            bound the oldest are dropped and counted (default 32 MiB).
        :param hermes_home: the service's ``HERMES_HOME`` (default ``$HERMES_HOME``): where the
            in-gateway hooks imported are recorded, and the home an autostarted service gets.
        :param collect_fail_closed: for callers that want decisions to fail closed: a value
            (say ``{"decision": "deny"}``) that ``emit_collect`` adds to its results once for
            each matching hook that gave no decision (it failed, timed out, was refused by trust
            or is not loaded), and once when the service gave no answer at all. Default
            ``None``: such hooks are only logged. ``emit_collect(..., fail_closed=)`` overrides
            it per call.
        """
        # Whether the address is the default one, which follows a patched HOOKS_DIR (issue 36).
        self._address_chosen = bool(address) or bool(os.environ.get(_transport.ADDRESS_ENV))
        self._address = self._default_address = _transport.resolve_address(address)
        self._dir_serve_args = []  # type: List[str]
        if token is None:
            token = os.environ.get(_transport.TOKEN_ENV) or None
        self._headers = {"Authorization": "Bearer %s" % token.strip()} if token else {}
        self._batch_headers = dict(self._headers, **{"Content-Type": "application/json",
                                                      "Accept": "application/json"})
        if int(queue_size) < 1:
            raise ValueError("queue_size must be at least 1, got %r" % (queue_size,))
        if not 1 <= int(batch_max) <= MAX_BATCH_EVENTS:
            raise ValueError("batch_max must be between 1 and %d, got %r"
                             % (MAX_BATCH_EVENTS, batch_max))
        if int(queue_bytes) < 1:
            raise ValueError("queue_bytes must be at least 1, got %r" % (queue_bytes,))
        if collect_timeout is not None and not float(collect_timeout) > 0:
            raise ValueError("collect_timeout must be positive, got %r" % (collect_timeout,))
        self._queue_size = int(queue_size)
        self._queue_bytes = int(queue_bytes)
        self._batch_max = int(batch_max)
        self.collect_timeout = None if collect_timeout is None else float(collect_timeout)
        self.collect_fail_closed = collect_fail_closed
        self._autostart = _autostart.wanted(autostart)
        self._binary = binary
        self._serve_args = list(serve_args)
        self._autostart_timeout = _autostart.ready_timeout(autostart_timeout)
        self._autostart_log = autostart_log
        self._request_timeout = float(request_timeout)
        self._backoff_initial = max(0.001, float(backoff_initial))
        self._backoff_max = max(self._backoff_initial, float(backoff_max))
        self._exit_flush_timeout = max(0.0, float(exit_flush_timeout))
        self._validate = bool(validate_events)

        #: Counters, see the class docstring.
        self.sent = 0
        self.dropped = 0
        self.rejected = 0
        self.connected = None  # type: Optional[bool]  # None: no batch sent yet
        self.last_error = None  # type: Optional[str]
        #: LoadReport entries from the service: ``{"dir", "name", "reason"}``.
        self.skipped = []  # type: List[Dict[str, Any]]
        #: The ``hermes-hooks serve`` process started by autostart, if any (it is not stopped
        #: by ``close()``: it serves whoever comes next).
        self.service_process = None  # type: Optional[subprocess.Popen]

        self._hooks = []  # type: List[Dict[str, Any]]
        self._home = hermes_home or _transport.hermes_home()
        self._home_given = hermes_home is not None
        #: Hooks that run inside the gateway (``"runs": "gateway"``), imported here.
        self._ingateway = _ingateway.InGatewayHooks()
        #: The original's in-process registry: event pattern -> callables (built-in hooks
        #: register here through ``_register_builtin_hooks``); run as in-gateway hooks are.
        self._handlers = {}  # type: Dict[str, List[Any]]
        self._inprocess = _upstream.InProcess(self._handlers)
        #: ``loaded_hooks`` came from the hooks directory on disk (the service did not answer):
        #: refreshed from the service when it answers.
        self._hooks_from_disk = False
        # Event name -> the encoded ``{"event":NAME,"context":`` prefix; a name is here once it
        # passed validation (bounded: past _NAME_CACHE_MAX names each emit computes its own).
        self._prefixes = {}  # type: Dict[Any, bytes]
        self._say = _RateLimited()
        self._init_sender_state()
        _live.add(self)

    def _init_sender_state(self) -> None:
        # One lock guards the buffer, the in-flight count and the counters emitters touch.
        self._lock = threading.Lock()
        # The sender waits here for work; emitters notify only when it is idle.
        self._wake = threading.Condition(self._lock)
        # flush() waits here until buffer and in-flight batch are both empty.
        self._drained = threading.Condition(self._lock)
        # Cuts a reconnect backoff short (flush, close).
        self._kick = threading.Event()
        # Buffered events, oldest first, not encoded yet: ``(prefix, context copy)``, the prefix
        # being the encoded ``{"event":NAME,"context":`` and the copy None for no context. One
        # deque, so that one append (atomic under the GIL) adds an event whole and ``emit`` needs
        # no lock. (A tuple of untracked objects, such as a dict of plain values, leaves the
        # garbage collector's lists at the first young collection that sees it.)
        self._queue = collections.deque()  # type: collections.deque
        # Events (and their encoded bytes) taken by the sender, not yet acknowledged or rejected.
        self._inflight = 0
        self._inflight_bytes = 0
        # Running average of the encoded size of an event: the byte bound's estimate for the
        # events still in the queue (a guess until the sender has encoded some).
        self._event_bytes = float(_INITIAL_EVENT_BYTES)
        self._event_bytes_measured = False
        self._sender_idle = False
        self._wake_pending = False
        self._thread = None  # type: Optional[threading.Thread]
        self._stopping = False
        self._closed = False
        # How many events the buffer holds before ``emit`` must take the slow path (which
        # drops): ``_room_now()`` as of the last change, kept by ``_set_room``; 0 until the
        # sender runs and once closed, so those cases go through ``_enqueue`` too.
        self._room = 0

    # ------------------------------------------------------------------ the original surface

    @property
    def address(self) -> str:
        """Where this registry sends events (socket path or ``http://host:port``)."""
        return str(self._address)

    @property
    def loaded_hooks(self) -> List[dict]:
        """Hooks the service reported at the last ``discover_and_load()``: dicts with at least
        ``name``, ``description``, ``events``, ``path`` (plus the service's ``kind``, ``status``...).
        While the service has not answered, the hooks on disk by the original's rules
        (``"source": "disk"``), replaced by the service's list once it answers."""
        return list(self._hooks)

    def _register_builtin_hooks(self) -> None:
        """The original's extension point for always-on hooks: a subclass or a patch may put
        callables in ``self._handlers`` here; ``discover_and_load`` calls it first."""
        return

    def discover_and_load(self) -> None:
        """Ask the service which hooks it loaded (``GET /v1/hooks``) and start the sender.

        Never raises: when the service is down, logs a warning and lists the hooks on disk (the
        gateway's ``HOOKS_DIR``) into ``loaded_hooks`` until the service answers (events
        emitted meanwhile wait in the buffer). With ``autostart=True`` it first starts the
        service when none answers. ``_register_builtin_hooks`` runs first, as in the original.
        """
        try:
            self._register_builtin_hooks()
        except Exception:
            log.exception("hermes-hooks: _register_builtin_hooks failed")
        try:
            self._follow_hooks_dir()
            if self._autostart:
                self.service_process = _autostart.ensure_service(
                    self._address, self._home, headers=self._headers, binary=self._binary,
                    serve_args=self._serve_args + self._dir_serve_args,
                    timeout=self._autostart_timeout,
                    log_path=self._autostart_log, env_home=self._home_given,
                    request_timeout=self._request_timeout) or self.service_process
            self._peer = {}  # type: Dict[str, Any]  # who served /v1/hooks (SO_PEERCRED)
            status, body, exc = self._fetch("/v1/hooks", self._peer)
            # A service still loading answers an empty list: not its hooks (issue 36: taken as
            # they were, a slow start left loaded_hooks empty and in-gateway hooks unloaded).
            loading = exc is None and status == 200 and _still_loading(body)
            if exc is not None or status != 200 or loading:
                directory = _upstream.hooks_dir(self._home)
                self._hooks = _upstream.read_disk_hooks(directory)
                self._hooks_from_disk = True
                why = ("its hooks are still loading" if loading else
                       exc if exc is not None else _error_detail(status, body))
                log.warning("hermes-hooks service not reachable at %s (%s): listing the %d "
                            "hook(s) in %s until it answers; events are buffered (up to %d)",
                            self._address, why, len(self._hooks), directory, self._queue_size)
            else:
                self._take_hook_list(body)
        except Exception:
            log.exception("hermes-hooks: discover_and_load failed")
        finally:
            self._ensure_sender()

    def _follow_hooks_dir(self) -> None:
        """A gateway (or a test) that patched ``gateway.hooks.HOOKS_DIR`` to another directory
        than ``$HERMES_HOME/hooks`` gets that directory's hooks, whether or not a service runs
        for the default one: unless an address was chosen, this registry uses a service of its
        own for it, at ``$HERMES_HOME/hooks-<digest of the directory>.sock`` (autostarted with
        ``--hooks-dir``; without autostart and none there, the directory's hooks on disk).
        Not with an address or ``hermes_home`` given: those name the service to use."""
        if self._address_chosen or self._home_given:  # the caller chose the service or home
            return
        directory = os.path.realpath(_upstream.hooks_dir(self._home))
        if directory == os.path.realpath(os.path.join(self._home, "hooks")):
            self._address = self._default_address
            self._dir_serve_args = []
            return
        digest = hashlib.sha256(os.fsencode(directory)).hexdigest()[:12]
        self._address = _transport.Address(
            "unix", path=os.path.join(self._home, "hooks-%s.sock" % digest))
        self._dir_serve_args = ["--hooks-dir", directory]

    def _take_hook_list(self, body: bytes) -> None:
        """Adopt the service's ``GET /v1/hooks`` answer: ``loaded_hooks``, ``skipped``, and the
        in-gateway hooks imported."""
        data = json.loads(body.decode("utf-8"))
        hooks = [_hook_entry(h) for h in data.get("hooks") or []]
        self.skipped = [s for s in data.get("skipped") or [] if isinstance(s, dict)]
        peer = getattr(self, "_peer", {})
        self._ingateway.load(hooks, self._home, _trusted.service_problem(
            self._address.kind, peer.get("uid"), bool(self._headers)))
        self._hooks = hooks
        self._hooks_from_disk = False
        for hook in hooks:
            # Under the shim (standing in for the gateway's own registry), on the gateway's
            # console as the original prints it (stdout; its console shows no INFO logs): once
            # per process and only the gateway's hooks (`_announce`); and in the log.
            line = "[hooks] Loaded hook '%s' for events: %s" % (hook["name"], hook["events"])
            if _autostart.shim_active:
                _announce(line, hook)
            log.info("%s", line)
        for entry in self.skipped:
            log.warning("[hooks] Skipping %s: %s", entry.get("name") or entry.get("dir"),
                        entry.get("reason"))

    def _refresh_hooks(self) -> None:
        """The service answered after ``loaded_hooks`` was read from disk: take its list."""
        try:
            self._peer = {}
            status, body, exc = self._fetch("/v1/hooks", self._peer)
            if exc is None and status == 200 and not _still_loading(body):
                self._take_hook_list(body)
        except Exception:
            log.exception("hermes-hooks: refreshing the hook list failed")

    async def emit(self, event_type: str, context: Optional[Dict[str, Any]] = None) -> None:
        """Queue an event for the hooks and return at once: never raises, never waits on the
        network (the coroutine completes without suspending).

        When the sender thread is idle, waking it (a futex wake and usually a context switch,
        some microseconds) is not done here but scheduled with ``loop.call_soon``: it runs when
        the calling task next yields, off the message's path, and one wake serves every event
        emitted until then.

        The common case (a dict context, a name already seen, room in the buffer) is inline
        here and takes no lock: a copy of the context and one ``deque.append``, atomic under the
        GIL. The room is precomputed under the lock whenever it changes (``_set_room``); the
        length is read before it, so a sender taking events meanwhile can only make the check
        stricter. Everything else (a new name, a full buffer, a closed registry, a context of
        another type) goes through ``_enqueue``, under the lock. The sender re-checks the buffer
        after saying it is idle (``_run_sender``), so an append it did not see is followed by a
        wake.

        ``agent:end`` gets the run's outcome from the gateway's frame (:mod:`._outcome`)."""
        try:
            if event_type == _AGENT_END and type(context) is dict:
                context = _outcome.with_outcome(context, 1)
            if self._handlers:
                self._inprocess.handlers = self._handlers
                self._inprocess.dispatch(event_type, context)
            if self._ingateway._hooks:
                self._ingateway.dispatch(event_type, context)
            result = None  # type: Any
            if type(context) is dict and type(event_type) is str:
                prefix = self._prefixes.get(event_type)
                if prefix is not None:
                    queue = self._queue
                    if len(queue) < self._room:
                        # A copy: the gateway may reuse its dict after emit returns.
                        queue.append((prefix, context.copy()))
                        if not self._sender_idle or self._wake_pending:
                            return
                        self._wake_pending = True
                        result = _WAKE
            if result is None:
                result = self._enqueue(event_type, context)
            if result is _WAKE:
                try:
                    asyncio.get_running_loop().call_soon(self._wake_sender)
                except RuntimeError:  # driven without a running loop
                    self._wake_sender()
        except Exception as exc:  # never into the gateway
            self._emit_failed(event_type, exc)

    def emit_nowait(self, event_type: str, context: Optional[Dict[str, Any]] = None) -> bool:
        """``emit`` for synchronous code and other threads (wakes the sender directly).
        Returns whether the event was buffered (``False``: rejected as invalid, dropped, or the
        registry is closed). Never raises."""
        try:
            if event_type == _AGENT_END and type(context) is dict:
                context = _outcome.with_outcome(context, 1)
            if self._handlers:
                self._inprocess.handlers = self._handlers
                self._inprocess.dispatch(event_type, context)
            if self._ingateway._hooks:
                self._ingateway.dispatch(event_type, context)
            result = self._enqueue(event_type, context)
            if result is _WAKE:
                self._wake_sender()
            return bool(result)
        except Exception as exc:  # never into the gateway
            self._emit_failed(event_type, exc)
            return False

    def _enqueue(self, event_type: Any, context: Any) -> Any:
        """Buffer one event. Returns ``False`` (not buffered), ``True`` (buffered) or ``_WAKE``
        (buffered, and the idle sender must be woken by the caller)."""
        if context is None:
            ctx = None  # type: Optional[Dict[str, Any]]
        elif type(context) is dict:
            ctx = context.copy()  # the gateway may reuse its dict after emit returns
        elif isinstance(context, collections.abc.Mapping):
            ctx = dict(context)
        else:
            return self._reject_early(
                "context for %r must be a dict, not %s" % (event_type, type(context).__name__))
        prefix = self._prefixes.get(event_type) if type(event_type) is str else None
        if prefix is None:
            if self._validate:
                problem = check_event_name(event_type)
                if problem is not None:
                    return self._reject_early(problem)
            prefix = _event_prefix(event_type)
            if type(event_type) is str and len(self._prefixes) < _NAME_CACHE_MAX:
                self._prefixes[event_type] = prefix
        wake = False
        with self._lock:
            if self._closed:
                self.dropped += 1
                lost = "closed"
            else:
                queue = self._queue
                lost = None
                room = self._room_now()
                if len(queue) >= room:
                    if room <= 0:
                        self.dropped += 1
                        lost = "newest"
                    else:
                        lost = "oldest"
                        while len(queue) >= room:
                            queue.popleft()
                            self.dropped += 1
                if lost != "newest":
                    queue.append((prefix, ctx))
                    if self._sender_idle and not self._wake_pending:
                        self._wake_pending = wake = True
        if self._thread is None and lost != "closed":
            self._ensure_sender()
        if lost is not None:
            self._note_drop(lost)
            if lost != "oldest":
                return False
        return _WAKE if wake else True

    def _room_now(self) -> int:
        """(Under the lock.) Room beside the batch in flight (never dropped), in events; the
        queued ones count for the average encoded size."""
        count_room = self._queue_size - self._inflight
        fits = int((self._queue_bytes - self._inflight_bytes) / self._event_bytes)
        return count_room if count_room < fits else fits

    def _set_room(self) -> None:
        """(Under the lock.) Refreshes ``_room`` after the in-flight counts, the average size,
        the sender or ``_closed`` changed."""
        self._room = 0 if self._closed or self._thread is None else self._room_now()

    def _wake_sender(self) -> None:
        with self._lock:
            self._wake_pending = False
            if self._sender_idle:
                self._sender_idle = False
                self._wake.notify()

    def _emit_failed(self, event_type: Any, exc: BaseException) -> None:
        try:
            self._say("emit-error", logging.ERROR, "hermes-hooks: emit(%r) failed: %r",
                      event_type, exc)
        except Exception:
            pass

    async def emit_collect(self, event_type: str, context: Optional[Dict[str, Any]] = None, *,
                           timeout: Optional[float] = None, fail_closed: Any = None) -> List[Any]:
        """Run the matching handlers now (``POST /v1/collect``) and return their non-None
        results in match order (exact-pattern hooks first, then wildcard hooks), like the
        original. Waits as long as the matching hooks' own timeouts allow unless ``timeout``
        (or ``collect_timeout``) says less: a decision never fails open by default. ``[]``
        when the service is down or errs: never raises (a failed or timed-out handler is
        logged and contributes nothing, as does a matching hook the service names as refused or
        not loaded). With ``fail_closed`` (or ``collect_fail_closed``) set, that value is added
        once for each matching hook that gave no decision and once when no answer came."""
        detailed = await self.emit_collect_detailed(event_type, context, timeout=timeout)
        results = [item.get("result") for item in detailed["results"]
                   if isinstance(item, dict) and item.get("result") is not None]
        closed = self.collect_fail_closed if fail_closed is None else fail_closed
        if closed is not None:
            missing = len(detailed["errors"]) + (1 if detailed.get("error") is not None else 0)
            results.extend(closed for _ in range(missing))
        return results

    async def emit_collect_detailed(self, event_type: str,
                                    context: Optional[Dict[str, Any]] = None, *,
                                    timeout: Optional[float] = None) -> Dict[str, Any]:
        """``emit_collect`` with everything the service said: ``{"results": [{"hook",
        "result"}], "errors": [{"hook", "error"[, "timed_out": true]}], "error": None | str}``;
        ``error`` is set when the call itself failed (service down, timeout, refused request);
        a matching hook that did not load is an error with ``"state": "refused"``,
        ``"disabled"`` or ``"not_loaded"``.
        Never raises. In-gateway hooks and the callables in ``_handlers`` run here at the same
        time; their results and errors are merged into the one match order (exact-pattern
        matches, then wildcard matches; in-process handlers first within each group, then hooks
        in discovery order)."""
        try:
            self._inprocess.handlers = self._handlers
            inproc = self._inprocess.matching(event_type)
            local = self._ingateway.matches(event_type)
        except Exception:
            inproc, local = [], False
        if not local and not inproc:
            return await self._service_collect(event_type, context, timeout=timeout)
        if context is None:
            context = {}
        wait = self._collect_wait(timeout)
        service, ingw, mine = await asyncio.gather(
            self._service_collect(event_type, context, timeout=timeout),
            self._ingateway.collect(event_type, context,
                                    _SERVICE_ANSWER_BOUND if wait is None else max(wait, 0.001))
            if local else _nothing(),
            self._inprocess.collect(event_type, context, wait) if inproc else _nothing(),
            return_exceptions=True)
        if isinstance(service, BaseException):  # pragma: no cover - it never raises
            service = {"results": [], "errors": [], "error": repr(service)}
        parts_r, parts_e = [service["results"]], [service["errors"]]
        for part in (ingw, mine):
            if isinstance(part, BaseException):
                log.error("hermes-hooks: in-gateway handlers failed on %r: %r", event_type, part)
                continue
            parts_r.append(part[0])
            parts_e.append(part[1])
        order = _upstream.match_order(event_type, self._hooks, inproc)
        service["results"] = _ingateway.merge(order, *parts_r)
        service["errors"] = _ingateway.merge(order, *parts_e)
        for err in service["errors"]:
            if _upstream.is_timeout(err.get("error")):
                err["timed_out"] = True
        return service

    def _collect_wait(self, timeout: Optional[float]) -> Optional[float]:
        """The caller's deadline, else ``collect_timeout``; ``None``: the hooks' own timeouts."""
        chosen = self.collect_timeout if timeout is None else timeout
        if chosen is None:
            return None
        return float(chosen)

    async def _service_collect(self, event_type: str, context: Optional[Dict[str, Any]] = None,
                               *, timeout: Optional[float] = None) -> Dict[str, Any]:
        """The service's part of ``emit_collect_detailed`` (``POST /v1/collect``)."""
        out = {"results": [], "errors": [], "error": None}  # type: Dict[str, Any]
        try:
            wait = self._collect_wait(timeout)
            if wait is not None and not wait > 0:
                raise ValueError("timeout must be positive, got %r" % (timeout,))
            if context is None:
                context = {}
            elif not isinstance(context, collections.abc.Mapping):
                raise ValueError("context must be a dict, not %s" % type(context).__name__)
            problem = check_event_name(event_type) if self._validate else None
            if problem is not None:
                raise ValueError(problem)
            request = {"event": event_type, "context": context}  # type: Dict[str, Any]
            if wait is not None:
                request["timeout_ms"] = max(1, int(wait * 1000))
            try:
                body = _dumps(request).encode("utf-8")
            except (TypeError, ValueError, RecursionError):
                request["context"] = _sanitize(context)
                body = _dumps(request).encode("utf-8")
        except Exception as exc:
            out["error"] = str(exc)
            self._say("collect-bad", logging.WARNING,
                      "hermes-hooks: emit_collect(%r) not sent: %s", event_type, out["error"])
            return out
        bound = _SERVICE_ANSWER_BOUND if wait is None else wait + 1.0
        try:
            status, raw = await asyncio.wait_for(self._post_collect(body), bound)
            if status != 200:
                out["error"] = _error_detail(status, raw)
            else:
                data = json.loads(raw.decode("utf-8"))
                out["results"] = [r for r in data.get("results") or [] if isinstance(r, dict)]
                out["errors"] = [e for e in data.get("errors") or [] if isinstance(e, dict)]
                for err in out["errors"]:
                    if err.get("state") in ("refused", "disabled", "not_loaded"):
                        self._say("collect-hook-absent:%s" % err.get("hook"), logging.WARNING,
                                  "[hooks] Decision hook %s cannot answer '%s' (%s): %s; no "
                                  "decision from it", err.get("hook"), event_type,
                                  err.get("state"), err.get("error"))
                        continue
                    if err.get("timed_out"):
                        self._say("collect-hook-timeout:%s" % err.get("hook"), logging.WARNING,
                                  "[hooks] Decision hook %s timed out for '%s' (%s): no "
                                  "decision from it; the gateway goes on as if it returned "
                                  "nothing", err.get("hook"), event_type, err.get("error"))
                        continue
                    self._say("collect-hook-error:%s" % err.get("hook"), logging.WARNING,
                              "[hooks] Error in handler %s for '%s': %s",
                              err.get("hook"), event_type, err.get("error"))
        except asyncio.TimeoutError:
            out["error"] = "no answer from %s within %.1f s" % (self._address, bound)
        except Exception as exc:
            out["error"] = "%s: %s" % (type(exc).__name__, exc)
        if out["error"] is not None:
            self._say("collect-failed", logging.WARNING,
                      "hermes-hooks: emit_collect(%r) got no decision: %s",
                      event_type, out["error"])
        return out

    async def _post_collect(self, body: bytes) -> Tuple[int, bytes]:
        """``POST /v1/collect``; while the service answers 503 ``not_ready`` (its hooks are
        still loading) it is asked again, so a decision is not mistaken for "no hooks" (the
        caller's deadline bounds the wait)."""
        pause = 0.02
        while True:
            status, raw = await _transport.arequest(self._address, "POST", "/v1/collect", body,
                                                    self._headers)
            if status != 503 or b'"not_ready"' not in raw:
                return status, raw
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

    # ------------------------------------------------------------------ extras

    @property
    def pending(self) -> int:
        """Events buffered or in the batch being sent (not yet acknowledged)."""
        return len(self._queue) + self._inflight

    @property
    def pending_bytes(self) -> int:
        """Bytes of JSON the pending events amount to: exact for the batch being sent, from
        the average encoded size for the events not encoded yet (what ``queue_bytes`` bounds)."""
        return int(self._inflight_bytes + len(self._queue) * self._event_bytes)

    def stats(self) -> Dict[str, Any]:
        """The counters in one dict (for a status page or a log line)."""
        return {"address": self.address, "sent": self.sent, "dropped": self.dropped,
                "rejected": self.rejected, "pending": self.pending,
                "pending_bytes": self.pending_bytes, "connected": self.connected,
                "last_error": self.last_error}

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until every buffered event was acknowledged (or rejected); ``False`` if that
        did not happen within ``timeout`` seconds. For synchronous code; see ``aflush``."""
        deadline = time.monotonic() + max(0.0, float(timeout))
        with self._lock:
            if not self._queue and not self._inflight:
                return True
        self._ensure_sender()
        self._kick.set()  # retry now rather than at the end of a backoff
        self._wake_sender()  # in case the loop that scheduled the wake is not running
        with self._lock:
            while self._queue or self._inflight:
                remaining = deadline - time.monotonic()
                thread = self._thread
                if remaining <= 0 or thread is None or not thread.is_alive():
                    return False
                self._drained.wait(remaining)
            return True

    async def aflush(self, timeout: float = 5.0) -> bool:
        """``flush`` without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.flush, timeout)

    def close(self, timeout: float = 2.0) -> bool:
        """Deliver what is buffered (for up to ``timeout`` s), then stop the sender. Later
        emits are dropped (counted). Returns whether everything was delivered. Idempotent."""
        if self._closed:
            return not self.pending
        delivered = self.flush(timeout)
        with self._lock:
            self._closed = True
            self._room = 0
            self._stopping = True
            self._wake.notify_all()
        self._kick.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        left = self.pending
        if left:
            log.warning("hermes-hooks: closed with %d event(s) undelivered to %s (last error: %s)",
                        left, self._address, self.last_error)
        return delivered

    async def aclose(self, timeout: float = 2.0) -> bool:
        """``close`` without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.close, timeout)

    def __enter__(self) -> "HookRegistry":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "HookRegistry":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return "<HookRegistry %s sent=%d pending=%d dropped=%d rejected=%d connected=%s>" % (
            self._address, self.sent, self.pending, self.dropped, self.rejected, self.connected)

    # ------------------------------------------------------------------ internals: emit side

    def _reject_early(self, problem: str) -> bool:
        with self._lock:
            self.rejected += 1
        self._say("reject", logging.WARNING, "hermes-hooks: event not sent: %s", problem)
        return False

    def _note_drop(self, which: str) -> None:
        if which == "closed":
            self._say("drop-closed", logging.WARNING,
                      "hermes-hooks: event emitted after close() was dropped")
        elif not self._say.quiet("drop"):
            self._say("drop", logging.WARNING,
                      "hermes-hooks: buffer full (%d events, service at %s: %s); dropping the %s "
                      "event (%d dropped so far)", self._queue_size, self._address,
                      "connected" if self.connected else
                      "unreachable: %s" % (self.last_error or "not connected yet"),
                      which, self.dropped)

    def _ensure_sender(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run_sender, name="hermes-hooks-sender",
                                            daemon=True)
            self._set_room()
        self._thread.start()

    def _close_at_exit(self) -> None:
        if not self._closed:
            self.close(self._exit_flush_timeout if self.pending else 0.0)

    def _reset_after_fork(self) -> None:
        # The sender thread does not exist in the child, and the parent still owns (and will
        # send) what was buffered: start empty; a new sender starts at the first emit.
        self._init_sender_state()

    # ------------------------------------------------------------------ internals: sender thread

    def _run_sender(self) -> None:
        conn = None  # type: Optional[_transport.KeepAliveConnection]
        parts = []  # type: List[bytes]   # encoded events taken from the buffer, oldest first
        # Every GIL hold here is short (one chunk of encoding, one join bounded by _BATCH_BYTES,
        # a few header lines): the rest is naps, socket I/O and lock waits, which release the
        # GIL, so the gateway's event loop gets it back at once (see the module docstring).
        chunk_limit = self._batch_max  # halved on 400/413 to isolate a bad event
        server_errors = 0
        delay = self._backoff_initial
        down_since = None  # type: Optional[float]
        try:
            while True:
                if not parts:
                    with self._lock:
                        while not self._queue:
                            if self._stopping:
                                return
                            self._sender_idle = True
                            # emit appends without the lock: one that came before the flag was
                            # set is seen here; one after it sees the flag and wakes us.
                            if self._queue:
                                break
                            self._wake.wait(_IDLE_RECHECK)
                        self._sender_idle = False
                        self._wake_pending = False  # a wake lost with its loop blocks no later one
                        if self._stopping:
                            return
                    parts = self._fill_batch()
                    if not parts:
                        continue
                elif self._stopping:
                    return

                chunk = parts if len(parts) <= chunk_limit else parts[:chunk_limit]
                body = b",".join(chunk).join((b'{"events":[', b"]}"))
                conn, outcome, status, detail = self._post_batch(conn, body)
                self.connected = status != 0  # the service answered, whatever it said

                # 502/503/504/429 and connection errors are transient (service restarting or
                # draining): retried as long as it takes. Another 5xx may be this batch's
                # fault: after a few, treat it like a 400 and isolate the event.
                if status >= 500 and status not in (502, 503, 504):
                    server_errors += 1
                    if server_errors >= _MAX_SERVER_ERRORS:
                        outcome = _SPLIT
                        server_errors = 0
                elif outcome != _RETRY:
                    server_errors = 0

                # (``chunk`` may be ``parts`` itself: settle before deleting.)
                if outcome == _OK:
                    self._settle(chunk, sent=True)
                    if self._hooks_from_disk:  # the service answers now: take its hook list
                        self._refresh_hooks()
                    del parts[:len(chunk)]
                    delay = self._backoff_initial
                    chunk_limit = min(self._batch_max, chunk_limit * 2)
                    if down_since is not None:
                        log.info("hermes-hooks: service at %s reachable again after %.1f s",
                                 self._address, time.monotonic() - down_since)
                        down_since = None
                elif outcome == _SPLIT and len(chunk) > 1:
                    chunk_limit = max(1, len(chunk) // 2)
                elif outcome in (_SPLIT, _REJECT):
                    refused = len(chunk)
                    self._settle(chunk, sent=False)
                    del parts[:refused]
                    self.last_error = detail
                    level = logging.WARNING if outcome == _SPLIT else logging.ERROR
                    self._say("batch-rejected:" + detail[:3], level,
                              "hermes-hooks: service at %s refused %d event(s): %s",
                              self._address, refused, detail)
                else:  # _RETRY: keep the batch, wait, try again
                    self.last_error = detail
                    if down_since is None:
                        down_since = time.monotonic()
                        log.warning("hermes-hooks: cannot deliver events to %s (%s); buffering "
                                    "up to %d events and retrying. Start the service "
                                    "(`hermes-hooks serve`), run the gateway through the shim "
                                    "(HERMES_HOOKS_SHIM=1 hermes-hooks-gateway ...), or let this "
                                    "client start it (HERMES_HOOKS_AUTOSTART=1, or "
                                    "HookRegistry(autostart=True))", self._address, detail,
                                    self._queue_size)
                    if self.service_process is not None:
                        self.service_process.poll()  # reap an autostarted service that died
                    self._kick.wait(delay)
                    self._kick.clear()
                    delay = min(delay * 2, self._backoff_max)
        except Exception:  # pragma: no cover - a bug here must be visible, not silent
            log.exception("hermes-hooks: sender thread crashed; events are no longer delivered")
            self.last_error = "sender thread crashed"
        finally:
            if conn is not None:
                conn.close()

    def _fill_batch(self) -> List[bytes]:
        """Takes events from the buffer ``_ENCODE_CHUNK`` at a time and encodes them, sleeping
        after each chunk (see the module docstring), until ``batch_max`` events or
        ``_BATCH_BYTES`` (or half the buffer's bounds); returns the encoded batch (empty if every
        event was refused)."""
        parts = []  # type: List[bytes]
        size = 0
        bad = 0
        # A batch in flight is never dropped: at most half the buffer, so that while the
        # service is away the newest events always find room.
        limit = min(self._batch_max, max(1, self._queue_size // 2))
        max_bytes = min(_BATCH_BYTES, max(1, self._queue_bytes // 2))
        while len(parts) < limit and size < max_bytes:
            if parts:
                time.sleep(_ENCODE_NAP)  # give the GIL to a waiting event loop
            with self._lock:
                queue = self._queue
                take = min(len(queue), _ENCODE_CHUNK, limit - len(parts))
                if not take:
                    break
                popleft = queue.popleft
                items = [popleft() for _ in range(take)]
                self._inflight += take
                self._set_room()
            chunk_size = 0
            kept = 0
            for index, (prefix, ctx) in enumerate(items):
                try:
                    part = prefix + (b"{}" if ctx is None else _encode_context(ctx)) + b"}"
                except Exception as exc:
                    bad += 1
                    self._say("encode", logging.WARNING,
                              "hermes-hooks: event %s...} not sent: context not encodable (%r)",
                              prefix[:80].decode("utf-8", "replace"), exc)
                    continue
                if len(part) > MAX_BATCH_BYTES:
                    bad += 1
                    self._say("too-big", logging.WARNING,
                              "hermes-hooks: event %s...} not sent: %d bytes encoded (limit %d)",
                              prefix[:80].decode("utf-8", "replace"), len(part), MAX_BATCH_BYTES)
                    continue
                parts.append(part)
                chunk_size += len(part)
                kept += 1
                if size + chunk_size >= max_bytes and index + 1 < len(items):
                    rest = items[index + 1:]  # the batch is full: back to the front, in order
                    with self._lock:
                        self._queue.extendleft(reversed(rest))
                        self._inflight -= len(rest)
                        self._set_room()
                    break
            size += chunk_size
            with self._lock:
                self._inflight_bytes += chunk_size
                if kept:  # the byte bound's estimate for what is still queued
                    average = chunk_size / kept
                    if self._event_bytes_measured:
                        self._event_bytes += 0.25 * (average - self._event_bytes)
                    else:
                        self._event_bytes = average
                        self._event_bytes_measured = True
                self._set_room()
        if bad:
            self._settle([], sent=False, count=bad)
        return parts

    def _settle(self, chunk: List[bytes], sent: bool, count: int = 0) -> None:
        """The service acknowledged (``sent``) or refused ``chunk`` (plus ``count`` events
        refused before encoding ended): count them, release them."""
        size = sum(map(len, chunk))
        count += len(chunk)
        with self._lock:
            self._inflight -= count
            self._inflight_bytes -= size
            self._set_room()
            if sent:
                self.sent += count
            else:
                self.rejected += count
            if not self._queue and not self._inflight:
                self._drained.notify_all()

    def _post_batch(self, conn: Optional[_transport.KeepAliveConnection], body: bytes
                    ) -> Tuple[Optional[_transport.KeepAliveConnection], str, int, str]:
        """Send one batch; returns the connection to keep, the outcome, the HTTP status (0 for
        a connection failure) and a detail text for logs and ``last_error``."""
        if conn is None:
            conn = _transport.KeepAliveConnection(self._address, self._request_timeout)
        for attempt in (1, 2):
            reused = conn.sock is not None
            try:
                if not conn.ready:
                    # A new connection: a service that is starting accepts connections before
                    # its hooks are loaded; events sent then would match nothing. Wait for it.
                    status, data = conn.request("GET", "/readyz", b"", self._headers)
                    if status == 503:
                        return conn, _RETRY, status, "service not ready yet: %s" % (
                            _error_detail(status, data))
                    conn.ready = True
                status, data = conn.request("POST", "/v1/events/batch", body,
                                            self._batch_headers)
            except OSError as exc:  # the connection is closed by request()
                if reused and attempt == 1:
                    continue  # the service closed an idle keep-alive connection: reconnect now
                return conn, _RETRY, 0, "%s: %s" % (type(exc).__name__, exc)
            if 200 <= status < 300:
                return conn, _OK, status, ""
            detail = _error_detail(status, data)
            if status in (400, 413, 422):
                return conn, _SPLIT, status, detail
            if status >= 500 or status == 429:
                return conn, _RETRY, status, detail
            return conn, _REJECT, status, detail
        return conn, _RETRY, 0, "unreachable"  # pragma: no cover - the loop always returns

    # ------------------------------------------------------------------ internals: control calls

    def _fetch(self, path: str, peer: Optional[Dict[str, Any]] = None
               ) -> Tuple[int, bytes, Optional[BaseException]]:
        try:
            status, body = _transport.request(self._address, "GET", path, None, self._headers,
                                              self._request_timeout, peer)
            return status, body, None
        except (OSError, http.client.HTTPException) as exc:
            return 0, b"", exc
