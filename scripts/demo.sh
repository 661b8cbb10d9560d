#!/usr/bin/env bash
# The embedded default: build comas, write a tiny random Qwen2-shaped model and generate from it.
# (Until the coordinator exists this is what `comas local` will grow into.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build -q -p comas
model=target/demo/tiny-qwen2
[ -f "$model/model.safetensors" ] || target/debug/comas tiny-model --out "$model" --seed 0
target/debug/comas generate --model "$model" --chat "What is 12 + 7?" --max-new-tokens 24 --seed 1 "$@"
