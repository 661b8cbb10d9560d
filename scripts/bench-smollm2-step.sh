#!/usr/bin/env bash
# The real-model step of the speed issue, timed end to end: `comas local` runs one CoMAS step of
# 2 LoRA agents (r 8 on q/v) on SmolLM2-135M-Instruct, 16 episodes (8 questions x 2 instances),
# l = 2, R = 1, at most 96 new tokens per turn, 48 experiences per learner in micro-batches of 12
# with gradient checkpointing, one rollout worker with 2 threads and one thread per learner.
# Prints rollout, training and broadcast seconds of each step from the metrics log.
#
#   bash scripts/bench-smollm2-step.sh            # DTYPE=bfloat16 (or float32), STEPS=1
#   COMAS_DECODE_ATTENTION=sdpa bash scripts/bench-smollm2-step.sh     # SDPA for decode attention
#                                                 # instead of the kernel (or `blocked`)
#   COMAS_DECODE_LINEAR=aten bash scripts/bench-smollm2-step.sh        # aten's linears in decode
#                                                 # instead of oneDNN's packed ones (bf16 on CPU)
#                                                 # or the few-row kernel (f32)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dtype=${DTYPE:-bfloat16}
steps=${STEPS:-1}
dir=${OUT:-$root/target/bench-step-$dtype}
cd "$root"
bash scripts/setup.sh >&2
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p comas   # NO_BUILD=1 times the binary as it is
model=$(bash scripts/fetch-smollm2.sh)
rm -rf "$dir" && mkdir -p "$dir"
python3 - "$dir/train.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(64):
        a, b = 3 + (i * 7) % 41, 5 + (i * 13) % 37
        f.write(json.dumps({"prompt": f"Mia has {a} marbles and gets {b} more. How many marbles does Mia have now?",
                            "answer": str(a + b), "task": "math", "id": f"step-{i}"}) + "\n")
PY
agent() {
  cat <<TOML

[[agents]]
model = "$model"
[agents.train]
lr = 2e-4
dtype = "$dtype"
train_batch_size = 48
micro_batch_size = 12
gradient_checkpointing = ${CHECKPOINT:-true}
[agents.train.lora]
r = 8
alpha = 16.0
target_modules = ["q_proj", "v_proj"]
TOML
}
{
  cat <<TOML
name = "bench-step"
seed = 1
[data]
train = "train.jsonl"
[schedule]
questions_per_step = 8
steps = $steps
[output]
dir = "out"
export = false
[rollout]
dtype = "$dtype"
[comas]
num_rounds = 1
evals_per_solution = 1
num_references = 2
instances_per_question = 2
[comas.sampling.solver]
temperature = 1.0
max_new_tokens = 96
[comas.sampling.evaluator]
temperature = 1.0
max_new_tokens = 96
[comas.sampling.scorer]
temperature = 1.0
max_new_tokens = 96
guided_suffix = "<score>[123]</score>"
TOML
  agent
  agent
} > "$dir/job.toml"
start=$(date +%s.%N)
target/release/comas local "$dir/job.toml" --workers 1 --worker-threads 2 --threads-per-process 1 --dir "$dir/run" > "$dir/local.log" 2>&1
end=$(date +%s.%N)
python3 - "$dir/out/metrics.jsonl" "$start" "$end" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") != "step":
        continue
    s = r["seconds"]
    tok = r.get("tokens_per_s", 0)
    print(f"step {r['step']}: rollout {s['rollout']:.1f} s ({r.get('generated_tokens', 0)} tokens, {tok:.1f} tok/s), "
          f"training {s['train']:.1f} s, broadcast {s['broadcast']:.2f} s, step total {s['total']:.1f} s")
    for k, a in enumerate(r.get("agents", [])):
        t = a.get("train") or {}
        print(f"  learner {k}: {t.get('tokens', 0)} tokens in {t.get('seconds', 0):.1f} s ({t.get('tokens_per_s', 0):.1f} tok/s), "
              f"peak RSS {t.get('peak_rss_bytes', 0) / 2**30:.2f} GiB")
print(f"wall time of comas local (start, load, step(s), export): {float(sys.argv[3]) - float(sys.argv[2]):.0f} s")
PY
