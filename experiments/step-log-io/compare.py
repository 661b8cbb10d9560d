#!/usr/bin/env python3
"""The step log before and after its rewrite (issue 41 §3): runs the built-in tiny example
(`comas local --example tiny`: 5 CoMAS steps, held-out evaluations) with two comas binaries and
compares what each wrote: every record of `metrics.jsonl` as JSON (key order aside) and every
TensorBoard scalar (tag, step, value), leaving out what differs from run to run by nature
(wall times, rates, memory, the job id). A second run of the newer binary is the control: the
same binary twice must compare equal too, or the job is not deterministic enough to tell.

    python3 experiments/step-log-io/compare.py --old /tmp/comas-old --new target/debug/comas \\
        --dir runs/step-log-compare --out docs/experiments/step-log-compare.md
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Keys whose values are wall times, rates, memory or ids: they differ between any two runs.
VOLATILE = re.compile(r"(^|_)(time|seconds|secs|per_s|rss|job_id)($|_)|^seconds$|^job_id$")


def run(comas: str, d: Path) -> Path:
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    with open(d / "local.log", "w") as log:
        subprocess.run([comas, "local", "--example", "tiny", "--dir", str(d), "--plaintext", "--json"],
                       stdout=open(d / "status.json", "w"), stderr=log, check=True)
    return d / "example/out"


def steady(v, path=""):
    """`v` without its volatile keys."""
    if isinstance(v, dict):
        return {k: steady(x, f"{path}.{k}") for k, x in v.items() if not VOLATILE.search(k)}
    if isinstance(v, list):
        return [steady(x, path) for x in v]
    return v


def records(out: Path):
    return [steady(json.loads(l)) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]


def scalars(out: Path):
    """{(tag, step): value} of every scalar in the run's event files, volatile tags left out."""
    sys.path.insert(0, str(ROOT / ".venv-tb/lib/python3.11/site-packages"))
    from tensorboard.backend.event_processing import event_accumulator as ea
    found = {}
    for f in sorted(out.glob("**/events.out.tfevents*")):
        acc = ea.EventAccumulator(str(f), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            if not any(VOLATILE.search(part) for part in tag.split("/")):
                for e in acc.Scalars(tag):
                    found[(tag, e.step)] = e.value
        for tag in acc.Tags().get("tensors", []):
            if not any(VOLATILE.search(part) for part in tag.split("/")):
                for e in acc.Tensors(tag):
                    found[(tag, e.step)] = float(ea.tensor_util.make_ndarray(e.tensor_proto).item())
    return found


def differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in the first" for k in a.keys() - b.keys()]
        out += [f"{path}.{k}: only in the second" for k in b.keys() - a.keys()]
        for k in a.keys() & b.keys():
            out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {json.dumps(a)[:80]} vs {json.dumps(b)[:80]}"]


def compare(first: Path, second: Path):
    ra, rb = records(first), records(second)
    diffs = [] if len(ra) == len(rb) else [f"{len(ra)} records vs {len(rb)}"]
    for i, (x, y) in enumerate(zip(ra, rb)):
        diffs += [f"record {i} ({x.get('kind')} {x.get('step')}){d}" for d in differences(x, y)]
    sa, sb = scalars(first), scalars(second)
    diffs += [f"scalar {k}: only in the first" for k in sorted(sa.keys() - sb.keys())]
    diffs += [f"scalar {k}: only in the second" for k in sorted(sb.keys() - sa.keys())]
    diffs += [f"scalar {k}: {sa[k]} vs {sb[k]}" for k in sorted(sa.keys() & sb.keys()) if sa[k] != sb[k]]
    return len(ra), len(sa), diffs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    d = Path(a.dir)
    old, new, again = run(a.old, d / "old"), run(a.new, d / "new"), run(a.new, d / "new-again")
    lines = ["# The step log before and after its rewrite", "",
             f"`python3 experiments/step-log-io/compare.py --old {a.old} --new {a.new} --dir {a.dir} --out {a.out}`", "",
             "The built-in tiny example (5 CoMAS steps, held-out evaluations) run by each binary; records of",
             "`metrics.jsonl` compared as JSON values (key order aside) and TensorBoard scalars as (tag, step,",
             "value), without wall times, rates, memory and the job id.", "",
             "| compared | records | scalars | differences |", "|---|---:|---:|---:|"]
    details = []
    for name, x, y in (("new, twice (control)", new, again), ("old against new", old, new)):
        n, s, diffs = compare(x, y)
        lines.append(f"| {name} | {n} | {s} | {len(diffs)} |")
        if diffs:
            details += ["", f"## {name}", ""] + [f"- {x}" for x in diffs[:60]]
    Path(a.out).write_text("\n".join(lines + details) + "\n")
    print("\n".join(lines + details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
