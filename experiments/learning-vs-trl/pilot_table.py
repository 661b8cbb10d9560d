#!/usr/bin/env python3
"""A comas run's training curve as a Markdown table, in blocks of steps: the share of right
answers, of readable (boxed) ones, of answers cut at max_new_tokens, the mean answer length,
the LoRA update's size at the block's end and seconds per step. For the pilots of the study.

    python3 experiments/learning-vs-trl/pilot_table.py runs/lvt-pilot/comas-s1/out/metrics.jsonl [--block 5]
"""
import argparse
import json
import statistics


def mean_of(v):
    return v.get("mean") if isinstance(v, dict) else v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("--block", type=int, default=5)
    a = ap.parse_args()
    steps = {}
    for line in open(a.metrics):
        r = json.loads(line)
        if r.get("kind") == "step":
            steps[r["step"]] = r  # a step logged twice keeps its last line
    print("| steps | right | readable | cut at max tokens | mean length | adapter norm (end) | s/step |")
    print("|---|---|---|---|---|---|---|")
    order = sorted(steps)
    for i in range(0, len(order), a.block):
        block = [steps[s] for s in order[i : i + a.block]]
        m = lambda key: statistics.mean(mean_of(r[key]) or 0.0 for r in block)
        train = (block[-1]["agents"][0].get("train") or {})
        norm = train.get("adapter_norm")
        secs = statistics.mean(r["seconds"]["total"] for r in block)
        print(
            f"| {block[0]['step']}–{block[-1]['step']} | {100 * m('accuracy'):.1f} % | {100 * m('readable_rate'):.0f} % | "
            f"{100 * m('truncation_rate'):.0f} % | {m('completion_tokens'):.0f} | {norm:.2f} | {secs:.1f} |"
        )


if __name__ == "__main__":
    main()
