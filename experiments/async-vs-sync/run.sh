#!/usr/bin/env bash
# The same CoMAS job in both schedules, one after the other on this machine: `sync =
# "synchronous"` (rollout, then training, then the broadcast) and `sync = "async"` (step s + 1's
# rollout beside step s's training, max_policy_lag 1). The job is the built-in tiny example
# (two tiny random models, 2 workers) with more steps and longer turns, so rollout and training
# both take time. Writes docs/experiments/async-vs-sync.md and a figure per mode.
#
#   bash experiments/async-vs-sync/run.sh              # 12 steps per mode
#   STEPS=3 bash experiments/async-vs-sync/run.sh      # a smoke run
#
# Knobs: STEPS (12), TOKENS (96 new tokens per turn), OUT (runs/async-vs-sync), COMAS_BIN.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/async-vs-sync"
steps=${STEPS:-12}
tokens=${TOKENS:-96}
out=${OUT:-$root/runs/async-vs-sync}
report="$root/docs/experiments/async-vs-sync.md"
figures="$root/docs/experiments/async-vs-sync"
mkdir -p "$out" "$figures"
cd "$root"
comas=${COMAS_BIN:-$PWD/target/release/comas}
if [ -z "${COMAS_BIN:-}" ]; then
  bash scripts/setup.sh >&2
  cargo build --release -q -p comas
fi

# The example's files (models, data, job) from one run of it.
if [ ! -f "$out/example/job.toml" ]; then
  "$comas" local --example tiny --dir "$out/example" > "$out/example.log" 2>&1
fi
for mode in synchronous async; do
  python3 - "$out/example/job.toml" "$out/$mode.toml" "$mode" "$steps" "$tokens" "$out/$mode/out" <<'PY'
import re, sys
src, dst, mode, steps, tokens, outdir = sys.argv[1:7]
t = open(src).read()
t = re.sub(r'(?m)^name = ".*"$', f'name = "async-vs-sync-{mode}"', t)
t = re.sub(r"(?m)^steps = .*$", f'steps = {steps}\nsync = "{mode}"', t)
t = re.sub(r"(?m)^max_new_tokens = 32$", f"max_new_tokens = {tokens}", t)
t = re.sub(r'(?m)^dir = ".*"$', f'dir = "{outdir}"', t)
t = re.sub(r"(?m)^learner = .*\n", "", t)
open(dst, "w").write(t)
PY
  if [ ! -f "$out/$mode/done" ]; then
    mkdir -p "$out/$mode"
    start=$(date +%s)
    "$comas" local "$out/$mode.toml" --workers 2 --threads-per-process 1 --dir "$out/$mode/run" > "$out/$mode/local.log" 2>&1
    echo $(($(date +%s) - start)) > "$out/$mode/wall_seconds"
    touch "$out/$mode/done"
  fi
  "$comas" plot "$out/$mode/out/metrics.jsonl" -o "$figures/$mode.png" --panels rewards,times --title "tiny CoMAS, sync = $mode" >&2
done
python3 "$here/report.py" "$out" "$steps" "$tokens" "$(nproc)" > "$report.part"
cat "$here/findings.md" >> "$report.part"
mv "$report.part" "$report"
echo "wrote $report" >&2
