"""Raises on every event."""


def handle(event_type, context):
    raise RuntimeError("raiser always fails")
