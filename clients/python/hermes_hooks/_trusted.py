"""What the gateway's client checks before and while it imports an in-gateway hook.

* **The service is the real one** (:func:`service_problem`): over the Unix socket, the peer's
  uid (``SO_PEERCRED``) is this process's user or root; over TCP, a bearer token is configured
  (whoever answers without knowing it cannot have listed the hooks).
* **The hook is where this gateway looks for hooks** (:func:`tree_problem`): its directory
  resolves inside one of the roots the client knows itself (``$HERMES_HOME/hooks`` and
  ``$HERMES_HOOKS_ROOTS``), not wherever the listing says; the root, the hook directory and
  everything under it are owned by this user or root and writable by nobody else.
* **Every module it imports is the one the service hashed** (:class:`HookFinder`): a per-hook
  finder, no ``sys.path`` entry. It serves the hook's top-level modules only after every other
  finder (so a hook's ``smtplib.py`` never shadows the gateway's ``smtplib``), and the
  submodules of the hook's own packages before them; it reads each file once, compares its
  SHA-256 with the service's manifest (``files`` in ``/v1/hooks``) and executes exactly those
  bytes. Bytecode is never read from the hook's tree. :func:`drop` removes a refused hook's
  finder and modules.
"""

import hashlib
import importlib.machinery
import importlib.util
import os
import socket
import struct
import sys
from typing import Dict, List, Optional

#: Extra hook roots the client accepts, ``os.pathsep``-separated (``$HERMES_HOME/hooks`` always).
ROOTS_ENV = "HERMES_HOOKS_ROOTS"


def peer_uid(sock: socket.socket) -> Optional[int]:
    """The uid of the process at the other end of a Unix socket (Linux ``SO_PEERCRED``)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", creds)[1]


def service_problem(kind: str, uid: Optional[int], has_token: bool) -> Optional[str]:
    """Why the listing may not come from the real service, or None."""
    if kind == "unix":
        if uid is None:
            return "cannot tell who serves the socket (no SO_PEERCRED)"
        if uid not in (os.geteuid(), 0):
            return ("the socket is served by uid %d, not by this user (uid %d) or root"
                    % (uid, os.geteuid()))
        return None
    if not has_token:
        return ("over TCP without a token nothing proves the hook listing comes from the "
                "service (set HERMES_HOOKS_TOKEN)")
    return None


def known_roots(hermes_home: Optional[str]) -> List[str]:
    roots = [os.path.join(hermes_home, "hooks")] if hermes_home else []
    roots += [p for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p]
    return [os.path.realpath(r) for r in roots]


def _unsafe(path: str) -> Optional[str]:
    try:
        st = os.stat(path)
    except OSError as exc:
        return "cannot inspect %s: %s" % (path, exc)
    if st.st_uid not in (os.geteuid(), 0):
        return "%s is owned by uid %d, not by this user (uid %d) or root" % (
            path, st.st_uid, os.geteuid())
    if st.st_mode & 0o022:
        return "%s is writable by group or others (mode %04o)" % (path, st.st_mode & 0o7777)
    return None


def tree_problem(hook_dir: str, roots: List[str]) -> Optional[str]:
    """Why the gateway must not import from ``hook_dir``, or None."""
    real = os.path.realpath(hook_dir)
    root = next((r for r in roots if real.startswith(r + os.sep)), None)
    if root is None:
        return ("%s is not inside the hook roots this gateway knows (%s)"
                % (hook_dir, ", ".join(roots) or "none: no HERMES_HOME"))
    for path in [root, real]:
        why = _unsafe(path)
        if why:
            return why
    for dirpath, dirnames, filenames in os.walk(real):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in dirnames + filenames:
            why = _unsafe(os.path.join(dirpath, name))
            if why:
                return why
    return None


class _VerifiedLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, finder: "HookFinder") -> None:
        super().__init__(fullname, path)
        self.finder = finder

    def get_code(self, fullname):  # type: ignore[override]
        return compile(self.finder.verified(self.path), self.path, "exec", dont_inherit=True)


class HookFinder:
    """The modules of one in-gateway hook (see the module docstring)."""

    def __init__(self, name: str, hook_dir: str, files: Dict[str, str]) -> None:
        self.name = name
        self.root = os.path.realpath(hook_dir)
        self.files = files
        self.first = _Side(self, top_level=False)
        self.last = _Side(self, top_level=True)

    def install(self) -> None:
        sys.meta_path.insert(0, self.first)
        sys.meta_path.append(self.last)

    def inside(self, path: str) -> bool:
        path = os.path.realpath(path)
        return path == self.root or path.startswith(self.root + os.sep)

    def verified(self, path: str) -> bytes:
        rel = os.path.relpath(os.path.realpath(path), self.root)
        with open(path, "rb") as f:
            data = f.read()
        want = self.files.get(rel)
        if want is None:
            raise ImportError("hermes-hooks: %s of hook %s is not among the files the service "
                              "checked; not imported" % (rel, self.name), path=path)
        if hashlib.sha256(data).hexdigest() != want:
            raise ImportError("hermes-hooks: %s of hook %s changed since the service checked it "
                              "(and, with --trust explicit, since it was approved); not imported"
                              % (rel, self.name), path=path)
        return data

    def find(self, fullname: str, dirs: List[str]):
        tail = fullname.rpartition(".")[2]
        for d in dirs:
            base = os.path.join(d, tail)
            init = os.path.join(base, "__init__.py")
            if os.path.isfile(init):
                return importlib.util.spec_from_file_location(
                    fullname, init, loader=_VerifiedLoader(fullname, init, self),
                    submodule_search_locations=[base])
            for suffix in importlib.machinery.SOURCE_SUFFIXES:
                if os.path.isfile(base + suffix):
                    return importlib.util.spec_from_file_location(
                        fullname, base + suffix,
                        loader=_VerifiedLoader(fullname, base + suffix, self))
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                if os.path.isfile(base + suffix):
                    self.verified(base + suffix)  # dlopen reads the path again (README)
                    return importlib.util.spec_from_file_location(
                        fullname, base + suffix,
                        loader=importlib.machinery.ExtensionFileLoader(fullname, base + suffix))
            for suffix in importlib.machinery.BYTECODE_SUFFIXES:
                if os.path.isfile(base + suffix):
                    raise ImportError("hermes-hooks: %s has bytecode without source; a hook's "
                                      "bytecode is never run" % (base + suffix), name=fullname)
            if os.path.isdir(base) and path_is_code(base):
                spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
                spec.submodule_search_locations = [base]
                return spec
        return None


def path_is_code(path: str) -> bool:
    return not os.path.basename(path).startswith((".", "__pycache__"))


class _Side:
    """One of a hook finder's two places on ``sys.meta_path``."""

    def __init__(self, finder: HookFinder, top_level: bool) -> None:
        self.finder = finder
        self.top_level = top_level

    def find_spec(self, fullname, path=None, target=None):
        if path is None:
            return self.finder.find(fullname, [self.finder.root]) if self.top_level else None
        if self.top_level:
            return None
        dirs = [d for d in path if isinstance(d, str) and self.finder.inside(d)]
        return self.finder.find(fullname, dirs) if dirs else None


def drop(finder: Optional[HookFinder], hook_dir: str, module_names: List[str]) -> None:
    """Forget a refused hook: its finder, and every module imported from its directory."""
    if finder is not None:
        sys.meta_path[:] = [f for f in sys.meta_path
                            if not (isinstance(f, _Side) and f.finder is finder)]
    real = os.path.realpath(hook_dir) if hook_dir else None
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if name in module_names or (real and where and (
                os.path.realpath(where) == real
                or os.path.realpath(where).startswith(real + os.sep))):
            sys.modules.pop(name, None)
