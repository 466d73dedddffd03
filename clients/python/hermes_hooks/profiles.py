"""``ProfileHookRegistries``: one ``HookRegistry`` per profile home, as the gateway keeps them.

Upstream gateways that serve several profiles hold one ``ProfileHookRegistries`` (in
``gateway/hooks.py``) with the ``HookRegistry`` surface; every call picks the registry of the
profile home active at that moment. This is its counterpart for the hermes-hooks service: the
home is taken per call from ``hermes_constants.get_hermes_home()`` when that module is
importable (it is inside the gateway), else from ``$HERMES_HOME`` (default ``~/.hermes``); each
home gets its own ``HookRegistry`` talking to that home's service at ``<home>/hooks.sock`` (and
starting it there with ``HERMES_HOME=<home>`` when ``autostart=True``), built and loaded on first
use. Two profiles with different hooks therefore receive only their own events.

``HERMES_HOOKS_ADDRESS`` (or ``address=``), when set, is the one service every profile talks to
(as a lone ``HookRegistry`` honours it). A profile's registry is built on first use; when that
first use is ``emit`` or ``emit_collect`` on the gateway's event loop, its ``discover_and_load``
(a request to the service, up to ``request_timeout``) runs on a thread of its own, never on the
loop: events emitted meanwhile wait in the registry's buffer as they would for a service that
is down; ``loaded_hooks`` waits for that discovery (upstream decides from it whether to wire
``agent:step``: a profile's first turn must not miss its step hooks; issue 36).
"""

import asyncio
import os
import threading
from typing import Any, Callable, Dict, List, Optional

from . import _transport
from .registry import HookRegistry

_UNSET = object()
_home_function = _UNSET  # type: Any


def active_home() -> str:
    """The profile home of this moment: ``hermes_constants.get_hermes_home()`` when importable,
    else ``$HERMES_HOME`` (default ``~/.hermes``)."""
    global _home_function
    if _home_function is _UNSET:
        try:
            from hermes_constants import get_hermes_home  # type: ignore
            _home_function = get_hermes_home
        except Exception:
            _home_function = None
    if _home_function is not None:
        try:
            return str(_home_function())
        except Exception:
            pass
    return _transport.hermes_home()


class ProfileHookRegistries:
    """Same surface as ``HookRegistry`` (``discover_and_load``, ``loaded_hooks``, ``emit``,
    ``emit_collect``...), delegating each call to the active profile home's registry.

    Keyword arguments are passed to every ``HookRegistry`` it builds (``autostart=True``,
    ``collect_timeout=``...); ``address`` is ``address=`` or ``$HERMES_HOOKS_ADDRESS`` when set
    (one service for every profile), else ``<home>/hooks.sock``; ``hermes_home`` is the home.
    ``home`` replaces :func:`active_home` (a callable returning the home to use now).
    """

    def __init__(self, home: Optional[Callable[[], str]] = None, **registry_kwargs: Any) -> None:
        self._address = registry_kwargs.pop("address", None) or os.environ.get(
            _transport.ADDRESS_ENV) or None
        registry_kwargs.pop("hermes_home", None)
        self._kwargs = registry_kwargs
        self._home = home or active_home
        self._by_home = {}  # type: Dict[str, HookRegistry]
        # Discoveries running on a thread, by home: set when done.
        self._discovering = {}  # type: Dict[str, threading.Event]
        self._lock = threading.Lock()

    def registry_for(self, home: str, background: bool = False) -> HookRegistry:
        """The registry of ``home``, built and loaded on first use (loaded on a thread of its
        own when ``background``, so the caller never waits on the service)."""
        key = os.path.realpath(os.path.expanduser(home))
        registry = self._by_home.get(key)
        if registry is None:
            with self._lock:
                registry = self._by_home.get(key)
                if registry is None:
                    address = self._address or os.path.join(key, _transport.DEFAULT_SOCKET_NAME)
                    registry = HookRegistry(address=address, hermes_home=key, **self._kwargs)
                    self._by_home[key] = registry
                    if background:
                        done = self._discovering[key] = threading.Event()

                        def discover(registry: HookRegistry = registry) -> None:
                            try:
                                registry.discover_and_load()
                            finally:
                                done.set()
                        threading.Thread(target=discover, daemon=True,
                                         name="hermes-hooks-discover").start()
                    else:
                        registry.discover_and_load()
        return registry

    def _active(self, background: bool = False) -> HookRegistry:
        return self.registry_for(self._home(), background)

    @property
    def registries(self) -> Dict[str, HookRegistry]:
        """Home -> registry, for every home used so far."""
        return dict(self._by_home)

    @property
    def loaded_hooks(self) -> List[dict]:
        """The active profile's hooks, once its first discovery (started by an emit on a thread)
        is done: as long as that takes (it is bounded by the registry's timeouts)."""
        registry = self._active()
        key = os.path.realpath(os.path.expanduser(self._home()))
        done = self._discovering.get(key)
        if done is not None:
            done.wait()
        return registry.loaded_hooks

    def discover_and_load(self) -> None:
        """Load the active home's hooks now (at startup, or in a profile's scoped startup)."""
        self._active()

    async def emit(self, event_type: str, context: Optional[Dict[str, Any]] = None) -> None:
        await self._active(background=True).emit(event_type, context)

    def emit_nowait(self, event_type: str, context: Optional[Dict[str, Any]] = None) -> bool:
        return self._active(background=True).emit_nowait(event_type, context)

    async def _loaded(self) -> HookRegistry:
        """The active registry; its first discovery runs off the loop (awaited: a decision
        needs the hook list, e.g. for in-gateway hooks)."""
        key = os.path.realpath(os.path.expanduser(self._home()))
        registry = self._by_home.get(key)
        if registry is not None:
            return registry
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.registry_for, key)

    async def emit_collect(self, event_type: str, context: Optional[Dict[str, Any]] = None, *,
                           timeout: Optional[float] = None) -> List[Any]:
        return await (await self._loaded()).emit_collect(event_type, context, timeout=timeout)

    async def emit_collect_detailed(self, event_type: str,
                                    context: Optional[Dict[str, Any]] = None, *,
                                    timeout: Optional[float] = None) -> Dict[str, Any]:
        return await (await self._loaded()).emit_collect_detailed(event_type, context,
                                                                  timeout=timeout)

    def close(self, timeout: float = 2.0) -> bool:
        return all([r.close(timeout) for r in list(self._by_home.values())])

    async def aclose(self, timeout: float = 2.0) -> bool:
        return all([await r.aclose(timeout) for r in list(self._by_home.values())])
