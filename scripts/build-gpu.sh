#!/usr/bin/env bash
# Builds the CUDA `comas` binary here, on a machine with no GPU and only the CUDA runtime
# wheels, for scripts/gpu-check.sh on a GPU machine: COMAS_CUDA=1 links libtorch_cuda (its own
# CUDA libraries are resolved where the binary runs), in target/cuda so that the CPU build is
# left alone. The binary is stripped and compressed to dist/gpu/comas.xz (what the device call
# carries: the working tree and what it carries must stay under 64 MiB).
#
#   bash scripts/build-gpu.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
COMAS_CUDA=1 CARGO_TARGET_DIR=target/cuda cargo build --release -p comas
# The model's and the learner's parity suites, which gpu-check.sh runs on the GPU
# (COMAS_TEST_DEVICE=cuda).
suites=$(COMAS_CUDA=1 CARGO_TARGET_DIR=target/cuda cargo test --release -p comas-model -p comas-learner \
  --test parity --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "parity":
        print(m["package_id"].split("#")[-1].split("@")[0].split(" ")[0], m["executable"])
')
mkdir -p dist/gpu
# pack NAME BINARY: stripped and compressed into dist/gpu/NAME.xz.
pack() {
  readelf -d "$2" | grep -q 'NEEDED.*libtorch_cuda' || { echo "build-gpu: $2 does not link libtorch_cuda" >&2; exit 1; }
  strip -o "dist/gpu/$1" "$2"
  xz -T0 -6 -c "dist/gpu/$1" > "dist/gpu/$1.xz.tmp" && mv "dist/gpu/$1.xz.tmp" "dist/gpu/$1.xz"
  rm "dist/gpu/$1"
}
pack comas target/cuda/release/comas
while read -r package exe; do
  pack "$package-parity" "$exe"
done <<< "$suites"
ls -l dist/gpu >&2
