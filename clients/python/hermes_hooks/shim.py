"""Opt-in shim: makes ``gateway.hooks`` hand out this package's ``HookRegistry`` and
``ProfileHookRegistries``, without editing the gateway's source.

Run the gateway through it::

    HERMES_HOOKS_SHIM=1 python -m hermes_hooks.shim -m hermes_cli.main gateway run
    # or: python -m hermes_hooks.shim path/to/script.py args...   (same as `python script.py`)
    # or: python -m hermes_hooks.shim -c CODE args...              (same as `python -c CODE`)
    # or the console script: hermes-hooks-gateway -m hermes_cli.main gateway run

It is off unless ``HERMES_HOOKS_SHIM`` is ``1``/``true``/``yes``/``on``, or
``HERMES_HOOKS_ADDRESS`` is set (and ``HERMES_HOOKS_SHIM`` is not ``0``/``false``/``no``/``off``);
when off, the launcher only runs the target, unchanged. When on, ``install()`` puts an import
hook first on ``sys.meta_path``: when ``gateway.hooks`` is imported, the gateway's own module
runs as usual, then its ``HookRegistry`` (and ``ProfileHookRegistries`` when it has one) are
replaced by the client's; the originals stay reachable as ``_original_HookRegistry`` and
``_original_ProfileHookRegistries``. Code that does ``from gateway.hooks import HookRegistry``
afterwards gets the client's class. No ``.pth`` file and no ``sitecustomize`` are involved:
nothing changes for a Python process that was not started through the launcher (or that does
not call ``install()`` itself).
"""

import importlib.abc
import importlib.machinery
import logging
import os
import runpy
import sys
from typing import Any, List, Optional

from . import _autostart
from .profiles import ProfileHookRegistries
from .registry import HookRegistry

log = logging.getLogger("hermes_hooks")

#: The module whose classes are replaced.
TARGET = "gateway.hooks"
ENABLE_ENV = "HERMES_HOOKS_SHIM"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def enabled() -> bool:
    """Whether the environment asks for the shim (see the module docstring)."""
    setting = os.environ.get(ENABLE_ENV, "").strip().lower()
    if setting in _ON:
        return True
    if setting in _OFF:
        return False
    return bool(os.environ.get("HERMES_HOOKS_ADDRESS"))


def patch(module: Any) -> None:
    """Replace the registry classes of an imported ``gateway.hooks``."""
    if getattr(module, "_hermes_hooks_shim", False):
        return
    if hasattr(module, "HookRegistry"):
        module._original_HookRegistry = module.HookRegistry
    module.HookRegistry = HookRegistry
    if hasattr(module, "ProfileHookRegistries"):
        module._original_ProfileHookRegistries = module.ProfileHookRegistries
        module.ProfileHookRegistries = ProfileHookRegistries
    module._hermes_hooks_shim = True
    log.info("hermes-hooks: %s now hands out hermes_hooks' HookRegistry%s", TARGET,
             " and ProfileHookRegistries" if hasattr(module, "_original_ProfileHookRegistries")
             else "")


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then :func:`patch`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename... for tracebacks
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``gateway.hooks`` with the other finders and wraps its loader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install(force: bool = False) -> bool:
    """Install the import hook when :func:`enabled` (or ``force``); patch ``gateway.hooks`` at
    once if it is already imported. Returns whether the shim is active. Idempotent."""
    if not (force or enabled()):
        return False
    _autostart.shim_active = True  # registries the gateway builds start the service if needed
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    module = sys.modules.get(TARGET)
    if module is not None:
        patch(module)
    return True


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m hermes_hooks.shim (-m MODULE | -c CODE | SCRIPT) [ARGS...]``: install when
    enabled, then run the target as ``python`` would."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stderr.write(__doc__ or "")
        raise SystemExit(2 if not args else 0)
    install()
    if args[0] == "-m":
        if len(args) < 2:
            sys.stderr.write("hermes_hooks.shim: -m needs a module name\n")
            raise SystemExit(2)
        sys.argv = [args[1]] + args[2:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        if len(args) < 2:
            sys.stderr.write("hermes_hooks.shim: -c needs a program\n")
            raise SystemExit(2)
        sys.argv = ["-c"] + args[2:]
        sys.path.insert(0, "")  # as `python -c`: the current directory first
        main_module = sys.modules["__main__"]
        namespace = {"__name__": "__main__", "__builtins__": __builtins__, "__doc__": None,
                     "__spec__": None, "__loader__": getattr(main_module, "__loader__", None)}
        exec(compile(args[1], "<string>", "exec"), namespace)
    else:
        sys.argv = args
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
