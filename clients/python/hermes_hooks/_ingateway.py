"""Hooks that run inside the gateway: import them as the original host did, call them off the
message path.

The service lists such hooks in ``/v1/hooks`` with ``"runs": "gateway"`` (they import the
gateway's own modules: patch its classes, reach ``gateway.run._gateway_runner_ref()``, schedule
watchers on its loop) and runs no worker for them. ``InGatewayHooks`` owns the rest:

* **Import** (``load``, from ``discover_and_load``): the handler file is read once, its SHA-256
  compared with the one the service reported (a mismatch refuses the hook: the file changed
  after the service looked at it, possibly after an approval), then executed from those same
  bytes as module ``hermes_hook_<name>`` (registered in ``sys.modules`` first; the hook's other
  modules through its own finder, each checked against the service's manifest, never through
  ``sys.path``: see ``_trusted``, which also checks the service and the hook's tree first), so
  import-time patches are in place before the gateway goes on. What was
  imported is recorded in ``$HERMES_HOME/hooks-in-gateway.json`` (pid, SHA-256 per hook) so that
  ``hermes-hooks list``/``check`` can say when a changed hook needs a gateway restart.
* **emit** (``dispatch``): returns at once. An ``async def`` handler becomes a task on the
  gateway's loop under the hook's ``timeout``; the sync handlers run on one shared thread, off
  the loop (one item per event for all of them, each hook's events in order; bounded queue,
  oldest dropped and counted): one thread to wake and to hand the GIL to, not one per hook. A
  sync call that overruns ``DETACH_AFTER`` (50 ms) gives its hook a thread of its own, and the
  shared work goes on on a new thread (``_Lane``): a slow hook delays the others by at most that
  much, then only its own events. An exception or a timeout is logged with the hook's name,
  never raised into the gateway.
* **emit_collect** (``collect``): awaits both kinds under the timeout and returns
  ``{"hook", "result"}`` / ``{"hook", "error"}`` items; ``match_order`` gives the one match
  order of every hook (exact-pattern hooks, then wildcard hooks, each in discovery order) to
  merge them with the service's results.

An ``async def`` handler gets the caller's real ``context`` dict, as with the original host; a
sync handler, which runs on another thread while the caller goes on, gets a deep copy (a shallow
one when the context cannot be deep-copied): mutating it changes nothing the caller sees.
"""

import asyncio
import collections
import copy
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _trusted

log = logging.getLogger("hermes_hooks")

#: Record of the hooks this gateway imported, in the service's ``HERMES_HOME``.
RECORD_FILE = "hooks-in-gateway.json"
#: Events waiting per in-gateway sync hook before the oldest is dropped.
DEFAULT_QUEUE = 1024
_MATCH_CACHE_MAX = 4096
#: Seconds between two "queue full" warnings of one hook.
_DROP_LOG_INTERVAL = 10.0


def _glob_regex(pattern: str) -> "re.Pattern":
    """The service's glob syntax (``*``, ``?``, ``[...]``, ``{a,b}``) as a regex; ``*`` crosses
    ``:`` as it does in the service."""
    out, i, depth = [], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "}" and depth:
            depth -= 1
            out.append(")")
        elif c == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


class _Patterns:
    """One hook's ``events:``: exact names and compiled globs."""

    def __init__(self, patterns: List[str]) -> None:
        self.exact = set()
        self.globs = []
        for p in patterns:
            if isinstance(p, str):
                if any(ch in p for ch in "*?[{"):
                    self.globs.append(_glob_regex(p))
                else:
                    self.exact.add(p)

    def match(self, event: str) -> Optional[str]:
        """``"exact"``, ``"wildcard"`` or ``None``."""
        if event in self.exact:
            return "exact"
        for g in self.globs:
            if g.match(event):
                return "wildcard"
        return None


#: Seconds the in-gateway hook threads, all together, work before they nap (see ``_Lane.run``)...
_BUSY_SLICE = 0.0003
#: ...and the nap, long enough for the loop's thread to wake and take the GIL.
_NAP = 0.0001
#: When the current slice of all hook threads began (shared: one slice for every hook thread,
#: so busy hooks cost the loop one slice, not one each).
_slice = [0.0]
#: A call on the shared thread running longer than this gives its hook a thread of its own: the
#: shared thread's other work goes on on a new thread (see ``_Lane.detach``)...
DETACH_AFTER = 0.05
#: ...checked this often by the watchdog thread while the shared thread works.
_WATCH_EVERY = 0.02
#: Seconds without work after which the watchdog sleeps until the shared thread is woken again.
_WATCH_PARK_AFTER = 1.0


def module_name(hook_name: str) -> str:
    """``hermes_hook_<name>``, the name as written (the original host's module name)."""
    return "hermes_hook_" + hook_name


class _Lane:
    """A queue of sync calls and the one thread that runs them, in order.

    The in-gateway hooks of a registry share one lane (``InGatewayHooks``): ``emit`` appends one
    item ``(event, context, loop, done, hooks)`` for all of an event's sync hooks and wakes at
    most one thread, and that thread holds the GIL in short slices; ten threads woken per
    burst, each taking the GIL in turn, cost the gateway's loop more (``benches/loop_lag.py``).
    A hook whose call on the shared lane overruns ``DETACH_AFTER`` gets a lane of its own: the
    stuck thread becomes that hook's thread and a new thread takes the shared lane over, so a
    slow hook delays the others' events by at most that long, and then only its own."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.queue = collections.deque()  # type: collections.deque
        # Wakes the lane's thread: released by ``put`` when the thread said it is idle. No
        # Condition: on the loop's thread a put costs a deque append and a flag test.
        self.wake = threading.Lock()
        self.wake.acquire()
        self.thread = None  # type: Optional[threading.Thread]
        # The thread waits for work (only then does put wake it); True before it exists, so the
        # first put starts it.
        self.idle = True
        #: Set while the thread is in a sync call: (hook, started, item, index, hand-over cell).
        self.call = None  # type: Optional[tuple]
        #: Guards the hand-over of a stuck lane against the end of its call.
        self.lock = threading.Lock()
        #: Called when an idle lane is woken (the watchdog's unpark).
        self.on_wake = None  # type: Optional[Callable[[], None]]

    def put(self, item: tuple) -> None:
        queue = self.queue
        if len(queue) >= self.capacity:
            self.drop_oldest()
        queue.append(item)
        if self.idle:
            self.wake_up()

    def wake_up(self) -> None:
        self.idle = False  # one wake per idle period; a busy thread needs none
        if self.on_wake is not None:
            self.on_wake()
        if self.thread is None:
            # The new thread first waits for the release below: it takes its first item only
            # after this (the loop's) thread goes on, as a thread that was idle would.
            self.start(wait_first=True)
        try:
            self.wake.release()
        except RuntimeError:  # already released: the thread wakes anyway
            pass

    def start(self, wait_first: bool) -> None:
        self.thread = threading.Thread(target=self.run, args=(wait_first,), daemon=True,
                                       name="hermes-hook-" + self.name)
        self.thread.start()

    def drop_oldest(self) -> None:
        try:
            event, _, _, done, hooks = self.queue.popleft()
        except IndexError:  # the thread took it meanwhile
            return
        for hook in hooks:
            hook.note_drop(self.capacity)
        if done is not None:
            done(None, "dropped: the hook's queue was full")

    def run(self, wait_first: bool) -> None:
        lane = self
        lock = lane.lock
        clock = time.monotonic
        handed = [None]  # set by detach(): the lane this thread runs from now on
        if wait_first:
            lane.wake.acquire()  # released by wake_up once start() returned
        while True:
            queue = lane.queue
            if not queue:
                lane.idle = True
                if not queue:  # checked again after saying so: put wakes only an idle thread
                    lane.wake.acquire()
                lane.idle = False
                continue
            # Threads working through a backlog keep the GIL for up to the switch interval
            # (5 ms), stalling the gateway's loop that long: once the hook threads together
            # have worked _BUSY_SLICE, each naps briefly on its next item, so a waiting thread
            # (the loop) takes the GIL. A bare release is not enough: a hook thread would take
            # it back before the loop's thread wakes.
            if clock() - _slice[0] > _BUSY_SLICE:
                time.sleep(_NAP)
                _slice[0] = clock()
            try:
                item = queue.popleft()
            except IndexError:
                continue
            event, context, loop, done, hooks = item
            for index, hook in enumerate(hooks):
                own = hook.lane
                if own is not None and own is not lane:
                    # The hook has a thread of its own now: it runs there, in order.
                    own.put((event, context, loop, done, (hook,)))
                    continue
                started = clock()
                lane.call = (hook, started, item, index, handed)
                hook.call(event, context, loop, done, started)
                lock.acquire()
                if handed[0] is None:
                    lane.call = None
                lock.release()
                if handed[0] is not None:  # the rest of the item is the new thread's
                    lane = handed[0]
                    lock = lane.lock
                    handed = [None]
                    threading.current_thread().name = "hermes-hook-" + lane.name
                    break

    def detach(self, limit: float) -> bool:
        """Called by the watchdog: if this lane's thread has been in one call for over
        ``limit`` s, that hook gets a lane of its own, run by the stuck thread once the call
        returns, and this lane a new thread, which goes on with the rest. Returns whether it
        did. The hook's later events reach its lane through this one (see ``run``), so they
        stay in order."""
        with self.lock:
            call = self.call
            if call is None or time.monotonic() - call[1] <= limit:
                return False
            hook, _, item, index, handed = call
            event, context, loop, done, hooks = item
            own = _Lane(hook.name, hook.capacity)
            own.idle = False  # its thread (the stuck one) is busy: puts need not wake it
            own.thread = self.thread
            hook.lane = own
            if index + 1 < len(hooks):
                self.queue.appendleft((event, context, loop, done, hooks[index + 1:]))
            handed[0] = own
            self.call = None
            self.start(wait_first=False)
        log.warning("[hooks] %s has run for over %.2f s on the in-gateway hooks' shared thread: "
                    "it gets a thread of its own, the other hooks go on without waiting for it",
                    hook.name, limit)
        return True


class _Hook:
    """One imported in-gateway hook (or an in-process callable) and its calls."""

    def __init__(self, entry: Dict[str, Any], handle: Callable, module: Any) -> None:
        self.name = entry["name"]
        self.entry = entry
        self.handle = handle
        self.module = module
        self.is_async = inspect.iscoroutinefunction(handle) or inspect.iscoroutinefunction(
            getattr(handle, "__call__", None))
        try:
            self.timeout = float(entry.get("timeout_s") or 30.0)
        except (TypeError, ValueError):
            self.timeout = 30.0
        try:
            self.capacity = int((entry.get("queue") or {}).get("capacity") or DEFAULT_QUEUE)
        except (TypeError, ValueError, AttributeError):
            self.capacity = DEFAULT_QUEUE
        self.dropped = 0
        self._drop_logged = -_DROP_LOG_INTERVAL
        self.failed = 0
        self.ok = 0
        #: The hook's own lane, or None while it runs on its registry's shared lane.
        self.lane = None  # type: Optional[_Lane]

    # -- sync handlers: on a lane's thread, the hook's events in order

    def submit(self, event: str, context: Dict[str, Any], loop: Optional[asyncio.AbstractEventLoop],
               done: Optional[Callable[[Any, Optional[str]], None]] = None) -> None:
        """Run on the hook's own thread (a hook outside ``InGatewayHooks``, which shares one)."""
        if self.lane is None:
            self.lane = _Lane(self.name, self.capacity)
        # Its own thread runs it while the caller goes on: it gets a copy, never the live dict.
        self.lane.put((event, _private_copy(context), loop, done, (self,)))

    def note_drop(self, capacity: int) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._drop_logged >= _DROP_LOG_INTERVAL:
            self._drop_logged = now
            log.warning("[hooks] %s: queue full (%d events waiting for its thread); "
                        "oldest dropped (%d dropped so far)", self.name, capacity, self.dropped)

    def call(self, event: str, context: Dict[str, Any],
             loop: Optional[asyncio.AbstractEventLoop], done: Optional[Callable],
             started: float) -> None:
        try:
            result = self.handle(event, context)
        except Exception as exc:
            result, error = None, self._failed(event, exc)
        else:
            if result is None:
                self.ok += 1
                error = None
            else:
                result, error = self._settle(event, result, loop)
        elapsed = time.monotonic() - started
        if elapsed > self.timeout:
            self._overran(event, elapsed)
        if done is not None:
            try:
                done(result, error)
            except Exception:  # pragma: no cover - the waiter's side is already gone
                pass

    def _settle(self, event: str, result: Any, loop: Optional[asyncio.AbstractEventLoop]
                ) -> Tuple[Any, Optional[str]]:
        """A sync handler returned something: await it on the loop if it is a coroutine."""
        if not inspect.isawaitable(result):
            self.ok += 1
            return result, None
        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("handler returned a coroutine but the gateway's loop is gone")
            result = asyncio.run_coroutine_threadsafe(_awaited(result), loop).result(self.timeout)
        except Exception as exc:
            return None, self._failed(event, exc)
        self.ok += 1
        return result, None

    def _overran(self, event: str, elapsed: float) -> None:
        log.warning("[hooks] %s took %.1f s for '%s' (timeout %.1f s; a sync handler in the "
                    "gateway cannot be interrupted, it only delays this hook's own events)",
                    self.name, elapsed, event, self.timeout)

    def _failed(self, event: str, exc: BaseException) -> str:
        self.failed += 1
        if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
            text = "timed out after %.1f s" % self.timeout
            log.warning("[hooks] Handler %s for '%s' %s", self.name, event, text)
        else:
            text = "%s: %s" % (type(exc).__name__, exc) if str(exc) else type(exc).__name__
            log.error("[hooks] Error in handler %s for '%s': %s", self.name, event, text,
                      exc_info=(type(exc), exc, exc.__traceback__))
        return text

    # -- async handlers: tasks on the gateway's loop

    async def call_async(self, event: str, context: Dict[str, Any],
                         limit: Optional[float] = None) -> Tuple[Any, Optional[str]]:
        try:
            result = await asyncio.wait_for(_awaited(self.handle(event, context)),
                                            self.timeout if limit is None else limit)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return None, self._failed(event, exc)
        self.ok += 1
        return result, None


_PLAIN = frozenset((str, int, float, bool, type(None), bytes))


def _plain_copy(value: Any) -> Any:
    """A deep copy of JSON-like data (what the gateway sends), several times faster than
    ``copy.deepcopy``; anything else inside is handed to ``copy.deepcopy``."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict:
        return {k: (v if type(v) in _PLAIN else _plain_copy(v)) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _PLAIN else _plain_copy(v) for v in value]
    if kind is tuple:
        return tuple(v if type(v) in _PLAIN else _plain_copy(v) for v in value)
    return copy.deepcopy(value)


def _private_copy(context: Any) -> Any:
    """A deep copy of the context for handlers on their own threads (a shallow one when something
    in it cannot be copied): the caller keeps using its dict while the handlers run."""
    try:
        if type(context) is dict and _PLAIN.issuperset(map(type, context.values())):
            return context.copy()  # flat (the usual gateway context): the same, in C
        return _plain_copy(context)
    except Exception:  # includes RecursionError for a very deep context
        return dict(context) if isinstance(context, dict) else context


def _record_owner(path: str) -> Optional[int]:
    """The pid in an existing in-gateway record (0 when unreadable), or None without one."""
    try:
        with open(path, encoding="utf-8") as f:
            pid = json.load(f).get("pid")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return 0
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else 0


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists
        return True
    return True


async def _awaited(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class InGatewayHooks:
    """The in-gateway hooks of one registry (see the module docstring)."""

    def __init__(self) -> None:
        self._hooks = {}  # type: Dict[str, _Hook]
        self._order = []  # type: List[Tuple[str, _Patterns]]   # every hook, discovery order
        self._cache = {}  # type: Dict[str, Tuple[List[str], List[_Hook]]]
        self._tasks = set()  # type: set
        self._loop = None  # type: Optional[asyncio.AbstractEventLoop]
        #: The sync handlers' shared lane (started at the first call) and its watchdog's state.
        self._shared = None  # type: Optional[_Lane]
        self._capacity = DEFAULT_QUEUE
        self._parked = False
        self._unparked = threading.Event()

    def __bool__(self) -> bool:
        return bool(self._hooks)

    @property
    def names(self) -> List[str]:
        return list(self._hooks)

    # ------------------------------------------------------------------ import

    def load(self, entries: List[Dict[str, Any]], hermes_home: Optional[str],
             service_problem: Optional[str] = None) -> None:
        """Import the entries with ``runs == "gateway"`` (once per name: a hook already imported
        is kept, re-importing patching code is not safe). Marks each entry's ``status``.
        ``service_problem`` (see :mod:`._trusted`) refuses every import: the listing may not
        come from the real service."""
        self._service_problem = service_problem
        self._roots = _trusted.known_roots(hermes_home)
        self._order = [(e.get("name", ""), _Patterns(list(e.get("events") or [])))
                       for e in entries]
        self._cache = {}
        for entry in entries:
            if entry.get("runs") != "gateway":
                continue
            name = entry.get("name", "")
            if name in self._hooks:
                entry["status"] = "imported"
                if entry.get("sha256") != self._hooks[name].entry.get("sha256"):
                    entry["restart_needed"] = "changed since this gateway imported it"
                    log.warning("[hooks] %s changed since it was imported; restart the gateway "
                                "to run the new version", name)
                continue
            hook = self._import(entry)
            if hook is not None:
                self._hooks[name] = hook
        self._capacity = max([h.capacity for h in self._hooks.values()] or [DEFAULT_QUEUE])
        if self._shared is not None:
            self._shared.capacity = self._capacity
        if hermes_home:
            self._write_record(hermes_home)

    def _import(self, entry: Dict[str, Any]) -> Optional[_Hook]:
        name = entry.get("name", "")
        handler = entry.get("handler") or ""
        hook_dir = entry.get("path") or os.path.dirname(handler)

        def refuse(status: str, why: str) -> None:
            entry["status"] = status
            entry["error"] = why
            log.error("[hooks] Skipping %s (runs in the gateway): %s", name, why)

        mod_name = module_name(name)
        problem = getattr(self, "_service_problem", None)
        if problem is None:
            problem = _trusted.tree_problem(hook_dir, getattr(self, "_roots", []))
        if problem is None:
            problem = _trusted.handler_problem(handler, hook_dir)
        files = entry.get("files")
        if problem is None and not isinstance(files, dict):
            problem = "the service sent no manifest of the hook's files"
        if problem is not None:
            refuse("refused", problem + "; not imported")
            return None
        finder = _trusted.HookFinder(name, hook_dir, files)
        try:
            with open(handler, "rb") as f:
                source = f.read()
        except OSError as exc:
            refuse("failed", "cannot read %s: %s" % (handler, exc))
            return None
        digest = hashlib.sha256(source).hexdigest()
        rel = os.path.relpath(os.path.realpath(handler), finder.root)
        if not entry.get("sha256") or digest != entry.get("sha256") or files.get(rel) != digest:
            refuse("refused", "%s has SHA-256 %s, not %s as the service reported: it changed "
                   "after the service checked it; not imported (reload the service, then "
                   "restart the gateway)" % (handler, digest[:12], str(entry.get("sha256"))[:12]))
            return None
        spec = importlib.util.spec_from_file_location(mod_name, handler)
        if spec is None:
            refuse("failed", "cannot make a module of %s" % handler)
            return None
        module = importlib.util.module_from_spec(spec)
        finder.install()  # no sys.path entry: see _trusted
        sys.modules[mod_name] = module
        try:
            code = compile(source, handler, "exec", dont_inherit=True)
            exec(code, module.__dict__)  # the bytes whose digest was checked, not a re-read
        except BaseException as exc:  # a hook's SystemExit must not stop the gateway either
            _trusted.drop(finder, hook_dir, [mod_name])
            refuse("failed", "import failed: %s: %s" % (type(exc).__name__, exc))
            log.debug("import traceback", exc_info=(type(exc), exc, exc.__traceback__))
            if isinstance(exc, KeyboardInterrupt):
                raise
            return None
        handle = getattr(module, "handle", None)
        if not callable(handle):
            _trusted.drop(finder, hook_dir, [mod_name])
            refuse("failed", "no 'handle' function found in %s" % os.path.basename(handler))
            return None
        entry["status"] = "imported"
        log.info("[hooks] Imported %s into the gateway (%s)", name, entry.get("why", ""))
        return _Hook(entry, handle, module)

    def _write_record(self, hermes_home: str) -> None:
        """Records this process's imports. A process that imported nothing creates no record,
        and none replaces the record of another running process (the gateway's): a script or a
        test with a registry on the same home must not erase what the gateway imported."""
        path = os.path.join(hermes_home, RECORD_FILE)
        owner = _record_owner(path)
        if not self._hooks and owner is None:
            return
        if owner not in (None, os.getpid()) and _alive(owner):
            log.warning("hermes-hooks: %s belongs to the running process %d; not replaced by "
                        "this one's (pid %d)", path, owner, os.getpid())
            return
        record = {"pid": os.getpid(),
                  "hooks": {n: {"sha256": h.entry.get("sha256", ""), "handler": h.entry.get(
                      "handler", "")} for n, h in self._hooks.items()}}
        tmp = "%s.%d.tmp" % (path, os.getpid())
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("hermes-hooks: cannot record the in-gateway hooks in %s: %s", path, exc)

    # ------------------------------------------------------------------ matching

    def _match(self, event: str) -> tuple:
        """(every matching hook's name in match order, the in-gateway ones among them, those
        with a sync handler as a tuple, those with an async one)."""
        hit = self._cache.get(event)
        if hit is not None:
            return hit
        exact, wild = [], []
        for name, patterns in self._order:
            kind = patterns.match(event)
            if kind == "exact":
                exact.append(name)
            elif kind == "wildcard":
                wild.append(name)
        names = exact + wild
        hooks = [self._hooks[n] for n in names if n in self._hooks]
        hit = (names, hooks, tuple(h for h in hooks if not h.is_async),
               [h for h in hooks if h.is_async])
        if len(self._cache) < _MATCH_CACHE_MAX:
            self._cache[event] = hit
        return hit

    def matches(self, event: str) -> bool:
        return bool(self._hooks) and bool(self._match(event)[1])

    def match_order(self, event: str) -> List[str]:
        return self._match(event)[0]

    # ------------------------------------------------------------------ emit

    def dispatch(self, event: str, context: Dict[str, Any]) -> None:
        """Start every matching in-gateway handler and return at once (never raises)."""
        if not self._hooks or not isinstance(event, str):
            return
        _, hooks, sync, asyncs = self._cache.get(event) or self._match(event)
        if not hooks:
            return
        if context is None:
            context = {}  # as the original host: handlers always get a dict
        try:
            loop = asyncio.get_running_loop()  # type: Optional[asyncio.AbstractEventLoop]
            self._loop = loop
            running_here = True
        except RuntimeError:
            loop = self._loop if self._loop is not None and not self._loop.is_closed() else None
            running_here = False
        if sync:
            try:
                # One item for all of the event's sync handlers, on the shared lane; they run
                # while the caller goes on, so they get one copy of the context (made once,
                # shared by this event's sync handlers as the original host shared its dict
                # between handlers), never the caller's live dict.
                (self._shared or self._start_shared()).put(
                    (event, _private_copy(context), loop, None, sync))
            except Exception as exc:  # never into the gateway
                log.error("[hooks] in-gateway hooks not run for '%s': %r", event, exc)
        for hook in asyncs:
            try:
                if running_here:
                    task = loop.create_task(hook.call_async(event, context))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif loop is not None:
                    asyncio.run_coroutine_threadsafe(hook.call_async(event, context), loop)
                else:
                    log.warning("[hooks] %s not run for '%s': async handler and no event loop "
                                "known yet", hook.name, event)
            except Exception as exc:  # never into the gateway
                log.error("[hooks] %s not run for '%s': %r", hook.name, event, exc)

    def _start_shared(self) -> _Lane:
        """The sync handlers' shared lane, and the watchdog that hands a stuck one over."""
        lane = _Lane("in-gateway", self._capacity)
        lane.on_wake = self._unpark
        self._shared = lane
        threading.Thread(target=self._watch, args=(lane,), daemon=True,
                         name="hermes-hooks-watchdog").start()
        return lane

    def _unpark(self) -> None:
        if self._parked:
            self._parked = False
            self._unparked.set()

    def _watch(self, lane: _Lane) -> None:
        """Every ``_WATCH_EVERY`` s while the shared lane works: hand a call that overran
        ``DETACH_AFTER`` over (``_Lane.detach``). Sleeps while the lane is idle."""
        quiet_since = time.monotonic()
        while True:
            time.sleep(_WATCH_EVERY)
            lane.detach(DETACH_AFTER)
            now = time.monotonic()
            if not lane.idle or lane.call is not None:
                quiet_since = now
            elif now - quiet_since > _WATCH_PARK_AFTER:
                self._unparked.clear()
                self._parked = True
                if lane.idle:  # else it was woken before it could see _parked
                    self._unparked.wait()
                self._parked = False
                quiet_since = time.monotonic()

    # ------------------------------------------------------------------ emit_collect

    async def collect(self, event: str, context: Dict[str, Any], timeout: float
                      ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
        """Run the matching in-gateway handlers now; (results, errors) tagged with hook names."""
        hooks = self._match(event)[1] if self._hooks else []
        if not hooks:
            return [], []
        loop = asyncio.get_running_loop()
        self._loop = loop
        waits = []
        for hook in hooks:
            limit = min(hook.timeout, timeout)
            if hook.is_async:
                waits.append(hook.call_async(event, context, limit))
            else:
                fut = loop.create_future()

                def done(result: Any, error: Optional[str], fut: "asyncio.Future" = fut) -> None:
                    def settle() -> None:
                        if not fut.done():
                            fut.set_result((result, error))
                    try:
                        loop.call_soon_threadsafe(settle)
                    except RuntimeError:  # loop closed meanwhile
                        pass
                (self._shared or self._start_shared()).put(
                    (event, _private_copy(context), loop, done, (hook,)))
                waits.append(_bounded(fut, hook, limit))
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        results, errors = [], []
        for hook, outcome in zip(hooks, outcomes):
            if isinstance(outcome, BaseException):
                errors.append({"hook": hook.name, "error": "%s: %s" % (
                    type(outcome).__name__, outcome)})
                continue
            result, error = outcome
            if error is not None:
                errors.append({"hook": hook.name, "error": error})
            elif result is not None:
                results.append({"hook": hook.name, "result": result})
        return results, errors


async def _bounded(fut: "asyncio.Future", hook: _Hook, limit: float
                   ) -> Tuple[Any, Optional[str]]:
    try:
        return await asyncio.wait_for(asyncio.shield(fut), limit)
    except asyncio.TimeoutError:
        log.warning("[hooks] Handler %s gave no result within %.1f s; emit_collect goes on "
                    "without it", hook.name, limit)
        return None, "no result within %.1f s" % limit


def merge(order: List[str], *parts: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Items of several sources, each tagged with ``hook``, in the one match order."""
    rank = {name: i for i, name in enumerate(order)}
    items = [item for part in parts for item in part]
    return sorted(items, key=lambda item: rank.get(item.get("hook"), len(rank)))
