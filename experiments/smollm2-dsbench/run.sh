#!/usr/bin/env bash
# MAPPA's DSBench chain on SmolLM2-135M-Instruct, coached by SmolLM2 itself: three agents (a
# LoRA adapter each on the shared base) play Data Engineer, Modeler and Analyst on the shipped
# generated tasks (data/dsbench-mini), sharing a file workspace; every run is Python in the
# sandbox; the frozen base model scores every action 0-10, and the Analyst's coach sees the
# submission's metrics. Runs `comas local`, then writes docs/experiments/smollm2-dsbench.md.
#
#   bash experiments/smollm2-dsbench/run.sh                 # 4 steps
#   STEPS=1 bash experiments/smollm2-dsbench/run.sh         # a smoke run
#   REPORT_ONLY=1 bash experiments/smollm2-dsbench/run.sh   # rewrite the report from a finished run
#
# Knobs: STEPS (4), QUESTIONS (4 tasks per step), OUT (runs/smollm2-dsbench), COMAS_BIN (a comas
# binary to use instead of building one). A finished run is not run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/smollm2-dsbench"
steps=${STEPS:-4}
questions=${QUESTIONS:-4}

cd "$root"
source experiments/prepare.sh


job="$out/job.toml"
cat > "$job" <<JOB
# Written by experiments/smollm2-dsbench/run.sh.
name = "smollm2-dsbench"
seed = 1
method = "mappa"

[data]
train = "$root/data/dsbench-mini/tasks.jsonl"

[schedule]
questions_per_step = $questions
steps = $steps

[rollout]
dtype = "bfloat16"

[output]
dir = "$out/out"
save_episodes = true

[mappa]
pipeline = "ds_bench"
agents = [0, 1, 2]
max_turns = [2, 2, 2]
instances_per_question = 1
tool_timeout_secs = 20.0

[mappa.sampling]
temperature = 0.7
top_p = 0.95
max_new_tokens = 256
min_new_tokens = 1

# The coach is greedy (spec: temperature 0); its tail is guided to the score line.
[mappa.coach_sampling]
temperature = 0.0
max_new_tokens = 64
min_new_tokens = 1
guided_suffix = '\nPROCESS_SCORE: (10|[0-9])'

[[frozen]]
name = "coach"
model = "$model"
JOB
for _ in 0 1 2; do lora_agent "$questions" "$questions" >> "$job"; done

if [ ! -f "$out/done" ] && [ -z "${REPORT_ONLY:-}" ]; then
  echo "== MAPPA DSBench on SmolLM2: $steps steps ($(date -u +%H:%M:%S))" >&2
  run_local_once "$job" "$out"
fi

metrics="$out/out/metrics.jsonl"
"$comas" plot "$metrics" -o "$figures/coaching.png" --panels coaching,rewards,training,times --title "MAPPA DSBench on SmolLM2-135M, coached by SmolLM2" >&2
python3 "$here/report.py" "$metrics" "$out/out/episodes" "$steps" "$questions" "$(cat "$out/wall_seconds")" "$(nproc)" > "$report.part"
cat "$here/findings.md" >> "$report.part" 2>/dev/null || true
mv "$report.part" "$report"
echo "wrote $report" >&2
