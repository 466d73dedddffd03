"""Appends each event it sees in the gateway's process to $HERMES_HOME/in_gateway.jsonl.

Called inline by the gateway (in both hosts), so its file is the list of what the gateway
emitted, in order, each with the gateway's own context.
"""
import json
import os
import sys


def handle(event_type, context):
    line = json.dumps({"event": event_type, "context": context, "pid": os.getpid(),
                       "gateway_loaded": "gateway.run" in sys.modules},
                      sort_keys=True, default=repr)
    with open(os.path.join(os.environ["HERMES_HOME"], "in_gateway.jsonl"), "a") as f:
        f.write(line + "\n")
