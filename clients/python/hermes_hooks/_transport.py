"""Where the hermes-hooks service listens and how to speak HTTP/1.1 to it.

An address is either a Unix socket path (``/run/user/1000/hooks.sock``, ``~/.hermes/hooks.sock``,
also accepted as ``unix:/path``) or ``http://host:port``. Blocking requests use
``http.client`` (a subclass connects over ``AF_UNIX``); the sender thread's batches go through
``KeepAliveConnection``, a lean keep-alive client; ``arequest`` is the asyncio counterpart used
by ``emit_collect`` so a decision call never blocks the event loop.
"""

import asyncio
import hashlib
import hmac
import http.client
import json
import os
import select
import socket
import threading
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from . import _trusted

#: Environment variable naming the service address (socket path or ``http://host:port``).
ADDRESS_ENV = "HERMES_HOOKS_ADDRESS"
#: Environment variable holding the bearer token, when the service requires one.
TOKEN_ENV = "HERMES_HOOKS_TOKEN"
#: Environment variable naming the ``hermes-hooks`` binary used by ``autostart``.
BIN_ENV = "HERMES_HOOKS_BIN"
#: Socket file name inside ``$HERMES_HOME`` when no address is configured.
DEFAULT_SOCKET_NAME = "hooks.sock"

#: Largest response body read from the service (collect answers and hook lists are small).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024

#: The protocol (the HTTP API of the service's docs/openapi.json, its ``info.version``) this
#: client speaks. The service says its own on every answer in this header; a service that says
#: none predates the header and speaks protocol 1.
PROTOCOL = "1"
PROTOCOL_HEADER = "hermes-hooks-protocol"


class IncompatibleService(ConnectionError):
    """The service speaks another protocol version than this client: nothing is sent to it (an
    ``OSError``, so every caller treats it as a service it cannot use, and never starts a
    second one beside it)."""


def check_protocol(headers: Dict[str, str], address: object) -> None:
    """Raises :class:`IncompatibleService` when an answer's (lower-cased) ``headers`` name a
    protocol other than :data:`PROTOCOL`."""
    said = headers.get(PROTOCOL_HEADER)
    if said is None or said.strip() == PROTOCOL:
        return
    from . import __version__  # the package is fully imported by the time anything is sent
    server = headers.get("server") or "an unknown release"
    raise IncompatibleService(
        "the hermes-hooks service at %s (%s) speaks protocol %s, this client (hermes_hooks %s) "
        "speaks protocol %s: install the client and the service from one release (the "
        "hermes-hooks wheel of that release gives both: `maturin build --release` in its "
        "checkout, then `pip install target/wheels/hermes_hooks-VERSION-*.whl`; or `pip install "
        "./clients/python` from the checkout the service was built from)"
        % (address, server, said.strip(), __version__, PROTOCOL))


#: The route and the MAC's context of the service's proof that it knows the token (the
#: service's ``POST /v1/proof``, docs/openapi.json).
PROOF_PATH = "/v1/proof"
PROOF_CONTEXT = b"hermes-hooks service proof v1"
PROOF_NONCE_BYTES = 32


class UnprovenService(IncompatibleService):
    """Over TCP, the process on the port did not prove that it knows the token: the token was
    not sent to it, and nothing it says is used (a service this client cannot use)."""


def _token(headers: Optional[Dict[str, str]]) -> Optional[str]:
    """The bearer token among ``headers``, if any."""
    for key, value in (headers or {}).items():
        if key.lower() == "authorization":
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def needs_proof(address: "Address", headers: Optional[Dict[str, str]]) -> Optional[str]:
    """The token to prove before sending ``headers`` to ``address`` (TCP only), or None."""
    return _token(headers) if address.kind == "tcp" else None


def proof_request(address: "Address") -> Tuple[bytes, bytes]:
    """A fresh nonce and the whole ``POST /v1/proof`` request carrying it (nothing secret)."""
    nonce = os.urandom(PROOF_NONCE_BYTES)
    body = json.dumps({"nonce": nonce.hex()}).encode("ascii")
    head = "\r\n".join(["POST %s HTTP/1.1" % PROOF_PATH, "Host: %s" % address.host_header(),
                         "Accept: application/json", "Content-Type: application/json",
                         "Content-Length: %d" % len(body)])
    return nonce, (head + "\r\n\r\n").encode("latin-1") + body


def check_proof(address: "Address", token: str, nonce: bytes, status: int, body: bytes) -> None:
    """Raises :class:`UnprovenService` unless ``body`` is the service's proof for ``nonce``:
    ``HMAC-SHA256(token, nonce || PROOF_CONTEXT)``."""
    want = hmac.new(token.encode("utf-8"), nonce + PROOF_CONTEXT, hashlib.sha256).hexdigest()
    try:
        got = json.loads(body.decode("utf-8")).get("proof") if status == 200 else None
    except (ValueError, AttributeError):
        got = None
    if isinstance(got, str) and hmac.compare_digest(got.encode("ascii", "replace"),
                                                    want.encode("ascii")):
        return
    why = "a wrong proof" if status == 200 else "status %d to POST %s" % (status, PROOF_PATH)
    raise UnprovenService(
        "the process at %s did not prove that it is the hermes-hooks service holding this "
        "token (%s): the token was not sent to it and nothing it lists is used" % (address, why))


def hermes_home() -> str:
    """``$HERMES_HOME``, defaulting to ``~/.hermes`` (as the gateway does)."""
    home = os.environ.get("HERMES_HOME")
    return os.path.expanduser(home) if home else os.path.expanduser("~/.hermes")


class Address:
    """A parsed service address: ``kind`` is ``"unix"`` (``path``) or ``"tcp"`` (``host``, ``port``)."""

    __slots__ = ("kind", "path", "host", "port")

    def __init__(self, kind: str, path: Optional[str] = None, host: Optional[str] = None,
                 port: Optional[int] = None) -> None:
        self.kind = kind
        self.path = path
        self.host = host
        self.port = port

    def __str__(self) -> str:
        if self.kind == "unix":
            return str(self.path)
        return "http://%s" % self.host_port()

    def __repr__(self) -> str:
        return "Address(%r)" % str(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Address) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def host_port(self) -> str:
        """``host:port`` with IPv6 literals bracketed (TCP addresses only)."""
        host = str(self.host)
        if ":" in host:
            host = "[%s]" % host
        return "%s:%d" % (host, self.port)

    def host_header(self) -> str:
        return "localhost" if self.kind == "unix" else self.host_port()

    def serve_args(self) -> List[str]:
        """The ``hermes-hooks serve`` arguments that make the service listen here."""
        if self.kind == "unix":
            return ["--socket", str(self.path)]
        return ["--listen", self.host_port()]

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        """A new (not yet connected) blocking HTTP/1.1 connection to this address."""
        if self.kind == "unix":
            return UnixHTTPConnection(str(self.path), timeout=timeout)
        return http.client.HTTPConnection(str(self.host), int(self.port or 80), timeout=timeout)


def parse_address(text: object) -> Address:
    """Parse a socket path or ``http://host:port``; raises ``ValueError`` with the reason."""
    if isinstance(text, os.PathLike):
        text = os.fspath(text)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not isinstance(text, str) or not text.strip():
        raise ValueError("hermes-hooks address must be a socket path or http://host:port, got %r"
                         % (text,))
    text = text.strip()
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if path.startswith("//"):  # unix:///tmp/hooks.sock
            path = path[2:]
        if not path:
            raise ValueError("hermes-hooks address %r names no socket path" % text)
        return Address("unix", path=os.path.expanduser(path))
    if "://" in text:
        parts = urllib.parse.urlsplit(text)
        if parts.scheme.lower() != "http":
            raise ValueError("hermes-hooks address %r: only http://host:port (or a Unix socket "
                             "path) is supported" % text)
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError("hermes-hooks address %r: bad port (%s)" % (text, exc)) from None
        if not parts.hostname:
            raise ValueError("hermes-hooks address %r names no host" % text)
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise ValueError("hermes-hooks address %r: give only http://host:port, without a "
                             "path, query or credentials" % text)
        return Address("tcp", host=parts.hostname, port=port if port is not None else 80)
    return Address("unix", path=os.path.expanduser(text))


def resolve_address(address: object = None) -> Address:
    """The argument, else ``$HERMES_HOOKS_ADDRESS``, else ``$HERMES_HOME/hooks.sock``."""
    if address is None or address == "":
        address = os.environ.get(ADDRESS_ENV) or None
    if address is None:
        return Address("unix", path=os.path.join(hermes_home(), DEFAULT_SOCKET_NAME))
    if isinstance(address, Address):
        return address
    return parse_address(address)


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client.HTTPConnection`` over a Unix domain socket."""

    def __init__(self, path: str, timeout: Optional[float] = None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        #: Who serves the socket (SO_PEERCRED), for the in-gateway import's check.
        self.peer_uid = _trusted.peer_uid(sock)


class NotSent(ConnectionError):
    """A request that certainly did not reach the service: no byte of it was written (see
    :meth:`KeepAliveConnection.request`). Sending it again, on another connection, cannot run
    anything twice."""


def _readable_now(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read (data, end of file or an error) at once."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


class KeepAliveConnection:
    """A minimal HTTP/1.1 client connection for the sender thread's batch requests.

    One socket kept open across requests; each request goes out in one ``sendall`` and the
    answer is parsed directly (status line, headers, Content-Length or chunked body). Compared
    with ``http.client`` (measured here: about 104 us of CPU per request against 18 us) this
    matters because in the gateway's process every microsecond the sender spends is GIL time
    taken from the event loop.
    """

    def __init__(self, address: Address, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self.sock = None  # type: Optional[socket.socket]
        self._rfile = None  # type: Any
        #: Set by the caller once the service said it is ready on this connection.
        self.ready = False

    def connect(self) -> None:
        if self.address.kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                sock.connect(str(self.address.path))
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((str(self.address.host), int(self.address.port or 80)),
                                            timeout=self.timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.sock = sock
        self._rfile = sock.makefile("rb")
        self.ready = False

    def close(self) -> None:
        sock, rfile = self.sock, self._rfile
        self.sock = self._rfile = None
        self.ready = False
        for closable in (rfile, sock):
            if closable is not None:
                try:
                    closable.close()
                except OSError:
                    pass

    def idle_closed(self) -> bool:
        """Whether this connection, open and idle between requests, can no longer carry one: on
        an idle HTTP/1.1 connection nothing may be readable, so anything that is (the service's
        end of file after it closed the connection, a reset, stray bytes) means it is done."""
        sock = self.sock
        if sock is None:
            return True
        try:
            return _readable_now(sock)
        except (OSError, ValueError):
            return True

    def request(self, method: str, path: str, body: bytes, headers: Dict[str, str]
                ) -> Tuple[int, bytes]:
        """Send a request and read the answer; raises ``OSError`` (``ConnectionError`` for a
        connection closed by the service) and leaves the connection closed on any failure.

        Raises :class:`NotSent` only when the request certainly did not reach the service: the
        connection was reused and found closed before anything was written (:meth:`idle_closed`),
        or the first write of the request failed with no byte taken by the kernel. Any other
        failure (a later write, or reading the answer) may come after the service got the whole
        request and acted on it: it is raised as it is, and must not be sent again."""
        if self.sock is not None and self.idle_closed():
            self.close()
            raise NotSent("the service closed the kept-alive connection to %s while it was idle"
                          % self.address)
        if self.sock is None:
            self.connect()
            token = needs_proof(self.address, headers)
            if token is not None:
                self._prove(token)
        head = ["%s %s HTTP/1.1" % (method, path), "Host: %s" % self.address.host_header()]
        if body or method == "POST":
            head.append("Content-Length: %d" % len(body))
        head.extend("%s: %s" % item for item in headers.items())
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        try:
            assert self.sock is not None
            if len(body) < 65536:
                self._send(data + body)
            else:
                self._send(data)
                self._send(body, started=True)
            status, answer_headers, answer = _read_response_sync(self._rfile)
            check_protocol(answer_headers, self.address)
        except BaseException:
            self.close()
            raise
        if answer_headers.get("connection", "").lower() == "close":
            self.close()
        return status, answer


    def _send(self, data: bytes, started: bool = False) -> None:
        """``sendall`` that tells a failure before the first byte was taken (:class:`NotSent`)
        from one after (the error itself). ``started``: part of the request is out already."""
        assert self.sock is not None
        view = memoryview(data)
        written = 0
        while written < len(view):
            try:
                written += self.sock.send(view[written:])
            except OSError as exc:
                if written or started:
                    raise
                raise NotSent("the service at %s took no byte of the request: %s"
                              % (self.address, exc)) from exc

    def _prove(self, token: str) -> None:
        """The proof, first on a new TCP connection (see :func:`check_proof`)."""
        nonce, data = proof_request(self.address)
        try:
            assert self.sock is not None
            self.sock.sendall(data)
            status, answer_headers, answer = _read_response_sync(self._rfile)
            check_protocol(answer_headers, self.address)
            check_proof(self.address, token, nonce, status, answer)
        except BaseException:
            self.close()
            raise


class KeepAlivePool:
    """Keep-alive connections to one address, shared by any number of threads.

    A thread takes a connection for one request (:meth:`request`) and gives it back; idle
    connections wait on a stack, the most recently used first. At most ``max_idle`` wait (one
    given back beyond that closes the oldest), and each closes after ``idle_seconds`` unused,
    well before the service cuts it (60 s after an answer; ``src/connections.rs``), by a reaper
    thread that runs only while some connection is idle. So threads that come and go (Hermes
    starts new ones per tool batch, for its async bridge and for subagents) leave no connection
    behind: open connections are those in use plus at most ``max_idle``.

    Sending again (issue 58 row 6): a request is sent a second time only when it certainly did
    not reach the service, :class:`NotSent` from the connection: a kept-alive connection found
    closed before anything was written, or a first write that took no byte. Then it goes out on
    the next idle connection or a new one. Any other failure, once a byte of the request may have
    reached the service (a later write, reading the answer, a connection cut before the answer),
    is raised: the service may have run the hooks already, and a decision must not run twice.
    A new connection that fails before sending (the service is not there) raises too.
    """

    def __init__(self, address: Address, timeout: float, max_idle: int = 8,
                 idle_seconds: float = 15.0) -> None:
        self.address = address
        self.timeout = timeout
        self.max_idle = max_idle
        self.idle_seconds = idle_seconds
        self._cond = threading.Condition(threading.Lock())
        self._idle = []  # type: List[Tuple[KeepAliveConnection, float]]  # oldest first
        self._generation = 0  # close() moves it on: connections out then are not kept
        self._reaper = None  # type: Optional[threading.Thread]
        #: Connections opened so far (for tests and diagnostics).
        self.opened = 0

    def idle_count(self) -> int:
        with self._cond:
            return len(self._idle)

    def request(self, method: str, path: str, body: bytes, headers: Dict[str, str]
                ) -> Tuple[int, bytes]:
        """One request on a pooled connection (see the class's rule on sending again)."""
        for _ in range(self.max_idle + 2):
            conn, generation = self._take()
            reused = conn.sock is not None
            try:
                answer = conn.request(method, path, body, headers)
            except NotSent:
                conn.close()
                if reused:
                    continue  # it never left: the next idle connection, or a new one
                raise
            except BaseException:
                conn.close()
                raise
            self._give_back(conn, generation)
            return answer
        raise NotSent("no connection to %s could carry the request" % self.address)

    def close(self) -> None:
        """Closes the idle connections; those in use close when given back. The pool stays
        usable (a request after it opens a new connection)."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._generation += 1
            self._cond.notify_all()
        for conn, _ in idle:
            conn.close()

    def _take(self) -> Tuple[KeepAliveConnection, int]:
        with self._cond:
            generation = self._generation
            if self._idle:
                return self._idle.pop()[0], generation
            self.opened += 1
        return KeepAliveConnection(self.address, self.timeout), generation

    def _give_back(self, conn: KeepAliveConnection, generation: int) -> None:
        surplus = []
        with self._cond:
            if conn.sock is None or generation != self._generation:
                surplus.append(conn)
            else:
                self._idle.append((conn, time.monotonic()))
                while len(self._idle) > self.max_idle:
                    surplus.append(self._idle.pop(0)[0])
                if self._reaper is None:
                    self._reaper = threading.Thread(target=self._reap, daemon=True,
                                                    name="hermes-hooks-pool-reaper")
                    self._reaper.start()
        for extra in surplus:
            extra.close()

    def _reap(self) -> None:
        """Closes connections idle for ``idle_seconds``; ends when none is idle."""
        while True:
            expired = []
            with self._cond:
                if not self._idle:
                    self._reaper = None
                    return
                now = time.monotonic()
                while self._idle and now - self._idle[0][1] >= self.idle_seconds:
                    expired.append(self._idle.pop(0)[0])
                if not expired and self._idle:
                    self._cond.wait(self._idle[0][1] + self.idle_seconds - now)
            for conn in expired:
                conn.close()


def _read_response_sync(rfile: Any) -> Tuple[int, Dict[str, str], bytes]:
    while True:
        status, headers = _parse_head(rfile.readline(65537), lambda: rfile.readline(65537))
        if not 100 <= status < 200:
            break
    if status in (204, 304):
        return status, headers, b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        total = 0
        while True:
            size = _chunk_size(rfile.readline(65537))
            if size == 0:
                while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return status, headers, b"".join(chunks)
            total += size
            if total > MAX_RESPONSE_BYTES:
                raise ConnectionError("response body over %d bytes" % MAX_RESPONSE_BYTES)
            chunks.append(_read_exactly(rfile, size))
            _read_exactly(rfile, 2)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length > MAX_RESPONSE_BYTES:
            raise ConnectionError("response body over %d bytes" % MAX_RESPONSE_BYTES)
        return status, headers, _read_exactly(rfile, length)
    headers["connection"] = "close"  # body delimited by the end of the connection
    data = rfile.read(MAX_RESPONSE_BYTES + 1)
    if len(data) > MAX_RESPONSE_BYTES:
        raise ConnectionError("response body over %d bytes" % MAX_RESPONSE_BYTES)
    return status, headers, data


def _read_exactly(rfile: Any, size: int) -> bytes:
    data = rfile.read(size)
    if len(data) != size:
        raise ConnectionError("the service closed the connection in the middle of an answer")
    return data


def _parse_head(first: bytes, next_line: Any) -> Tuple[int, Dict[str, str]]:
    """Status and lower-cased headers from a status line and a line source (sync)."""
    status = _status(first)
    headers = {}  # type: Dict[str, str]
    while True:
        line = next_line()
        if not line:
            raise ConnectionError("the service closed the connection in the middle of an answer")
        if line in (b"\r\n", b"\n"):
            return status, headers
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()


def _status(line: bytes) -> int:
    if not line:
        raise ConnectionError("the service closed the connection before answering")
    fields = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        raise ConnectionError("not an HTTP response: %r" % line[:80])
    return int(fields[1])


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise ConnectionError("bad chunk size line %r" % line[:80]) from None


def request(address: Address, method: str, path: str, body: Optional[bytes] = None,
            headers: Optional[Dict[str, str]] = None, timeout: float = 5.0,
            peer: Optional[Dict[str, Any]] = None) -> Tuple[int, bytes]:
    """One blocking request on a fresh connection; returns ``(status, body)``. With ``peer``
    (a dict), ``peer["uid"]`` is set to the uid serving a Unix socket (None over TCP).

    Raises ``OSError`` / ``http.client.HTTPException`` when the service cannot be reached.
    """
    conn = address.connection(timeout)
    try:
        if peer is not None:
            conn.connect()
            peer["uid"] = getattr(conn, "peer_uid", None)
        token = needs_proof(address, headers)
        if token is not None:  # on this connection, before the token goes out
            nonce, _ = proof_request(address)
            conn.request("POST", PROOF_PATH, body=json.dumps({"nonce": nonce.hex()}),
                         headers={"Accept": "application/json",
                                  "Content-Type": "application/json"})
            resp = conn.getresponse()
            check_protocol({k.lower(): v for k, v in resp.getheaders()}, address)
            check_proof(address, token, nonce, resp.status, resp.read(MAX_RESPONSE_BYTES))
        hdrs = {"Accept": "application/json", "Connection": "close"}
        if body is not None or method == "POST":  # the service refuses a POST without it
            hdrs["Content-Type"] = "application/json"
        if headers:
            hdrs.update(headers)
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        check_protocol({k.lower(): v for k, v in resp.getheaders()}, address)
        return resp.status, resp.read(MAX_RESPONSE_BYTES)
    finally:
        conn.close()


async def arequest(address: Address, method: str, path: str, body: Optional[bytes] = None,
                   headers: Optional[Dict[str, str]] = None) -> Tuple[int, bytes]:
    """One request with asyncio streams on a short-lived connection; returns ``(status, body)``.

    The caller bounds it with ``asyncio.wait_for``; cancelling it closes the connection.
    """
    if address.kind == "unix":
        reader, writer = await asyncio.open_unix_connection(str(address.path))
    else:
        reader, writer = await asyncio.open_connection(str(address.host), int(address.port or 80))
    try:
        token = needs_proof(address, headers)
        if token is not None:  # on this connection, before the token goes out
            nonce, data = proof_request(address)
            writer.write(data)
            await writer.drain()
            status, answer = await _read_response(reader, address)
            check_proof(address, token, nonce, status, answer)
        lines = [
            "%s %s HTTP/1.1" % (method, path),
            "Host: %s" % address.host_header(),
            "Accept: application/json",
            "Connection: close",
        ]
        if body is not None or method == "POST":  # the service refuses a POST without it
            lines.append("Content-Type: application/json")
            lines.append("Content-Length: %d" % len(body or b""))
        for key, value in (headers or {}).items():
            lines.append("%s: %s" % (key, value))
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        await writer.drain()
        return await _read_response(reader, address)
    finally:
        writer.close()


async def _read_response(reader: asyncio.StreamReader, address: object = "?"
                         ) -> Tuple[int, bytes]:
    while True:
        status = _status(await reader.readline())
        headers = {}  # type: Dict[str, str]
        while True:
            line = await reader.readline()
            if not line:
                raise ConnectionError("the service closed the connection in the middle of an "
                                      "answer")
            if line in (b"\r\n", b"\n"):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        if not 100 <= status < 200:  # skip interim answers (100 Continue)
            break
    check_protocol(headers, address)
    if status in (204, 304):
        return status, b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        total = 0
        while True:
            size = _chunk_size(await reader.readline())
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return status, b"".join(chunks)
            total += size
            if total > MAX_RESPONSE_BYTES:
                raise ConnectionError("response body over %d bytes" % MAX_RESPONSE_BYTES)
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length > MAX_RESPONSE_BYTES:
            raise ConnectionError("response body over %d bytes" % MAX_RESPONSE_BYTES)
        return status, await reader.readexactly(length)
    chunks = []
    total = 0
    while True:
        data = await reader.read(65536)
        if not data:
            return status, b"".join(chunks)
        total += len(data)
        if total > MAX_RESPONSE_BYTES:
            raise ConnectionError("response body over %d bytes" % MAX_RESPONSE_BYTES)
        chunks.append(data)
