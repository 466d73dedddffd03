"""The running gateway, reachable through a module-level weak handle as in the real one."""

import weakref

from gateway.platforms.base import FakeChatAdapter

_runner = None


class GatewayRunner:
    def __init__(self):
        global _runner
        self.adapters = {"fakechat": FakeChatAdapter()}
        self.notes = []
        _runner = weakref.ref(self)


def _gateway_runner_ref():
    return _runner() if _runner is not None else None
