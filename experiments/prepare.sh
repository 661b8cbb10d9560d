# Sourced by the SmolLM2 experiment scripts from the repository root, after they set `root` and
# `here` (their own folder): builds comas in release (unless COMAS_BIN names a binary to use, or
# REPORT_ONLY only rewrites the report) and fetches SmolLM2-135M-Instruct. Sets `comas` (the
# binary) and `model` (the model folder), and the experiment's paths, named after its folder:
# `out` (the run, runs/NAME unless OUT says otherwise), `report` (docs/experiments/NAME.md) and
# `figures` (docs/experiments/NAME/), the last two created, and `dtype`: DTYPE, or bfloat16
# where the CPU multiplies bf16 in hardware (AMX or AVX-512 BF16) and float32 elsewhere, where
# bf16 products are emulated and several times slower.
name=$(basename "$here")
out=${OUT:-$root/runs/$name}
report="$root/docs/experiments/$name.md"
figures="$root/docs/experiments/$name"
mkdir -p "$out" "$figures"
comas=${COMAS_BIN:-$PWD/target/release/comas}
if [ -z "${REPORT_ONLY:-}" ] && [ -z "${COMAS_BIN:-}" ]; then
  bash scripts/setup.sh >&2
  cargo build --release -q -p comas
fi
model=$(bash scripts/fetch-smollm2.sh)
if grep -qE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then
  dtype=${DTYPE:-bfloat16}
else
  dtype=${DTYPE:-float32}
fi

# One agent's table: a LoRA adapter (r 16 on the attention projections) on the shared base,
# trained in `dtype` at lr 3e-4. Usage: lora_agent TRAIN_BATCH MICRO_BATCH
lora_agent() {
  cat <<AGENT

[[agents]]
model = "$model"
[agents.train]
lr = 3e-4
dtype = "$dtype"
train_batch_size = $1
micro_batch_size = $2
gradient_checkpointing = false
[agents.train.lora]
r = 16
alpha = 32.0
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj"]
AGENT
}

# Runs JOB with `comas local` (one worker, 2 threads) into DIR, once: DIR/done marks a finished
# run, DIR/wall_seconds its time, DIR/local.log its output. Usage: run_local_once JOB DIR
run_local_once() {
  local job=$1 dir=$2 start
  [ -f "$dir/done" ] && return 0
  start=$(date +%s)
  "$comas" local "$job" --workers 1 --worker-threads 2 --threads-per-process 1 --dir "$dir/run" > "$dir/local.log" 2>&1
  echo $(($(date +%s) - start)) > "$dir/wall_seconds"
  touch "$dir/done"
}

# Data: sums of two numbers from 1 to 9 in a few phrasings, so that the untrained model gets a
# fair share right (about half greedy, a fifth to a quarter sampled at 0.5 in a probe). The 16
# held-out questions use number pairs never seen in training.
# Usage: arithmetic_data DIR (writes DIR/train.jsonl and DIR/test.jsonl once).
arithmetic_data() {
  local out=$1
  [ -f "$out/train.jsonl" ] && return 0
  python3 - "$out" <<'PY'
import json, random, sys
out = sys.argv[1]
names = ["Mia", "Omar", "Lena", "Raj", "Ana", "Tom", "Zoe", "Ivan"]
things = ["marbles", "stickers", "books", "coins", "apples", "pencils"]
verbs = ["gets {b} more", "finds {b} more", "buys {b} more", "is given {b} more"]
rng = random.Random(13)
pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
rng.shuffle(pairs)
def record(i, a, b):
    who, what, verb = rng.choice(names), rng.choice(things), rng.choice(verbs).format(b=b)
    text = f"{who} has {a} {what} and {verb}. How many {what} does {who} have now?"
    return {"prompt": text, "answer": str(a + b), "task": "math", "id": f"sum-{i:04d}"}
test = [record(i, a, b) for i, (a, b) in enumerate(pairs[:16])]
train = [record(100 + i, a, b) for i, (a, b) in enumerate(pairs[16:])]
for name, rows in (("train", train), ("test", test)):
    with open(f"{out}/{name}.jsonl.part", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
PY
  mv "$out/test.jsonl.part" "$out/test.jsonl"
  mv "$out/train.jsonl.part" "$out/train.jsonl"
}

# A CoMAS job on the arithmetic data (l = 2, R = 1, guided scores, two LoRA agents) for ARM
# (comas, no_scoring, no_evaluation or verifier) and SEED. From the caller: `steps`,
# `questions`, `eval_every` and `out`; optional `job_name` (default smollm2-ARM-sSEED),
# `job_dir` (its output goes to job_dir/out; default out/ARM-sSEED) and `schedule_extra`
# (lines added to its [schedule]). Usage: comas_job_file ARM SEED
comas_job_file() {
  local arm=$1 seed=$2 variant="" reward="" evals=1 judge_tag=""
  case $arm in
    comas) ;;
    no_scoring) variant='variant = { kind = "no_scoring" }'; evals=2
      judge_tag="guided_suffix = '<judgment>(correct|incorrect)</judgment>'" ;;
    no_evaluation) variant='variant = { kind = "no_evaluation" }' ;;
    verifier) reward='reward = "verifier"' ;;
    *) echo "unknown arm $arm (use comas, no_scoring, no_evaluation, verifier)" >&2; exit 2 ;;
  esac
  # Turns per agent per step: every agent solves once per instance and judges once per judged pair.
  local instances=$((questions * 2)) per_agent
  case $arm in
    no_scoring) per_agent=$((instances * 3)) ;;    # 1 solution + 2 verdicts
    no_evaluation) per_agent=$((instances * 2)) ;; # 1 solution + 1 score
    *) per_agent=$((instances * 3)) ;;             # 1 solution + 1 evaluation + 1 score
  esac
  cat <<EOF
# Written by experiments/prepare.sh (comas_job_file): arm $arm, seed $seed.
name = "${job_name:-smollm2-$arm-s$seed}"
seed = $seed

[data]
train = "$out/train.jsonl"

[schedule]
questions_per_step = $questions
steps = $steps
${schedule_extra:-}

[rollout]
dtype = "$dtype"

[output]
dir = "${job_dir:-$out/$arm-s$seed}/out"

[comas]
num_rounds = 1
evals_per_solution = $evals
num_references = 2
instances_per_question = 2
$variant
$reward

[comas.sampling.solver]
temperature = 0.5
top_p = 0.95
top_k = 0
max_new_tokens = 96
min_new_tokens = 1

[comas.sampling.evaluator]
temperature = 0.5
top_p = 0.95
top_k = 0
max_new_tokens = 64
min_new_tokens = 1
$judge_tag

[comas.sampling.scorer]
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = 24
min_new_tokens = 1
guided_suffix = "<score>[123]</score>"

[eval]
data = "$out/test.jsonl"
every_steps = $eval_every
temperature = 0.7
greedy = true
EOF
  lora_agent "$per_agent" 12
  lora_agent "$per_agent" 12
}
