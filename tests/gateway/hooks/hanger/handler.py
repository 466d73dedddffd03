"""An async handler that never returns: the timeout must cut it."""

import asyncio


async def handle(event_type, context):
    await asyncio.sleep(3600)
