#!/usr/bin/env bash
# The Hooks tab in the real Hermes dashboard (issue 39): hermes-agent (pinned) serves the
# dashboard with our plugin installed by `hermes-hooks dashboard install`, and Debian's chromium,
# driven by Playwright from pip, checks the tab (tests/dashboard/check_tab.py says what).
# Screenshots are kept under the system temp dir ($TMPDIR/hermes-hooks-dashboard) as the CI
# artifact.
#
# Usage: .ci/dashboard.sh [HERMES_HOOKS_BIN]   (default target/debug/hermes-hooks)
#        DASHBOARD_DOCS_IMAGE=docs/dashboard-hooks.png .ci/dashboard.sh   (also refresh the docs' image)
#        DASHBOARD_DOCS_DIR=docs .ci/dashboard.sh   (also refresh docs/dashboard-hooks-1280.png and -390.png)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/hermes-hooks}
target=${CARGO_TARGET_DIR:-$PWD/target}
say() { printf 'dashboard.sh: %s\n' "$*" >&2; }

if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
# The venv with hermes-agent pinned: the real-gateway test's script when it exists (issue 36),
# else our own, made the same way.
venv=$target/hermes-agent-venv
if [ -x .ci/hermes-agent-venv.sh ]; then
  .ci/hermes-agent-venv.sh "$venv"
elif [ ! -x "$venv/bin/hermes" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'hermes-agent==0.19.0'
fi
# Playwright drives the system chromium (its own browser download is not used); the plugin's
# backend imports the gateway's client, installed into the dashboard's Python as an operator would.
"$venv/bin/python" -c 'import playwright' 2>/dev/null || "$venv/bin/pip" install -q 'playwright==1.65.2'
"$venv/bin/pip" install -q --no-deps --force-reinstall ./clients/python
[ -x "$bin" ] || cargo build
out=${TMPDIR:-/tmp}/hermes-hooks-dashboard
rm -rf "$out"
"$venv/bin/python" tests/dashboard/check_tab.py --bin "$bin" --hermes "$venv/bin/hermes" \
  --chromium "$(command -v chromium)" --out "$out" ${DASHBOARD_DOCS_IMAGE:+--docs-image "$DASHBOARD_DOCS_IMAGE"} \
  ${DASHBOARD_DOCS_DIR:+--docs-dir "$DASHBOARD_DOCS_DIR"}
say "screenshots: $out"
# A web page on another origin (and a DNS-rebound name) cannot drive the service (issue 46).
"$venv/bin/python" tests/dashboard/cross_origin.py --bin "$bin" --chromium "$(command -v chromium)"
# The tab's backend proves the service before its token leaves (issue 46).
"$venv/bin/python" tests/dashboard/impostor.py --bin "$bin"
