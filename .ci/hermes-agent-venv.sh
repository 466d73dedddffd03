#!/usr/bin/env bash
# A venv with the real gateway (issue 36): `hermes-agent==0.19.0` from PyPI, pinned, with the
# extra its `webhook` platform needs (`sms`: aiohttp, the platform's HTTP server), and our
# client (the `hermes_hooks` package and its `hermes-hooks-gateway` launcher).
#
# Usage: .ci/hermes-agent-venv.sh PATH [WHEEL]
#   PATH   the venv (created when missing, reused when present: e.g. target/hermes-agent-venv)
#   WHEEL  our wheel (as .ci/wheel.sh builds it) instead of clients/python; also taken from
#          $HERMES_HOOKS_WHEEL. Without it, clients/python is installed editable (the venv then
#          follows the worktree's client code), and the service binary is not in the venv: give
#          it with $HERMES_HOOKS_BIN (e.g. target/debug/hermes-hooks).
#
# Prints nothing on success; on failure, pip's output and the reason. Idempotent: the gateway is
# installed once (a stamp in the venv says what is installed); our part again only when it changed.
# The interpreter is the first of $HERMES_AGENT_PYTHON, python3, python3.13, python3.12, python3.11
# that hermes-agent accepts (3.11 to 3.13).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: .ci/hermes-agent-venv.sh PATH [WHEEL]}
wheel=${2:-${HERMES_HOOKS_WHEEL:-}}
gateway_spec='hermes-agent[sms]==0.19.0'
fail() { printf 'hermes-agent-venv.sh: FAILED: %s\n' "$*" >&2; exit 1; }

mkdir -p "$(dirname "$venv")"
venv=$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")
if [ -n "$wheel" ]; then
  [ -f "$wheel" ] || fail "no wheel at $wheel"
  ours="wheel $(sha256sum "$wheel" | cut -d' ' -f1)"
else
  # The metadata of an editable install (its entry points: the Hermes plugin, issue 49) is
  # made at install time: install again when clients/python/pyproject.toml changes.
  ours="editable $root/clients/python $(sha256sum "$root/clients/python/pyproject.toml" | cut -d' ' -f1)"
fi
stamp=$venv/.hermes-agent-venv
if [ -f "$stamp" ] && [ -x "$venv/bin/python" ] && [ "$(cat "$stamp")" = "$gateway_spec; $ours" ]; then
  exit 0
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" >>"$log" 2>&1 || {
  cat "$log" >&2; fail "pip $*"; }; }

if [ ! -x "$venv/bin/python" ]; then
  python=
  for candidate in ${HERMES_AGENT_PYTHON:-} python3 python3.13 python3.12 python3.11; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  [ -n "$python" ] || fail "no Python 3.11 to 3.13 (hermes-agent 0.19.0 needs one); set HERMES_AGENT_PYTHON"
  "$python" -m venv "$venv" >>"$log" 2>&1 || { cat "$log" >&2; fail "$python -m venv $venv"; }
fi
if ! grep -qF "$gateway_spec;" "$stamp" 2>/dev/null; then
  pip install "$gateway_spec"
fi
# Our part: the client alone or the wheel (service binary and client); never both at once (the
# two distributions hold the same package).
pip uninstall -y hermes-hooks hermes-hooks-client
if [ -n "$wheel" ]; then
  pip install --no-deps --force-reinstall "$wheel"
else
  pip install --no-deps -e "$root/clients/python"
fi
[ -x "$venv/bin/hermes-hooks-gateway" ] || fail "no hermes-hooks-gateway launcher in $venv/bin"
"$venv/bin/python" -c 'import gateway.hooks, gateway.platforms.webhook, aiohttp, hermes_hooks' \
  >>"$log" 2>&1 || { cat "$log" >&2; fail "the venv cannot import the gateway, aiohttp or hermes_hooks"; }
printf '%s; %s\n' "$gateway_spec" "$ours" > "$stamp"
