# What the long studies' run.sh share (sourced): the comas binary they run, and keeping their
# finished parts in the tree.

# study_comas ROOT LOCK: the comas binary to run, printed: $COMAS_BIN when set (a copy keeps a
# long study apart from rebuilds of the tree), else a release build of the tree (under LOCK).
study_comas() {
  if [ -n "${COMAS_BIN:-}" ]; then
    echo "$COMAS_BIN"
  else
    (cd "$1" && flock "$2" cargo build -q --release -p comas) >&2
    echo "$1/target/release/comas"
  fi
}

# Keeping a long study's finished parts:
#
# A study runs for hours over several sessions, and a session's runs/ folder does not outlive
# it. KEEP (a committed folder) holds each finished part's small files: an evaluation's
# held-out answers (gzipped) and summary as soon as it is done, a training run's step logs and
# peak memory once the run and every evaluation of its checkpoints are. `keep_restore` puts them
# back into a fresh runs/ folder first, so the study redoes only the part that was under way.
# Checkpoints are not kept: a run whose evaluations were not all done trains again.
#
# Each function takes the runs folder, the keep folder (empty: keep nothing) and the data mix
# (a keep folder made on another mix is refused).

# keep_restore RUNS KEEP MIX: every kept evaluation and run back into RUNS.
keep_restore() {
  local runs=$1 keep=$2 mix=$3
  # No mix file: nothing kept there yet (a new folder, or one with notes only).
  [ -n "$keep" ] && [ -f "$keep/mix" ] || return 0
  if [ "$(cat "$keep/mix")" != "$mix" ]; then
    echo "$keep was made on the data mix '$(cat "$keep/mix")', these settings use '$mix': use another KEEP folder" >&2
    return 2
  fi
  local gz d kept
  for gz in "$keep"/eval/*/results.jsonl.gz; do
    [ -e "$gz" ] || continue
    d="$runs/eval/$(basename "$(dirname "$gz")")"
    [ -f "$d/summary.json" ] && continue
    mkdir -p "$d"
    gunzip -c "$gz" > "$d/results.jsonl"
    cp "$(dirname "$gz")/summary.json" "$d/"
  done
  for kept in "$keep"/runs/*; do
    [ -d "$kept" ] || continue
    d="$runs/$(basename "$kept")"
    [ -f "$d/DONE" ] && continue
    mkdir -p "$d"
    cp -r "$kept"/. "$d"/
  done
}

# keep_eval RUNS KEEP MIX NAME: the finished evaluation RUNS/eval/NAME into KEEP.
keep_eval() {
  local runs=$1 keep=$2 mix=$3 name=$4
  [ -n "$keep" ] && [ -f "$runs/eval/$name/summary.json" ] || return 0
  local to="$keep/eval/$name"
  [ -f "$to/summary.json" ] && return 0
  mkdir -p "$to"
  echo "$mix" > "$keep/mix"
  gzip -9nc "$runs/eval/$name/results.jsonl" > "$to/results.jsonl.gz"
  cp "$runs/eval/$name/summary.json" "$to/"
}

# keep_run RUNS KEEP MIX NAME EVALS...: the finished run RUNS/NAME (its DONE marker, step logs
# and peak memory) into KEEP, once every evaluation named in EVALS is done.
keep_run() {
  local runs=$1 keep=$2 mix=$3 name=$4
  shift 4
  [ -n "$keep" ] && [ -f "$runs/$name/DONE" ] || return 0
  local e f
  for e in "$@"; do
    [ -f "$runs/eval/$e/summary.json" ] || return 0
  done
  for e in "$@"; do
    keep_eval "$runs" "$keep" "$mix" "$e"
  done
  for f in DONE peak.json status.json steps.jsonl out/metrics.jsonl; do
    [ -f "$runs/$name/$f" ] || continue
    mkdir -p "$keep/runs/$name/$(dirname "$f")"
    cp "$runs/$name/$f" "$keep/runs/$name/$f"
  done
}
