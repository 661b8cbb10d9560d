#!/usr/bin/env bash
# The embedded default: build comas and run `comas local` with its built-in example: a coordinator,
# two learners and a rollout worker on loopback train two LoRA agents on the real
# SmolLM2-135M-Instruct with CoMAS for 2 steps, with a held-out evaluation before and after
# (about 10 minutes on 2 cores). `--example tiny` runs two tiny random models instead (a minute).
# Extra arguments go to `comas local` (e.g. --json, --example tiny, or a job file).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build -q -p comas
bash scripts/fetch-smollm2.sh >/dev/null
# A finished example runs afresh; an interrupted one resumes where it stopped.
target/debug/comas local --dir target/demo/local "$@"
