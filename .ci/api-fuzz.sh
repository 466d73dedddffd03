#!/usr/bin/env bash
# API fuzzing: schemathesis against the real service on the example hooks, once without a token
# and once with --token-file. Fails on any 5xx, any answer that does not match docs/openapi.json,
# any schema-valid request refused or schema-violating request accepted, and (with the token) any
# route that does not enforce it. Every service started here is stopped on exit, even on failure.
#
# Usage: .ci/api-fuzz.sh [path to the hermes-hooks binary]   (default: target/debug/hermes-hooks)
# Env:   API_FUZZ_EXAMPLES (default 60 per operation and phase), API_FUZZ_SEED (default: random;
#        the seed is printed so a failure can be replayed), API_FUZZ_BUDGET (seconds per run,
#        default 75: both runs stay under three minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

SCHEMATHESIS_VERSION=4.32.5
bin=$(realpath -m "${1:-target/debug/hermes-hooks}")
examples=${API_FUZZ_EXAMPLES:-60}
budget=${API_FUZZ_BUDGET:-75} # seconds per run
seed=${API_FUZZ_SEED:-$RANDOM}
venv=target/api-fuzz-venv
work=$(mktemp -d "${TMPDIR:-/tmp}/hermes-api-fuzz.XXXXXX")

pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# schemathesis, pinned, in a venv under target/ so the system stays clean.
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi
[ -x "$bin" ] || cargo build --quiet
[ -x "$bin" ] || { echo "api-fuzz: no binary at $bin" >&2; exit 1; }

# Starts `serve` on 127.0.0.1:0 with the example hooks and a fresh HERMES_HOME; sets $addr once
# it answers /readyz.
start() {
  local name=$1; shift
  mkdir -p "$work/$name/home"
  # A copy of the example hooks: `POST /v1/hooks/{name}/disable` edits a hook's HOOK.yaml, and the
  # fuzzer must not edit the checkout's.
  cp -a "$root/hooks-examples" "$work/$name/hooks"
  : >"$work/$name/stderr" # exists before the service opens it, for the sed below
  HERMES_HOME="$work/$name/home" HERMES_HOOKS_LOG=warn,hermes_hooks::service=info \
    "$bin" serve --hooks-dir "$work/$name/hooks" --listen 127.0.0.1:0 "$@" \
    >"$work/$name/stdout" 2>"$work/$name/stderr" &
  pids+=($!)
  local pid=$! deadline=$((SECONDS + 60))
  addr=
  while [ -z "$addr" ]; do
    kill -0 "$pid" 2>/dev/null || { echo "api-fuzz: the service exited:" >&2; cat "$work/$name/stderr" >&2; exit 1; }
    [ $SECONDS -lt $deadline ] || { echo "api-fuzz: no listening address after 60s" >&2; exit 1; }
    addr=$(sed -n 's/.*listening on http:\/\/\([0-9.:]*\).*/\1/p' "$work/$name/stderr" | head -n1)
    [ -n "$addr" ] || sleep 0.05
  done
  until python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "http://$addr/readyz" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "api-fuzz: the service exited:" >&2; cat "$work/$name/stderr" >&2; exit 1; }
    [ $SECONDS -lt $deadline ] || { echo "api-fuzz: not ready after 60s" >&2; exit 1; }
    sleep 0.05
  done
}

# The checks and bounds common to both runs. `--max-examples` bounds each phase per operation
# (about 10 s per run with the default here, 30 s on a heavily loaded machine); `timeout` is the
# backstop, so the whole script stays under three minutes even when something hangs.
# Run from $work: schemathesis and hypothesis leave their caches in the working directory.
# One worker: Hypothesis is not thread-safe (its caches are shared by schemathesis's worker
# threads), and with two a CI run died in its own generation code ("Inconsistent results", a
# FlakyFailure raised while drawing POST /v1/dead/replay's body) with the service answering fine.
fuzz() {
  local status=0
  (cd "$work" && timeout "$budget" "$root/$venv/bin/schemathesis" \
    --config-file "$root/.ci/schemathesis.toml" run "$@" \
    --phases examples,coverage,fuzzing,stateful \
    --max-examples "$examples" --seed "$seed" --workers 1 \
    --request-timeout 10 --max-response-time 8 \
    --suppress-health-check too_slow,filter_too_much \
    --generation-database none --output-truncate true --no-color) 2>&1 |
    cut -c -2000 || status=$? # a failing case's curl line can be megabytes long
  if [ "$status" = 124 ]; then
    echo "api-fuzz: schemathesis did not finish within ${budget}s (a hung request, or a machine" \
      "too loaded for API_FUZZ_EXAMPLES=$examples)" >&2
  fi
  return "$status"
}

echo "api-fuzz: schemathesis $SCHEMATHESIS_VERSION, $examples examples per phase, seed $seed"

# Without a token: the document minus its security requirement is the contract of such a service.
start open
python3 - "$root/docs/openapi.json" "$work/openapi-open.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["security"] = []
json.dump(doc, open(sys.argv[2], "w"))
EOF
failed=()
fuzz "$work/openapi-open.json" --url "http://$addr" --checks all || failed+=("without a token")

# With --token-file: the document as it is (tests/it/openapi.rs checks the service serves exactly
# this file); every route but the probes must refuse a missing or wrong token.
token=$(python3 -c "import secrets; print(secrets.token_hex(16))")
printf '%s\n' "$token" >"$work/token.txt"
start token --token-file "$work/token.txt"
fuzz "$root/docs/openapi.json" --url "http://$addr" --checks all \
  -H "Authorization: Bearer $token" || failed+=("with --token-file")

if [ ${#failed[@]} -gt 0 ]; then
  for log in "$work"/*/stderr; do
    echo "--- the service's log ($log), last lines:" >&2
    tail -n 20 "$log" >&2
  done
  echo "api-fuzz: FAILED ($(IFS=,; echo "${failed[*]}")); replay with API_FUZZ_SEED=$seed .ci/api-fuzz.sh" >&2
  exit 1
fi
echo "api-fuzz: ok"
