#!/usr/bin/env bash
# The time goal of issue 42 §3 (a comas step in at most a third of TRL's wall time, same
# settings, this machine), measured side by side: ROUNDS rounds of STEPS training steps of each
# system on the study's settings and data, one system after the other under the heavy-work lock
# (the order alternates between rounds, so neither always runs first), nothing else beside
# them. No evaluation. `timing.py` then prints each system's step seconds and their ratio.
#
#   bash experiments/learning-vs-trl/timing.sh
#   ROUNDS=1 STEPS=3 SETTINGS=experiments/learning-vs-trl/settings.json bash ...
#   COMAS_BIN=/path/to/comas ...   # a fixed binary (no build)
#
# Each round is a fresh seed-1 run of `run.sh` (EVAL=0) in its own folder; a finished round is
# not run again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
settings=${SETTINGS:-$here/settings-v2.json}
runs=${RUNS:-runs/learning-vs-trl-timing}
rounds=${ROUNDS:-2}
steps=${STEPS:-5}
data=${DATA:-runs/learning-vs-trl-v2/data}
mkdir -p "$runs"
for ((r = 1; r <= rounds; r++)); do
  order="comas trl"
  ((r % 2 == 0)) && order="trl comas"
  dir="$runs/round-$r"
  mkdir -p "$dir"
  # The study's data (run.sh makes it when the folder has none).
  if [ -f "$data/heldout.jsonl" ] && [ ! -f "$dir/data/heldout.jsonl" ]; then
    cp -r "$data" "$dir/data"
  fi
  for system in $order; do
    echo "timing round $r: $system ($steps steps)" >&2
    STEPS=$steps RUNS=$dir SEEDS=1 SYSTEMS=$system EVAL=0 KEEP= SETTINGS=$settings \
      REPORT=none bash "$here/run.sh"
  done
done
python3 "$here/timing.py" --runs "$runs" --rounds "$rounds"
