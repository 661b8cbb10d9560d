#!/usr/bin/env bash
# One prepared check of comas on a GPU machine (issue 43 §2): parity against transformers in
# f32 and bf16 on two random models in Hugging Face format (Qwen2 at 0.5B shape, Llama at 1B
# shape), decode throughput against transformers' generate, a learner step against a PyTorch
# eager step, and a 3-step `comas local` job with two LoRA agents and two workers (the weights
# relayed between them). It writes every figure as JSON and the report gpu.md into $OUT.
#
#   bash scripts/gpu-check.sh                          # on the GPU machine (DEVICE=cuda)
#   DEVICE=cpu bash scripts/gpu-check.sh               # here, small sizes
#   PACK=1 ...                                         # the logs as one logs.tar.gz in $OUT
#   STRICT=1 ...                                       # exit 1 unless every step ran, f32
#                                                      # parity held and the counts are exact
#
# The comas binary: $COMAS_BIN, else (on a GPU) dist/gpu/comas.xz unpacked (scripts/build-gpu.sh
# makes it, with the parity suites beside it), else target/release/comas. Python: $PYTHON (default python3 on
# the GPU machine, .venv-ref/bin/python here) with torch and transformers. A step that fails is
# recorded in the report and the next one runs: one run on a GPU shows everything it can.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
device=${DEVICE:-cuda}
if [ "$device" = cpu ]; then size=${SIZE:-small}; else size=${SIZE:-full}; fi
out=${OUT:-$root/runs/gpu-check-$device}
# Models and intermediate files (gigabytes at full size) stay out of $OUT.
work=${WORK:-/tmp/comas-gpu-check/work-$device}
mkdir -p "$out" "$work" "$out/logs" /tmp/comas-gpu-check
: > "$out/steps.jsonl"

if [ -z "${PYTHON:-}" ]; then
  if [ "$device" = cpu ]; then bash tests/fixtures/setup-ref.sh >/dev/null; PYTHON=$root/.venv-ref/bin/python; else PYTHON=python3; fi
fi
py=$PYTHON
check=(env PYTHONUNBUFFERED=1 "$py" "$root/scripts/gpu_check/check.py")

# unpack SRC.xz DEST: a carried binary, decompressed with Python (xz may be missing there).
unpack() {
  "$py" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
  chmod +x "$2"
}
if [ -n "${COMAS_BIN:-}" ]; then
  comas=$COMAS_BIN
elif [ "$device" != cpu ] && [ -f dist/gpu/comas.xz ]; then
  comas=/tmp/comas-gpu-check/comas
  unpack dist/gpu/comas.xz "$comas"
else
  comas=$root/target/release/comas
fi
# The binary links libtorch by name: on the GPU machine it takes that machine's own torch
# (the same 2.11.0, built for CUDA), whose libraries find their CUDA libraries themselves.
if [ "$device" != cpu ]; then
  torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# step NAME CMD...: runs CMD with its output in logs/NAME.log and records its status and time.
step() {
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  echo "== $name" >&2
  # A hung step must not eat the device's few minutes: STEP_TIMEOUT seconds each.
  timeout -k 10 "${STEP_TIMEOUT:-240}" "$@" > "$out/logs/$name.log" 2>&1
  local rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  printf '{"step": "%s", "rc": %d, "seconds": %d.%03d}\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) >> "$out/steps.jsonl"
  [ $rc = 0 ] || { echo "   failed (rc $rc); the end of its log:" >&2; tail -5 "$out/logs/$name.log" >&2; }
  return $rc
}

models=$work/models
step environment bash -c "nvidia-smi 2>/dev/null || true; '$py' -c 'import torch, transformers; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"transformers\", transformers.__version__)'; ldd '$comas' | grep -E 'torch|cuda|not found'; '$comas' --version"
step models "${check[@]}" models --size "$size" --out "$models"

# 1. Parity: log-probabilities of fixed completions and greedy continuations, f32 and bf16.
parity=$work/parity
step parity-reference "${check[@]}" reference --models "$models" --device "$device" --out "$parity"
for m in "$models"/*/; do
  name=$(basename "$m")
  for dtype in float32 bfloat16; do
    step "parity-score-$name-$dtype" "$comas" score --model "$m" --dtype "$dtype" --device "$device" \
      --input "$parity/$name/score-input.jsonl" --output "$parity/$name/comas-score-$dtype.jsonl"
    # One process for the 4 prompts, each decoded alone (batch 1, as transformers did).
    mapfile -t ids < <("$py" -c 'import json, sys; [print(",".join(map(str, json.loads(l)["prompt_ids"]))) for l in open(sys.argv[1])]' "$parity/$name/score-input.jsonl")
    prompt_args=()
    for p in "${ids[@]}"; do prompt_args+=(--prompt-ids "$p"); done
    step "parity-greedy-$name-$dtype" bash -c "'$comas' generate --model '$m' --dtype $dtype --device $device \
      ${prompt_args[*]} --greedy --ignore-eos --max-new-tokens 32 --min-new-tokens 32 --json \
      > '$parity/$name/comas-greedy-$dtype.jsonl'"
  done
done
step parity-compare "${check[@]}" parity --parity "$parity"

# 2. Decode throughput, greedy, no stopping, the same prompts on both sides.
if [ "$size" = full ]; then batches=1,8,32,128; new=128; repeats=3; else batches=1,8; new=16; repeats=2; fi
step bandwidth "${check[@]}" bandwidth --device "$device" --out "$work/bandwidth.json"
step prompts "${check[@]}" prompts --models "$models" --count 128 --len 32 --out "$work/prompts.json"
for name in qwen2-0.5b llama-1b; do
  b=$batches; [ "$name" = llama-1b ] && b=1,${batches##*,}
  step "decode-comas-$name" bash -c "'$comas' bench decode --model '$models/$name' --dtype bfloat16 --device $device \
    --prompts '$work/prompts.json' --batches $b --new-tokens $new --repeats $repeats > '$work/decode-comas-$name.jsonl'"
  step "decode-transformers-$name" bash -c "'$py' '$root/model/benches/hf_decode.py' --model '$models/$name' \
    --dtype bfloat16 --device $device --prompts '$work/prompts.json' --batches $b --new-tokens $new \
    --repeats $repeats > '$work/decode-transformers-$name.jsonl'"
done

# 3. A learner step (f32) against the PyTorch eager step on the same samples: full fine-tuning
# (time and largest weight difference) and LoRA r 16 on q/v (time).
learner=$work/learner
if [ "$size" = full ]; then ls_args=(--samples 16 --prompt-len 128 --completion-len 128); else ls_args=(--samples 8 --prompt-len 16 --completion-len 16); fi
step learner-batch "${check[@]}" batch --model "$models/qwen2-0.5b" --device "$device" "${ls_args[@]}" --out "$learner"
step learner-comas-full bash -c "'$comas' bench train-step --model '$models/qwen2-0.5b' --batch '$learner/batch.jsonl' \
  --config '$learner/comas-full.toml' --repeats 2 --out '$learner/comas-full' > '$learner/comas-full.json'"
step learner-reference-full "$py" tests/fixtures/learner/ref_step.py --model "$models/qwen2-0.5b" --batch "$learner/batch.jsonl" \
  --config "$learner/reference.toml" --out "$learner/reference-full" --device "$device"
step learner-diff "${check[@]}" diff --a "$learner/comas-full" --b "$learner/reference-full" --out "$learner/diff.json"
step learner-torch-full bash -c "'$py' learner/benches/torch_step.py --model '$models/qwen2-0.5b' --batch '$learner/batch.jsonl' \
  --config '$learner/reference.toml' --device $device --repeats 2 > '$learner/torch-full.json'"
step learner-comas-lora bash -c "'$comas' bench train-step --model '$models/qwen2-0.5b' --batch '$learner/batch.jsonl' \
  --config '$learner/comas-lora.toml' --repeats 2 > '$learner/comas-lora.json'"
step learner-torch-lora bash -c "'$py' learner/benches/torch_step.py --model '$models/qwen2-0.5b' --batch '$learner/batch.jsonl' \
  --config '$learner/reference.toml' --device $device --repeats 2 --lora-r 16 > '$learner/torch-lora.json'"

# The model's and the learner's parity suites on the device, where scripts/build-gpu.sh packed
# them (their fixtures are this tree's; the one test that runs another binary is skipped).
for suite in comas-model-parity comas-learner-parity; do
  [ "$device" != cpu ] && [ -f "dist/gpu/$suite.xz" ] || continue
  exe=/tmp/comas-gpu-check/$suite
  unpack "dist/gpu/$suite.xz" "$exe"
  step "suite-$suite" env COMAS_TEST_DEVICE="$device" COMAS_FIXTURES="$root/tests/fixtures" "$exe" \
    --test-threads 1 --skip one_shot_step_binary
done

# 4. A 3-step job: two LoRA agents on the 0.5B model, two workers (the second gets the new
# weights through the first), every service on this machine; peak GPU memory sampled meanwhile.
job=$work/job
rm -rf "$job" && mkdir -p "$job"
head -8 examples/grpo/test.jsonl > "$job/train.jsonl"
"$py" - "$job/job.toml" "$models/qwen2-0.5b" "$device" <<'PY'
import sys
path, model, device = sys.argv[1:]
agent = f'''
[[agents]]
model = "{model}"
[agents.train]
device = "{device}"
dtype = "bfloat16"
lr = 1e-4
train_batch_size = 8
micro_batch_size = 4
[agents.train.lora]
r = 16
alpha = 32.0
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj"]
'''
open(path, "w").write(f'''name = "gpu-check"
seed = 1
method = "grpo"
[data]
train = "train.jsonl"
[schedule]
questions_per_step = 2
steps = 3
[grpo]
group_size = 4
[grpo.sampling]
temperature = 1.0
max_new_tokens = 32
[grpo.reward]
correct = 1.0
wrong = 0.0
[rollout]
dtype = "bfloat16"
[output]
dir = "out"
export = false
''' + agent * 2)
PY
if [ "$device" != cpu ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$job/gpu-memory.csv" &
  smi=$!
fi
step local-job bash -c "'$comas' local --dir '$job/local' --plaintext --workers 2 --device $device --json '$job/job.toml' > '$job/status.json'"
[ -n "${smi:-}" ] && kill "$smi" 2>/dev/null
# The memory estimate the job was submitted with (comas local prints it).
grep -E "needs about|each rollout worker holds" "$out/logs/local-job.log" > "$job/estimate.txt"

"$py" "$root/scripts/gpu_check/report.py" --work "$work" --out "$out" --device "$device" --size "$size" ${STRICT:+--check}
rc=$?
# PACK=1 (the device call, which brings back at most 8 files): the logs in one archive.
if [ "${PACK:-0}" = 1 ]; then
  tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$out/logs"
fi
echo "report: $out/gpu.md" >&2
exit $rc
