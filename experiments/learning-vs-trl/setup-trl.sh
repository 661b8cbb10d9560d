#!/usr/bin/env bash
# The reference trainer's environment: TRL's GRPOTrainer with a PEFT LoRA on PyPI's torch
# 2.11.0 (the libtorch comas links), in .venv-trl at the repository root. Idempotent: a stamp
# file makes the second run instant. The versions used are written to .venv-trl/versions.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-trl"
stamp="$venv/.learning-vs-trl-1"
if [ -f "$stamp" ]; then
  cat "$venv/versions.txt"
  exit 0
fi
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
echo "setup-trl: installing torch 2.11.0, trl, peft, transformers, datasets, math-verify (several GB, once)" >&2
"${pip[@]}" install "torch==2.11.0" "trl==1.16.0" peft transformers datasets accelerate "math-verify==0.8.0" "antlr4-python3-runtime==4.13.2" matplotlib
"$venv/bin/python" - > "$venv/versions.txt" <<'PY'
import importlib.metadata as md
for name in ("torch", "trl", "peft", "transformers", "datasets", "accelerate", "math-verify", "sympy"):
    print(f"{name}=={md.version(name)}")
PY
"$venv/bin/python" -c 'import torch, trl, peft, math_verify' || { echo "setup-trl: import check failed" >&2; exit 1; }
touch "$stamp"
cat "$venv/versions.txt"
