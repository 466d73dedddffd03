"""A Hermes plugin: the agent's hook events (``pre_tool_call``, ``pre_llm_call``...) for the
hooks the hermes-hooks service hosts (issue 49).

Hermes (hermes-agent 0.19.0) offers its agent's hook points to Python plugins through
``ctx.register_hook(name, callback)``; it calls every callback of an event in turn, keeps the
answers that are not ``None``, and each call site reads those answers its own way. This plugin
registers one callback for each of those events that some hook of the service subscribes to
(its ``events:`` patterns match the Hermes name), and no other:

* **Observers** (``post_tool_call``, ``on_session_end``...) go to ``POST /v1/events`` through
  the client's buffer (``HookRegistry.emit_nowait``): the callback builds the context and
  returns, whatever the hooks do and however long they take.
* **Deciding events** (see ``DECIDING``) go to ``POST /v1/collect``, once the observer events
  buffered before them have been sent (``AgentBridge.flush_observers``, so that a hook on both
  gets them in Hermes's order), and wait for the matching hooks' answers, as long as their
  own ``timeout:`` allows; the answers are read the way 0.19.0 reads a callback's
  (``decide``), and the callback hands Hermes one answer, so Hermes combines it with other
  plugins' as it would any plugin's.

The context a hook gets is what 0.19.0 writes to a shell hook's stdin (``context``):
``hook_event_name``, ``tool_name``, ``tool_input``, ``session_id``, ``cwd`` and ``extra`` (every
other argument by name). It is encoded with the client's rules: values that are not JSON data
(the gateway's ``MessageEvent``, the runner) become their ``str()``; nothing is pickled.

Enabling: the wheel declares this module in the ``hermes_agent.plugins`` entry-point group as
``hermes-hooks``; Hermes loads it once ``hermes-hooks`` is in ``plugins.enabled`` of
``config.yaml`` (``hermes-hooks plugin install`` adds it). Settings, in ``config.yaml``::

    hermes_hooks:
      fail_closed: [pre_tool_call]   # events whose decision fails closed (see below)

or ``$HERMES_HOOKS_FAIL_CLOSED`` (comma-separated). A deciding event fails **open** by default:
when the service cannot be reached, or a matching hook errs, times out or is not running, the
others' answers count and Hermes goes on. Listed in ``fail_closed``, ``pre_tool_call`` then
blocks the call and ``pre_gateway_dispatch`` skips the message, with a message saying why,
whenever a matching hook gave no decision, whatever the other hooks answered (an approve, a
rewrite or an allow from one hook does not outvote another that could not answer).

Standard library only. Never raises into Hermes.
"""

import collections
import hashlib
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from . import _ingateway, _transport
from .profiles import active_home
from .registry import HookRegistry, _sanitize

log = logging.getLogger("hermes_hooks.agent")

#: hermes-agent 0.19.0's ``VALID_HOOKS``, in its order (facts about its interface).
AGENT_EVENTS = (
    "pre_tool_call", "post_tool_call", "transform_terminal_output", "transform_tool_result",
    "transform_llm_output", "pre_llm_call", "post_llm_call", "pre_verify", "pre_api_request",
    "post_api_request", "api_request_error", "on_session_start", "on_session_end",
    "on_session_finalize", "on_session_reset", "subagent_start", "subagent_stop",
    "pre_gateway_dispatch", "pre_approval_request", "post_approval_response",
    "kanban_task_claimed", "kanban_task_completed", "kanban_task_blocked",
)

#: The events whose answers 0.19.0 reads back; every other one is observed only.
DECIDING = frozenset((
    "pre_tool_call", "pre_llm_call", "pre_verify", "pre_gateway_dispatch",
    "transform_tool_result", "transform_terminal_output", "transform_llm_output",
))

#: Events whose decision can fail closed, and the answer that closes them.
CLOSABLE = frozenset(("pre_tool_call", "pre_gateway_dispatch"))

#: The arguments 0.19.0 lifts out of ``extra`` into the context's own keys.
_TOP_LEVEL = frozenset(("tool_name", "args", "session_id", "parent_session_id"))

#: Seconds the plugin waits for the service's answer beyond its longest budget (301 s).
_ANSWER_BOUND = 305.0

#: Seconds a decision waits at most for the observer events buffered before it to reach the
#: service (:meth:`AgentBridge.flush_observers`): a short bound, so a slow service costs a
#: decision this much at worst; a service found down costs nothing (the sender is backing off).
FLUSH_BOUND = 0.5

#: Idle decision connections kept at most (0.19.0 runs up to 8 tools of a batch at once), and
#: how long one is kept unused: well under the service's 60 s cut of an idle connection.
POOL_IDLE_MAX = 8
POOL_IDLE_SECONDS = 15.0


def context(event: str, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The context of one call: the object 0.19.0 gives a shell hook on stdin."""
    args = kwargs.get("args")
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    return {
        "hook_event_name": event,
        "tool_name": kwargs.get("tool_name"),
        "tool_input": args if isinstance(args, dict) else None,
        "session_id": kwargs.get("session_id") or kwargs.get("parent_session_id") or "",
        "cwd": cwd,
        "extra": {k: v for k, v in kwargs.items() if k not in _TOP_LEVEL},
    }


def _text(*candidates: Any) -> Optional[str]:
    for c in candidates:
        if isinstance(c, str) and c.strip():
            return c
    return None


def _block(result: Any, hook: str) -> Optional[Dict[str, Any]]:
    """A ``pre_tool_call`` answer as Hermes reads it, from either block shape (or an approve)."""
    if not isinstance(result, dict):
        return None
    if result.get("action") == "approve":
        out = {"action": "approve", "message": _text(result.get("message")) or ""}
        if _text(result.get("rule_key")):
            out["rule_key"] = result["rule_key"].strip()
        return out
    if result.get("action") == "block":
        message = _text(result.get("message"), result.get("reason"))
    elif result.get("decision") == "block":
        message = _text(result.get("reason"), result.get("message"))
    else:
        return None
    return {"action": "block", "message": message or "Blocked by hook %s." % hook}


def _continue(result: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(result, dict):
        return None
    action = str(result.get("action") or result.get("decision") or "").strip().lower()
    if action not in ("continue", "block"):
        return None
    message = _text(result.get("message"), result.get("reason"))
    return {"action": "continue", "message": message.strip()} if message else None


def _context_piece(result: Any) -> Optional[str]:
    if isinstance(result, dict):
        return _text(result.get("context"))
    return _text(result)


def decide(event: str, answers: List[Tuple[str, Any]]) -> Any:
    """The one answer this plugin gives Hermes for ``event``, from the hooks' ``(hook, result)``
    in match order, by 0.19.0's rules for that event: the first block (or approve) of
    ``pre_tool_call``, every ``pre_llm_call`` context joined by a blank line, the first continue
    of ``pre_verify``, the first skip / rewrite / allow of ``pre_gateway_dispatch``, the first
    string of ``transform_tool_result`` and ``transform_terminal_output``, the first non-empty
    string of ``transform_llm_output``. ``None``: no opinion."""
    if event == "pre_llm_call":
        pieces = [p for p in (_context_piece(r) for _, r in answers) if p]
        return {"context": "\n\n".join(pieces)} if pieces else None
    for hook, result in answers:
        if event == "pre_tool_call":
            out = _block(result, hook)
        elif event == "pre_verify":
            out = _continue(result)
        elif event == "pre_gateway_dispatch":
            out = (dict(result) if isinstance(result, dict)
                   and result.get("action") in ("skip", "rewrite", "allow") else None)
        elif event == "transform_llm_output":
            out = _text(result)
        elif event in ("transform_tool_result", "transform_terminal_output"):
            out = result if isinstance(result, str) else None
        else:
            out = None
        if out is not None:
            return out
    return None


def is_closing(event: str, answer: Any) -> bool:
    """Whether ``answer`` (of :func:`decide`) already closes ``event``: a ``pre_tool_call``
    block, a ``pre_gateway_dispatch`` skip."""
    if not isinstance(answer, dict):
        return False
    if event == "pre_tool_call":
        return answer.get("action") == "block"
    if event == "pre_gateway_dispatch":
        return answer.get("action") == "skip"
    return False


def closed_answer(event: str, why: str) -> Any:
    """What a fail-closed ``event`` answers when a decision is missing."""
    text = "hermes-hooks: no decision (%s); failing closed" % why
    if event == "pre_tool_call":
        return {"action": "block", "message": text}
    if event == "pre_gateway_dispatch":
        return {"action": "skip", "reason": text}
    return None


def subscribed(hooks: Iterable[Dict[str, Any]], names: Iterable[str] = AGENT_EVENTS) -> List[str]:
    """The event names some hook's ``events:`` patterns match, in ``names``' order."""
    sets = [_ingateway._Patterns(list(h.get("events") or [])) for h in hooks
            if isinstance(h, dict) and h.get("enabled", True) is not False]
    return [n for n in names if any(s.match(n) for s in sets)]


def _config_fail_closed() -> List[str]:
    """``hermes_hooks.fail_closed`` of Hermes's config, plus ``$HERMES_HOOKS_FAIL_CLOSED``."""
    names = [n.strip() for n in os.environ.get("HERMES_HOOKS_FAIL_CLOSED", "").split(",")]
    try:
        from hermes_cli.config import load_config  # type: ignore
        section = (load_config() or {}).get("hermes_hooks") or {}
        listed = section.get("fail_closed") if isinstance(section, dict) else None
        if isinstance(listed, list):
            names.extend(str(n).strip() for n in listed)
    except Exception:
        pass
    return [n for n in names if n]


def _hook_cause(err: Dict[str, Any]) -> str:
    """Why a hook gave no decision, from its entry in a collect's ``errors``."""
    why = str(err.get("error") or "").strip()
    if err.get("timed_out"):
        head = "timed out"
    elif err.get("state"):
        head = "not running (%s)" % err.get("state")
    else:
        head = "failed"
    return "%s: %s" % (head, why) if why else head


def _cause_kind(cause: str) -> str:
    """The part of a cause that names its kind (what a repeat is compared by): up to the first
    ": ", so that "failed: KeyError: 'x'" and "failed: KeyError: 'y'" are one cause, while a
    hook that times out after it failed is said again."""
    return cause.split(": ", 1)[0].strip()


def to_terminal(line: str) -> None:
    """Shows ``line`` to the person at Hermes's terminal. Inside ``hermes chat``'s interactive
    screen (prompt_toolkit running) it goes through the CLI's own printer, ``cli._cprint``, which
    prints above the input area from any thread (a bare write would be swallowed there); else
    to ``sys.stderr``, where Hermes writes its own warnings (``hermes -z`` silences it, as it
    silences Hermes's). Never raises."""
    try:
        cli = sys.modules.get("cli")
        printer = getattr(cli, "_cprint", None)
        app_module = sys.modules.get("prompt_toolkit.application")
        app = app_module.get_app_or_none() if app_module is not None else None
        if callable(printer) and app is not None and getattr(app, "_is_running", False):
            printer(line)
            return
    except Exception:
        pass
    try:
        stream = sys.stderr
        if stream is not None:
            stream.write(line + "\n")
            stream.flush()
    except Exception:
        pass


class FailOpenNotices:
    """One line in the terminal when a decision fails open, once per session for each (hook,
    kind of cause), however many calls fail the same way (issue 58 row 7: before, only WARNING
    lines in ``logs/agent.log`` said so, one per call). Thread-safe; remembers at most ``limit``
    (session, hook, cause) keys, forgetting the oldest."""

    def __init__(self, limit: int = 4096, write: Optional[Callable[[str], None]] = None) -> None:
        self._lock = threading.Lock()
        self._seen = collections.OrderedDict()  # type: collections.OrderedDict
        self._limit = limit
        self._write = write or to_terminal

    def failed_open(self, session: str, event: str, hook: str, cause: str) -> bool:
        """Says that ``hook`` gave ``event`` no decision because of ``cause`` and Hermes went
        on without it, unless this session was told already. Returns whether it said it."""
        key = (session, hook, _cause_kind(cause))
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = True
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)
        cause = " ".join(cause.split())
        if len(cause) > 300:
            cause = cause[:297] + "..."
        who = ("hooks %s" if ", " in hook else "hook %s") % hook if hook else "its hooks"
        self._write("hermes-hooks: %s: %s gave no decision (%s); Hermes went on without it "
                    "(fail open). Said once per session; every call is in logs/agent.log."
                    % (event, who, cause))
        return True


class AgentBridge:
    """The callbacks of one Hermes process, over one ``HookRegistry``."""

    def __init__(self, registry: HookRegistry, fail_closed: Iterable[str] = ()) -> None:
        self.registry = registry
        #: Keep-alive connections for collects, shared by Hermes's threads (it runs tools, and
        #: so their decisions, on several at once, and starts new threads per tool batch, for
        #: its async bridge and for subagents): a few kept idle for a short while, none per
        #: thread (issue 58 row 4).
        self.pool = _transport.KeepAlivePool(registry._address, _ANSWER_BOUND,
                                             max_idle=POOL_IDLE_MAX,
                                             idle_seconds=POOL_IDLE_SECONDS)
        self._collect_headers = dict(registry._headers, **{
            "Content-Type": "application/json", "Accept": "application/json"})
        self.fail_closed = frozenset(n for n in fail_closed if n in CLOSABLE)
        #: What has been said in the terminal about decisions that failed open.
        self.notices = FailOpenNotices()
        #: The events a callback is registered for (:meth:`attach`).
        self.attached = frozenset()  # type: frozenset
        #: What the config.yaml entries were handed over from (:meth:`recheck`), and its lock.
        self._stamp = None  # type: Optional[Tuple[Any, ...]]
        self._stamp_lock = threading.Lock()
        self._config_files = _config_files(getattr(registry, "_home", None))
        for n in fail_closed:
            if n not in CLOSABLE:
                log.warning("hermes-hooks: fail_closed lists %r; only %s can fail closed",
                            n, ", ".join(sorted(CLOSABLE)))

    def events(self) -> List[str]:
        """The agent events some hook of the service subscribes to."""
        return subscribed(self.registry.loaded_hooks)

    def hand_over(self) -> List[str]:
        """Keeps Hermes's runner off the config.yaml entries the service hosts and lists as off
        (:func:`hand_over_shell_hooks`), for the events this plugin forwards; remembers what it
        looked at (:meth:`recheck`). Returns the commands handed over."""
        with self._stamp_lock:
            return self._hand_over()

    def _hand_over(self) -> List[str]:
        self._stamp = _config_stamp(self._config_files)
        off = [s for s in self.registry.skipped if s.get("code") in ("disabled", "revoked")]
        return hand_over_shell_hooks(self.registry.loaded_hooks, off, self.attached)

    def recheck(self) -> None:
        """Before each event: when config.yaml, the allowlist or the entries Hermes's runner has
        registered changed since the last hand-over (two ``stat`` calls and a set's size when
        nothing did), has the service load again and hands over what it hosts now, so an entry
        added and approved during a session (``--accept-hooks``, the TTY prompt) runs once, in
        the service, not also in Hermes's runner (issue 58 row 5). Never raises."""
        if self._stamp is None or self._stamp == _config_stamp(self._config_files):
            return
        with self._stamp_lock:
            if self._stamp == _config_stamp(self._config_files):
                return  # another thread did it while this one waited
            try:
                sync_config_hooks(self.registry)
                taken = self._hand_over()
                if taken:
                    log.info("hermes-hooks: hosting the shell hooks %s", ", ".join(taken))
            except Exception as exc:
                log.warning("hermes-hooks: config.yaml's hooks not taken over again: %r", exc)

    def callback(self, event: str) -> Callable[..., Any]:
        """The callback Hermes calls for ``event``."""
        if event in DECIDING:
            def deciding(**kwargs: Any) -> Any:
                try:
                    self.recheck()
                    return self.decide(event, kwargs)
                except Exception as exc:  # never into Hermes
                    log.warning("hermes-hooks: %s failed: %r", event, exc)
                    if event in self.fail_closed:
                        return closed_answer(event, repr(exc))
                    self.notices.failed_open(str(kwargs.get("session_id") or ""), event,
                                             "", "the plugin failed: %r" % (exc,))
                    return None
            fn = deciding
        else:
            def observing(**kwargs: Any) -> None:
                self.recheck()
                self.registry.emit_nowait(event, context(event, kwargs))
                return None
            fn = observing
        fn.__name__ = fn.__qualname__ = "hermes_hooks[%s]" % event
        return fn

    def decide(self, event: str, kwargs: Dict[str, Any]) -> Any:
        """Ask the service (``POST /v1/collect``) and read the answers by 0.19.0's rules."""
        ctx = context(event, kwargs)
        data, failure = self.collect(event, ctx)
        answers = [(str(r.get("hook")), r.get("result")) for r in data.get("results") or []
                   if isinstance(r, dict) and r.get("result") is not None]
        missing = [e for e in data.get("errors") or [] if isinstance(e, dict)]
        for err in missing:
            log.warning("hermes-hooks: hook %s gave no decision on %s: %s",
                        err.get("hook"), event, err.get("error") or err.get("state"))
        answer = decide(event, answers)
        if event in self.fail_closed and (failure is not None or missing):
            # A matching hook that erred, timed out or is not running (or a service that did
            # not answer) closes the event whatever the others said: another hook's approve
            # (or rewrite, or allow) must not open a gate a failing hook may have shut (issue
            # 58 row 3). Another hook's own block (skip) is kept: it closes too, and says why.
            if is_closing(event, answer):
                return answer
            if failure is not None:
                return closed_answer(event, failure)
            return closed_answer(event, "hook %s: %s" % (
                missing[0].get("hook"), missing[0].get("error") or missing[0].get("state")))
        if event not in self.fail_closed:
            session = str(ctx.get("session_id") or "")
            if failure is not None:
                self.notices.failed_open(session, event, self._gates(event), failure)
            for err in missing:
                if err.get("state") != "disabled":  # turned off by the operator, on purpose
                    self.notices.failed_open(session, event, str(err.get("hook")),
                                             _hook_cause(err))
        return answer

    def _gates(self, event: str) -> str:
        """The hooks of the service's list whose ``events:`` match ``event``, by name."""
        try:
            names = [str(h.get("name")) for h in self.registry.loaded_hooks
                     if isinstance(h, dict) and h.get("enabled", True) is not False
                     and subscribed([h], (event,))]
        except Exception:
            names = []
        return ", ".join(names)

    def flush_observers(self) -> bool:
        """Waits until the observer events buffered so far (``emit_nowait``, sent by the
        client's background thread as ``/v1/events/batch``) have reached the service, for at
        most :data:`FLUSH_BOUND` seconds, so that a decision sent next is queued after them:
        one hook on both (a config.yaml command on ``post_llm_call`` and ``pre_tool_call``)
        then gets them in the order Hermes emitted them (issue 58 row 1). Nothing buffered: one
        length read, no lock. The service last found down (the sender backing off): no wait;
        the decision then fails open or closed as it would. Returns whether nothing is left."""
        reg = self.registry
        if not reg.pending:
            return True
        if reg.connected is False:
            return False
        return reg.flush(FLUSH_BOUND)

    def collect(self, event: str, ctx: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[str]]:
        """``POST /v1/collect``, blocking, on a pooled connection (Hermes calls from its own
        threads; no event loop is assumed), after the observer events emitted before it
        (:meth:`flush_observers`). Returns the service's answer and why it failed, if it
        did."""
        self.flush_observers()
        try:
            body = json.dumps({"event": event, "context": ctx}, ensure_ascii=False,
                              default=str, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError):
            # Keys that are not text, NaN, cycles: the client's own rules make it JSON.
            body = json.dumps({"event": event, "context": _sanitize(ctx)},
                              ensure_ascii=False).encode("utf-8")
        reg = self.registry
        deadline = time.monotonic() + _ANSWER_BOUND
        pause = 0.02
        try:
            while True:
                status, raw = self._post(body)
                if status == 503 and b'"not_ready"' in raw and time.monotonic() < deadline:
                    time.sleep(pause)  # its hooks are still loading: not "no hooks"
                    pause = min(pause * 2, 0.2)
                    continue
                break
        except Exception as exc:
            why = "%s unreachable: %s" % (reg._address, exc)
            log.warning("hermes-hooks: %s: %s", event, why)
            return {}, why
        if status != 200:
            why = "the service answered %d: %s" % (status, raw[:200].decode("utf-8", "replace"))
            log.warning("hermes-hooks: %s: %s", event, why)
            return {}, why
        try:
            data = json.loads(raw.decode("utf-8"))
        except ValueError as exc:
            return {}, "unreadable answer: %s" % exc
        return (data if isinstance(data, dict) else {}), None

    def _post(self, body: bytes) -> Tuple[int, bytes]:
        """``POST /v1/collect`` on a pooled keep-alive connection. The collect is sent a second
        time only when it certainly never reached the service (a kept-alive connection found
        closed before a byte was written, or a first write that took none: see
        ``_transport.KeepAlivePool``); a failure after that may follow a decision the service
        already ran, and is the caller's failure (fail open, or closed), never a resend (issue
        58 row 6)."""
        return self.pool.request("POST", "/v1/collect", body, self._collect_headers)

    def close(self) -> None:
        """Closes the decision connections (a call after it opens a new one)."""
        self.pool.close()

    def attach(self, register_hook: Callable[[str, Callable[..., Any]], None]) -> List[str]:
        """Registers a callback for each subscribed event; returns their names."""
        names = self.events()
        for name in names:
            register_hook(name, self.callback(name))
        self.attached = self.attached | frozenset(names)
        return names


def shell_hook_name(command: str) -> str:
    """The name the service gives the hook it makes of the config.yaml shell-hook entries that
    run ``command`` (``src/config_hooks.rs``): one hook per command, on every event it has
    consent for (issue 58 row 1), named by a digest of the command."""
    return "shell-%s" % hashlib.sha256(command.encode("utf-8")).hexdigest()[:10]


def _entry_hook_name(event: str, matcher: Optional[str], command: str) -> str:
    """The name a service before issue 58 gave the hook of one entry: the event and a digest of
    the triple Hermes registers it under. Still read, so that this plugin with an older service
    hands over what that service hosts."""
    digest = hashlib.sha256(b"\0".join(
        (event.encode("utf-8"), (matcher or "").encode("utf-8"), command.encode("utf-8"))))
    return "shell-%s-%s" % (event, digest.hexdigest()[:10])


def _events_of(listed: Iterable[Any]) -> Dict[str, Optional[set]]:
    """Hook name -> the events it lists, from ``/v1/hooks``' hooks or skipped entries (a bare
    name, or an entry listing none, as an older service's skipped ones: ``None``, every event)."""
    out = {}  # type: Dict[str, Optional[set]]
    for item in listed:
        if isinstance(item, str):
            out[item] = None
        elif isinstance(item, dict) and item.get("name"):
            events = item.get("events")
            out[str(item["name"])] = set(map(str, events)) if events else None
    return out


def _covers(events_of: Dict[str, Optional[set]], name: str, event: str) -> bool:
    """Whether the hook ``name`` of ``events_of`` is there and takes ``event``."""
    if name not in events_of:
        return False
    events = events_of[name]
    return events is None or event in events


def _config_files(home: Optional[str]) -> Tuple[str, ...]:
    """The files of ``home`` the hand-over of config.yaml's entries reads."""
    if not home:
        return ()
    return tuple(os.path.join(home, n) for n in ("config.yaml", "shell-hooks-allowlist.json"))


def _config_stamp(files: Tuple[str, ...]) -> Tuple[Any, ...]:
    """What the hand-over of config.yaml's entries depends on, cheaply: the identity of
    ``files`` (``stat``), and how many entries Hermes's runner has registered."""
    out = []  # type: List[Any]
    for path in files:
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    shell_hooks = sys.modules.get("agent.shell_hooks")
    out.append(len(getattr(shell_hooks, "_registered", ()) or ()))
    return tuple(out)


def _runner_spec(callback: Any) -> Optional[Tuple[Any, Any, Any]]:
    """The (event, matcher, command) of a callback of Hermes's shell-hook runner (a closure over
    its entry), or ``None`` for any other callback."""
    for cell in getattr(callback, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if all(hasattr(value, k) for k in ("event", "matcher", "command")):
            return (value.event, value.matcher, value.command)
    return None


def _unregister_runner(keys: Iterable[Tuple[Any, Any, Any]]) -> None:
    """Turns off the callbacks Hermes's runner registered for ``keys`` in its plugin manager (an
    entry approved during a session was registered before the service hosted it). Each is
    replaced in its place by one that does nothing, never removed: a call of the event going
    through the list now (the one whose callback of this plugin got here first) skips it and
    misses no other callback."""
    keys = set(keys)
    if not keys:
        return
    try:
        from hermes_cli.plugins import get_plugin_manager  # type: ignore
        hooks = get_plugin_manager()._hooks
    except Exception:
        return
    for event in {k[0] for k in keys}:
        callbacks = hooks.get(event) or []
        for i, cb in enumerate(callbacks):
            key = _runner_spec(cb)
            if key in keys:
                callbacks[i] = _handed_over(key)


def _handed_over(key: Tuple[Any, Any, Any]) -> Callable[..., None]:
    """What stands in for Hermes's runner of an entry the service runs now."""
    def handed_over(**_kwargs: Any) -> None:
        return None
    handed_over.__name__ = handed_over.__qualname__ = "hermes_hooks[hosted %s: %s]" % (
        key[0], key[2])
    return handed_over


def hand_over_shell_hooks(hooks: Iterable[Dict[str, Any]], disabled: Iterable[Any] = (),
                          events: Optional[Iterable[str]] = None) -> List[str]:
    """Keeps Hermes's own shell-hook runner off the config.yaml entries the service hosts, so
    each command runs once per event: 0.19.0 registers an entry only when its (event, matcher,
    command) is not in ``agent.shell_hooks._registered`` yet (that is how a second registration
    by the gateway is avoided), and plugins are loaded before shell hooks, in ``hermes chat``
    and in ``hermes gateway run``; an entry Hermes registered already (approved during a
    session) has its runner's callback taken out (issue 58 row 5). An entry the service does
    not list (no consent yet, the service unreachable), or whose event this plugin does not
    forward (``events``, when given), stays Hermes's; one the service lists as disabled or
    revoked (an operator turned it off here: `disable`, the dashboard, under either trust
    mode) is handed over too, so that it does not run at all. The service hosts all the entries
    of one command as one hook (issue 58 row 1), on the events whose (event, command) has
    consent: an entry is the service's when that hook lists its event (``disabled``: skipped
    entries of ``/v1/hooks``, or bare names, which cover every event); its other events stay
    Hermes's. Returns the commands handed over."""
    try:
        from agent import shell_hooks  # type: ignore
        from hermes_cli.config import load_config  # type: ignore
    except Exception:
        return []  # not inside Hermes
    hosted = _events_of(h for h in hooks if isinstance(h, dict))
    off = _events_of(disabled)
    forwarded = None if events is None else set(events)
    taken, ran = [], []
    try:
        specs = shell_hooks.iter_configured_hooks(load_config())
        with shell_hooks._registered_lock:
            for spec in specs:
                key = (spec.event, spec.matcher, spec.command)
                names = (shell_hook_name(spec.command), _entry_hook_name(*key))
                runs_here = (any(_covers(hosted, n, spec.event) for n in names)
                             and (forwarded is None or spec.event in forwarded))
                if runs_here or any(_covers(off, n, spec.event) for n in names):
                    if key in shell_hooks._registered:
                        ran.append(key)
                    shell_hooks._registered.add(key)
                    taken.append(spec.command)
        _unregister_runner(ran)
    except Exception as exc:
        log.warning("hermes-hooks: could not take the shell hooks over from Hermes: %r", exc)
    return taken


def sync_config_hooks(registry: HookRegistry) -> None:
    """When Hermes's config has a ``hooks:`` block, has the service load again
    (``POST /v1/reload``: it reads config.yaml and the allowlist before every load; unchanged
    hooks are kept as they run) and takes its new list, so that an entry added or approved since
    the service started is hosted from this start of Hermes on. Never raises."""
    try:
        from hermes_cli.config import load_config  # type: ignore
        if not (load_config() or {}).get("hooks"):
            return
    except Exception:
        return  # not inside Hermes
    try:
        status, raw = _transport.request(registry._address, "POST", "/v1/reload", b"{}",
                                         registry._headers, timeout=60.0)
        if status != 200:
            log.warning("hermes-hooks: the service did not reload (%d): %s", status,
                        raw[:200].decode("utf-8", "replace"))
            return
        registry._refresh_hooks()
    except Exception as exc:
        log.warning("hermes-hooks: the service did not reload: %r", exc)


def _autostart_default() -> bool:
    setting = os.environ.get("HERMES_HOOKS_AUTOSTART", "").strip().lower()
    return setting not in ("0", "false", "no", "off")


#: The bridge of this process (Hermes may call ``register`` again on a forced rediscovery).
_bridge = None  # type: Optional[AgentBridge]


def register(ctx: Any) -> None:
    """Hermes's plugin entry point: ``register(ctx)``."""
    global _bridge
    try:
        if _bridge is None:
            # The profile's home (``hermes -p NAME``): its own service, hooks and config.yaml.
            home = os.path.realpath(os.path.expanduser(active_home()))
            address = (os.environ.get(_transport.ADDRESS_ENV)
                       or os.path.join(home, _transport.DEFAULT_SOCKET_NAME))
            registry = HookRegistry(address=address, hermes_home=home,
                                    autostart=_autostart_default())
            registry.discover_and_load()
            _bridge = AgentBridge(registry, _config_fail_closed())
            if not registry._hooks_from_disk:  # the service's own list: what it hosts
                sync_config_hooks(registry)
                # The events are attached first: an entry is handed over only for an event this
                # plugin forwards. Off by the operator's choice (`enabled: false`, or an approval
                # revoked under --trust explicit: `disable`, the dashboard): Hermes must not run
                # it either.
                names = _bridge.attach(ctx.register_hook)
                taken = _bridge.hand_over()
                if taken:
                    log.info("hermes-hooks: hosting the shell hooks %s", ", ".join(taken))
                log.info("hermes-hooks: forwarding %d agent event(s) to %s: %s", len(names),
                         _bridge.registry.address, ", ".join(names) or "none")
                return
        names = _bridge.attach(ctx.register_hook)
        log.info("hermes-hooks: forwarding %d agent event(s) to %s: %s", len(names),
                 _bridge.registry.address, ", ".join(names) or "none")
    except Exception:
        log.exception("hermes-hooks: the Hermes plugin did not register")
