#!/usr/bin/env python3
"""The learning study's report: training curves, held-out accuracy of every saved adapter (one
evaluator for both systems), the gains over the untrained model with 95 % intervals (a paired
bootstrap over questions, and one over seeds and questions), wall time per step and peak memory.
Reads what run.sh wrote; whatever is missing is reported as missing.

    .venv-trl/bin/python experiments/learning-vs-trl/report.py --runs runs/learning-vs-trl \
        --settings experiments/learning-vs-trl/settings.json --out docs/experiments/learning-vs-trl.md
"""
import argparse
import gzip
import json
import pathlib
import random
import statistics

from answers import last_box

SYSTEMS = ("comas", "trl")
MODES = ("sampled", "greedy")
BOOT = 4000


def jsonl(path):
    """The lines of `path`, or of its kept `.gz` (experiments/study.sh); [] when neither is there."""
    p = pathlib.Path(path)
    gz = p.with_name(p.name + ".gz")
    if p.exists():
        text = p.read_text()
    elif gz.exists():
        text = gzip.decompress(gz.read_bytes()).decode()
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def train_curve(runs, system, seed):
    """Mean training reward and seconds by step (a step logged twice keeps its last line)."""
    if system == "comas":
        recs = [r for r in jsonl(runs / f"comas-s{seed}/out/metrics.jsonl") if r.get("kind") == "step"]
        return {r["step"]: (r.get("accuracy", {}).get("mean"), r.get("seconds", {}).get("total")) for r in recs}
    # The share of right answers (the reward less the format bonus).
    return {r["step"]: (r.get("correct", r.get("reward")), r.get("seconds")) for r in jsonl(runs / f"trl-s{seed}/steps.jsonl")}


def boxed_right(r):
    """The answer in the box: math_verify on the last box's content alone (what
    `answer_in_box = true` rewards); an answer without a box, or with an empty one, is wrong."""
    from math_verify import parse, verify
    b = last_box(r["output"])
    return b is not None and verify(parse(f"${r['answer']}$"), parse(f"$\\boxed{{{b}}}$"))


def passes(runs, name, mode, strict=False):
    """Per-question verdicts of one evaluation, by question id; None when not evaluated. With
    `strict`, graded on the last box alone instead of the evaluator's verdict."""
    rs = jsonl(runs / f"eval/{name}-{mode}/results.jsonl")
    if not rs:
        return None
    if strict:
        return {r["id"]: 1.0 if boxed_right(r) else 0.0 for r in rs}
    return {r["id"]: 1.0 if r["verdict"]["passed"] else 0.0 for r in rs}


def empty_boxes(runs, name, mode):
    """Share of answers whose last box is there but empty."""
    rs = jsonl(runs / f"eval/{name}-{mode}/results.jsonl")
    if not rs:
        return None
    return mean([1.0 if "\\boxed{" in r["output"] and last_box(r["output"]) is None else 0.0 for r in rs])


def evaluations(runs, seeds, steps, every, strict=False):
    """{(system, seed, step, mode): {id: pass}}, step 0 being the base model for everyone."""
    out = {}
    for mode in MODES:
        base = passes(runs, "base", mode, strict)
        for system in SYSTEMS:
            for seed in seeds:
                if base is not None:
                    out[(system, seed, 0, mode)] = base
                for k in range(every, steps + 1, every):
                    p = passes(runs, f"{system}-s{seed}-step{k}", mode, strict)
                    if p is not None:
                        out[(system, seed, k, mode)] = p
    return out


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def interval(samples):
    s = sorted(samples)
    return s[int(0.025 * len(s))], s[int(0.975 * len(s)) - 1]


def gain_ci(pairs, rng):
    """95 % intervals of the mean gain: `pairs` is [(after, before)] per seed, each a dict of
    per-question passes. Returns (mean gain, question-bootstrap CI, seed-and-question CI)."""
    ids = sorted(set.intersection(*[set(a) & set(b) for a, b in pairs]))
    if not ids:
        return None
    diffs = [[a[i] - b[i] for i in ids] for a, b in pairs]
    point = statistics.mean(statistics.mean(d) for d in diffs)
    n = len(ids)
    by_q = []
    for _ in range(BOOT):
        pick = [rng.randrange(n) for _ in range(n)]
        by_q.append(statistics.mean(sum(d[j] for j in pick) / n for d in diffs))
    by_sq = []
    for _ in range(BOOT):
        seeds = [rng.randrange(len(diffs)) for _ in diffs]
        pick = [rng.randrange(n) for _ in range(n)]
        by_sq.append(statistics.mean(sum(diffs[s][j] for j in pick) / n for s in seeds))
    return point, interval(by_q), interval(by_sq)


def pct(x):
    return "-" if x is None else f"{100 * x:.1f} %"


def pts(x):
    return "-" if x is None else f"{100 * x:+.1f}"


def figure(path, curves, evals, seeds, steps, every):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"comas": "tab:blue", "trl": "tab:orange"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for system in SYSTEMS:
        per_seed = []
        for seed in seeds:
            c = curves.get((system, seed), {})
            xs = sorted(k for k in c if c[k][0] is not None)
            if xs:
                ax.plot(xs, [c[k][0] for k in xs], color=colours[system], lw=0.6, alpha=0.5)
                per_seed.append(c)
        xs = sorted({k for c in per_seed for k in c})
        ys = [mean([c.get(k, (None, None))[0] for c in per_seed]) for k in xs]
        if xs:
            ax.plot(xs, ys, color=colours[system], lw=2.2, label=system)
    ax.set_title("Training answers right, per step")
    ax.set_xlabel("step")
    ax.set_ylim(0, 1)
    ax.legend()
    for ax, mode in zip(axes[1:], MODES):
        for system in SYSTEMS:
            ks = list(range(0, steps + 1, every))
            means = []
            for seed in seeds:
                ys = [mean(list(evals[(system, seed, k, mode)].values())) if (system, seed, k, mode) in evals else None for k in ks]
                have = [(k, y) for k, y in zip(ks, ys) if y is not None]
                if have:
                    ax.plot([k for k, _ in have], [y for _, y in have], color=colours[system], lw=0.6, alpha=0.5, marker=".")
                means.append(ys)
            m = [mean([ys[i] for ys in means]) for i in range(len(ks))]
            have = [(k, y) for k, y in zip(ks, m) if y is not None]
            if have:
                ax.plot([k for k, _ in have], [y for _, y in have], color=colours[system], lw=2.2, marker="o", label=system)
        ax.set_title(f"Held-out accuracy, {mode} (240 questions)")
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def tables(lines, evals, seeds, steps, every, rng, title):
    """The accuracy, gain and difference tables of one reading of the answers."""
    lines += ["", f"## Held-out accuracy{title} (240 questions, one answer each, comas eval, vanilla)", ""]
    lines.append("| system | mode | untrained | " + " | ".join(f"step {k}" for k in range(every, steps + 1, every)) + " |")
    lines.append("|---|---|---:|" + "---:|" * (steps // every))
    for system in SYSTEMS:
        for mode in MODES:
            row = [pct(mean([mean(list(evals[(system, sd, k, mode)].values())) for sd in seeds if (system, sd, k, mode) in evals])) for k in range(0, steps + 1, every)]
            lines.append(f"| {system} | {mode} | " + " | ".join(row) + " |")
    lines += ["", f"## Gains over the untrained model at the last evaluated step{title} (points, 95 % intervals)", ""]
    lines.append("| system | mode | step | seeds | gain | CI over questions | CI over seeds and questions |")
    lines.append("|---|---|---:|---:|---:|---|---|")
    finals = {}
    for system in SYSTEMS:
        for mode in MODES:
            done = [k for k in range(every, steps + 1, every) if all((system, sd, k, mode) in evals for sd in seeds if (system, sd, every, mode) in evals)]
            have = [sd for sd in seeds if done and (system, sd, done[-1], mode) in evals]
            if not done or not have:
                lines.append(f"| {system} | {mode} | - | 0 | - | - | - |")
                continue
            k = done[-1]
            finals[(system, mode)] = (k, have)
            g = gain_ci([(evals[(system, sd, k, mode)], evals[(system, sd, 0, mode)]) for sd in have], rng)
            if g is None:
                continue
            p, q, sq = g
            lines.append(f"| {system} | {mode} | {k} | {len(have)} | {pts(p)} | [{pts(q[0])}, {pts(q[1])}] | [{pts(sq[0])}, {pts(sq[1])}] |")
    lines += ["", f"## comas minus TRL at the same step{title} (points, 95 % intervals)", ""]
    lines.append("| mode | step | seeds | difference | CI over questions | CI over seeds and questions |")
    lines.append("|---|---:|---:|---:|---|---|")
    for mode in MODES:
        if ("comas", mode) in finals and ("trl", mode) in finals:
            k = min(finals[("comas", mode)][0], finals[("trl", mode)][0])
            both = [sd for sd in seeds if ("comas", sd, k, mode) in evals and ("trl", sd, k, mode) in evals]
            g = gain_ci([(evals[("comas", sd, k, mode)], evals[("trl", sd, k, mode)]) for sd in both], rng) if both else None
            if g:
                p, q, sq = g
                lines.append(f"| {mode} | {k} | {len(both)} | {pts(p)} | [{pts(q[0])}, {pts(q[1])}] | [{pts(sq[0])}, {pts(sq[1])}] |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--settings", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="1,2,3")
    a = ap.parse_args()
    runs = pathlib.Path(a.runs)
    s = json.loads(pathlib.Path(a.settings).read_text())
    seeds = [int(x) for x in a.seeds.split(",")]
    steps, every = s["steps"], s["eval_every"]
    rng = random.Random(7)
    curves = {(system, seed): train_curve(runs, system, seed) for system in SYSTEMS for seed in seeds}
    evals = evaluations(runs, seeds, steps, every)
    strict = evaluations(runs, seeds, steps, every, strict=True)
    # A study that pays only the box's content reads the box first: that is what it trains.
    box_first = s.get("answer_in_box", False)
    out = pathlib.Path(a.out)
    figdir = out.with_suffix("")
    figdir.mkdir(parents=True, exist_ok=True)
    try:
        figure(figdir / "curves.png", curves, strict if box_first else evals, seeds, steps, every)
        fig_line = f"![curves]({figdir.name}/curves.png)"
    except ImportError:
        fig_line = "(matplotlib missing: no figure)"

    lines = ["# Learning, shown: comas `grpo` against TRL's GRPOTrainer", ""]
    lines.append(f"Generated by `experiments/learning-vs-trl/report.py` from `{runs}`; settings in `{a.settings}`.")
    lines += ["", fig_line]
    box_text = ("Graded on the last `\\boxed{}` alone (empty or missing: wrong; what "
                "`answer_in_box = true` rewards)")
    if box_first:
        lines += ["", box_text + "; the figure's held-out curves are this reading."]
        tables(lines, strict, seeds, steps, every, rng, ", box alone")
        lines += ["", "## The evaluator's reading", "",
                  "`comas eval`'s verdict, which grades as `math_verify` does: the box, or with no "
                  "usable box the text's last expression.", ""]
        tables(lines, evals, seeds, steps, every, rng, ", evaluator's reading")
    else:
        tables(lines, evals, seeds, steps, every, rng, "")
        lines += ["", "## The answer in the box", "",
                  "The evaluator grades as `math_verify` does: with no usable box it reads the text's last "
                  "expression. " + box_text + ":", ""]
        tables(lines, strict, seeds, steps, every, rng, ", box alone")
    lines += ["", "The share of answers whose last box is empty:"]
    lines += ["", "| system | mode | untrained | " + " | ".join(f"step {k}" for k in range(every, steps + 1, every)) + " |",
              "|---|---|---:|" + "---:|" * (steps // every)]
    for system in SYSTEMS:
        for mode in MODES:
            row = [pct(mean([e for e in (empty_boxes(runs, "base" if k == 0 else f"{system}-s{sd}-step{k}", mode) for sd in seeds) if e is not None])) for k in range(0, steps + 1, every)]
            lines.append(f"| {system} (empty last box) | {mode} | " + " | ".join(row) + " |")
    lines += ["", "## Wall time per step and peak memory (this machine, 2 cores)", ""]
    lines.append("| system | seeds | steps | seconds per step (mean, min-max) | peak RSS of the process tree |")
    lines.append("|---|---:|---:|---|---:|")
    per_step = {}
    for system in SYSTEMS:
        secs = [v[1] for sd in seeds for v in curves[(system, sd)].values() if v[1] is not None]
        peaks = []
        for sd in seeds:
            p = runs / f"{system}-s{sd}/peak.json"
            if p.exists():
                peaks.append(json.loads(p.read_text())["peak_rss_bytes"])
        ran = [sd for sd in seeds if curves[(system, sd)]]
        per_step[system] = mean(secs)
        if secs:
            lines.append(f"| {system} | {len(ran)} | {len(secs)} | {mean(secs):.1f} ({min(secs):.1f}-{max(secs):.1f}) | {max(peaks) / 2**30:.2f} GiB |" if peaks else f"| {system} | {len(ran)} | {len(secs)} | {mean(secs):.1f} | - |")
        else:
            lines.append(f"| {system} | 0 | 0 | - | - |")
    if per_step.get("comas") and per_step.get("trl"):
        lines += ["", f"TRL's step takes {per_step['trl'] / per_step['comas']:.2f}x comas's (means over every logged step of both)."]
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
