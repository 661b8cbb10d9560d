#!/usr/bin/env bash
# NeuroMAS on SmolLM2-135M-Instruct: a [2, 1] graph (two message nodes, then the readout), one
# LoRA adapter per node on the shared base (three agents, three learners), trained from scratch
# on generated arithmetic word problems. Every node's sample of a rollout gets the readout's
# grade (spec neuromas.md §5), normalised over the task's rollouts. The readout's reply ends
# with a guided `Final answer: \boxed{}` line, so the 135M model always gives an answer the
# grader reads; which number stays its choice. Nodes sample at temperature 0.5, top_p 0.95, as
# the CoMAS SmolLM2 runs do: at the spec's 1.0 the 135M model writes noise. Held-out accuracy
# of the graph before, during and after training, and of the base model alone (`comas eval
# --setup vanilla`) on the same 16 questions. Writes docs/experiments/smollm2-neuromas.md.
#
#   bash experiments/smollm2-neuromas/run.sh                 # 24 steps
#   STEPS=1 bash experiments/smollm2-neuromas/run.sh         # a smoke run
#   REPORT_ONLY=1 bash experiments/smollm2-neuromas/run.sh   # rewrite the report from a finished run
#
# Knobs: STEPS (24), QUESTIONS (4 per step), ROLLOUTS (4 per question), EVAL_EVERY (6), OUT
# (runs/smollm2-neuromas), COMAS_BIN (a comas binary to use instead of building one).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/smollm2-neuromas"
steps=${STEPS:-24}
questions=${QUESTIONS:-4}
rollouts=${ROLLOUTS:-4}
eval_every=${EVAL_EVERY:-6}

cd "$root"
source experiments/prepare.sh
arithmetic_data "$out"

job="$out/job.toml"
cat > "$job" <<JOB
# Written by experiments/smollm2-neuromas/run.sh.
name = "smollm2-neuromas"
seed = 1
method = "neuromas"

[data]
train = "$out/train.jsonl"

[schedule]
questions_per_step = $questions
steps = $steps

[rollout]
dtype = "bfloat16"

[output]
dir = "$out/out"
save_episodes = true

[eval]
data = "$out/test.jsonl"
every_steps = $eval_every
at_start = true
temperature = 0.7
greedy = true

[neuromas]
rollouts_per_task = $rollouts
max_msg_tokens = 48

[neuromas.topology]
layers = [2, 1]

[neuromas.sampling]
temperature = 0.5
top_p = 0.95
max_new_tokens = 64
min_new_tokens = 1

[neuromas.readout_sampling]
temperature = 0.5
top_p = 0.95
max_new_tokens = 48
min_new_tokens = 1
guided_suffix = '\\nFinal answer: \\\\boxed\\{[0-9]{1,2}\\}'
JOB
for _ in 0 1 2; do
  lora_agent $((questions * rollouts)) $((questions * rollouts / 2)) >> "$job"
done

if [ ! -f "$out/done" ] && [ -z "${REPORT_ONLY:-}" ]; then
  echo "== NeuroMAS [2, 1] on SmolLM2: $steps steps ($(date -u +%H:%M:%S))" >&2
  run_local_once "$job" "$out"
fi
# The base model alone on the same questions (as benchmark records), sampled at 0.7 and greedy.
python3 -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(json.dumps({"query": r["prompt"], "gt": r["answer"], "tag": "math", "source": "arithmetic", "id": r["id"]}))' "$out/test.jsonl" > "$out/test-bench.jsonl"
for t in 0.7 0; do
  if [ ! -f "$out/base-$t/summary.json" ] && [ -z "${REPORT_ONLY:-}" ]; then
    "$comas" eval --model "$model" --setup vanilla --bench "$out/test-bench.jsonl" --temperature "$t" --max-new-tokens 96 \
      --dtype bfloat16 --threads 2 --seed 1 --out "$out/base-$t" > "$out/base-$t.log" 2>&1
  fi
done

metrics="$out/out/metrics.jsonl"
"$comas" plot "$metrics" -o "$figures/training.png" --panels rewards,training,times --title "NeuroMAS [2, 1] on SmolLM2-135M (one LoRA per node)" >&2
python3 "$here/report.py" "$metrics" "$out" "$steps" "$questions" "$rollouts" "$(cat "$out/wall_seconds")" "$(nproc)" > "$report.part"
cat "$here/findings.md" >> "$report.part" 2>/dev/null || true
mv "$report.part" "$report"
echo "wrote $report" >&2
