#!/usr/bin/env bash
# Does CoMAS make SmolLM2-135M-Instruct better? Runs the arms of the experiment one after the
# other with `comas local` on generated arithmetic word problems, then writes the report
# docs/experiments/smollm2-comas.md: a table (`comas compare`), curves (`comas plot`), the wall
# time of each arm, and the findings written by hand in experiments/smollm2-comas/findings.md.
#
#   bash experiments/smollm2-comas/run.sh                 # every arm, 20 steps, seed 1
#   STEPS=5 ARMS="comas verifier" bash experiments/smollm2-comas/run.sh
#   REPORT_ONLY=1 bash experiments/smollm2-comas/run.sh   # rewrite the report from finished runs
#
# Arms (ARMS, in this order by default):
#   comas          the method: solver and evaluator paid from the scorer's 1–3 score
#   no_scoring     ablation: two evaluators give correct/incorrect verdicts, paid by agreement
#   no_evaluation  ablation: the scorer judges the solution alone
#   verifier       positive control: the solver is paid 1 when its boxed answer is right
# The untrained arm is the evaluation before step 0, which every arm runs with the same seed and
# base weights (greedy, the same answers in each; sampled, the ablations' games differ).
#
# Knobs: STEPS (20), SEEDS ("1"; e.g. "1 2"), ARMS, OUT (runs/smollm2-comas), QUESTIONS (4 per
# step), EVAL_EVERY (10 steps), REPORT_ONLY=1, COMAS_BIN (a comas binary to use instead of
# building one: a copy keeps a long run apart from rebuilds). Runs resume: a finished arm is not
# run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/smollm2-comas"
steps=${STEPS:-20}
seeds=${SEEDS:-1}
arms=${ARMS:-"comas no_scoring no_evaluation verifier"}
questions=${QUESTIONS:-4}
eval_every=${EVAL_EVERY:-10}

cd "$root"
source experiments/prepare.sh

arithmetic_data "$out"


for seed in $seeds; do
  for arm in $arms; do
    dir="$out/$arm-s$seed"
    mkdir -p "$dir"
    if [ -f "$dir/done" ] || [ -n "${REPORT_ONLY:-}" ]; then
      continue
    fi
    comas_job_file "$arm" "$seed" > "$dir/job.toml"
    echo "== arm $arm, seed $seed: $steps steps ($(date -u +%H:%M:%S))" >&2
    run_local_once "$dir/job.toml" "$dir"
  done
done

# The report.
runs=()
wall_rows=""
for seed in $seeds; do
  for arm in $arms; do
    dir="$out/$arm-s$seed"
    [ -f "$dir/done" ] || continue
    runs+=(--run "$arm (seed $seed)=$dir/out/metrics.jsonl")
    "$comas" plot "$dir/out/metrics.jsonl" -o "$figures/$arm-s$seed.png" --roles --title "SmolLM2 $arm, seed $seed" >&2
    wall_rows+="| $arm | $seed | $(cat "$dir/wall_seconds") s |"$'\n'
  done
done
[ ${#runs[@]} -gt 0 ] || { echo "no finished arm under $out" >&2; exit 1; }
{
  echo "# Does CoMAS make SmolLM2-135M-Instruct better?"
  echo
  echo "Made by \`bash experiments/smollm2-comas/run.sh\` (STEPS=$steps, SEEDS=\"$seeds\", QUESTIONS=$questions,"
  echo "EVAL_EVERY=$eval_every) on $(nproc) CPU cores. Job files: \`$out/<arm>-s<seed>/job.toml\`; the"
  echo "settings and why they were chosen are in \`experiments/smollm2-comas/README.md\`."
  echo
  echo "## Results"
  echo
  echo "Held-out accuracy: the fraction of the 32 last-round solutions (16 held-out questions, 2"
  echo "agents) whose answer is right, in the evaluation before training and after the last step,"
  echo "sampled at temperature 0.7 and greedy. An answer is its last \\boxed{}, or without one what"
  echo "\`math_verify\` would read (the number after \"answer is\", else the last number). The"
  echo "\"before\" figure is the untrained arm: every arm plays it with the same seed and the base"
  echo "weights (the same answers greedy; sampled, the ablations' other game changes the sampling"
  echo "streams). Training-step columns are means over the first and the last 5 steps. The"
  echo "solver's reward is split by whether its answer was right (checked against the data set for"
  echo "logging; only the verifier arm is paid from it); the approval rate is the share of valid"
  echo "verdicts that pass the solution (a score of 3, or \"correct\" under no_scoring)."
  echo
  "$comas" compare "${runs[@]}"
  echo
  echo "| arm | seed | wall time |"
  echo "|---|---:|---:|"
  printf "%s" "$wall_rows"
  echo
  echo "## Curves"
  echo
  for seed in $seeds; do
    for arm in $arms; do
      [ -f "$out/$arm-s$seed/done" ] && echo "![$arm, seed $seed](smollm2-comas/$arm-s$seed.png)"
    done
  done
  echo
  if [ -f "$here/findings.md" ]; then
    cat "$here/findings.md"
  fi
} > "$report.part"
mv "$report.part" "$report"
echo "report: $report" >&2
