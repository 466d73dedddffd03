#!/usr/bin/env bash
# The hermes-hooks wheel (issue 26), end to end: build it (release, maturin bin bindings), install
# it into a clean venv with a `cargo` on PATH that fails loudly (installing must build nothing),
# then run a gateway-like script through the wheel's `hermes-hooks-gateway` launcher with one
# environment variable (HERMES_HOOKS_SHIM=1): the bundled service must start, the hook must
# handle the event, and once the gateway has exited no process of the service may be left (it
# stops itself after the default 30 s linger; this waits for that).
#
# Usage: .ci/wheel.sh            (CARGO_TARGET_DIR is honoured; work files go under it)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}
work=$target/wheel-ci
rm -rf "$work"
mkdir -p "$work"

ms() { echo $(( $(date +%s%N) / 1000000 )); }
say() { printf 'wheel.sh: %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

# The build tool, pinned, in its own venv (only building needs it, never installing).
tools=$target/wheel-tools
if [ ! -x "$tools/bin/maturin" ]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q 'maturin==1.16.0'
fi

t0=$(ms)
"$tools/bin/maturin" build --release --locked -o "$work/dist" >&2
t1=$(ms)
wheel=$(ls "$work"/dist/hermes_hooks-*.whl)
say "built $(basename "$wheel"): $(( $(stat -c %s "$wheel") / 1024 )) KiB in $(( (t1 - t0) / 1000 )) s"

# A clean venv, and a PATH whose cargo, rustc and maturin fail loudly and leave a mark. (pip
# itself runs `rustc --version` for its User-Agent string: that probe is answered with a
# failure and not counted; any other use of the toolchain is.)
python3 -m venv "$work/venv"
mkdir -p "$work/stub"
for tool in cargo rustc maturin; do
  cat > "$work/stub/$tool" <<EOF
#!/bin/sh
if [ "$tool" = rustc ] && [ "\$*" = --version ]; then exit 1; fi
echo "wheel.sh: $tool was called while installing the wheel: \$*" >&2
echo "$tool \$*" >> "$work/toolchain-called"
exit 97
EOF
  chmod +x "$work/stub/$tool"
done
clean_path=$work/stub:/usr/local/bin:/usr/bin:/bin
t0=$(ms)
PATH=$clean_path "$work/venv/bin/pip" install -q --no-index --no-deps "$wheel"
t1=$(ms)
[ ! -e "$work/toolchain-called" ] || fail "the Rust toolchain was called at install time: $(cat "$work/toolchain-called")"
say "installed in $(( t1 - t0 )) ms (pip install --no-index --no-deps)"
[ -x "$work/venv/bin/hermes-hooks" ] || fail "no hermes-hooks binary in the venv's bin"
[ -x "$work/venv/bin/hermes-hooks-gateway" ] || fail "no hermes-hooks-gateway launcher"
PATH=$clean_path "$work/venv/bin/hermes-hooks" --version >&2

# A gateway-like layout: gateway/hooks.py with its own HookRegistry, a run script that uses it,
# and a hook in $HERMES_HOME/hooks that leaves a file behind.
home=$work/home
gw=$work/gateway
mkdir -p "$gw/gateway" "$home/hooks/ci-marker"
chmod 700 "$home"
: > "$gw/gateway/__init__.py"
cat > "$gw/gateway/hooks.py" <<'EOF'
"""Stands in for the gateway's own hook registry (runs hooks in process)."""


class HookRegistry:
    def discover_and_load(self):
        raise SystemExit("the gateway's own HookRegistry ran: the shim did not replace it")
EOF
cat > "$gw/run.py" <<'EOF'
"""A gateway's start-up as far as hooks go: build the registry, load, emit, carry on."""
import asyncio
import os
import sys
import time

from gateway.hooks import HookRegistry


async def main() -> None:
    hooks = HookRegistry()
    hooks.discover_and_load()
    print("registry:", type(hooks).__module__, [h["name"] for h in hooks.loaded_hooks])
    await hooks.emit("agent:start", {"platform": "ci", "user_id": "42"})
    marker = os.path.join(os.environ["HERMES_HOME"], "handled.json")
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
        if time.monotonic() > deadline:
            sys.exit("the hook did not handle the event within 60 s")
        await asyncio.sleep(0.05)
    proc = hooks.service_process
    print("service:", proc.args[0] if proc else None)
    print("handled:", open(marker).read())


asyncio.run(main())
EOF
cat > "$home/hooks/ci-marker/HOOK.yaml" <<'EOF'
name: ci-marker
description: Leaves the event's context in $HERMES_HOME/handled.json
events: ["agent:start"]
EOF
cat > "$home/hooks/ci-marker/handler.py" <<'EOF'
import json
import os


def handle(event_type, context):
    path = os.path.join(os.environ["HERMES_HOME"], "handled.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"event": event_type, "context": context}, f)
    os.replace(path + ".tmp", path)
EOF

# The switch-over: the launcher and one variable (HERMES_HOME is the gateway's own).
out=$work/gateway.out
if ! (cd "$gw" && env -i PATH="$clean_path" HOME="$HOME" HERMES_HOME="$home" \
      HERMES_HOOKS_SHIM=1 "$work/venv/bin/hermes-hooks-gateway" run.py) > "$out" 2>&1; then
  cat "$out" >&2
  cat "$home/logs/hooks.log" >&2 2>/dev/null || true
  fail "the gateway-like script failed"
fi
cat "$out" >&2
grep -q "^registry: hermes_hooks.registry \['ci-marker'\]" "$out" || fail "the shim's registry did not list the hook"
grep -qx "service: $work/venv/bin/hermes-hooks" "$out" || fail "the service was not the bundled binary"
grep -q '"user_id": "42"' "$home/handled.json" || fail "the hook did not see the event's context"
grep -q "listening on unix:$home/hooks.sock" "$home/logs/hooks.log" || fail "no service log in \$HERMES_HOME/logs/hooks.log"

# The gateway has exited: the service goes after its linger (30 s by default), with its workers.
t0=$(date +%s)
while pgrep -f "$work" >/dev/null; do
  if [ $(( $(date +%s) - t0 )) -gt 90 ]; then
    pgrep -af "$work" >&2
    for pid in $(pgrep -f "$work/venv/bin/hermes-hooks serve"); do kill "$pid" || true; done
    fail "processes of the autostarted service are left 90 s after the gateway exited"
  fi
  sleep 0.5
done
grep -q "no gateway has held the lease" "$home/logs/hooks.log" || fail "the service did not stop by its lease"
say "ok: the service stopped $(( $(date +%s) - t0 )) s after the gateway exited; nothing is left"
