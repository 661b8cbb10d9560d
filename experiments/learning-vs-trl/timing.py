"""The side-by-side step times of `timing.sh`: per round and system, the seconds of each training
step, the completion tokens it generated, and comas's time over TRL's (issue 42 §3's time goal:
at most 1/3). Prints a Markdown table; writes the figures to RUNS/timing.json."""
import argparse
import json
import statistics
from pathlib import Path


def jsonl(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def comas_steps(d):
    """(seconds, completion tokens) of each step of a comas run, in step order."""
    recs = {r["step"]: r for r in jsonl(d / "out/metrics.jsonl") if r.get("kind") == "step"}
    return [(r["seconds"]["total"], sum(a["train"]["completion_tokens"] for a in r["agents"]))
            for _, r in sorted(recs.items())]


def trl_steps(d, completions):
    """The same for a TRL run (its mean completion length times the step's completions)."""
    recs = {r["step"]: r for r in jsonl(d / "steps.jsonl")}
    return [(r["seconds"], r["completion_length"] * completions) for _, r in sorted(recs.items())]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--completions", type=int, default=32, help="answers per step")
    a = ap.parse_args()
    rows, out = [], {"rounds": []}
    for r in range(1, a.rounds + 1):
        d = a.runs / f"round-{r}"
        got = {"comas": comas_steps(d / "comas-s1"), "trl": trl_steps(d / "trl-s1", a.completions)}
        rec = {"round": r}
        for system, steps in got.items():
            secs = [s for s, _ in steps]
            tokens = sum(t for _, t in steps)
            rec[system] = {"seconds": secs, "median": statistics.median(secs),
                           "ms_per_token": 1000 * sum(secs) / tokens}
            rows.append(f"| {r} | {system} | {len(secs)} | "
                        + ", ".join(f"{s:.1f}" for s in secs)
                        + f" | {statistics.median(secs):.1f} | {rec[system]['ms_per_token']:.1f} |")
        rec["ratio_median"] = rec["comas"]["median"] / rec["trl"]["median"]
        rec["ratio_per_token"] = rec["comas"]["ms_per_token"] / rec["trl"]["ms_per_token"]
        out["rounds"].append(rec)
    print("| round | system | steps | seconds per step | median | ms per completion token |")
    print("|---:|---|---:|---|---:|---:|")
    print("\n".join(rows))
    print()
    for rec in out["rounds"]:
        print(f"round {rec['round']}: comas's median step / TRL's = {rec['ratio_median']:.2f}; "
              f"per completion token {rec['ratio_per_token']:.2f}")
    (a.runs / "timing.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
