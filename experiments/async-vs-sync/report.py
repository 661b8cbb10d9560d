"""Writes the async-vs-sync report (stdout, markdown) from both runs' metrics logs."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from async_modes import fmt, lag_histogram, load, stats  # noqa: E402

out, steps, tokens, cores = sys.argv[1:5]

modes = {m: load(out, m) for m in ("synchronous", "async")}
print("# Async vs synchronous on the tiny CoMAS example\n")
print(f"Made by `bash experiments/async-vs-sync/run.sh` (STEPS={steps}, TOKENS={tokens}) on {cores} CPU cores: the built-in")
print("tiny example of `comas local` (two tiny random models, 2 workers, 4 questions x 2 instances per step) with")
print(f"{tokens}-token turns, run once with `sync = \"synchronous\"` and once with `sync = \"async\"` (max_policy_lag 1), one")
print("after the other. Wall time is the whole `comas local` run (start-up and evaluations included); utilisation is")
print("1 − idle / step time summed over the steps that ran no evaluation, from each step's `idle_seconds` (workers:")
print("no rollout or evaluation running; learners: not training). Figures: `async-vs-sync/synchronous.png`,")
print("`async-vs-sync/async.png`.\n")
print("| | synchronous | async | ratio |")
print("|---|---|---|---|")
figures = {m: stats(*run) for m, run in modes.items()}
for key, name, d in (("wall", "wall time, s", 0), ("per_hour", "steps per hour", 0), ("step_s", "mean step time, s", 2), ("workers", "worker utilisation", 2), ("learners", "learner utilisation", 2)):
    a, b = figures["synchronous"][key], figures["async"][key]
    print(f"| {name} | {fmt(a, d)} | {fmt(b, d)} | {b / a:.2f}x |")
hist, dropped = lag_histogram(modes["async"][0])
print(f"\nAsync turns trained: {hist.get(0, 0)} at lag 0, {hist.get(1, 0)} at lag 1; {dropped} dropped.\n")
print("## Rewards per step (mean solver reward) and held-out accuracy\n")
print("| step | synchronous | async |")
print("|---|---|---|")
rs, ra = modes["synchronous"][0], modes["async"][0]
for i in range(max(len(rs), len(ra))):
    v = lambda rows: fmt(((rows[i].get("reward") or {}).get("solver") or {}).get("mean")) if i < len(rows) else "–"
    print(f"| {i} | {v(rs)} | {v(ra)} |")
print()
for m, (_, evals, _) in modes.items():
    acc = [fmt((e.get("accuracy") or {}).get("last_round")) for e in evals]
    print(f"- {m}: held-out accuracy (last round) after {', '.join(str(e['after_steps']) for e in evals)} steps: {', '.join(acc)}")
print()
