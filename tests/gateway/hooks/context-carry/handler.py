"""Uses the real context dict: what agent:start writes, agent:end reads (same dict object)."""

SEEN = []


def handle(event_type, context):
    if event_type == "agent:start":
        context["carried"] = "set on start"
    else:
        SEEN.append(context.get("carried"))
