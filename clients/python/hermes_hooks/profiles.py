"""``ProfileHookRegistries``: one ``HookRegistry`` per profile home, as the gateway keeps them.

Upstream gateways that serve several profiles hold one ``ProfileHookRegistries`` (in
``gateway/hooks.py``) with the ``HookRegistry`` surface; every call picks the registry of the
profile home active at that moment. This is its counterpart for the hermes-hooks service: the
home is taken per call from ``hermes_constants.get_hermes_home()`` when that module is
importable (it is inside the gateway), else from ``$HERMES_HOME`` (default ``~/.hermes``); each
home gets its own ``HookRegistry`` talking to that home's service at ``<home>/hooks.sock`` (and
starting it there with ``HERMES_HOME=<home>`` when ``autostart=True``), built and loaded on first
use. Two profiles with different hooks therefore receive only their own events.
"""

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
    ``collect_timeout=``...); ``address`` is always ``<home>/hooks.sock`` and ``hermes_home`` the
    home. ``home`` replaces :func:`active_home` (a callable returning the home to use now).
    """

    def __init__(self, home: Optional[Callable[[], str]] = None, **registry_kwargs: Any) -> None:
        registry_kwargs.pop("address", None)
        registry_kwargs.pop("hermes_home", None)
        self._kwargs = registry_kwargs
        self._home = home or active_home
        self._by_home = {}  # type: Dict[str, HookRegistry]
        self._lock = threading.Lock()

    def registry_for(self, home: str) -> HookRegistry:
        """The registry of ``home``, built and loaded on first use."""
        key = os.path.realpath(os.path.expanduser(home))
        registry = self._by_home.get(key)
        if registry is None:
            with self._lock:
                registry = self._by_home.get(key)
                if registry is None:
                    registry = HookRegistry(address=os.path.join(key, _transport.DEFAULT_SOCKET_NAME),
                                            hermes_home=key, **self._kwargs)
                    registry.discover_and_load()
                    self._by_home[key] = registry
        return registry

    def _active(self) -> HookRegistry:
        return self.registry_for(self._home())

    @property
    def registries(self) -> Dict[str, HookRegistry]:
        """Home -> registry, for every home used so far."""
        return dict(self._by_home)

    @property
    def loaded_hooks(self) -> List[dict]:
        return self._active().loaded_hooks

    def discover_and_load(self) -> None:
        """Load the active home's hooks now (at startup, or in a profile's scoped startup)."""
        self._active()

    async def emit(self, event_type: str, context: Optional[Dict[str, Any]] = None) -> None:
        await self._active().emit(event_type, context)

    def emit_nowait(self, event_type: str, context: Optional[Dict[str, Any]] = None) -> bool:
        return self._active().emit_nowait(event_type, context)

    async def emit_collect(self, event_type: str, context: Optional[Dict[str, Any]] = None, *,
                           timeout: Optional[float] = None) -> List[Any]:
        return await self._active().emit_collect(event_type, context, timeout=timeout)

    async def emit_collect_detailed(self, event_type: str,
                                    context: Optional[Dict[str, Any]] = None, *,
                                    timeout: Optional[float] = None) -> Dict[str, Any]:
        return await self._active().emit_collect_detailed(event_type, context, timeout=timeout)

    def close(self, timeout: float = 2.0) -> bool:
        return all([r.close(timeout) for r in list(self._by_home.values())])

    async def aclose(self, timeout: float = 2.0) -> bool:
        return all([await r.aclose(timeout) for r in list(self._by_home.values())])
