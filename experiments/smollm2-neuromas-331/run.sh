#!/usr/bin/env bash
# NeuroMAS [3, 3, 1] on SmolLM2-135M-Instruct, two ways (spec neuromas.md §6, §7): trained from
# scratch, and grown with `comas grow` from the trained [2, 1] graph of
# experiments/smollm2-neuromas (run first if it has not been). Growth widens layer 1 from 2 to 3
# (the new node copies node 1's adapter and Adam moments) and inserts a layer of 3 before the
# readout (each node a copy of the node below it), read through identity wiring for BRIDGE steps.
# Both arms use the [2, 1] run's settings, data and held-out questions; each evaluates the graph
# before its first step (for the grown arm: just after growth) and every EVAL_EVERY steps.
# Writes docs/experiments/smollm2-neuromas-331.md.
#
#   SCRATCH_STEPS=8 bash experiments/smollm2-neuromas-331/run.sh  # as in the report: 16 grown, 8 scratch
#   STEPS=1 bash experiments/smollm2-neuromas-331/run.sh        # a smoke run
#   REPORT_ONLY=1 bash experiments/smollm2-neuromas-331/run.sh  # rewrite the report
#
# Knobs: STEPS (16), SCRATCH_STEPS (STEPS; the scratch arm's), BRIDGE (4), EVAL_EVERY (4), OUT
# (runs/smollm2-neuromas-331), COMAS_BIN.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/smollm2-neuromas-331"
steps=${STEPS:-16}
scratch_steps=${SCRATCH_STEPS:-$steps}
bridge=${BRIDGE:-4}
eval_every=${EVAL_EVERY:-4}

cd "$root"
source experiments/prepare.sh
small="$root/runs/smollm2-neuromas"
if [ ! -f "$small/done" ] && [ -z "${REPORT_ONLY:-}" ]; then
  echo "== the [2, 1] run first" >&2
  COMAS_BIN="$comas" bash experiments/smollm2-neuromas/run.sh
fi

# From scratch: the [2, 1] job with layers [3, 3, 1] and seven adapters.
mkdir -p "$out/scratch"
python3 - "$small/job.toml" "$out/scratch/job.toml" "$scratch_steps" "$eval_every" "$out/scratch/out" <<'PY'
import re, sys
src, dst, steps, every, outdir = sys.argv[1:6]
text = open(src).read()
head, first, *_ = re.split(r"(?m)^\[\[agents\]\]$", text)
text = head + ("[[agents]]" + first) * 7
text = text.replace('name = "smollm2-neuromas"', 'name = "smollm2-neuromas-331-scratch"')
text = re.sub(r"(?m)^layers = .*$", "layers = [3, 3, 1]", text)
text = re.sub(r"(?m)^steps = .*$", f"steps = {steps}", text)
text = re.sub(r"(?m)^every_steps = .*$", f"every_steps = {every}", text)
text = re.sub(r'(?m)^dir = ".*/out"$', f'dir = "{outdir}"', text)
open(dst, "w").write(text)
PY

# Grown: from the [2, 1] run's last checkpoints.
if [ ! -f "$out/grown/job.toml" ] && [ -z "${REPORT_ONLY:-}" ]; then
  "$comas" grow "$small/job.toml" --checkpoints "$small/run/checkpoints/agent-{agent}" --to 3,3,1 \
    --bridge-steps "$bridge" --name smollm2-neuromas-331-grown --out "$out/grown" > /dev/null 2> "$out/grow.log"
  sed -i "s/^steps = .*/steps = $steps/; s/^every_steps = .*/every_steps = $eval_every/" "$out/grown/job.toml"
fi

for arm in grown scratch; do
  if [ ! -f "$out/$arm/done" ] && [ -z "${REPORT_ONLY:-}" ]; then
    echo "== NeuroMAS [3, 3, 1] $arm on SmolLM2 ($(date -u +%H:%M:%S))" >&2
    run_local_once "$out/$arm/job.toml" "$out/$arm"
  fi
done

# Self-consistency with the base model (5 samples and an aggregating call), about the graph's
# call budget, on the same questions at the same temperature.
if [ ! -f "$out/base-consistency-0.7/summary.json" ] && [ -z "${REPORT_ONLY:-}" ]; then
  "$comas" eval --model "$model" --setup consistency --bench "$small/test-bench.jsonl" --temperature 0.7 --max-new-tokens 96 \
    --dtype bfloat16 --threads 2 --seed 1 --out "$out/base-consistency-0.7" > "$out/base-consistency-0.7.log" 2>&1
fi

for arm in grown scratch; do
  "$comas" plot "$out/$arm/out/metrics.jsonl" -o "$figures/$arm.png" --panels rewards,training,times \
    --title "NeuroMAS [3, 3, 1] $arm on SmolLM2-135M (one LoRA per node)" >&2
done
python3 "$here/report.py" "$small" "$out" "$steps" "$bridge" "$(nproc)" "$scratch_steps" > "$report.part"
cat "$here/findings.md" >> "$report.part" 2>/dev/null || true
mv "$report.part" "$report"
echo "wrote $report" >&2
