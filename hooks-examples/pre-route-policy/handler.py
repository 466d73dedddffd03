"""pre-route-policy: a decision hook for message:pre_route. "/switch <session_id>" asks the gateway to
route the message to that session; any other message returns None (no decision)."""

PREFIX = "/switch "


def handle(event_type, context):
    message = (context.get("message") or "").strip()
    if not message.startswith(PREFIX):
        return None
    target = message[len(PREFIX):].strip()
    if not target:
        return None
    return {"decision": "switch_session", "session_id": target}
