# session-webhook: POST session:start and session:reset as JSON to a URL taken from the environment.
#
# What it shows:
# - a webhook written in Python because its URL comes from the environment (SESSION_WEBHOOK_URL,
#   set in the service's environment). When the URL is fixed, no code is needed: the built-in
#   webhook kind does the same from HOOK.yaml alone, with retries:
#       events: ["session:start", "session:reset"]
#       url: https://example.org/hermes/session
#       secret_env: SESSION_WEBHOOK_SECRET
# - the same body and headers as that built-in kind, so one receiver verifies both:
#   body {"hook_event_name", "event", "context", "delivery_id", "timestamp"}; headers
#   Content-Type: application/json, X-Hermes-Event, X-Hermes-Delivery and, when
#   SESSION_WEBHOOK_SECRET is set, X-Hermes-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>
#   (stdlib hmac/hashlib). Receiver side, in Python:
#       expected = "sha256=" + hmac.new(secret, raw_body, hashlib.sha256).hexdigest()
#       ok = hmac.compare_digest(expected, request.headers["X-Hermes-Signature-256"])
# - skipped cleanly when not configured: without SESSION_WEBHOOK_URL the hook still loads, logs
#   once that it is off, and does nothing (no `requires:`, so `hermes-hooks check` passes anywhere);
# - network calls that never raise into the host: one attempt with a 5 s timeout, redirects not
#   followed, only http(s) URLs, every failure logged (print() lands in the service log under this
#   hook's name). The URL's path and query are never logged (they may hold a token).
#
# Stdlib only, CPython 3.9+.
import hashlib
import hmac
import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timezone

POST_TIMEOUT = 5.0  # seconds; HOOK.yaml gives the hook 15 s in all

URL = os.environ.get("SESSION_WEBHOOK_URL", "").strip()
SECRET = os.environ.get("SESSION_WEBHOOK_SECRET", "").encode("utf-8")

_said_off = False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx becomes an HTTPError instead of a silent re-send somewhere else."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def _where(url):
    """scheme://host[:port] only, for log lines."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = ":%d" % parts.port if parts.port else ""
    except ValueError:  # a port that is not a number
        port = ":?"
    return "%s://%s%s" % (parts.scheme, parts.hostname or "?", port)


def _say_off_once(reason):
    global _said_off
    if not _said_off:
        _said_off = True
        print("%s: session webhooks are off" % reason)


def post(url, body, event, delivery_id):
    """POST body; returns None on a 2xx answer, else a one-line reason. Never raises."""
    headers = {
        "Content-Type": "application/json",
        "X-Hermes-Event": event,
        "X-Hermes-Delivery": delivery_id,
        "User-Agent": "hermes-hooks-example/session-webhook",
    }
    if SECRET:
        headers["X-Hermes-Signature-256"] = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with _opener.open(request, timeout=POST_TIMEOUT) as response:
            response.read(65536)
            return None
    except urllib.error.HTTPError as exc:
        return "HTTP %d %s" % (exc.code, exc.reason)
    except Exception as exc:  # URLError, timeouts, resets: log, never raise into the host
        return "%s: %s" % (type(exc).__name__, exc)


def handle(event_type, context):
    if not URL:
        _say_off_once("SESSION_WEBHOOK_URL is not set in the service's environment")
        return None
    parts = urllib.parse.urlsplit(URL)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        _say_off_once("SESSION_WEBHOOK_URL is not an http:// or https:// URL")
        return None

    delivery_id = uuid.uuid4().hex
    body = json.dumps({
        "hook_event_name": event_type,
        "event": event_type,
        "context": context,
        "delivery_id": delivery_id,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    error = post(URL, body, event_type, delivery_id)
    if error is None:
        print("delivered %s (delivery %s, %s) to %s"
              % (event_type, delivery_id, "signed" if SECRET else "UNSIGNED", _where(URL)))
    else:
        print("delivery of %s to %s failed (delivery %s): %s" % (event_type, _where(URL), delivery_id, error))
    return None
