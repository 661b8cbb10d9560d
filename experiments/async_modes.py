"""Shared by the async-vs-synchronous reports: one mode's run and its time figures."""
import json
import os


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def load(out, mode):
    """A finished mode under OUT/MODE: its step records, its evaluations and its wall seconds."""
    rows = [json.loads(line) for line in open(os.path.join(out, mode, "out", "metrics.jsonl"))]
    wall = int(open(os.path.join(out, mode, "wall_seconds")).read())
    steps = sorted((r for r in rows if r["kind"] == "step"), key=lambda r: r["step"])
    evals = sorted((r for r in rows if r["kind"] == "eval"), key=lambda r: r["after_steps"])
    return steps, evals, wall


def utilisation(rows, side, evals):
    """1 − idle / step time over the steps that ran no evaluation (before evaluations counted as
    busy workers, their steps showed the workers idle), from each step's `idle_seconds`."""
    afters = {e["after_steps"] for e in evals}
    plain = [r for r in rows if r["step"] not in afters] or rows
    return 1 - sum(r["idle_seconds"][side] for r in plain) / sum(r["seconds"]["total"] for r in plain)


def stats(rows, evals, wall):
    """A mode's time figures: wall, steps per hour, stage means and utilisation."""
    total = sum(r["seconds"]["total"] for r in rows)
    return {
        "wall": wall,
        "per_hour": len(rows) * 3600 / wall,
        "step_s": total / len(rows),
        "rollout": mean(r["seconds"]["rollout"] for r in rows),
        "train": mean(r["seconds"]["train"] for r in rows),
        "broadcast": mean(r["seconds"]["broadcast"] for r in rows),
        "tok_s": mean(r.get("tokens_per_s") for r in rows),
        "workers": utilisation(rows, "workers", evals),
        "learners": utilisation(rows, "learners", evals),
    }


def lag_histogram(rows):
    """Trained turns by lag, summed over steps and agents, and the dropped turns."""
    hist, dropped = {}, 0
    for r in rows:
        for a in (r.get("policy_lag") or {}).get("agents", []):
            dropped += a["dropped"]
            for k, v in a["lag"].items():
                hist[int(k)] = hist.get(int(k), 0) + v
    return hist, dropped
