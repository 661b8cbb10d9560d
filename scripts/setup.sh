#!/usr/bin/env bash
# Creates the project-local virtualenv that provides libtorch (from the PyPI torch wheel) and
# points `.venv/libtorch` at it. Idempotent: a stamp file makes the second run instant.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
torch_version="2.11.0"
stamp="$venv/.comas-libtorch-$torch_version"
[ -f "$stamp" ] && [ -e "$venv/libtorch/lib" ] && exit 0

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "setup: $python not found; install Python 3.9+ or set PYTHON" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

echo "setup: installing torch==$torch_version (libtorch only, no Python deps) into .venv" >&2
"${pip[@]}" install --no-deps "torch==$torch_version"

# The lean install skips torch's dependencies, but libtorch_cpu still links the CUDA runtime and
# CUPTI. Install exactly the versions this wheel names: either directly (older wheels) or through
# the `cudart`/`cupti` extras of the `cuda-toolkit` meta package (torch 2.11).
cuda_reqs() {
  "$venv/bin/python" - "$@" <<'PY'
import importlib.metadata as md, re, sys
dist = sys.argv[1]
for req in md.requires(dist) or []:
    spec, _, marker = req.partition(";")
    spec = spec.strip()
    name = re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0]
    if dist == "torch" and name == "cuda-toolkit":
        print("TOOLKIT " + re.sub(r"\[.*\]", "", spec).replace(" ", ""))
    elif name.startswith(("nvidia-cuda-runtime", "nvidia-cuda-cupti")):
        if dist == "torch" or re.search(r"extra == .(cudart|cupti).", marker):
            print(spec.replace(" ", ""))
PY
}
mapfile -t reqs < <(cuda_reqs torch)
wanted=()
for r in "${reqs[@]}"; do
  if [[ $r == TOOLKIT\ * ]]; then
    "${pip[@]}" install --no-deps "${r#TOOLKIT }"
    mapfile -t more < <(cuda_reqs cuda-toolkit)
    wanted+=("${more[@]}")
  else
    wanted+=("$r")
  fi
done
if [ ${#wanted[@]} -gt 0 ]; then
  echo "setup: installing ${wanted[*]}" >&2
  "${pip[@]}" install --no-deps "${wanted[@]}"
fi

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -f "$site/torch/lib/libtorch_cpu.so" ] || { echo "setup: $site/torch/lib/libtorch_cpu.so missing after install" >&2; exit 1; }
ln -sfn "$site/torch" "$venv/libtorch"
touch "$stamp"
echo "setup: libtorch ready at .venv/libtorch" >&2
