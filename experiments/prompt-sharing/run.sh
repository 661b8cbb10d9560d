#!/usr/bin/env bash
# Prompt sharing in the rollout worker, on and off, side by side on the learning study's `grpo`
# step (SmolLM2-135M-Instruct, 4 questions x 8 samples, settings-v2.json): ROUNDS rounds of
# STEPS training steps with sharing on (the worker's default) and off
# (COMAS_WORKER_SHARE_PROMPTS=false), in the order on, off, off, on, ... so that neither
# always runs first; each run is a fresh seed-1 run of learning-vs-trl/run.sh (no evaluation)
# under the heavy-work lock. `report.py` prints the step and rollout seconds of each.
#
#   COMAS_BIN=target/release/comas bash experiments/prompt-sharing/run.sh
#   ROUNDS=1 STEPS=2 ...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
runs=${RUNS:-runs/prompt-sharing}
rounds=${ROUNDS:-2}
steps=${STEPS:-4}
data=${DATA:-runs/learning-vs-trl-v2/data}
mkdir -p "$runs"
for ((r = 1; r <= rounds; r++)); do
  order="on off"
  ((r % 2 == 0)) && order="off on"
  for mode in $order; do
    dir="$runs/$mode-r$r"
    mkdir -p "$dir"
    if [ -f "$data/heldout.jsonl" ] && [ ! -f "$dir/data/heldout.jsonl" ]; then
      cp -r "$data" "$dir/data"
    fi
    share=true; [ "$mode" = off ] && share=false
    echo "prompt sharing round $r: $mode ($steps steps)" >&2
    COMAS_WORKER_SHARE_PROMPTS=$share STEPS=$steps RUNS=$dir SEEDS=1 SYSTEMS=comas EVAL=0 \
      KEEP= REPORT=none bash experiments/learning-vs-trl/run.sh
  done
done
python3 "$here/report.py" --runs "$runs" --out "$runs/timing.json"
