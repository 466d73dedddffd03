"""Answers every /status with a refusal the user sees."""


def handle(event_type, context):
    return {"decision": "deny", "message": "hh-deny: /status is closed here"}
