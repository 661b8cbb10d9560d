#!/usr/bin/env bash
# The fleet bench (cli/benches/fleet.rs) with two coordinator binaries taking turns under the
# same bench binary, so that a change to the coordinator is measured side by side:
#   bash scripts/bench-fleet-ab.sh OLD_COMAS [ROUNDS]
# OLD_COMAS is a `comas` release binary built before the change (keep a copy of
# target/release/comas before building the new one); the new one is this checkout's. Run it
# alone on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bash scripts/bench-fleet-ab.sh OLD_COMAS [ROUNDS]}
rounds=${2:-3}
[[ -x "$old" ]] || { echo "$old is not an executable comas binary" >&2; exit 2; }
cargo bench -p comas --bench fleet --no-run 2>&1 | tail -1
bench=$(ls -t target/release/deps/fleet-* | grep -v '\.d$' | head -1)
new=$(mktemp -d)/comas
cp target/release/comas "$new"
# The bench starts target/release/comas: each round puts one binary there, then the other.
trap 'cp "$new" target/release/comas' EXIT
for i in $(seq 1 "$rounds"); do
  for which in old new; do
    if [[ $which == old ]]; then cp "$old" target/release/comas; else cp "$new" target/release/comas; fi
    echo "== $which, round $i, $(date -u +%FT%TZ)"
    "$bench" 2>&1 | grep -E '^\| (10|100|1000) |scale-down'
  done
done
