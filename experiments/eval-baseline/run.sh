#!/usr/bin/env bash
# Baseline of SmolLM2-135M-Instruct under the four inference setups (vanilla, consistency,
# debate, autogen) on HumanEval and on the built-in arithmetic benchmark, with `comas eval`.
# Writes the results under runs/eval-baseline/ and the tables into docs/experiments/eval-baseline.md.
#
#   bash experiments/eval-baseline/run.sh     # HE=20 ARITH=30 NEW=256 DTYPE=bfloat16
# Extra team members or a trained checkpoint: MODEL_ARGS="--job-dir DIR --agent 0" LABEL=trained
# (the report then goes to docs/experiments/eval-trained.md); BENCHES="arithmetic" for one only.
# COMAS_BIN: a copy of the binary to run, so that rebuilding during a long run does not touch it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
he=${HE:-20}
arith=${ARITH:-30}
new=${NEW:-256}
dtype=${DTYPE:-bfloat16}
label=${LABEL:-base}
bash scripts/setup.sh >&2
bash scripts/fetch-humaneval.sh >/dev/null
[ -n "${NO_BUILD:-}${COMAS_BIN:-}" ] || cargo build --release -q -p comas
bin=${COMAS_BIN:-target/release/comas}
model=$(bash scripts/fetch-smollm2.sh)
model_args=${MODEL_ARGS:---model $model}
out=$root/runs/eval-baseline/$label
mkdir -p "$out"
benches=${BENCHES:-humaneval arithmetic}
for bench in $benches; do
  limit=$([ "$bench" = humaneval ] && echo "$he" || echo "$arith")
  # shellcheck disable=SC2086
  COMAS_THREADS=${THREADS:-2} "$bin" eval $model_args --dtype "$dtype" --setup all --bench "$bench" \
    --limit "$limit" --arithmetic-questions "$arith" --max-new-tokens "$new" --out "$out/$bench" >/dev/null 2>"$out/$bench.log"
  tail -1 "$out/$bench.log"
done
report=$root/docs/experiments/eval-$([ "$label" = base ] && echo baseline || echo "$label").md
{
  echo "# SmolLM2-135M-Instruct under the four inference setups ($label)"
  echo
  echo "\`bash experiments/eval-baseline/run.sh\` ($(date -u +%Y-%m-%d)): $dtype, temperature 0.7, at most $new new"
  echo "tokens per call, benchmarks: $benches (HumanEval: the first $he problems, code graded in the sandbox; arithmetic: $arith built-in"
  echo "arithmetic word problems). Accuracy per setup, passed/graded in brackets."
  for bench in $benches; do
    echo
    echo "## $bench"
    echo
    cat "$out/$bench/summary.md"
    echo
    echo "Run: \`$(tail -1 "$out/$bench.log")\`"
  done
} >"$report"
echo "wrote $report"
