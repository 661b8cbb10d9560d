#!/usr/bin/env bash
# Checks that the crates with C++ in them (and all they need) compile for 64-bit Arm Linux hosts
# (Grace in GH200/GB200, Graviton): the shims in model/csrc with the aarch64 cross compiler
# against libtorch's headers, the Rust for the target. Nothing is linked: there is no aarch64
# libtorch here, and the headers are the same on both.
#
#   bash scripts/check-aarch64.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
command -v aarch64-linux-gnu-g++ >/dev/null || {
  echo "check-aarch64: no aarch64-linux-gnu-g++; install it (Debian: apt-get install g++-aarch64-linux-gnu)" >&2
  exit 1
}
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++ \
  CARGO_TARGET_DIR=target/aarch64-check \
  cargo check --target aarch64-unknown-linux-gnu -p comas-model -p comas-learner
echo "check-aarch64: comas-model and comas-learner compile for aarch64-unknown-linux-gnu" >&2
