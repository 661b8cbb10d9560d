#!/usr/bin/env bash
# Installs third-party clients comas did not write into .venv-clients, so the tests talk to comas
# the way its users do: `mlflow` (a real tracking server, and its Python client reads the runs
# back; 3.18.0 needs an mlflow-tracing the index lacks), `grpcio-tools` (a Python gRPC client
# generated from proto/), `openai` (against `comas serve`), `datasets` and `pyarrow` (they
# write the parquet data sets the tests train on). About 1 GB. Idempotent: a stamp
# file makes the second run instant.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv-clients"
pins=(mlflow==3.17.2 grpcio-tools==1.85.4 grpcio-health-checking==1.85.1 openai==3.63.0 datasets==5.2.0)
stamp="$venv/.comas-clients-$(printf '%s\n' "${pins[@]}" | md5sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0
python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "setup-clients: $python not found; install Python 3.9+ or set PYTHON" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
echo "setup-clients: installing ${pins[*]} into .venv-clients" >&2
"$venv/bin/python" -m pip --disable-pip-version-check -q install "${pins[@]}"
"$venv/bin/python" -c 'import mlflow, grpc_tools.protoc, grpc_health.v1.health_pb2, openai, datasets, pyarrow.parquet' \
  || { echo "setup-clients: the clients installed but do not import" >&2; exit 1; }
[ -x "$venv/bin/mlflow" ] || { echo "setup-clients: no mlflow command in .venv-clients/bin" >&2; exit 1; }
rm -f "$venv"/.comas-clients-*
touch "$stamp"
