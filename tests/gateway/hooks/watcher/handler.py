"""Schedules a watcher with asyncio.create_task that outlives the call and ticks on the
gateway loop, writing into the live runner."""

import asyncio

from gateway.run import _gateway_runner_ref

_tasks = []


async def _watch():
    while True:
        runner = _gateway_runner_ref()
        if runner is not None:
            runner.notes.append(("watcher", "tick"))
        await asyncio.sleep(0.02)


async def handle(event_type, context):
    _tasks.append(asyncio.create_task(_watch()))
