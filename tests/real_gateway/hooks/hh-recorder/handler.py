"""Appends each event, its context and the process it ran in to $HERMES_HOME/recorded.jsonl.

Imports httpx, a dependency of the gateway and not of a bare python3: the hook loads only in
the gateway's interpreter (what the original host gave every hook).
"""
import json
import os

import httpx  # noqa: F401  (the import is the point: see above)


def handle(event_type, context):
    line = json.dumps({"event": event_type, "context": context, "pid": os.getpid()},
                      sort_keys=True, default=repr)
    with open(os.path.join(os.environ["HERMES_HOME"], "recorded.jsonl"), "a") as f:
        f.write(line + "\n")
