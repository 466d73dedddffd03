#!/usr/bin/env bash
# Install time of the hermes-hooks wheel (issue 26) against the pure-Python client, in alternating
# rounds, each into a fresh venv (venv creation not timed), offline: `pip install --no-index
# --no-deps`. Prints the wheel's size, then the median and every round for both.
# Usage: benches/wheel_install.sh WHEEL [ROUNDS]   (build the wheel with `maturin build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$1
rounds=${2:-7}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ms() { echo $(( $(date +%s%N) / 1000000 )); }
# The pure client as a wheel too, so both installs do the same work (no build step timed).
python3 -m pip wheel -q --no-deps -w "$tmp/pure" ./clients/python >/dev/null
pure=$(ls "$tmp"/pure/*.whl)
echo "wheel: $(basename "$wheel") $(stat -c %s "$wheel") bytes; installed binary $(unzip -l "$wheel" | awk '/data\/scripts\/hermes-hooks$/ {print $1}') bytes"
echo "pure client: $(basename "$pure") $(stat -c %s "$pure") bytes"
a=(); b=()
for i in $(seq "$rounds"); do
  for kind in wheel pure; do
    rm -rf "$tmp/venv"; python3 -m venv "$tmp/venv"
    file=$wheel; [ $kind = pure ] && file=$pure
    t0=$(ms); "$tmp/venv/bin/pip" install -q --no-index --no-deps "$file"; t1=$(ms)
    if [ $kind = wheel ]; then a+=($((t1 - t0))); else b+=($((t1 - t0))); fi
  done
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
echo "wheel install ms: median $(median "${a[@]}"), rounds ${a[*]}"
echo "pure client install ms: median $(median "${b[@]}"), rounds ${b[*]}"
