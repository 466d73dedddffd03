"""The rest of the original ``gateway.hooks`` contract (issue 19), kept apart from the transport.

* **Where hooks live.** ``hooks_dir(home)``: the gateway's own ``gateway.hooks.HOOKS_DIR`` when
  that module is imported (so a test or a launcher that patches it is honoured), else
  ``$HERMES_HOME/hooks``.
* **``loaded_hooks`` with the service unreachable.** ``read_disk_hooks(dir)`` lists what is on
  disk by the original's rules (a directory with a HOOK.yaml mapping, a non-empty ``events``
  list, a handler; for ``handler.py``, a top-level ``handle``), so a gateway started before the
  service still sees its hooks (it reads ``loaded_hooks`` to decide whether to wire
  ``agent:step``). Entries carry ``"source": "disk"`` until the service answers and replaces them.
* **The in-process registry.** ``InProcess`` runs the callables a gateway (or its built-in hooks,
  through ``_register_builtin_hooks``) put in ``HookRegistry._handlers`` (event pattern -> list
  of callables), as hooks with ``runs: gateway`` run: off the message path on ``emit``, awaited
  by ``emit_collect``, in the one match order (exact patterns first, then wildcards; within each
  group the in-process handlers first, as the original registered built-ins first).
"""

import ast
import asyncio
import logging
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _ingateway

log = logging.getLogger("hermes_hooks")

#: Module whose ``HOOKS_DIR`` the gateway's hooks live in.
GATEWAY_MODULE = "gateway.hooks"
#: Timeout of an in-process handler (the service's default hook timeout).
DEFAULT_TIMEOUT = 30.0
#: Handler files the service looks for, in its order (DESIGN 4), besides ``handler.py``.
_OTHER_HANDLERS = ("handler", "handler.sh", "handler.so", "handler.dylib", "handler.dll")


def hooks_dir(home: str) -> str:
    """``gateway.hooks.HOOKS_DIR`` when the gateway's module is loaded, else ``<home>/hooks``."""
    module = sys.modules.get(GATEWAY_MODULE)
    patched = getattr(module, "HOOKS_DIR", None) if module is not None else None
    if patched is not None:
        try:
            return os.fspath(patched)
        except TypeError:
            pass
    return os.path.join(home, "hooks")


def _load_yaml(text: str) -> Any:
    """PyYAML when importable (the gateway has it), else a reader for the keys used here."""
    try:
        import yaml  # type: ignore
    except ImportError:
        return _mini_yaml(text)
    return yaml.safe_load(text)


def _scalar(value: str) -> Any:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    low = value.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("", "~", "null"):
        return None
    return value


def _mini_yaml(text: str) -> Any:
    """Top-level ``key: value`` pairs, flow lists ``[a, b]`` and block lists ``- a``."""
    out = {}  # type: Dict[str, Any]
    key = None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t-":
            item = line.strip()
            if key is not None and item.startswith("- ") and isinstance(out.get(key), list):
                out[key].append(_scalar(item[2:]))
            continue
        if ":" not in line:
            return None
        key, value = line.split(":", 1)
        key = key.strip()
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            out[key] = [_scalar(v) for v in value[1:-1].split(",") if v.strip()]
        elif value == "":
            out[key] = []
        else:
            out[key] = _scalar(value)
    return out


def _defines_handle(path: str) -> bool:
    """Whether ``handler.py`` binds ``handle`` at top level (def, assignment or import)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "handle":
            return True
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "handle" for t in node.targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name) == "handle" for a in node.names):
            return True
    return False


def read_disk_hooks(directory: str) -> List[Dict[str, Any]]:
    """The hooks in ``directory`` as the original host would load them (see the module
    docstring); never raises."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    hooks = []
    for name in names:
        hook_dir = os.path.join(directory, name)
        manifest_path = os.path.join(hook_dir, "HOOK.yaml")
        if name.startswith(".") or not os.path.isdir(hook_dir) or not os.path.isfile(
                manifest_path):
            continue
        try:
            with open(manifest_path, encoding="utf-8") as f:
                manifest = _load_yaml(f.read())
        except Exception as exc:
            log.debug("[hooks] %s: HOOK.yaml not readable: %s", name, exc)
            continue
        if not isinstance(manifest, dict) or manifest.get("enabled", True) is False:
            continue
        events = manifest.get("events")
        if not isinstance(events, list) or not events:
            continue
        handler = manifest.get("handler")
        if isinstance(handler, str):
            found = os.path.isfile(os.path.join(hook_dir, handler))
            py = handler.endswith(".py")
        else:
            py = os.path.isfile(os.path.join(hook_dir, "handler.py"))
            handler = "handler.py"
            found = py or manifest.get("url") or any(
                os.path.isfile(os.path.join(hook_dir, h)) for h in _OTHER_HANDLERS)
        if not found or (py and not _defines_handle(os.path.join(hook_dir, handler))):
            continue
        hooks.append({"name": str(manifest.get("name") or name),
                      "description": manifest.get("description") or "",
                      "events": [e for e in events if isinstance(e, str)],
                      "path": hook_dir, "source": "disk", "status": "unconfirmed"})
    return hooks


# ---------------------------------------------------------------------- in-process registry

class InProcess:
    """Runs ``HookRegistry._handlers`` (see the module docstring). Each callable gets its own
    worker (a thread for sync callables, tasks on the gateway's loop for async ones) and the
    default timeout, as an in-gateway hook does."""

    def __init__(self, handlers: Dict[str, List[Callable]]) -> None:
        self.handlers = handlers
        # id(callable) -> (callable, its worker); the callable is kept so its id stays unique.
        self._workers = {}  # type: Dict[int, Tuple[Callable, Any]]
        self._tasks = set()  # type: set

    def _worker(self, label: str, fn: Callable) -> Any:
        hit = self._workers.get(id(fn))
        if hit is not None and hit[0] is fn:
            return hit[1]
        worker = _ingateway._Hook({"name": label, "timeout_s": DEFAULT_TIMEOUT}, fn, None)
        self._workers[id(fn)] = (fn, worker)
        return worker

    def matching(self, event: str) -> List[Tuple[str, str, Any]]:
        """``(label, "exact" | "wildcard", worker)`` of every matching callable, match order."""
        if not self.handlers or not isinstance(event, str):
            return []
        exact, wild = [], []
        for pattern, fns in list(self.handlers.items()):
            kind = _ingateway._Patterns([pattern]).match(event)
            if kind is None:
                continue
            for index, fn in enumerate(list(fns or [])):
                if callable(fn):
                    label = "_handlers[%r][%d]" % (pattern, index)
                    (exact if kind == "exact" else wild).append(
                        (label, kind, self._worker(label, fn)))
        return exact + wild

    def dispatch(self, event: str, context: Optional[Dict[str, Any]]) -> None:
        """Start every matching callable and return at once (never raises)."""
        matched = self.matching(event)
        if not matched:
            return
        if context is None:
            context = {}
        try:
            loop = asyncio.get_running_loop()  # type: Optional[asyncio.AbstractEventLoop]
        except RuntimeError:
            loop = None
        for label, _, worker in matched:
            try:
                if worker.is_async and loop is not None:
                    task = loop.create_task(worker.call_async(event, context))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    worker.submit(event, context, loop)
            except Exception as exc:  # never into the gateway
                log.error("[hooks] %s not run for '%s': %r", label, event, exc)

    async def collect(self, event: str, context: Dict[str, Any], limit: Optional[float]
                      ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
        """Run the matching callables now; (results, errors) tagged with their labels."""
        matched = self.matching(event)
        if not matched:
            return [], []
        loop = asyncio.get_running_loop()
        waits = []
        for _, _, worker in matched:
            wait = worker.timeout if limit is None else min(worker.timeout, limit)
            if worker.is_async:
                waits.append(worker.call_async(event, context, wait))
                continue
            fut = loop.create_future()

            def done(result: Any, error: Optional[str], fut: "asyncio.Future" = fut) -> None:
                def settle() -> None:
                    if not fut.done():
                        fut.set_result((result, error))
                try:
                    loop.call_soon_threadsafe(settle)
                except RuntimeError:  # the loop closed meanwhile
                    pass
            worker.submit(event, context, loop, done)
            waits.append(_ingateway._bounded(fut, worker, wait))
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        results, errors = [], []
        for (label, _, _), outcome in zip(matched, outcomes):
            if isinstance(outcome, BaseException):
                errors.append({"hook": label, "error": "%s: %s" % (
                    type(outcome).__name__, outcome)})
                continue
            result, error = outcome
            if error is not None:
                errors.append({"hook": label, "error": error})
            elif result is not None:
                results.append({"hook": label, "result": result})
        return results, errors


def match_order(event: str, hooks: List[Dict[str, Any]], local: List[Tuple[str, str, Any]]
                ) -> List[str]:
    """Every matching name in the one match order: exact-pattern matches (in-process handlers,
    then hooks in discovery order), then wildcard matches (the same way)."""
    exact = [label for label, kind, _ in local if kind == "exact"]
    wild = [label for label, kind, _ in local if kind != "exact"]
    for hook in hooks:
        kind = _ingateway._Patterns(list(hook.get("events") or [])).match(event)
        if kind == "exact":
            exact.append(hook.get("name"))
        elif kind == "wildcard":
            wild.append(hook.get("name"))
    return exact + wild


def is_timeout(error: Any) -> bool:
    """Whether an error text means the hook ran out of time (not that it failed)."""
    text = str(error or "")
    return text.startswith(("timed out after", "no result within"))
