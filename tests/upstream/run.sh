#!/bin/sh
# Runs the upstream gateway's own hook tests twice: with its HookRegistry, then with ours
# substituted through the shim (python -m hermes_hooks.shim -m pytest ...). Not run in CI: it
# needs upstream's tests (not in the PyPI package) and its test dependencies.
#
#   tests/upstream/run.sh UPSTREAM [PYTEST_ARGS...]
#
# UPSTREAM is a hermes-agent checkout, or a directory holding just its `tests/` (then the gateway
# is the one installed in PYTHON's environment, e.g. the venv of .ci/hermes-agent-venv.sh with
# hermes-agent 0.19.0 from PyPI). PYTHON (default: python3) must have hermes-agent's
# dependencies, pytest and pytest-asyncio (e.g. `pip install pytest==9.0.2 pytest-asyncio==1.3.0`
# into that venv, or a venv with `pip install -e UPSTREAM_CHECKOUT pytest pytest-asyncio`). The selection is
# tests/gateway/test_hooks.py, every test file that names gateway.hooks, HookRegistry,
# emit_collect or hooks.emit(, and the session-boundary and `hermes hooks` CLI tests.
# The result at upstream commit 306e2d2 is in docs/hook-authors.md ("Upstream's own tests").
set -eu
if [ $# -lt 1 ] || [ ! -d "$1/tests/gateway" ]; then
    echo "usage: $0 UPSTREAM [PYTEST_ARGS...]  (a hermes-agent checkout, or its tests/ alone)" >&2
    exit 2
fi
upstream=$(cd "$1" && pwd)
shift
here=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
cd "$upstream"
files=$( (grep -rlE 'gateway\.hooks|HookRegistry|emit_collect|hooks\.emit\(|_hooks\.emit' tests \
            --include='*.py'; ls tests/gateway/test_hooks.py tests/gateway/test_session_boundary_hooks.py \
            tests/hermes_cli/test_hooks_cli.py 2>/dev/null) | sort -u)
echo "== upstream's own HookRegistry" >&2
"$python" -m pytest -q -p no:cacheprovider $files "$@" | tail -n 3 || true
echo "== hermes_hooks substituted through the shim" >&2
HERMES_HOOKS_SHIM=1 PYTHONPATH="$here/clients/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$python" -m hermes_hooks.shim -m pytest -q -p no:cacheprovider -rf $files "$@" \
    | grep -E '^(FAILED|ERROR)|passed|failed' || true
