#!/usr/bin/env bash
# CoSIR's partial_table game on SmolLM2-135M-Instruct: three seats played by one shared LoRA
# policy, small generated tables (3 options x 3 criteria, scores 0-5), 2 rounds of messages
# then private finals, rewarded by the Bayesian evaluator (spec cosir.md). Guided tails end each
# message with one tag line and each final turn with a FINAL line, so the 135M model always
# says something the evaluator can score; which cell, which value and which option stay the
# model's choice. Evaluated on 12 held-out tables before and after training. Runs `comas local`,
# then writes docs/experiments/smollm2-cosir.md.
#
#   bash experiments/smollm2-cosir/run.sh                 # 15 steps
#   STEPS=1 bash experiments/smollm2-cosir/run.sh         # a smoke run
#   REPORT_ONLY=1 bash experiments/smollm2-cosir/run.sh   # rewrite the report from a finished run
#
# Knobs: STEPS (15), TABLES (4 per step), OUT (runs/smollm2-cosir), COMAS_BIN (a comas binary to
# use instead of building one). A finished run is not run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/smollm2-cosir"
steps=${STEPS:-15}
tables=${TABLES:-4}

cd "$root"
source experiments/prepare.sh

job="$out/job.toml"
cat > "$job" <<JOB
# Written by experiments/smollm2-cosir/run.sh.
name = "smollm2-cosir"
seed = 1
method = "cosir"

[schedule]
questions_per_step = $tables
steps = $steps

[rollout]
dtype = "bfloat16"

[output]
dir = "$out/out"
save_episodes = true

[eval]
every_steps = $steps
at_start = true
max_questions = 12
temperature = 0.7

[cosir]
options = 3
criteria = 3
criteria_names = ["price", "quality", "speed"]
agents = 3
max_score = 5
rounds = 2

[cosir.sampling]
temperature = 0.8
top_p = 0.95
max_new_tokens = 96
min_new_tokens = 1
guided_suffix = '\n(SHARE\((A|B|C), (price|quality|speed), [0-5]\)|REQUEST\((A|B|C), (price|quality|speed)\))'

[cosir.final_sampling]
temperature = 0.8
top_p = 0.95
max_new_tokens = 48
min_new_tokens = 1
guided_suffix = '\nFINAL\((A|B|C)\)'
JOB
lora_agent $((tables * 9 / 2)) 9 >> "$job"

if [ ! -f "$out/done" ] && [ -z "${REPORT_ONLY:-}" ]; then
  echo "== CoSIR on SmolLM2: $steps steps ($(date -u +%H:%M:%S))" >&2
  run_local_once "$job" "$out"
fi

metrics="$out/out/metrics.jsonl"
"$comas" plot "$metrics" -o "$figures/sharing.png" --panels sharing,rewards,training,times --title "CoSIR partial_table on SmolLM2-135M (one shared policy, 3 seats)" >&2
python3 "$here/report.py" "$metrics" "$out/out/episodes" "$steps" "$tables" "$(cat "$out/wall_seconds")" "$(nproc)" > "$report.part"
cat "$here/findings.md" >> "$report.part" 2>/dev/null || true
mv "$report.part" "$report"
echo "wrote $report" >&2
