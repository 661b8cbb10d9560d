#!/usr/bin/env bash
# A short CoMAS run on SmolLM2-135M-Instruct, then its agent 0 evaluated like the baseline: the
# "after training" side of docs/experiments/eval-baseline.md. The training job is the speed
# issue's step (scripts/bench-smollm2-step.sh: 2 LoRA agents, 16 episodes a step of one-step
# addition problems), run for STEPS steps; the evaluation is the built-in two-step arithmetic
# benchmark under the four setups (BENCHES to change), report in docs/experiments/eval-trained.md.
#
#   bash experiments/eval-baseline/train-and-eval.sh     # STEPS=5
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
steps=${STEPS:-5}
train=$root/runs/eval-baseline/train
STEPS=$steps CHECKPOINT=false OUT=$train bash scripts/bench-smollm2-step.sh
NO_BUILD=1 LABEL=trained BENCHES=${BENCHES:-arithmetic} MODEL_ARGS="--job-dir $train/run --agent 0" \
  bash experiments/eval-baseline/run.sh
