"""What the gateway's client checks before and while it imports an in-gateway hook.

* **The service is the real one** (:func:`service_problem`): over the Unix socket, the peer's
  uid (``SO_PEERCRED``) is this process's user or root; over TCP, a bearer token is configured
  and the process on the port proved that it holds it before the token was sent (the
  transport's ``POST /v1/proof``: :func:`._transport.check_proof`); without the proof nothing
  is fetched at all.
* **The hook is where this gateway looks for hooks** (:func:`tree_problem`): its directory
  resolves inside one of the roots the client knows itself (``$HERMES_HOME/hooks`` and
  ``$HERMES_HOOKS_ROOTS``), not wherever the listing says, and so does its handler, inside
  that directory (:func:`handler_problem`); the root, the hook directory and everything under
  it are owned by this user or root and writable by nobody else, and every file imported is
  checked again, through the descriptor it is read from.
* **Every module it imports is the one the service hashed** (:class:`HookFinder`): a per-hook
  finder, no ``sys.path`` entry. It serves the hook's top-level modules only after every other
  finder (so a hook's ``smtplib.py`` never shadows the gateway's ``smtplib``), and the
  submodules of the hook's own packages before them; it reads each file once, compares its
  SHA-256 with the service's manifest (``files`` in ``/v1/hooks``) and executes exactly those
  bytes. It also finds every path entry inside the tree (a hook that puts its directory on
  ``sys.path``): nothing there is reachable through the plain path finder. Bytecode is never
  read from the hook's tree (a package whose ``__init__`` is bytecode is refused), an extension
  module runs only when it is in the manifest, loaded through the descriptor it was hashed from;
  a refused import is logged with the hook and the file. :func:`drop` removes a refused hook's
  finder and modules.
"""

import _imp
import hashlib
import logging
import importlib.machinery
import importlib.util
import os
import socket
import struct
import sys
from typing import Any, Dict, List, Optional

log = logging.getLogger("hermes_hooks")

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
    return _unsafe_stat(path, st)


def _unsafe_stat(path: str, st: os.stat_result) -> Optional[str]:
    if st.st_uid not in (os.geteuid(), 0):
        return "%s is owned by uid %d, not by this user (uid %d) or root" % (
            path, st.st_uid, os.geteuid())
    if st.st_mode & 0o022:
        return "%s is writable by group or others (mode %04o)" % (path, st.st_mode & 0o7777)
    return None


def inside(path: str, directory: str) -> bool:
    """``path`` resolves (symlinks and ``..`` followed) inside ``directory``."""
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real.startswith(top + os.sep)


def handler_problem(handler: str, hook_dir: str) -> Optional[str]:
    """Why the gateway must not run ``handler`` as the hook in ``hook_dir``, or None."""
    if not handler or not inside(handler, hook_dir):
        return "its handler %s is not inside the hook directory %s" % (handler, hook_dir)
    return _unsafe(handler)


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
        return compile(self.finder.verified(self.path, fullname), self.path, "exec",
                       dont_inherit=True)


#: The descriptors extension modules were loaded from, held for the life of the process: the
#: dynamic loader knows a library by the name it was opened with, so a descriptor number used
#: again would give the next extension module the first one's library.
_extension_fds: List[Any] = []


class _VerifiedExtensionLoader(importlib.machinery.ExtensionFileLoader):
    """Loads an extension module through the descriptor whose bytes were hashed
    (``/proc/self/fd/N``, each module its own ``N``, kept open since a library is never
    unloaded): a file renamed over it after the check is not what runs."""

    def __init__(self, fullname: str, path: str, finder: "HookFinder") -> None:
        super().__init__(fullname, path)
        self.finder = finder

    def create_module(self, spec):  # type: ignore[override]
        f = open(self.path, "rb")
        try:
            self.finder.checked(f, self.path, spec.name)
            proc = "/proc/self/fd/%d" % f.fileno()
            if not os.path.exists(proc):  # no /proc: the path, checked just now
                f.close()
                return super().create_module(spec)
            module = _imp.create_dynamic(
                importlib.machinery.ModuleSpec(spec.name, self, origin=proc))
        except BaseException:
            f.close()
            raise
        _extension_fds.append(f)
        return module


class HookFinder:
    """The modules of one in-gateway hook (see the module docstring). Also the finder of every
    path entry inside the hook's tree (:meth:`path_hook`, first on ``sys.path_hooks``): a hook
    that puts its own directory on ``sys.path`` still imports only checked files from it."""

    def __init__(self, name: str, hook_dir: str, files: Dict[str, str]) -> None:
        self.name = name
        self.root = os.path.realpath(hook_dir)
        self.files = files
        self.first = _Side(self, top_level=False)
        self.last = _Side(self, top_level=True)

    def install(self) -> None:
        sys.meta_path.insert(0, self.first)
        sys.meta_path.append(self.last)
        sys.path_hooks.insert(0, self.path_hook)
        for entry in list(sys.path_importer_cache):  # finders made before this one existed
            if isinstance(entry, str) and self.inside(entry or os.curdir):
                del sys.path_importer_cache[entry]

    def uninstall(self) -> None:
        sys.meta_path[:] = [f for f in sys.meta_path
                            if not (isinstance(f, _Side) and f.finder is self)]
        sys.path_hooks[:] = [h for h in sys.path_hooks if getattr(h, "__self__", None) is not self]
        for entry, found in list(sys.path_importer_cache.items()):
            if isinstance(found, _TreeEntry) and found.finder is self:
                del sys.path_importer_cache[entry]

    def inside(self, path: str) -> bool:
        path = os.path.realpath(path)
        return path == self.root or path.startswith(self.root + os.sep)

    def path_hook(self, entry: str) -> "_TreeEntry":
        """``sys.path_hooks``: the finder of a path entry inside the tree (ImportError if not)."""
        if isinstance(entry, str) and self.inside(entry or os.curdir):
            return _TreeEntry(self, os.path.realpath(entry or os.curdir))
        raise ImportError("not inside the tree of hook %s" % self.name, path=entry)

    def refuse(self, fullname: Optional[str], path: str, why: str) -> ImportError:
        """Logs the refusal (hook, file) and returns the ImportError to raise."""
        message = "hermes-hooks: %s of hook %s %s; not imported" % (
            os.path.relpath(os.path.realpath(path), self.root), self.name, why)
        log.warning("[hooks] %s", message)
        return ImportError(message, name=fullname, path=path)

    def verified(self, path: str, fullname: Optional[str] = None) -> bytes:
        with open(path, "rb") as f:
            return self.checked(f, path, fullname)

    def checked(self, f, path: str, fullname: Optional[str] = None) -> bytes:
        """The bytes read from the open file ``f`` (of ``path``), checked against the manifest."""
        rel = os.path.relpath(os.path.realpath(path), self.root)
        if not self.inside(path) or rel == os.curdir:
            raise self.refuse(fullname, path, "is not inside the hook's directory")
        why = _unsafe_stat(path, os.fstat(f.fileno()))
        if why:
            raise self.refuse(fullname, path, "is unsafe (%s)" % why)
        data = f.read()
        want = self.files.get(rel)
        if want is None:
            raise self.refuse(fullname, path, "is not among the files the service checked")
        if hashlib.sha256(data).hexdigest() != want:
            raise self.refuse(fullname, path, "changed since the service checked it (and, with "
                              "--trust explicit, since it was approved)")
        return data

    def find(self, fullname: str, dirs: List[str]):
        for d in dirs:
            spec = self.entry_spec(fullname, d)
            if spec is not None:
                return spec
        return None

    def entry_spec(self, fullname: str, d: str):
        """What ``fullname`` is in the directory ``d`` of the tree, in the plain path finder's
        order (package, module, namespace directory): a checked spec, a namespace package, None;
        bytecode (``__init__.pyc`` too) and files not in the manifest raise ImportError."""
        tail = fullname.rpartition(".")[2]
        base = os.path.join(d, tail)
        is_dir = os.path.isdir(base)
        if is_dir:
            spec = self.file_spec(fullname, os.path.join(base, "__init__"), [base])
            if spec is not None:
                return spec
        spec = self.file_spec(fullname, base, None)
        if spec is None and is_dir and path_is_code(base):
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [base]
        return spec

    def file_spec(self, fullname: str, stem: str, locations: Optional[List[str]]):
        loaders = ((importlib.machinery.SOURCE_SUFFIXES, _VerifiedLoader),
                   (importlib.machinery.EXTENSION_SUFFIXES, _VerifiedExtensionLoader))
        for suffixes, loader in loaders:
            for suffix in suffixes:
                if os.path.isfile(stem + suffix):
                    return importlib.util.spec_from_file_location(
                        fullname, stem + suffix, loader=loader(fullname, stem + suffix, self),
                        submodule_search_locations=locations)
        for suffix in importlib.machinery.BYTECODE_SUFFIXES:
            if os.path.isfile(stem + suffix):
                raise self.refuse(fullname, stem + suffix, "is bytecode; a hook's bytecode is "
                                  "never run")
        return None


def path_is_code(path: str) -> bool:
    return not os.path.basename(path).startswith((".", "__pycache__"))


class _TreeEntry:
    """The path entry finder of one directory of a hook's tree (see :class:`HookFinder`)."""

    def __init__(self, finder: HookFinder, path: str) -> None:
        self.finder = finder
        self.path = path

    def find_spec(self, fullname, target=None):
        return self.finder.entry_spec(fullname, self.path)

    def invalidate_caches(self) -> None:
        pass

    def iter_modules(self, prefix=""):
        """What ``pkgutil.iter_modules`` lists here (names only: importing them comes back
        through ``find_spec``)."""
        import pkgutil
        return pkgutil.iter_importer_modules(importlib.machinery.FileFinder(self.path), prefix)


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
        finder.uninstall()
    real = os.path.realpath(hook_dir) if hook_dir else None
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if name in module_names or (real and where and (
                os.path.realpath(where) == real
                or os.path.realpath(where).startswith(real + os.sep))):
            sys.modules.pop(name, None)
