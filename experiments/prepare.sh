# Sourced by the SmolLM2 experiment scripts from the repository root: builds comas in release
# (unless COMAS_BIN names a binary to use, or REPORT_ONLY only rewrites the report) and fetches
# SmolLM2-135M-Instruct. Sets `comas` (the binary) and `model` (the model folder).
comas=${COMAS_BIN:-$PWD/target/release/comas}
if [ -z "${REPORT_ONLY:-}" ] && [ -z "${COMAS_BIN:-}" ]; then
  bash scripts/setup.sh >&2
  cargo build --release -q -p comas
fi
model=$(bash scripts/fetch-smollm2.sh)
