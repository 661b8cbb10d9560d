#!/usr/bin/env bash
# Offline checks of deploy/: renders every kustomize overlay, validates each object against the
# Kubernetes schemas, checks the values that must agree, and lints the Dockerfile.
set -euo pipefail
deploy=$(cd "$(dirname "$0")/.." && pwd)
bash "$deploy/tests/setup.sh"
exec "$deploy/.tools/venv/bin/python" -m unittest discover -s "$deploy/tests" -t "$deploy/tests" "$@"
