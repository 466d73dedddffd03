"""Imports a package plain python3 lacks; works only with the gateway venv interpreter."""

import venv_only_pkg


def handle(event_type, context):
    return {"where": venv_only_pkg.WHERE}
