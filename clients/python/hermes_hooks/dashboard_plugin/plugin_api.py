"""The backend of the Hooks tab in the Hermes dashboard (mounted at
``/api/plugins/hermes-hooks-dashboard/``).

The dashboard imports this file only for a plugin listed in ``plugins.enabled`` of its config,
and its own authentication guards every route under ``/api/`` (the session token of a loopback
dashboard, or its login): nothing here is reachable without it. Each route is one request to the
hermes-hooks service, made the way the gateway's client makes them (``hermes_hooks``): the
address is ``$HERMES_HOOKS_ADDRESS`` or ``$HERMES_HOME/hooks.sock``, the token
``$HERMES_HOOKS_TOKEN``, and the client's trust check runs before anything is sent (over the
Unix socket the service must run as this user or root; over TCP a token must be set). The
actions are the service's own endpoints, which apply the CLI's rules (``enable``/``disable``,
approvals under ``--trust explicit``, ``dead replay`` on a fleet edge). Routes are plain functions: FastAPI runs them on its
thread pool, so a slow service never blocks the dashboard's event loop.
"""

import json
import os
import urllib.parse
from typing import Any, Dict, Optional, Tuple

from fastapi import APIRouter, Body, HTTPException

router = APIRouter()

#: Seconds a read may take; actions (which reload the hooks) get longer.
READ_TIMEOUT = 5.0
ACTION_TIMEOUT = 60.0


def _client():
    """The gateway's client modules, or a 503 saying how to install them."""
    try:
        from hermes_hooks import _transport, _trusted
    except ImportError as exc:
        raise HTTPException(
            status_code=503,
            detail="the hermes-hooks client is not installed in the dashboard's Python (%s): "
                   "install it into the environment that runs `hermes`: the hermes-hooks wheel "
                   "(`maturin build --release` in the hermes-hooks checkout, then `pip install "
                   "target/wheels/hermes_hooks-*.whl`) or the client alone (`pip install "
                   "./clients/python` from the checkout); hermes-hooks is not on PyPI" % exc)
    return _transport, _trusted


class ServiceDown(Exception):
    """The service cannot be used: not running, or not the one the client trusts."""


def _call(method: str, path: str, body: Optional[bytes] = None,
          timeout: float = READ_TIMEOUT) -> Tuple[int, Any, str]:
    """One request to the service after the client's trust check: (status, decoded JSON,
    the address)."""
    transport, trusted = _client()
    try:
        address = transport.resolve_address()
    except ValueError as exc:
        raise ServiceDown(str(exc))
    token = (os.environ.get(transport.TOKEN_ENV) or "").strip()
    conn = address.connection(timeout)
    try:
        try:
            conn.connect()
        except OSError as exc:
            raise ServiceDown("the hermes-hooks service is not running at %s (%s)" % (address, exc))
        problem = trusted.service_problem(address.kind, getattr(conn, "peer_uid", None),
                                          bool(token))
        if problem:
            raise ServiceDown("refusing to talk to %s: %s" % (address, problem))
        if token and transport.needs_proof(address, {"Authorization": "Bearer " + token}):
            # Over TCP the service first proves, on this connection, that it holds the token
            # (as the gateway's client does): an impostor on the port never gets it.
            nonce, _ = transport.proof_request(address)
            conn.request("POST", transport.PROOF_PATH,
                         body=json.dumps({"nonce": nonce.hex()}).encode("ascii"),
                         headers={"Accept": "application/json",
                                  "Content-Type": "application/json"})
            proof = conn.getresponse()
            transport.check_protocol({k.lower(): v for k, v in proof.getheaders()}, address)
            try:
                transport.check_proof(address, token, nonce, proof.status,
                                      proof.read(transport.MAX_RESPONSE_BYTES))
            except transport.UnprovenService as exc:
                raise ServiceDown(str(exc))
        headers = {"Accept": "application/json", "Connection": "close"}
        if token:
            headers["Authorization"] = "Bearer %s" % token
        if body is not None or method == "POST":  # the service refuses a POST without it
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        transport.check_protocol({k.lower(): v for k, v in resp.getheaders()}, address)
        raw = resp.read(transport.MAX_RESPONSE_BYTES)
    except ServiceDown:
        raise
    except Exception as exc:  # OSError, http.client's errors, an incompatible service
        raise ServiceDown("the hermes-hooks service at %s did not answer (%s)" % (address, exc))
    finally:
        conn.close()
    try:
        data = json.loads(raw.decode("utf-8")) if raw else {}
    except ValueError:
        data = {"error": {"code": "bad_answer", "message": raw[:200].decode("utf-8", "replace")}}
    return resp.status, data, str(address)


def _answer(status: int, data: Any) -> Any:
    """The service's answer, or its error as the dashboard's HTTP error."""
    if 200 <= status < 300:
        return data
    err = data.get("error") if isinstance(data, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    raise HTTPException(status_code=status if status >= 400 else 502,
                        detail=message or "the service answered %d" % status)


def _name(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@router.get("/state")
def state() -> Dict[str, Any]:
    """Everything the tab shows: the hooks, what did not load, the roots; or why not."""
    try:
        status, hooks, address = _call("GET", "/v1/hooks")
        _, health, _ = _call("GET", "/healthz")
    except ServiceDown as exc:
        return {"running": False, "problem": str(exc)}
    if status != 200:
        return {"running": False, "problem": "the service answered %d: %s" % (status, hooks)}
    return {"running": True, "address": address, "version": health.get("version"), **hooks}


@router.get("/notices")
def notices(after: int = 0) -> Dict[str, Any]:
    """The service's notices numbered above ``after`` (the live tail); none while it is down
    (``/state`` says why)."""
    try:
        status, data, _ = _call("GET", "/v1/notices?after=%d" % max(0, after))
    except ServiceDown as exc:
        return {"notices": [], "last": 0, "running": False, "problem": str(exc)}
    return _answer(status, data)


@router.get("/review/{name}")
def review(name: str) -> Dict[str, Any]:
    """What approving hook ``name`` would cover: its files and their SHA-256."""
    try:
        status, data, _ = _call("GET", "/v1/hooks/%s/review" % _name(name))
    except ServiceDown as exc:
        raise HTTPException(status_code=503, detail=str(exc))
    return _answer(status, data)


def _action(path: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    payload = json.dumps(body).encode("utf-8") if body is not None else None
    try:
        status, data, _ = _call("POST", path, payload, timeout=ACTION_TIMEOUT)
    except ServiceDown as exc:
        raise HTTPException(status_code=503, detail=str(exc))
    return _answer(status, data)


@router.post("/reload")
def reload() -> Dict[str, Any]:
    """Rescan the hook roots now."""
    return _action("/v1/reload")


@router.post("/hooks/{name}/enable")
def enable(name: str, body: Dict[str, Any] = Body(default={})) -> Dict[str, Any]:
    """``hermes-hooks enable NAME``: approve (``reviewed``: the digest the operator was shown).
    The digest is required here (issue 57 row 4): the dashboard's session token is in the page it
    serves to anyone on this machine who can reach its port (a confined hook granted that port,
    another user), so an enable says exactly what it enables, as shown by ``GET
    /review/{name}``."""
    reviewed = body.get("reviewed") if isinstance(body, dict) else None
    if not isinstance(reviewed, str) or not reviewed:
        raise HTTPException(
            status_code=400,
            detail="`reviewed` is required: the digest of GET /review/{name}, which the tab shows "
                   "before Approve (an enable says exactly what it enables)")
    return _action("/v1/hooks/%s/enable" % _name(name), {"reviewed": reviewed})


@router.post("/hooks/{name}/disable")
def disable(name: str) -> Dict[str, Any]:
    """``hermes-hooks disable NAME``."""
    return _action("/v1/hooks/%s/disable" % _name(name))


@router.get("/dead")
def dead(hook: str = "", limit: int = 100) -> Dict[str, Any]:
    """Fleet mode: the dead letters (of ``hook``), oldest first, as ``hermes-hooks dead list``
    shows them; the service answers ``not_fleet`` (404) when it is not a fleet edge."""
    query = {"limit": max(1, min(1000, limit))}
    if hook:
        query["hook"] = hook
    try:
        status, data, _ = _call("GET", "/v1/dead?" + urllib.parse.urlencode(query))
    except ServiceDown as exc:
        raise HTTPException(status_code=503, detail=str(exc))
    return _answer(status, data)


@router.post("/dead/replay")
def dead_replay(body: Dict[str, Any] = Body(default={})) -> Dict[str, Any]:
    """``hermes-hooks dead replay``: ``{"seqs": [N, ...]}`` or ``{"hook": NAME, "all": true}``;
    the service checks the rest."""
    if not isinstance(body, dict):
        raise HTTPException(status_code=400, detail="the body must be a JSON object")
    hook, seqs, every = body.get("hook"), body.get("seqs"), body.get("all")
    if hook is not None and not isinstance(hook, str):
        raise HTTPException(status_code=400, detail="`hook` must be a hook's name")
    if seqs is not None and (not isinstance(seqs, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in seqs)):
        raise HTTPException(status_code=400, detail="`seqs` must be a list of sequences")
    if every is not None and not isinstance(every, bool):
        raise HTTPException(status_code=400, detail="`all` must be true or false")
    request = {k: v for k, v in (("hook", hook), ("seqs", seqs), ("all", every)) if v is not None}
    return _action("/v1/dead/replay", request)
