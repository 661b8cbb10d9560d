"""Writes the async-vs-sync report (stdout, markdown) from both runs' metrics logs."""
import json
import os
import sys

out, steps, tokens, cores = sys.argv[1:5]


def load(mode):
    rows = [json.loads(l) for l in open(os.path.join(out, mode, "out", "metrics.jsonl"))]
    wall = int(open(os.path.join(out, mode, "wall_seconds")).read())
    return [r for r in rows if r["kind"] == "step"], [r for r in rows if r["kind"] == "eval"], wall


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


modes = {m: load(m) for m in ("synchronous", "async")}
print("# Async vs synchronous on the tiny CoMAS example\n")
print(f"Made by `bash experiments/async-vs-sync/run.sh` (STEPS={steps}, TOKENS={tokens}) on {cores} CPU cores: the built-in")
print("tiny example of `comas local` (two tiny random models, 2 workers, 4 questions x 2 instances per step) with")
print(f"{tokens}-token turns, run once with `sync = \"synchronous\"` and once with `sync = \"async\"` (max_policy_lag 1), one")
print("after the other. Wall time is the whole `comas local` run (start-up and evaluations included); utilisation is")
print("1 − idle / step time summed over the steps, from each step's `idle_seconds` (workers: no rollout running;")
print("learners: not training). Figures: `async-vs-sync/synchronous.png`, `async-vs-sync/async.png`.\n")
print("| | synchronous | async | ratio |")
print("|---|---|---|---|")
stats = {}
for m, (rows, evals, wall) in modes.items():
    total = sum(r["seconds"]["total"] for r in rows)
    stats[m] = {
        "wall": wall,
        "steps_per_hour": len(rows) * 3600 / wall,
        "step_s": total / len(rows),
        "workers": 1 - sum(r["idle_seconds"]["workers"] for r in rows) / total,
        "learners": 1 - sum(r["idle_seconds"]["learners"] for r in rows) / total,
    }
for key, name, d in (("wall", "wall time, s", 0), ("steps_per_hour", "steps per hour", 0), ("step_s", "mean step time, s", 2), ("workers", "worker utilisation", 2), ("learners", "learner utilisation", 2)):
    a, b = stats["synchronous"][key], stats["async"][key]
    print(f"| {name} | {fmt(a, d)} | {fmt(b, d)} | {b / a:.2f}x |")
lag = [0, 0]
for r in modes["async"][0]:
    for a in r.get("policy_lag", {}).get("agents", []):
        for k, v in a["lag"].items():
            lag[int(k)] += v
print(f"\nAsync turns trained: {lag[0]} at lag 0, {lag[1]} at lag 1, none dropped.\n")
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
