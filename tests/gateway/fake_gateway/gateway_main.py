"""A gateway entry point, unchanged by the shim: builds its registries from gateway.hooks and
prints which classes it got, plus what the hooks it loaded did."""

import asyncio
import json
import sys

from gateway.hooks import HookRegistry, ProfileHookRegistries
from gateway.run import GatewayRunner


async def main():
    runner = GatewayRunner()
    registry = HookRegistry()
    registry.discover_and_load()
    profiles = ProfileHookRegistries()
    adapter = runner.adapters["fakechat"]
    sent = await adapter.send("c1", "hello")
    out = {
        "registry": "%s.%s" % (type(registry).__module__, type(registry).__name__),
        "profiles": "%s.%s" % (type(profiles).__module__, type(profiles).__name__),
        "hooks": [h.get("name") for h in registry.loaded_hooks],
        "sent": sent,
    }
    close = getattr(registry, "close", None)
    if close is not None:
        close(0)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
