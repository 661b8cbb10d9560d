#!/usr/bin/env bash
# The embedded default: build comas and run `comas local` with its built-in example (a coordinator,
# two learners and two rollout workers on loopback train two tiny agents with CoMAS for 5 steps).
# Extra arguments go to `comas local` (e.g. --json, --workers 3, or a job file).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build -q -p comas
# A finished example runs afresh; an interrupted one resumes where it stopped.
target/debug/comas local --dir target/demo/local "$@"
