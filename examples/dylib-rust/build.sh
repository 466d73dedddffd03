#!/bin/sh
# Builds this hook and installs it as a ready hook directory (HOOK.yaml + handler.so):
#   examples/dylib-rust/build.sh ~/.hermes/hooks/rust-pre-route
# Environment: CARGO_TARGET_DIR (default: the repository's target/), HERMES_HOOK_PROFILE
# (release, the default, or debug).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: build.sh DEST_DIR, e.g. ~/.hermes/hooks/rust-pre-route}
profile=${HERMES_HOOK_PROFILE:-release}
target_dir=${CARGO_TARGET_DIR:-$here/../../target}
case "$profile" in
  release) flag=--release ;;
  debug) flag= ;;
  *) echo "HERMES_HOOK_PROFILE must be release or debug" >&2; exit 2 ;;
esac
case "$(uname -s)" in
  Darwin) lib=libhermes_hook_example_rust.dylib; ext=dylib ;;
  *) lib=libhermes_hook_example_rust.so; ext=so ;;
esac
# shellcheck disable=SC2086 # $flag is empty or one word
"${CARGO:-cargo}" build $flag --manifest-path "$here/Cargo.toml" --target-dir "$target_dir"
mkdir -p "$dest"
# Library first, by rename: the service never sees a half-written file or a HOOK.yaml without it.
cp "$target_dir/$profile/$lib" "$dest/.handler.$ext.tmp"
mv -f "$dest/.handler.$ext.tmp" "$dest/handler.$ext"
cp "$here/HOOK.yaml" "$dest/.HOOK.yaml.tmp"
mv -f "$dest/.HOOK.yaml.tmp" "$dest/HOOK.yaml"
echo "installed $dest/handler.$ext"
