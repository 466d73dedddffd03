# forum-thread-reply: reply in the right place - the forum topic the conversation happened in.
#
# What it shows:
# - thread awareness from the context of agent:end (also in agent:start and message:pre_route):
#   `chat_id`, `thread_id` and `chat_type`. When chat_type is "forum" and thread_id is not empty,
#   the reply goes to that topic (Telegram: `message_thread_id=int(thread_id)`); in every other
#   case (private chat, group, a thread_id that is not a number) it goes to the chat itself;
# - what a hook can and cannot do: it runs in its own process and gets a JSON copy of the context,
#   not the gateway's adapters, so it cannot "reply" through the gateway. It records the Telegram
#   sendMessage payload it would send, one JSON line per event, in
#   $HERMES_HOME/logs/forum-replies.jsonl, and sends it for real through the Bot API only when
#   TELEGRAM_BOT_TOKEN is set and the event comes from platform "telegram";
# - Telegram's "message thread not found" (a deleted topic, or the General topic, which cannot be
#   addressed by id): the send is retried once without message_thread_id, as the gateway's own
#   Telegram adapter does;
# - network calls that never raise into the host: stdlib urllib, a 5 s timeout, failures logged.
#   TELEGRAM_API_BASE (default https://api.telegram.org) points it at another Bot API server.
#
# Careful: the gateway already delivers the agent's answer. With TELEGRAM_BOT_TOKEN set (e.g. for
# long-task-alert), this example posts one extra message per agent:end; set `enabled: false` in
# HOOK.yaml (`hermes-hooks disable forum-thread-reply`) if you only wanted the demo.
#
# Stdlib only, CPython 3.9+. print() lands in the service log under this hook's name.
import json
import os
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

HERMES_HOME = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes")
LOG = HERMES_HOME / "logs" / "forum-replies.jsonl"
TOKEN = os.environ.get("TELEGRAM_BOT_TOKEN", "").strip()
API_BASE = (os.environ.get("TELEGRAM_API_BASE") or "https://api.telegram.org").rstrip("/")
SEND_TIMEOUT = 5.0

_said_dry_run = False


def reply_target(context):
    """The sendMessage addressing for this conversation: chat_id, plus message_thread_id in a forum topic."""
    target = {"chat_id": context.get("chat_id")}
    thread_id = str(context.get("thread_id") or "").strip()
    if context.get("chat_type") == "forum" and thread_id:
        try:
            target["message_thread_id"] = int(thread_id)
        except ValueError:
            print("thread_id %r is not a number; replying to the chat itself" % thread_id)
    return target


def reply_text(context):
    model = context.get("model") or "the agent"
    provider = context.get("provider")
    return "Answered by %s%s (session %s)" % (
        model, " via %s" % provider if provider else "", context.get("session_id") or "-")


def _redact(text):
    return text.replace(TOKEN, "<token>") if TOKEN else text


def send_message(payload):
    """POST sendMessage; returns None on success, else a one-line reason. Never raises."""
    if not API_BASE.startswith(("https://", "http://")):
        return "TELEGRAM_API_BASE must start with https:// or http://"
    request = urllib.request.Request(
        "%s/bot%s/sendMessage" % (API_BASE, TOKEN), method="POST",
        data=json.dumps(payload).encode("utf-8"), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=SEND_TIMEOUT) as response:
            answer = json.loads(response.read().decode("utf-8") or "{}")
        return None if answer.get("ok") else "Bot API answered ok=false: %s" % answer.get("description")
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read().decode("utf-8")).get("description")
        except Exception:
            detail = None
        return _redact("HTTP %d from the Bot API: %s" % (exc.code, detail or exc.reason))
    except Exception as exc:  # URLError, timeouts, resets, bad JSON: log, never raise into the host
        return _redact("%s: %s" % (type(exc).__name__, exc))


def deliver(payload):
    """Send, falling back to the chat itself when Telegram does not know the topic.
    Returns (error or None, whether the fallback was used)."""
    error = send_message(payload)
    if error and "thread not found" in error.lower() and "message_thread_id" in payload:
        print("topic %s not found in chat %s; retrying without message_thread_id"
              % (payload["message_thread_id"], payload["chat_id"]))
        error = send_message({k: v for k, v in payload.items() if k != "message_thread_id"})
        return error, True
    return error, False


def record(entry):
    try:
        LOG.parent.mkdir(parents=True, exist_ok=True)
        with LOG.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    except OSError as exc:
        print("cannot write %s: %s" % (LOG, exc.strerror or exc))


def handle(event_type, context):
    global _said_dry_run
    if not context.get("chat_id"):
        print("%s without chat_id: nowhere to reply" % event_type)
        return None
    payload = dict(reply_target(context), text=reply_text(context))
    entry = {
        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "event": event_type,
        "platform": context.get("platform"),
        "session_id": context.get("session_id"),
        "chat_type": context.get("chat_type"),
        "method": "sendMessage",
        "payload": payload,
        "sent": False,
    }
    if not TOKEN:
        if not _said_dry_run:
            _said_dry_run = True
            print("TELEGRAM_BOT_TOKEN is not set: recording reply payloads in %s without sending them" % LOG)
    elif context.get("platform") != "telegram":
        entry["skipped"] = "platform %r is not telegram" % context.get("platform")
    else:
        error, fell_back = deliver(payload)
        entry["sent"] = error is None
        if fell_back:
            entry["sent_without_thread"] = True
        if error:
            entry["error"] = error
            print("reply to chat %s failed: %s" % (payload["chat_id"], error))
        else:
            where = payload.get("message_thread_id")
            print("replied in chat %s%s" % (
                payload["chat_id"], " topic %s" % where if where and not fell_back else ""))
    record(entry)
    return None
