"""Sleeps 0.5 s in a plain def handler, then leaves a mark on the runner."""

import time

import gateway.run


def handle(event_type, context):
    time.sleep(0.5)
    gateway.run._gateway_runner_ref().notes.append(("slow-sync", event_type))
