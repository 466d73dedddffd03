"""The gateway's notion of the active profile home: a variable the tests can switch."""

import os

ACTIVE = {"home": None}


def get_hermes_home():
    return ACTIVE["home"] or os.environ.get("HERMES_HOME") or os.path.expanduser("~/.hermes")
