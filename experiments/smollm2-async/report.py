"""Writes the SmolLM2 async-vs-synchronous report (markdown, stdout) from each mode's metrics log.

Usage: report.py OUT STEPS EVAL_EVERY QUESTIONS ARM DTYPE CORES MODE...
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from async_modes import fmt, lag_histogram, load, mean, stats  # noqa: E402

out, steps, eval_every, questions, arm, dtype, cores = sys.argv[1:8]
modes = sys.argv[8:]

runs = {m: load(out, m) for m in modes}
base = modes[0]
print("# Async vs synchronous on SmolLM2-135M-Instruct\n")
print(f"Made by `bash experiments/smollm2-async/run.sh` (STEPS={steps}, EVAL_EVERY={eval_every}, QUESTIONS={questions},")
print(f"ARM={arm}) on {cores} CPU cores: the same job in each mode, one after the other, with `comas local` (one worker")
print("with 2 threads, one learner process per agent with 1 thread). The job: two LoRA agents (r 16 on the attention")
print(f"projections, {dtype}) on one SmolLM2 base play CoMAS (l = 2, R = 1, guided scores) on sums of two numbers, 8")
print(f"episodes per step; the `{arm}` arm of `experiments/prepare.sh`'s `comas_job_file`. `async-N` is")
print("`sync = \"async\"` with `max_policy_lag = N`.\n")
print("Times: wall is the whole `comas local` run (start-up included); step time is the sum of the steps' own")
print("seconds (no start-up; each evaluation is inside the step that starts with it, in both modes).")
print("Utilisation is 1 − idle / step time over the steps that ran no evaluation, from each step's `idle_seconds`")
print("(workers: no rollout running; learners: not training).\n")
print("| | " + " | ".join(modes) + " |")
print("|---|" + "---|" * len(modes))
figures = {m: stats(*run) for m, run in runs.items()}
for key, name, d in (
    ("wall", "wall time, s", 0),
    ("per_hour", "steps per hour (wall)", 1),
    ("step_s", "mean step time, s", 1),
    ("rollout", "mean rollout, s", 1),
    ("train", "mean training, s", 1),
    ("broadcast", "mean broadcast, s", 2),
    ("tok_s", "rollout tok/s", 1),
    ("workers", "worker utilisation", 2),
    ("learners", "learner utilisation", 2),
):
    cells = [fmt(figures[m][key], d) for m in modes]
    print(f"| {name} | " + " | ".join(cells) + " |")
ratios = [f"{m}: {figures[base]['step_s'] / figures[m]['step_s']:.2f}x" for m in modes[1:]]
if ratios:
    print(f"\nStep-time speed-up over {base}: {', '.join(ratios)}.\n")

print("## Policy lag of the trained turns\n")
for m in modes:
    hist, dropped = lag_histogram(runs[m][0])
    if hist:
        parts = ", ".join(f"{v} at lag {k}" for k, v in sorted(hist.items()))
        print(f"- {m}: {parts}; {dropped} dropped.")
    else:
        print(f"- {m}: every turn trained on the weights that sampled it (synchronous).")
print()

print("## Training steps: solver reward and accuracy\n")
print("Solver reward mean and the share of right last-round solutions among the step's graded ones (temperature 0.5).\n")
print("| step | " + " | ".join(f"{m} reward | {m} acc." for m in modes) + " |")
print("|---|" + "---|---|" * len(modes))
n = max(len(runs[m][0]) for m in modes)
for i in range(n):
    cells = []
    for m in modes:
        rows = runs[m][0]
        if i < len(rows):
            r = rows[i]
            cells += [fmt(((r.get("reward") or {}).get("solver") or {}).get("mean")), fmt((r.get("accuracy") or {}).get("last_round"))]
        else:
            cells += ["–", "–"]
    print(f"| {i} | " + " | ".join(cells) + " |")
half = n // 2
print()
for m in modes:
    rows = runs[m][0]
    first = mean((r.get("accuracy") or {}).get("last_round") for r in rows[:half])
    last = mean((r.get("accuracy") or {}).get("last_round") for r in rows[half:])
    print(f"- {m}: training accuracy {fmt(first)} over steps 0–{half - 1}, {fmt(last)} over steps {half}–{len(rows) - 1}.")
print()

print("## Held-out accuracy\n")
print("Right last-round answers of 32 (16 held-out questions, 2 agents), sampled at 0.7 / greedy.\n")
afters = sorted({e["after_steps"] for m in modes for e in runs[m][1]})
print("| after steps | " + " | ".join(modes) + " |")
print("|---|" + "---|" * len(modes))
for s in afters:
    cells = []
    for m in modes:
        e = next((e for e in runs[m][1] if e["after_steps"] == s), None)
        if e is None:
            cells.append("–")
            continue
        sampled = (e.get("accuracy") or {}).get("last_round")
        greedy = ((e.get("greedy") or {}).get("accuracy") or {}).get("last_round")
        cell = lambda a: "–" if a is None else str(round(a * 32))
        cells.append(f"{cell(sampled)} / {cell(greedy)}")
    print(f"| {s} | " + " | ".join(cells) + " |")
print()
print("Figures: " + ", ".join(f"`smollm2-async/{m}.png`" for m in modes) + ".\n")
for m in modes:
    print(f"![{m}](smollm2-async/{m}.png)")
print()
