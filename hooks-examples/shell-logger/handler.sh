#!/bin/sh
# shell-logger: an executable hook. stdin carries one JSON object:
#   {"hook_event_name": "session:start", "event": "session:start", "context": {...}, "hook": "shell-logger"}
# We append it, wrapped with a timestamp, as one line to $HERMES_HOME/logs/shell-hook.log.
# Nothing is printed on stdout, so the hook contributes no result.
set -eu

log_dir="${HERMES_HOME:-$HOME/.hermes}/logs"
mkdir -p "$log_dir"

# JSON never has raw newlines inside strings, so dropping them keeps the object valid and on one line.
payload=$(tr -d '\r\n')
[ -n "$payload" ] || exit 0

printf '{"time":"%s","input":%s}\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$payload" \
    >> "$log_dir/${SHELL_HOOK_LOG:-shell-hook.log}"
