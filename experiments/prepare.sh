# Sourced by the SmolLM2 experiment scripts from the repository root, after they set `root` and
# `here` (their own folder): builds comas in release (unless COMAS_BIN names a binary to use, or
# REPORT_ONLY only rewrites the report) and fetches SmolLM2-135M-Instruct. Sets `comas` (the
# binary) and `model` (the model folder), and the experiment's paths, named after its folder:
# `out` (the run, runs/NAME unless OUT says otherwise), `report` (docs/experiments/NAME.md) and
# `figures` (docs/experiments/NAME/), the last two created.
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

# One agent's table: a LoRA adapter (r 16 on the attention projections) on the shared base,
# trained in bf16 at lr 3e-4. Usage: lora_agent TRAIN_BATCH MICRO_BATCH
lora_agent() {
  cat <<AGENT

[[agents]]
model = "$model"
[agents.train]
lr = 3e-4
dtype = "bfloat16"
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
