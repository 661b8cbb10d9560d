#!/usr/bin/env bash
# The learning study: comas `grpo` and TRL's GRPOTrainer on SmolLM2-135M-Instruct with the same
# data, prompt, reward, group size, LoRA, optimizer and schedule (settings.json), 3 seeds each,
# and every saved adapter evaluated by one evaluator (`comas eval`, vanilla, sampled and
# greedy) on 240 held-out questions. Resumable: run it again and it goes on where it stopped
# (a finished run, a finished evaluation is never redone; a comas run stopped midway goes on
# from its newest checkpoint, a TRL run from its own); each heavy part runs under
# `flock /tmp/heavy.lock`, so nothing else builds or measures beside it.
#
#   bash experiments/learning-vs-trl/run.sh            # everything still missing, seed by seed
#   SEEDS="1" bash experiments/learning-vs-trl/run.sh  # one seed
#   STEPS=2 RUNS=runs/lvt-smoke bash ...               # a smoke test of the whole pipeline
#   SYSTEMS=comas EVAL=0 ...                           # one system's training only
#   COMAS_BIN=/path/to/comas ...                       # a fixed binary (no build)
#   SETTINGS=pilot.json RUNS=runs/lvt-pilot ...         # other settings (a pilot)
#   KEEP=experiments/learning-vs-trl/results-v2 ...     # keep finished parts in the tree
#   REPORT=docs/experiments/x.md ...                    # where the report goes (none: no report)
#
# KEEP (experiments/study.sh): a committed folder that holds each finished evaluation and each
# finished run's logs, so that a study spread over sessions redoes only the part under way. A run
# whose evaluations were not all done trains again from its start and only its missing
# evaluations run (a comas run repeats exactly on the same kind of machine; a TRL run need not).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
runs=${RUNS:-runs/learning-vs-trl}
seeds=${SEEDS:-1 2 3}
systems=${SYSTEMS:-comas trl}
do_eval=${EVAL:-1}
lock=/tmp/heavy.lock
settings=${SETTINGS:-$here/settings.json}
py() { python3 -c "import json,sys; print(json.load(open('$settings'))[sys.argv[1]])" "$1"; }
# A setting that older settings files lack: its default.
py_or() { python3 -c "import json,sys; print(json.load(open('$settings')).get(sys.argv[1], sys.argv[2]))" "$1" "$2"; }
steps=${STEPS:-$(py steps)}
eval_every=$(py eval_every)
mkdir -p "$runs"
keep=${KEEP:-}

bash scripts/setup.sh
bash scripts/fetch-smollm2.sh >/dev/null
bash "$here/setup-trl.sh" >/dev/null
model=${COMAS_SMOLLM2:-${COMAS_CACHE:-$HOME/.cache/comas}/models/smollm2-135m-instruct}
. "$root/experiments/study.sh"
comas=$(study_comas "$root" "$lock")
# The data of the settings' mix: made once, made again when the mix changed.
mix=$(py_or data_mix classic)
if [ ! -f "$runs/data/heldout.jsonl" ] || [ "$(cat "$runs/data/mix" 2>/dev/null || echo classic)" != "$mix" ]; then
  [ -z "$(ls -d "$runs"/comas-s* "$runs"/trl-s* 2>/dev/null)" ] || { echo "$runs holds runs on another data mix: use another RUNS folder" >&2; exit 2; }
  python3 "$here/make_data.py" "$runs/data" --mix "$mix"
  echo "$mix" > "$runs/data/mix"
  rm -rf "$runs/eval"
fi

# What KEEP holds comes back first: finished evaluations, finished runs.
keep_restore "$runs" "$keep" "$mix"

# The names of a run's evaluations (every `eval_every` steps, sampled and greedy).
evals_of() {
  local k mode
  for ((k = eval_every; k <= steps; k += eval_every)); do
    for mode in sampled greedy; do echo "$1-step$k-$mode"; done
  done
}

# The comas job of one seed, from settings.json.
comas_job() {
  python3 - "$settings" "$1" "$steps" "$model" "$root/$runs/data/train.jsonl" "$here" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); seed, steps, model, train = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
sys.path.insert(0, sys.argv[6])
from agent_table import agent_table
agent = agent_table(s, model, s["questions_per_step"] * s["group_size"], 'estimator = "group_norm"\nkl_coef = 0.0\n')
print(f'''name = "learning-vs-trl-s{seed}"
seed = {seed}
method = "grpo"
[data]
train = "{train}"
[schedule]
questions_per_step = {s["questions_per_step"]}
steps = {steps}
checkpoint_every = {s["checkpoint_every"]}
[grpo]
group_size = {s["group_size"]}
prompt_suffix = {json.dumps(s["prompt_suffix"])}
[grpo.reward]
correct = 1.0
wrong = 0.0
format = {s["format_reward"]}
answer_in_box = {str(s.get("answer_in_box", False)).lower()}
[grpo.sampling]
temperature = {s["temperature"]}
top_p = 1.0
top_k = 0
max_new_tokens = {s["max_new_tokens"]}
min_new_tokens = 0
[output]
dir = "out"
export = false
{agent}''')
PY
}

run_comas() {
  local seed=$1 dir="$runs/comas-s$1"
  mkdir -p "$dir"
  if [ -f "$dir/DONE" ]; then return; fi
  # A run stopped midway resumes: its job goes back to the newest checkpoint its learner holds.
  local fresh=--fresh
  [ -d "$dir/local" ] && fresh=
  comas_job "$seed" > "$dir/job.toml"
  echo "comas seed $seed: training ($steps steps)" >&2
  flock "$lock" python3 "$here/tree_rss.py" --out "$dir/peak.json" -- \
    "$comas" local $fresh --dir "$dir/local" --plaintext --workers 1 --keep-checkpoints 1000 --threads-per-process "$(py threads)" --worker-threads "$(py threads)" --json "$dir/job.toml" > "$dir/status.json"
  touch "$dir/DONE"
}

run_trl() {
  local seed=$1 dir="$runs/trl-s$1"
  mkdir -p "$dir"
  if [ -f "$dir/DONE" ]; then return; fi
  echo "TRL seed $seed: training ($steps steps)" >&2
  flock "$lock" python3 "$here/tree_rss.py" --out "$dir/peak.json" -- \
    "$root/.venv-trl/bin/python" "$here/trl_grpo.py" --model "$model" --data "$runs/data" --settings "$settings" --seed "$seed" --out "$dir" --steps "$steps"
}

# One evaluation of an adapter (or of the base model) on the held-out set, sampled and greedy.
evaluate() {
  local name=$1 adapter=$2
  for mode in sampled greedy; do
    local out="$runs/eval/$name-$mode"
    [ -f "$out/summary.json" ] && continue
    local t; t=$([ "$mode" = greedy ] && echo 0 || py temperature)
    local extra=(); [ -n "$adapter" ] && extra=(--adapter "$adapter")
    echo "evaluating $name ($mode)" >&2
    flock "$lock" "$comas" eval --model "$model" "${extra[@]}" --setup vanilla --bench "$runs/data/heldout.jsonl" \
      --temperature "$t" --seed 1 --max-new-tokens "$(py max_new_tokens)" --out "$out" > /dev/null
    keep_eval "$runs" "$keep" "$mix" "$name-$mode"
  done
}

# The adapters of a finished run at every `eval_every` steps (step 0 is the base model), the
# last first: a study stopped midway already has the answer that matters most.
evaluate_run() {
  local system=$1 seed=$2
  for ((k = steps / eval_every * eval_every; k >= eval_every; k -= eval_every)); do
    local adapter name="$system-s$seed-step$k"
    [ -f "$runs/eval/$name-sampled/summary.json" ] && [ -f "$runs/eval/$name-greedy/summary.json" ] && continue
    if [ "$system" = comas ]; then
      adapter=$(ls -d "$runs/comas-s$seed"/local/checkpoints/agent-0/*/step-"$k"/adapter 2>/dev/null | head -1)
    else
      adapter="$runs/trl-s$seed/checkpoint-$k"
    fi
    [ -n "$adapter" ] && [ -e "$adapter" ] || { echo "no adapter for $system seed $seed step $k" >&2; continue; }
    evaluate "$name" "$adapter"
  done
}

[ "$do_eval" = 1 ] && evaluate base ""
# Seed by seed, each run with its evaluations right after it: a part finished is a part kept.
for seed in $seeds; do
  for system in $systems; do
    "run_$system" "$seed"
    if [ "$do_eval" = 1 ]; then
      evaluate_run "$system" "$seed"
      # shellcheck disable=SC2046
      keep_run "$runs" "$keep" "$mix" "$system-s$seed" $(evals_of "$system-s$seed")
    fi
  done
done
# REPORT=none: no report (timing.sh's rounds have no evaluations to report).
[ "${REPORT:-}" = none ] ||
  "$root/.venv-trl/bin/python" "$here/report.py" --runs "$runs" --settings "$settings" --out "${REPORT:-docs/experiments/learning-vs-trl.md}"
