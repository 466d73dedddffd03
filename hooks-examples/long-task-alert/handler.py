# long-task-alert: a Telegram alert when an agent run gets long.
#
# What it shows:
# - a threshold on `agent:step`: when `iteration` reaches LONG_TASK_THRESHOLD (default 10, set with
#   `env:` in HOOK.yaml) the hook sends ONE Telegram message per session through the Bot API;
# - state kept between events: the set of sessions already alerted lives in this module, which
#   stays imported for the life of the hook's worker (a service restart, a reload of this hook or
#   a worker crash forgets it: a long session may then be alerted once more);
# - configuration from the environment, skipped cleanly when absent: TELEGRAM_BOT_TOKEN and
#   TELEGRAM_ALERT_CHAT_ID come from the service's environment. Without them the hook still loads
#   (they are NOT under `requires:`, so `hermes-hooks check` passes on any machine), logs once that
#   it is not configured, and does nothing;
# - network calls that never raise into the host: stdlib urllib, a 5 s timeout, every failure
#   logged (print() lands in the service log under this hook's name). A failed send is retried on
#   the session's next step, up to 3 attempts;
# - TELEGRAM_API_BASE (default https://api.telegram.org) points the hook at another Bot API server,
#   e.g. a local one for testing.
#
# Stdlib only, CPython 3.9+. Runs unmodified under the original in-gateway HookRegistry too.
import json
import os
import urllib.error
import urllib.request
from collections import OrderedDict

DEFAULT_THRESHOLD = 10
SEND_TIMEOUT = 5.0          # seconds per Bot API call; HOOK.yaml gives the hook 15 s in all
MAX_ATTEMPTS = 3            # sends tried per session before giving up on it
MAX_TRACKED = 10000         # sessions remembered (oldest forgotten first)


def _threshold():
    raw = os.environ.get("LONG_TASK_THRESHOLD", "")
    try:
        value = int(raw)
        if value > 0:
            return value
    except ValueError:
        pass
    if raw:
        print("LONG_TASK_THRESHOLD=%r is not a positive integer; using %d" % (raw, DEFAULT_THRESHOLD))
    return DEFAULT_THRESHOLD


THRESHOLD = _threshold()
TOKEN = os.environ.get("TELEGRAM_BOT_TOKEN", "").strip()
CHAT_ID = os.environ.get("TELEGRAM_ALERT_CHAT_ID", "").strip()
API_BASE = (os.environ.get("TELEGRAM_API_BASE") or "https://api.telegram.org").rstrip("/")

# session -> "sent", or the number of failed attempts so far
_sessions = OrderedDict()
_said_unconfigured = False


def _redact(text):
    """Error messages must never carry the bot token (it is part of the request URL)."""
    return text.replace(TOKEN, "<token>") if TOKEN else text


def send_telegram(chat_id, text):
    """POST sendMessage; returns None on success, else a one-line reason. Never raises."""
    if not API_BASE.startswith(("https://", "http://")):
        return "TELEGRAM_API_BASE must start with https:// or http://"
    url = "%s/bot%s/sendMessage" % (API_BASE, TOKEN)
    body = json.dumps({"chat_id": chat_id, "text": text}).encode("utf-8")
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=SEND_TIMEOUT) as response:
            answer = json.loads(response.read().decode("utf-8") or "{}")
        if answer.get("ok"):
            return None
        return "Bot API answered ok=false: %s" % answer.get("description")
    except urllib.error.HTTPError as exc:
        # Telegram explains a refusal in the JSON body: {"ok": false, "description": "..."}
        try:
            detail = json.loads(exc.read().decode("utf-8")).get("description")
        except Exception:
            detail = None
        return _redact("HTTP %d from the Bot API: %s" % (exc.code, detail or exc.reason))
    except Exception as exc:  # URLError, timeouts, resets, bad JSON: log, never raise into the host
        return _redact("%s: %s" % (type(exc).__name__, exc))


def _as_int(value):
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def handle(event_type, context):
    global _said_unconfigured
    if not (TOKEN and CHAT_ID):
        if not _said_unconfigured:
            _said_unconfigured = True
            missing = [n for n, v in (("TELEGRAM_BOT_TOKEN", TOKEN), ("TELEGRAM_ALERT_CHAT_ID", CHAT_ID)) if not v]
            print("not configured (%s unset in the service's environment): long-task alerts are off"
                  % " and ".join(missing))
        return None

    iteration = _as_int(context.get("iteration"))
    if iteration is None or iteration < THRESHOLD:
        return None
    session = context.get("session_id") or "%s:%s" % (context.get("platform"), context.get("user_id"))
    state = _sessions.get(session, 0)
    if state == "sent" or state >= MAX_ATTEMPTS:
        return None

    tools = context.get("tool_names") or []
    if isinstance(tools, (list, tuple)):
        tools = ", ".join(str(t) for t in tools)
    text = ("Long task: the agent reached step %d (threshold %d)\n"
            "session: %s\nplatform: %s, user: %s\nlast tools: %s") % (
        iteration, THRESHOLD, session, context.get("platform"), context.get("user_id"), tools or "-")

    error = send_telegram(CHAT_ID, text)
    if error is None:
        _sessions[session] = "sent"
        print("alert sent for session %s at step %d" % (session, iteration))
    else:
        _sessions[session] = state + 1
        tail = "will retry on the next step" if state + 1 < MAX_ATTEMPTS else "giving up on this session"
        print("alert for session %s failed (attempt %d/%d, %s): %s"
              % (session, state + 1, MAX_ATTEMPTS, tail, error))
    _sessions.move_to_end(session)
    while len(_sessions) > MAX_TRACKED:
        _sessions.popitem(last=False)
    return None
