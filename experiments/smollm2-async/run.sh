#!/usr/bin/env bash
# The same SmolLM2-135M-Instruct job (two LoRA agents, CoMAS games on the arithmetic data, the
# verifier reward of experiments/smollm2-comas, so there is something to learn) under three
# schedules, one after the other on this machine: `sync = "synchronous"`, then `sync = "async"`
# with max_policy_lag 1 (MODES adds others, e.g. async-2). Writes docs/experiments/smollm2-async.md
# (steps per hour, utilisation, reward, training and held-out accuracy per mode) and a figure
# per mode.
#
#   bash experiments/smollm2-async/run.sh                        # 12 steps per mode
#   STEPS=2 EVAL_EVERY=2 MODES="synchronous async-1" bash experiments/smollm2-async/run.sh
#   REPORT_ONLY=1 bash experiments/smollm2-async/run.sh          # the report from finished runs
#
# Knobs: STEPS (12), EVAL_EVERY (6), QUESTIONS (4 per step), SEED (1), MODES ("synchronous
# async-1"; async-N is max_policy_lag N), ARM (verifier; any arm of comas_job_file), DTYPE
# (see prepare.sh), OUT (runs/smollm2-async), REPORT_ONLY=1, COMAS_BIN. A finished mode is not
# run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/smollm2-async"
steps=${STEPS:-12}
eval_every=${EVAL_EVERY:-6}
questions=${QUESTIONS:-4}
seed=${SEED:-1}
modes=${MODES:-"synchronous async-1"}
arm=${ARM:-verifier}

cd "$root"
source experiments/prepare.sh
arithmetic_data "$out"

for mode in $modes; do
  case $mode in
    synchronous) schedule_extra='sync = "synchronous"' ;;
    async-[1-9]) schedule_extra=$(printf 'sync = "async"\nmax_policy_lag = %s' "${mode#async-}") ;;
    *) echo "unknown mode $mode (use synchronous or async-N)" >&2; exit 2 ;;
  esac
  dir="$out/$mode"
  mkdir -p "$dir"
  if [ -f "$dir/done" ] || [ -n "${REPORT_ONLY:-}" ]; then
    continue
  fi
  job_name="smollm2-async-$mode" job_dir="$dir" comas_job_file "$arm" "$seed" > "$dir/job.toml"
  echo "== $mode: $steps steps ($(date -u +%H:%M:%S))" >&2
  run_local_once "$dir/job.toml" "$dir"
done

finished=()
for mode in $modes; do
  [ -f "$out/$mode/done" ] || continue
  finished+=("$mode")
  "$comas" plot "$out/$mode/out/metrics.jsonl" -o "$figures/$mode.png" --panels rewards,accuracy,times --title "SmolLM2 $arm, $mode" >&2
done
[ ${#finished[@]} -gt 0 ] || { echo "no finished mode under $out" >&2; exit 1; }
python3 "$here/report.py" "$out" "$steps" "$eval_every" "$questions" "$arm" "$dtype" "$(nproc)" "${finished[@]}" > "$report.part"
[ -f "$here/findings.md" ] && cat "$here/findings.md" >> "$report.part"
mv "$report.part" "$report"
echo "report: $report" >&2
