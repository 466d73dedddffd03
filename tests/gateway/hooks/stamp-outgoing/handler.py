"""Wraps BasePlatformAdapter.send when imported: only works inside the gateway process."""

import logging

from gateway.platforms.base import BasePlatformAdapter

log = logging.getLogger(__name__)
_original_send = BasePlatformAdapter.send


async def _stamped_send(self, chat_id, text):
    return await _original_send(self, chat_id, text + " [stamped]")


BasePlatformAdapter.send = _stamped_send


def handle(event_type, context):
    log.info("send is wrapped")
