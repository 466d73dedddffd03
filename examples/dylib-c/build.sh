#!/bin/sh
# Builds this hook and installs it as a ready hook directory (HOOK.yaml + handler.so):
#   examples/dylib-c/build.sh ~/.hermes/hooks/c-counter
# Environment: CC (default cc), CFLAGS (default -O2).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: build.sh DEST_DIR, e.g. ~/.hermes/hooks/c-counter}
case "$(uname -s)" in
  Darwin) ext=dylib; shared="-dynamiclib" ;;
  *) ext=so; shared="-shared" ;;
esac
mkdir -p "$dest"
# Build next to the target, then rename: the service never sees a half-written library.
# shellcheck disable=SC2086 # CFLAGS is a list of words
"${CC:-cc}" ${CFLAGS:--O2} -Wall -Wextra -fPIC $shared -o "$dest/.handler.$ext.tmp" "$here/handler.c"
mv -f "$dest/.handler.$ext.tmp" "$dest/handler.$ext"
cp "$here/HOOK.yaml" "$dest/.HOOK.yaml.tmp"
mv -f "$dest/.HOOK.yaml.tmp" "$dest/HOOK.yaml"
echo "installed $dest/handler.$ext"
