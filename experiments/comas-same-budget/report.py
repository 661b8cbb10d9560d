#!/usr/bin/env python3
"""CoMAS on the learning study's budget (issue 42 §4): per step, how far the judges' scores tell
right answers from wrong ones and how often the solvers are right; held-out accuracy of each
agent's adapters next to the untrained model and `grpo` (the learning study's runs: same task,
held-out set, evaluator, optimizer and steps), with 95 % intervals of every gain (a paired
bootstrap over questions). Reads what run.sh wrote (a folder of runs or a kept results folder);
whatever is missing is reported as missing.

    .venv-trl/bin/python experiments/comas-same-budget/report.py --runs runs/comas-same-budget \
        --grpo experiments/learning-vs-trl/results-v2 --out docs/experiments/comas-same-budget.md
"""
import argparse
import importlib.util
import json
import pathlib
import random
import sys

# The learning study's grading and bootstrap, loaded by path (both files are named report.py).
_study = pathlib.Path(__file__).resolve().parent.parent / "learning-vs-trl"
sys.path.insert(0, str(_study))
_spec = importlib.util.spec_from_file_location("learning_report", _study / "report.py")
_lvt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_lvt)
gain_ci, jsonl, mean, passes, pct, pts = _lvt.gain_ci, _lvt.jsonl, _lvt.mean, _lvt.passes, _lvt.pct, _lvt.pts

ARMS = ("comas", "comas-warm")
MODES = ("sampled", "greedy")
COLOURS = {"grpo": "tab:blue", "comas": "tab:red", "comas-warm": "tab:green", "untrained": "grey"}


def step_records(runs, arm, seed):
    """The job's step records by step (a step logged twice, as after a resume, keeps its last).
    A run folder sits in RUNS itself, a kept one under KEEP/runs."""
    recs = []
    for folder in (pathlib.Path(runs), pathlib.Path(runs) / "runs"):
        recs = recs or jsonl(folder / f"{arm}-s{seed}" / "out/metrics.jsonl")
    return {r["step"]: r for r in recs if r.get("kind") == "step"}


def score_means(r):
    by = r.get("judge_score_by_correctness") or {}
    return (by.get("correct") or {}).get("mean"), (by.get("wrong") or {}).get("mean")


def window_mean(recs, lo, hi, f):
    return mean([f(recs[k]) for k in range(lo, hi) if k in recs])


def figure(path, steps_by_arm, held, steps, every, warm):
    """`held`: {reading: {model: {(step, mode): accuracy}}}; the figure shows greedy answers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    for ax, key, title in ((axes[0], "judge_separation", "Judges: E[score | right] - E[score | wrong]"),
                           (axes[1], "accuracy", "Training answers right (solvers)")):
        for arm, recs in steps_by_arm.items():
            xs = sorted(recs)
            if key == "accuracy":
                ys = [recs[k].get("accuracy", {}).get("last_round") for k in xs]
            else:
                ys = [recs[k].get(key) for k in xs]
            have = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if not have:
                continue
            ax.plot([x for x, _ in have], [y for _, y in have], color=COLOURS[arm], lw=0.6, alpha=0.5)
            # A 5-step moving mean: one step holds only 32 answers.
            sm = [(x, mean([y for x2, y in have if x - 4 <= x2 <= x])) for x, _ in have]
            ax.plot([x for x, _ in sm], [y for _, y in sm], color=COLOURS[arm], lw=2, label=arm)
        if warm:
            ax.axvspan(-0.5, warm - 0.5, color="tab:green", alpha=0.08, label="judges' warm-up")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    for ax, reading in zip(axes[2:], held):
        for name, curve in held[reading].items():
            pts_ = [(k, curve.get((k, "greedy"))) for k in range(0, steps + 1, every)]
            have = [(k, y) for k, y in pts_ if y is not None]
            if have:
                ax.plot([k for k, _ in have], [y for _, y in have], marker="o", lw=1.6,
                        color=COLOURS[name.split(" ")[0]], ls="--" if name.endswith("1") else "-", label=name)
        ax.set_title(f"Held-out accuracy, greedy, {reading}")
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True, help="run.sh's RUNS (or its KEEP folder)")
    ap.add_argument("--grpo", required=True, help="the learning study's runs or kept results")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--grpo-seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--summary", default=str(pathlib.Path(__file__).with_name("summary.md")),
                    help="hand-written findings put under the title (skipped when missing)")
    a = ap.parse_args()
    runs, grpo, seed = pathlib.Path(a.runs), pathlib.Path(a.grpo), a.seed
    gseeds = [int(x) for x in a.grpo_seeds.split(",")]
    steps, every, warm = a.steps, a.every, a.warmup
    ks = list(range(every, steps + 1, every))
    rng = random.Random(7)
    steps_by_arm = {arm: step_records(runs, arm, seed) for arm in ARMS}
    steps_by_arm = {arm: r for arm, r in steps_by_arm.items() if r}

    lines = ["# CoMAS on the learning study's budget", ""]
    lines.append(f"Generated by `experiments/comas-same-budget/report.py` from `{runs}` (CoMAS, seed {seed}) "
                 f"and `{grpo}` (`grpo` seeds {a.grpo_seeds} and the untrained model).")
    if pathlib.Path(a.summary).exists():
        lines += ["", pathlib.Path(a.summary).read_text().strip()]
    out = pathlib.Path(a.out)
    figdir = out.with_suffix("")
    figdir.mkdir(parents=True, exist_ok=True)

    # Per-step table: the judges and the solvers, in windows of 5 steps.
    lines += ["", "## The judges and the solvers during training (means over 5-step windows)", "",
              "Separation: the mean score judges gave right answers less the mean they gave wrong ones "
              "(scores 1 to 3; right and wrong read by the math grader, as the held-out evaluator does). "
              "Solver reward right/wrong: what CoMAS paid solvers for right and for wrong answers.", ""]
    lines.append("| arm | steps | phase | solvers right | separation | score right | score wrong "
                 "| solver reward right | solver reward wrong | seconds per step |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for arm, recs in steps_by_arm.items():
        last = max(recs)
        for lo in range(0, last + 1, 5):
            hi = min(lo + 5, last + 1)
            phase = "CoMAS"
            if arm == "comas-warm" and lo < warm:
                phase = "warm-up" if hi <= warm else "warm-up, then CoMAS"
            acc = window_mean(recs, lo, hi, lambda r: r.get("accuracy", {}).get("last_round"))
            sep = window_mean(recs, lo, hi, lambda r: r.get("judge_separation"))
            sr = window_mean(recs, lo, hi, lambda r: score_means(r)[0])
            sw = window_mean(recs, lo, hi, lambda r: score_means(r)[1])
            rr = window_mean(recs, lo, hi, lambda r: ((r.get("solver_reward_by_correctness") or {}).get("correct") or {}).get("mean"))
            rw = window_mean(recs, lo, hi, lambda r: ((r.get("solver_reward_by_correctness") or {}).get("wrong") or {}).get("mean"))
            sec = window_mean(recs, lo, hi, lambda r: r.get("seconds", {}).get("total"))
            f = lambda x, d=3: "-" if x is None else f"{x:+.{d}f}"
            lines.append(f"| {arm} | {lo}-{hi - 1} | {phase} | {pct(acc)} | {f(sep)} | {f(sr, 2)} | {f(sw, 2)} "
                         f"| {f(rr)} | {f(rw)} | {'-' if sec is None else f'{sec:.0f}'} |")

    held = {}
    for strict, title in ((True, "box alone"), (False, "the evaluator's reading")):
        base = {m: passes(grpo, "base", m, strict) for m in MODES}
        rows = {}  # name -> {(step, mode): verdicts}
        rows["untrained"] = {(0, m): base[m] for m in MODES if base[m]}
        for sd in gseeds:
            rows[f"grpo s{sd}"] = {(k, m): v for k in ks for m in MODES
                                  if (v := passes(grpo, f"comas-s{sd}-step{k}", m, strict))}
        for arm in ARMS:
            for agent in (0, 1):
                rows[f"{arm} a{agent}"] = {(k, m): v for k in ks for m in MODES
                                          if (v := passes(runs, f"{arm}-s{seed}-a{agent}-step{k}", m, strict))}
        rows = {n: r for n, r in rows.items() if r}
        acc = {n: {km: mean(list(v.values())) for km, v in r.items()} for n, r in rows.items()}
        lines += ["", f"## Held-out accuracy, {title} (240 questions, one answer each, comas eval, vanilla)", ""]
        lines.append("| model | mode | untrained | " + " | ".join(f"step {k}" for k in ks) + " |")
        lines.append("|---|---|---:|" + "---:|" * len(ks))
        for n in rows:
            if n == "untrained":
                continue
            for m in MODES:
                cells = [pct(acc["untrained"].get((0, m))) if "untrained" in acc else "-"]
                cells += [pct(acc[n].get((k, m))) for k in ks]
                lines.append(f"| {n} | {m} | " + " | ".join(cells) + " |")
        lines += ["", f"Gains over the untrained model at each arm's last evaluated step, {title} "
                  "(points; 95 % paired bootstrap over questions):", ""]
        lines.append("| model | mode | step | gain | 95 % interval | minus grpo (same seed, same step) | 95 % interval |")
        lines.append("|---|---|---:|---:|---|---:|---|")
        for n, r in rows.items():
            if n == "untrained" or n.startswith("grpo s") and n != f"grpo s{seed}":
                continue
            for m in MODES:
                done = [k for k in ks if (k, m) in r]
                if not done or not base[m]:
                    continue
                k = done[-1]
                p, q, _ = gain_ci([(r[(k, m)], base[m])], rng)
                g = rows.get(f"grpo s{seed}", {}).get((k, m))
                if g is not None and not n.startswith("grpo"):
                    d, dq, _ = gain_ci([(r[(k, m)], g)], rng)
                    vs = f"{pts(d)} | [{pts(dq[0])}, {pts(dq[1])}]"
                else:
                    vs = "- | -"
                lines.append(f"| {n} | {m} | {k} | {pts(p)} | [{pts(q[0])}, {pts(q[1])}] | {vs} |")
        # The figure: every arm from the untrained model on, and grpo of the same seed.
        curves = {n: dict(c) for n, c in acc.items() if n != "untrained" and (not n.startswith("grpo s") or n == f"grpo s{seed}")}
        for c in curves.values():
            c.update({km: v for km, v in acc.get("untrained", {}).items()})
        held[title] = curves
    try:
        figure(figdir / "curves.png", steps_by_arm, held, steps, every, warm)
        at = lines.index("## The judges and the solvers during training (means over 5-step windows)")
        lines[at:at] = [f"![curves]({figdir.name}/curves.png)", ""]
    except ImportError:
        pass
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
