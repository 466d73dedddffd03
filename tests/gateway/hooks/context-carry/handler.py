"""Writes into the context on agent:start and reads it back on agent:end: a sync handler in the
gateway gets a private copy per event, so the mark does not carry over (issue 20)."""

SEEN = []


def handle(event_type, context):
    if event_type == "agent:start":
        context["carried"] = "set on start"
    else:
        SEEN.append(context.get("carried"))
