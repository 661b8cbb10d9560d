#!/usr/bin/env python3
"""Bytes written per step over a long tiny job (issue 41 §3): the metrics log and the TensorBoard
file are appended once per step, so what a step writes stays the same at step 10 and at step
190. Runs `comas local --example tiny` with its job stretched to --steps steps (no held-out
evaluation), samples the coordinator process's write counter (/proc/PID/io `wchar`: every byte
it hands to write(2), the job store's and logs' included) and both files' sizes each time a
step record lands, and writes a Markdown report.

    python3 experiments/step-log-io/measure.py --comas target/release/comas --steps 200 \\
        --dir runs/step-log-io --out docs/experiments/step-log-io.md
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tiny_job(steps: int) -> str:
    """The built-in tiny example's job (cli/src/examples.rs), stretched, without evaluation."""
    src = (ROOT / "cli/src/examples.rs").read_text()
    job = re.search(r'pub const TINY_JOB: &str = r#"(.*?)"#;', src, re.S).group(1)
    job = re.sub(r"\nsteps = \d+\n", f"\nsteps = {steps}\n", job)
    return re.sub(r"\n# Held-out evaluation:[^\[]*\n\[eval\]\n(?:[^\[\n][^\n]*\n)*", "\n", job)


def wchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--comas", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    (d / "example").mkdir(parents=True)
    (d / "example/job.toml").write_text(tiny_job(a.steps))
    log = d / "example/out/metrics.jsonl"
    proc = subprocess.Popen([a.comas, "local", "--example", "tiny", "--dir", str(d), "--plaintext", "--json"],
                            stdout=subprocess.PIPE, stderr=open(d / "local.log", "w"))
    samples, seen = [], 0
    while proc.poll() is None:
        try:
            n = sum(1 for line in log.read_text().splitlines() if '"kind":"step"' in line)
            w = wchar(proc.pid)
        except (OSError, RuntimeError):
            time.sleep(0.02)
            continue
        if n > seen:
            events = sorted((d / "example/out").glob("**/events.out.tfevents*"))
            samples.append({"steps": n, "wchar": w, "metrics": log.stat().st_size,
                            "events": sum(e.stat().st_size for e in events)})
            seen = n
        time.sleep(0.02)
    status = json.loads(proc.stdout.read() or b"{}")
    (d / "samples.json").write_text(json.dumps(samples, indent=1))
    # Per-step differences between consecutive samples that are one step apart.
    deltas = [(b["steps"], {k: b[k] - a_[k] for k in ("wchar", "metrics", "events")})
              for a_, b in zip(samples, samples[1:]) if b["steps"] - a_["steps"] == 1]
    quarters = [(lo, hi) for lo, hi in ((2, 50), (51, 100), (101, 150), (151, a.steps))]
    lines = [
        f"# Bytes written per step over a {a.steps}-step tiny job",
        "",
        f"`python3 experiments/step-log-io/measure.py --comas {a.comas} --steps {a.steps} --dir {a.dir} --out {a.out}`",
        f"(job state: {status.get('state', '?')}, {status.get('steps_done', '?')} steps; {len(deltas)} steps sampled one apart).",
        "",
        "Each row: the mean (min-max) over the steps in that range of what one step added. `wchar` is every byte",
        "the `comas local` process (the coordinator, its job store and logs) handed to write(2) during the step.",
        "",
        "| steps | wchar per step | metrics.jsonl growth | event file growth |",
        "|---|---:|---:|---:|",
    ]
    for lo, hi in quarters:
        rows = [x for s, x in deltas if lo <= s <= hi]
        if not rows:
            continue
        cell = lambda k: f"{sum(r[k] for r in rows) / len(rows):,.0f} ({min(r[k] for r in rows):,}-{max(r[k] for r in rows):,})"
        lines.append(f"| {lo}-{hi} | {cell('wchar')} | {cell('metrics')} | {cell('events')} |")
    last = samples[-1] if samples else {"metrics": 0, "events": 0}
    rewrite = sum(s["metrics"] + s["events"] for s in samples)
    lines += [
        "",
        f"Final sizes: metrics.jsonl {last['metrics']:,} bytes, event file {last['events']:,} bytes. Rewriting both",
        f"whole at every step (before b999885) would have written {rewrite:,} bytes over the sampled steps;",
        f"appended, they hold {last['metrics'] + last['events']:,}.",
    ]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if status.get("state") == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
