#!/usr/bin/env python3
"""Writes gpu.md (and summary.json) from what scripts/gpu-check.sh left in its work folder.

Every figure is read from a file a step wrote; a step that failed shows as failed with the end of
its log. The summary holds the same figures for tests and later reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_json(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def read_lines(p: Path) -> list:
    try:
        return [json.loads(x) for x in p.read_text().splitlines() if x.strip().startswith("{")]
    except (OSError, ValueError):
        return []


def fmt(x, spec=".3g", none="n/a"):
    return none if x is None else format(x, spec)


def parameters(model_dir: Path) -> int:
    """Parameters of a checkpoint saved in f32 (the bytes of its tensors over 4)."""
    total = 0
    for f in model_dir.glob("*.safetensors"):
        with open(f, "rb") as h:
            n = int.from_bytes(h.read(8), "little")
            header = json.loads(h.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                a, b = v["data_offsets"]
                total += (b - a) // 4
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--size", required=True)
    ap.add_argument("--check", action="store_true", help="exit 1 unless every step ran and the f32 figures agree")
    a = ap.parse_args()
    work, out = Path(a.work), Path(a.out)
    steps = read_lines(out / "steps.jsonl")
    failed = [s for s in steps if s["rc"] != 0]
    summary: dict = {"device": a.device, "size": a.size, "steps": steps, "failed": [s["step"] for s in failed]}
    md = [f"# comas on a GPU: the check of `scripts/gpu-check.sh` (device `{a.device}`, {a.size} sizes)", ""]
    env = out / "logs" / "environment.log"
    if env.is_file():
        md += ["```", *env.read_text().strip().splitlines()[:40], "```", ""]
    md += [f"{len(steps)} steps, {len(failed)} failed; {sum(s['seconds'] for s in steps):.0f} s in all.", ""]

    # Parity.
    parity = read_json(work / "parity" / "parity.json") or {}
    summary["parity"] = parity
    md += ["## Parity with transformers on the same device", "",
           "Random weights in Hugging Face format made by transformers; 4 prompts, teacher-forced "
           "log-probabilities of 24 given tokens, and 32 greedy tokens from each prompt.", "",
           "| model / dtype | max abs Δ log-prob | mean abs Δ | greedy equal | common prefix of each |",
           "|---|---:|---:|---:|---|"]
    for key, row in parity.items():
        md.append(f"| {key} | {fmt(row.get('max_logprob_diff'))} | {fmt(row.get('mean_logprob_diff'))} | "
                  f"{row.get('greedy_equal', 'n/a')}/{row.get('greedy_total', 'n/a')} | "
                  f"{row.get('greedy_common_prefix', 'n/a')} |")
    md.append("")

    # Decode.
    bw = read_json(work / "bandwidth.json") or {}
    summary["bandwidth"] = bw
    md += ["## Decode throughput (bf16, greedy, no stopping, prompts of 32 tokens)", ""]
    if bw:
        md += [f"Memory bandwidth measured by PyTorch on `{bw.get('name', a.device)}`: copy "
               f"{bw['copy_bytes_per_s'] / 1e9:.0f} GB/s (read + written), read {bw['read_bytes_per_s'] / 1e9:.0f} GB/s.", ""]
    md += ["| model | batch | comas tok/s | transformers tok/s | ratio | comas prefill s | batch-1 bound reached |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    summary["decode"] = {}
    for name in ("qwen2-0.5b", "llama-1b"):
        ours = {r["batch"]: r for r in read_lines(work / f"decode-comas-{name}.jsonl")}
        ref = {r["batch"]: r for r in read_lines(work / f"decode-transformers-{name}.jsonl")}
        params = parameters(work / "models" / name) if (work / "models" / name).is_dir() else 0
        bound = bw.get("read_bytes_per_s", 0) / (2 * params) if params else None
        summary["decode"][name] = {"comas": list(ours.values()), "transformers": list(ref.values()),
                                   "parameters": params, "batch1_bound_tokens_per_s": bound}
        for b in sorted(set(ours) | set(ref)):
            o, r = ours.get(b, {}), ref.get(b, {})
            ratio = o["tokens_per_s"] / r["tokens_per_s"] if o and r else None
            reached = f"{100 * o['tokens_per_s'] / bound:.0f} %" if b == 1 and o and bound else ""
            md.append(f"| {name} | {b} | {fmt(o.get('tokens_per_s'), '.1f')} | {fmt(r.get('tokens_per_s'), '.1f')} | "
                      f"{fmt(ratio, '.2f')} | {fmt(o.get('prefill_seconds'), '.4f')} | {reached} |")
    md += ["", "The batch-1 bound: the read bandwidth over the bytes of bf16 weights a decode step reads "
           "(every parameter, the embedding tied to the output layer).", ""]

    # Learner.
    ld = work / "learner"
    res = {k: read_json(ld / f"{k}.json") for k in ("comas-full", "torch-full", "comas-lora", "torch-lora", "diff")}
    summary["learner"] = res
    md += ["## A learner step (f32) against a PyTorch eager step on the same samples", "",
           "| step | comas s | PyTorch s | ratio | largest weight difference |", "|---|---:|---:|---:|---:|"]
    for kind in ("full", "lora"):
        c, t = res[f"comas-{kind}"] or {}, res[f"torch-{kind}"] or {}
        ratio = t["seconds"] / c["seconds"] if c and t else None
        diff = res["diff"]["max_abs_diff"] if kind == "full" and res["diff"] else None
        md.append(f"| {'full fine-tuning' if kind == 'full' else 'LoRA r 16 on q/v'} | {fmt(c.get('seconds'), '.3f')} | "
                  f"{fmt(t.get('seconds'), '.3f')} | {fmt(ratio, '.2f')}× faster | "
                  f"{fmt(diff, '.2e', '')} |")
    md.append("")

    # The parity suites, where they were carried.
    suites = {}
    for s in steps:
        if s["step"].startswith("suite-"):
            log = (out / "logs" / f"{s['step']}.log").read_text() if (out / "logs" / f"{s['step']}.log").is_file() else ""
            results = [x for x in log.splitlines() if x.startswith("test result:")]
            suites[s["step"][len("suite-"):]] = {"rc": s["rc"], "result": results[-1] if results else "no result"}
    summary["suites"] = suites
    if suites:
        md += ["## The parity suites on the device (`COMAS_TEST_DEVICE`)", "", "| suite | result |", "|---|---|"]
        md += [f"| {k} | {v['result']} |" for k, v in suites.items()] + [""]

    # The job.
    job = work / "job"
    status = read_json(job / "status.json") or {}
    records = [r for r in read_lines(job / "out" / "metrics.jsonl") if r.get("kind") == "step"]
    rows = []
    for r in records:
        agents = r.get("agents") or []
        rows.append({
            "step": r["step"], "episodes": r.get("episodes"),
            "samples": [x.get("samples") for x in agents],
            "weight_bytes": [x.get("weight_sync", {}).get("bytes") for x in agents],
            "learner_bytes": [x.get("weight_sync", {}).get("learner_bytes") for x in agents],
            "seconds": (r.get("seconds") or {}).get("total"),
        })
    peak = None
    mem = job / "gpu-memory.csv"
    if mem.is_file():
        vals = [float(x) for x in mem.read_text().split() if x.replace(".", "").isdigit()]
        peak = max(vals) * 2**20 if vals else None
    estimate = (job / "estimate.txt").read_text().strip().splitlines() if (job / "estimate.txt").is_file() else []
    summary["job"] = {"state": status.get("state"), "steps": rows, "peak_gpu_bytes": peak, "estimate": estimate}
    md += ["## A 3-step `comas local` job: `grpo`, two LoRA agents, two workers", "",
           f"State: **{status.get('state', 'n/a')}**, {status.get('steps_done', 'n/a')} of {status.get('total_steps', 'n/a')} steps.", "",
           "| step | episodes | samples per agent | bytes pulled per agent (from the learner) | seconds |",
           "|---:|---:|---|---|---:|"]
    for r in rows:
        pulled = ", ".join(f"{b} ({lb})" for b, lb in zip(r["weight_bytes"], r["learner_bytes"]))
        md.append(f"| {r['step']} | {r['episodes']} | {r['samples']} | {pulled} | {fmt(r['seconds'], '.1f')} |")
    md += ["", "The model has random weights, so every answer is wrong and every group's rewards are "
           "equal: no step has a policy gradient. What the job shows is the pipeline on the device "
           "(rollout, experience, the learners' passes, the weights relayed between workers) with "
           "exact counts.", "",
           f"Peak GPU memory in use (nvidia-smi, every 200 ms, learners and workers together): "
           f"{fmt(peak and peak / 2**30, '.2f')} GiB. The estimate at submit:", ""]
    md += [f"- {x.strip()}" for x in estimate] + [""]

    if failed:
        md += ["## Failed steps", ""]
        for s in failed:
            log = out / "logs" / f"{s['step']}.log"
            tail = log.read_text().strip().splitlines()[-8:] if log.is_file() else []
            md += [f"### {s['step']} (rc {s['rc']})", "```", *tail, "```", ""]
    (out / "gpu.md").write_text("\n".join(md) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if a.check:
        problems = check(summary)
        for p in problems:
            print(f"gpu-check: {p}", file=sys.stderr)
        return 1 if problems else 0
    return 0


# What the job of gpu-check.sh must show: 2 questions a step, 4 answers each, per agent.
JOB_STEPS, QUESTIONS, GROUP, AGENTS = 3, 2, 4, 2


def check(summary: dict) -> list[str]:
    """The figures that must hold on any device: every step ran, f32 parity, exact counts."""
    problems = [f"step {s} failed" for s in summary["failed"]]
    for key, row in summary["parity"].items():
        if key.endswith("/float32"):
            if row.get("max_logprob_diff", 1.0) > 1e-3:
                problems.append(f"{key}: log-probabilities differ by {row.get('max_logprob_diff')}")
            if row.get("greedy_equal") != row.get("greedy_total"):
                problems.append(f"{key}: greedy continuations differ: {row.get('greedy_common_prefix')}")
    if len(summary["parity"]) != 4:
        problems.append(f"parity ran on {len(summary['parity'])} model/dtype pairs, not 4")
    diff = (summary["learner"].get("diff") or {}).get("max_abs_diff")
    if diff is None or diff > 1e-4:
        problems.append(f"the learner step's weights differ from PyTorch's by {diff}")
    job = summary["job"]
    if job["state"] != "succeeded" or len(job["steps"]) != JOB_STEPS:
        problems.append(f"the job ended {job['state']} with {len(job['steps'])} of {JOB_STEPS} steps")
    for r in job["steps"]:
        if r["samples"] != [QUESTIONS * GROUP] * AGENTS:
            problems.append(f"job step {r['step']}: samples per agent {r['samples']}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
