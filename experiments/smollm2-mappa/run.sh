#!/usr/bin/env bash
# MAPPA's MathChat chain on SmolLM2-135M-Instruct, coached by SmolLM2 itself: three agents (a
# LoRA adapter each on the shared base) play Problem Solver, Code Executor (Python in the
# sandbox) and Verifier; the frozen base model scores every action 0-10. Runs `comas local`, then
# writes docs/experiments/smollm2-mappa.md with the coach score per role over the steps.
#
#   bash experiments/smollm2-mappa/run.sh                 # 10 steps
#   STEPS=2 bash experiments/smollm2-mappa/run.sh         # a smoke run
#   REPORT_ONLY=1 bash experiments/smollm2-mappa/run.sh   # rewrite the report from a finished run
#
# Knobs: STEPS (10), QUESTIONS (4 per step), OUT (runs/smollm2-mappa), COMAS_BIN (a comas binary
# to use instead of building one). A finished run is not run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/smollm2-mappa"
steps=${STEPS:-10}
questions=${QUESTIONS:-4}

cd "$root"
source experiments/prepare.sh

# Data: word problems that sum two numbers from 1 to 9 (the CoMAS experiment's kind), 16
# held out with number pairs never seen in training.
if [ ! -f "$out/train.jsonl" ]; then
  python3 - "$out" <<'PY'
import json, random, sys
out = sys.argv[1]
names = ["Mia", "Omar", "Lena", "Raj", "Ana", "Tom", "Zoe", "Ivan"]
things = ["marbles", "stickers", "books", "coins", "apples", "pencils"]
rng = random.Random(29)
pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
rng.shuffle(pairs)
def record(i, a, b):
    who, what = rng.choice(names), rng.choice(things)
    text = f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?"
    return {"prompt": text, "answer": str(a + b), "task": "math", "id": f"sum-{i:04d}"}
for name, rows in (("test", [record(i, a, b) for i, (a, b) in enumerate(pairs[:16])]),
                   ("train", [record(100 + i, a, b) for i, (a, b) in enumerate(pairs[16:])])):
    with open(f"{out}/{name}.jsonl.part", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
PY
  mv "$out/test.jsonl.part" "$out/test.jsonl"
  mv "$out/train.jsonl.part" "$out/train.jsonl"
fi


job="$out/job.toml"
cat > "$job" <<JOB
# Written by experiments/smollm2-mappa/run.sh.
name = "smollm2-mappa"
seed = 1
method = "mappa"

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

[mappa]
agents = [0, 1, 2]
instances_per_question = 2
tool_timeout_secs = 10.0

[mappa.sampling]
temperature = 0.7
top_p = 0.95
max_new_tokens = 96
min_new_tokens = 1

[mappa.role_sampling.code_executor]
temperature = 0.7
top_p = 0.95
max_new_tokens = 128
min_new_tokens = 1

# The coach is greedy (spec: temperature 0). A 135M model rarely ends with the score line on its
# own, so its tail is guided: free text, then the score line (and optionally the verdict line).
[mappa.coach_sampling]
temperature = 0.0
max_new_tokens = 64
min_new_tokens = 1
guided_suffix = '\nPROCESS_SCORE: (10|[0-9])(\nANSWER_CORRECT: [01])?'

[eval]
data = "$out/test.jsonl"
every_steps = $steps
temperature = 0.6

[[frozen]]
name = "coach"
model = "$model"
JOB
for _ in 0 1 2; do lora_agent $((questions * 2)) $((questions * 2)) >> "$job"; done

if [ ! -f "$out/done" ] && [ -z "${REPORT_ONLY:-}" ]; then
  echo "== MAPPA on SmolLM2: $steps steps ($(date -u +%H:%M:%S))" >&2
  run_local_once "$job" "$out"
fi

metrics="$out/out/metrics.jsonl"
"$comas" plot "$metrics" -o "$figures/coaching.png" --panels coaching,rewards,training,times --title "MAPPA MathChat on SmolLM2-135M, coached by SmolLM2" >&2
python3 "$here/report.py" "$metrics" "$steps" "$questions" "$(cat "$out/wall_seconds")" "$(nproc)" > "$report.part"
cat "$here/findings.md" >> "$report.part" 2>/dev/null || true
mv "$report.part" "$report"
echo "wrote $report" >&2
