#!/usr/bin/env bash
# CoMAS on the learning study's task, held-out set, evaluator and budget (issue 42 §4): two
# LoRA agents on SmolLM2-135M-Instruct play CoMAS (l = 2, R = 1) on the same 1000 training
# questions, 4 per step, 4 instances each, so each step has the 32 solver answers a GRPO step
# has; the same optimizer, schedule and steps (experiments/learning-vs-trl/settings.json).
# Arms:
#   comas       the method, no verifier anywhere
#   comas-warm  the judges learn to score first: for `judge_warmup_steps` (10) steps scorers are
#               paid for agreeing with the data set's answer, then pure CoMAS
# `grpo` and the untrained model are the learning study's runs (same data, held-out set and
# evaluator); each step logs how far the judges tell right from wrong (`judge_separation`).
# Every 10th step each agent's adapter is evaluated by `comas eval` (vanilla, sampled and
# greedy, the 240 held-out questions). Resumable: a training run stopped midway goes on from
# its newest checkpoint (every `checkpoint_every` steps); heavy parts under the flock.
#
#   bash experiments/comas-same-budget/run.sh
#   ARMS=comas-warm SEEDS=1 STEPS=2 RUNS=runs/csb-smoke bash experiments/comas-same-budget/run.sh
#   EVAL_STEPS="10 30 50" AGENTS="0" ...       # fewer evaluations (each takes minutes)
#   KEEP=experiments/comas-same-budget/results  # keep finished parts in the tree (experiments/study.sh)
#   COMAS_BIN=/path/to/comas ...                # a fixed binary (no build)
#
# The judges' warm-up and `judge_separation` tell right from wrong with the math grader's
# lenient reading (the box, else the last expression), as the held-out evaluator does; the
# learning study's report also grades the box alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
study="$root/experiments/learning-vs-trl"
settings=${SETTINGS:-$study/settings-v2.json}
runs=${RUNS:-runs/comas-same-budget}
data=${DATA:-runs/learning-vs-trl-v2/data}
keep=${KEEP:-}
seeds=${SEEDS:-1}
arms=${ARMS:-comas comas-warm}
warmup=${WARMUP:-10}
lock=/tmp/heavy.lock
py() { python3 -c "import json,sys; print(json.load(open('$settings'))[sys.argv[1]])" "$1"; }
py_or() { python3 -c "import json,sys; print(json.load(open('$settings')).get(sys.argv[1], sys.argv[2]))" "$1" "$2"; }
steps=${STEPS:-$(py steps)}
eval_every=$(py eval_every)
eval_steps=${EVAL_STEPS:-$(seq -s ' ' "$eval_every" "$eval_every" "$steps")}
agents=${AGENTS:-0 1}
# The two learners train at once, so each gets its share of the study's threads: 2 threads each
# on 2 cores made a step's training 1.6x slower (173 s against 106 s, same samples). The
# learning settings are untouched.
learner_threads=$(( $(py threads) / 2 )); [ "$learner_threads" -ge 1 ] || learner_threads=1
mkdir -p "$runs"
bash scripts/setup.sh
bash scripts/fetch-smollm2.sh >/dev/null
model=${COMAS_SMOLLM2:-${COMAS_CACHE:-$HOME/.cache/comas}/models/smollm2-135m-instruct}
. "$root/experiments/study.sh"
comas=$(study_comas "$root" "$lock")
mix=$(py_or data_mix classic)
[ -f "$data/heldout.jsonl" ] || python3 "$study/make_data.py" "$data" --mix "$mix"
keep_restore "$runs" "$keep" "$mix"

job() {
  local arm=$1 seed=$2 warm=0
  [ "$arm" = comas-warm ] && warm=$warmup
  python3 - "$settings" "$seed" "$steps" "$model" "$root/$data/train.jsonl" "$warm" "$study" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); seed, steps, model, train, warm = sys.argv[2:7]
sys.path.insert(0, sys.argv[7])
from agent_table import agent_table
role = lambda t, n, extra="": f'temperature = {t}\ntop_p = 1.0\ntop_k = 0\nmax_new_tokens = {n}\nmin_new_tokens = 1\n{extra}'
agent = agent_table(s, model, 48) + "\n"
print(f'''name = "comas-budget-{warm}-s{seed}"
seed = {seed}
method = "comas"
[data]
train = "{train}"
[schedule]
questions_per_step = {s["questions_per_step"]}
steps = {steps}
checkpoint_every = {s["checkpoint_every"]}
[output]
dir = "out"
export = false
[comas]
num_rounds = 1
evals_per_solution = 1
num_references = 2
instances_per_question = 4
judge_warmup_steps = {warm}
[comas.sampling.solver]
{role(s["temperature"], s["max_new_tokens"])}[comas.sampling.evaluator]
{role(s["temperature"], 128)}[comas.sampling.scorer]
{role(s["temperature"], 64, 'guided_suffix = "<score>[123]</score>"' + chr(10))}{agent}{agent}''')
PY
}

evaluate() {
  local name=$1 adapter=$2
  for mode in sampled greedy; do
    local out="$runs/eval/$name-$mode"
    [ -f "$out/summary.json" ] && continue
    local t; t=$([ "$mode" = greedy ] && echo 0 || py temperature)
    echo "evaluating $name ($mode)" >&2
    flock "$lock" "$comas" eval --model "$model" --adapter "$adapter" --setup vanilla --bench "$data/heldout.jsonl" \
      --temperature "$t" --seed 1 --max-new-tokens "$(py max_new_tokens)" --out "$out" > /dev/null
    keep_eval "$runs" "$keep" "$mix" "$name-$mode"
  done
}

for seed in $seeds; do
  for arm in $arms; do
    dir="$runs/$arm-s$seed"
    mkdir -p "$dir"
    if [ ! -f "$dir/DONE" ]; then
      # A run stopped midway (its folder there, no DONE) resumes: its job goes back to the
      # newest checkpoint its learners hold and runs on from there.
      fresh=--fresh
      [ -d "$dir/local" ] && fresh=
      job "$arm" "$seed" > "$dir/job.toml"
      echo "$arm seed $seed: training ($steps steps)" >&2
      flock "$lock" python3 "$study/tree_rss.py" --out "$dir/peak.json" -- \
        "$comas" local $fresh --dir "$dir/local" --plaintext --workers 1 --keep-checkpoints 1000 --threads-per-process "$learner_threads" --worker-threads "$(py threads)" --json "$dir/job.toml" > "$dir/status.json"
      touch "$dir/DONE"
    fi
    names=()
    for k in $eval_steps; do
      for agent in $agents; do
        name="$arm-s$seed-a$agent-step$k"
        names+=("$name-sampled" "$name-greedy")
        [ -f "$runs/eval/$name-sampled/summary.json" ] && [ -f "$runs/eval/$name-greedy/summary.json" ] && continue
        adapter=$(ls -d "$dir"/local/checkpoints/agent-$agent/*/step-"$k"/adapter 2>/dev/null | head -1)
        [ -n "$adapter" ] || { echo "no adapter for $arm seed $seed agent $agent step $k" >&2; continue; }
        evaluate "$name" "$adapter"
      done
    done
    keep_run "$runs" "$keep" "$mix" "$arm-s$seed" "${names[@]}"
  done
done
