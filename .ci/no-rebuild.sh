#!/usr/bin/env bash
# The service's build depends only on its sources and Cargo.lock, never on the machine
# (issue 60 row 1): builds the library and the binary, then builds them again with another PATH
# (an extra empty directory first), another HOME, CI flipped and, as root under CI, /etc/passwd
# and /etc/group touched (what adding a user does to them), and fails if anything recompiles.
# What the test machine has is probed by crates/testenv, a dev-dependency: a changed PATH
# rebuilds the test targets only.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --bin hermes-hooks --message-format=json-render-diagnostics >/dev/null

scratch=$(mktemp -d)
mkdir -p "$scratch/bin" "$scratch/home"
touched=()
if [ -n "${CI:-}" ] && [ "$(id -u)" = 0 ]; then
  for f in /etc/passwd /etc/group; do
    touch -r "$f" "$scratch/$(basename "$f").mtime" && touch "$f" && touched+=("$f")
  done
fi
restore() {
  for f in "${touched[@]}"; do
    touch -r "$scratch/$(basename "$f").mtime" "$f"
  done
  rm -rf "$scratch"
}
trap restore EXIT

# cargo and rustup find their homes through HOME unless told: keep them where they are.
export CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
if [ -n "${CI:-}" ]; then flip=(env -u CI); else flip=(env CI=1); fi
"${flip[@]}" PATH="$scratch/bin:$PATH" HOME="$scratch/home" \
  cargo build --bin hermes-hooks --message-format=json-render-diagnostics >"$scratch/second.json"

# Every unit of the second build must be fresh: one that is not names what the build depended on.
python3 - "$scratch/second.json" <<'EOF'
import json, sys

rebuilt = []
units = 0
with open(sys.argv[1]) as f:
    for line in f:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") in ("compiler-artifact", "build-script-executed"):
            units += 1
            if msg.get("reason") == "compiler-artifact" and not msg.get("fresh", False):
                rebuilt.append(msg.get("package_id", "?") + " " + msg["target"]["name"])
if units == 0:
    sys.exit("no-rebuild: cargo reported no units: cannot tell")
if rebuilt:
    sys.exit(
        "no-rebuild: another PATH/HOME/CI (or /etc/passwd touched) recompiled:\n  "
        + "\n  ".join(rebuilt)
    )
print(f"no-rebuild: {units} units, all fresh with another PATH, HOME and CI")
EOF
