#!/usr/bin/env bash
# Installs the PyPI `tensorboard` package into .venv-tb: the tests read comas's event files back
# with TensorBoard's own reader. Idempotent: a stamp file makes the second run instant.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv-tb"
version="2.21.0"
stamp="$venv/.comas-tensorboard-$version"
[ -f "$stamp" ] && exit 0
python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "setup-tensorboard: $python not found; install Python 3.9+ or set PYTHON" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
echo "setup-tensorboard: installing tensorboard==$version into .venv-tb" >&2
"$venv/bin/python" -m pip --disable-pip-version-check -q install "tensorboard==$version"
"$venv/bin/python" -c 'from tensorboard.backend.event_processing import event_accumulator' \
  || { echo "setup-tensorboard: tensorboard installed but its event reader does not import" >&2; exit 1; }
rm -f "$venv"/.comas-tensorboard-*
touch "$stamp"
