"""Logs the way real hooks do: a module logger, no print."""

import logging

logger = logging.getLogger(__name__)
logger.info("chatty imported")


def handle(event_type, context):
    logger.info("info line for %s", event_type)
    logger.warning("warning line for %s", event_type)
    logging.getLogger("some.library").info("a library speaks")
    logger.debug("debug line that stays hidden")
    return "logged"
