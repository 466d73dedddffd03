"""Reaches the running gateway through gateway.run._gateway_runner_ref() inside handle."""


def handle(event_type, context):
    from gateway.run import _gateway_runner_ref

    runner = _gateway_runner_ref()
    runner.notes.append(("runner-peek", event_type, sorted(runner.adapters)))
