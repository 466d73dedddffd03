"""An original-style in-process hook registry (the thing the client replaces).

It only records that it was used, so a test can tell which class the gateway got."""

import os


class HookRegistry:
    origin = "gateway"

    def __init__(self):
        self.loaded_hooks = []

    def discover_and_load(self):
        pass

    async def emit(self, event_type, context=None):
        pass

    async def emit_collect(self, event_type, context=None):
        return []


class ProfileHookRegistries(HookRegistry):
    """One registry per profile home; here it only needs to exist."""

    def home(self):
        return os.environ.get("HERMES_HOME", "")
