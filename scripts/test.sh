#!/usr/bin/env bash
# Runs every test of the workspace. Installs libtorch into .venv first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace "$@"
