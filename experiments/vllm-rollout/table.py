#!/usr/bin/env python3
"""The rollout benchmark's table: per engine and number of episodes, the last step's rollout
seconds, generated tokens per rollout second and the run's peak memory (best of the repeats by
rollout time). Also writes results.jsonl beside the runs.

    python3 experiments/vllm-rollout/table.py runs/vllm-rollout
"""
import glob
import json
import os
import sys


def step_record(run_dir):
    """The run's last step record: the first step's rollout also waits for a vLLM server to
    start (a minute or two), which later steps do not."""
    last = None
    for path in glob.glob(os.path.join(run_dir, "**", "metrics.jsonl"), recursive=True):
        for line in open(path):
            m = json.loads(line)
            if m.get("kind") == "step" and (last is None or m.get("step", 0) >= last.get("step", 0)):
                last = m
    return last


def main():
    out = sys.argv[1]
    rows = {}
    for d in sorted(glob.glob(os.path.join(out, "*-r*"))):
        if not os.path.exists(os.path.join(d, "DONE")):
            continue
        engine, n, _ = os.path.basename(d).rsplit("-", 2)
        m = step_record(d)
        if m is None:
            continue
        peak = json.load(open(os.path.join(d, "peak.json")))
        r = {
            "engine": engine,
            "episodes": int(n),
            "step": m.get("step"),
            "rollout_s": m["seconds"]["rollout"],
            "tokens": m["generated_tokens"],
            "tokens_per_s": m["generated_tokens"] / m["seconds"]["rollout"],
            "peak_rss_gib": peak.get("peak_rss_bytes", 0) / 2**30,
        }
        key = (engine, int(n))
        if key not in rows or r["rollout_s"] < rows[key]["rollout_s"]:
            rows[key] = r
    with open(os.path.join(out, "results.jsonl"), "w") as f:
        for r in rows.values():
            f.write(json.dumps(r) + "\n")
    print("| engine | episodes | rollout s | tokens | tokens/s | peak RSS of the run (GiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for (engine, n), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"| {engine} | {n} | {r['rollout_s']:.1f} | {r['tokens']} | {r['tokens_per_s']:.1f} | {r['peak_rss_gib']:.2f} |")
    for n in sorted({k[1] for k in rows}):
        a, b = rows.get(("comas", n)), rows.get(("vllm", n))
        if a and b:
            print(f"\n{n} episodes: comas / vLLM tokens per second = {a['tokens_per_s'] / b['tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
