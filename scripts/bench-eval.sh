#!/usr/bin/env bash
# Throughput of `comas eval`: the same calls (SmolLM2-135M-Instruct, the built-in arithmetic
# benchmark, the consistency setup: 6 calls per question) decoded all together in one continuous
# batch (--max-running 64) and one at a time (--max-running 1), one run after the other. Prints
# tokens/s of each, the ratio, and whether the outputs are identical (they must be: every call
# has its own seed, and decoding is batch-invariant).
#
#   bash scripts/bench-eval.sh        # QUESTIONS=16 NEW=128 SETUP=consistency DTYPE=bfloat16
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
questions=${QUESTIONS:-16}
new=${NEW:-128}
setup=${SETUP:-consistency}
dtype=${DTYPE:-bfloat16}
bash scripts/setup.sh >&2
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p comas
model=$(bash scripts/fetch-smollm2.sh)
dir=${OUT:-$root/target/bench-eval}
rm -rf "$dir" && mkdir -p "$dir"
run() {
  local running=$1 out=$2
  COMAS_THREADS=${THREADS:-2} target/release/comas eval --model "$model" --dtype "$dtype" --setup "$setup" --bench arithmetic \
    --arithmetic-questions "$questions" --max-new-tokens "$new" --max-running "$running" --out "$out" >"$out.summary.json" 2>"$out.log"
  # comas eval's own figure: tokens over the time from the first call on (model loading excluded).
  echo "max-running $running: $(grep -o '[0-9]* calls, [0-9]* tokens in .*this run)' "$out.log")"
}
run 64 "$dir/batched"
run 1 "$dir/single"
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def load(name):
    return {(r["setup"], r["id"]): r["output"] for r in map(json.loads, open(f"{d}/{name}/results.jsonl"))}
b, s = load("batched"), load("single")
print("outputs identical:", b == s)
PY
