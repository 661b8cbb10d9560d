"""Writes the NeuroMAS [3, 3, 1] report (stdout, markdown): both arms beside the [2, 1] run and the base model."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "smollm2-neuromas"))
from graph_report import base_accuracy, fmt, mean  # noqa: E402

small, out, steps, bridge, cores, scratch_steps = sys.argv[1:7]


def log(path):
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    return [r for r in rows if r["kind"] == "step"], [r for r in rows if r["kind"] == "eval"]


def base(t):
    return base_accuracy(small, t)


def consistency():
    # `comas eval --setup consistency` at t = 0.7 on the same questions (written as base-consistency-0.7).
    return base_accuracy(out, "consistency-0.7")


arms = {"[2, 1] from scratch": f"{small}/out/metrics.jsonl", "[3, 3, 1] grown from [2, 1]": f"{out}/grown/out/metrics.jsonl", "[3, 3, 1] from scratch": f"{out}/scratch/out/metrics.jsonl"}
print("# NeuroMAS [3, 3, 1] on SmolLM2-135M-Instruct: grown from [2, 1] and from scratch\n")
def step_minutes(path):
    rows, _ = log(path)
    return sum(r["seconds"]["total"] for r in rows) / 60


print(f"Made by `bash experiments/smollm2-neuromas-331/run.sh` (STEPS={steps}, SCRATCH_STEPS={scratch_steps}, BRIDGE={bridge}) on {cores} CPU cores:")
print(f"the grown arm trained {steps} steps ({step_minutes(out + '/grown/out/metrics.jsonl'):.0f} min of step time), the scratch arm {scratch_steps}")
print(f"({step_minutes(out + '/scratch/out/metrics.jsonl'):.0f} min); evaluations come on top. Other work ran on the same 2 cores part of the time, so the")
print("seconds are not benchmarks. The grown arm's run was interrupted once at step 15 (its worker starved by that other work) and")
print("resumed from its checkpoints with `comas local` on the same folder.")
print("Settings, data and held-out questions are those of the [2, 1] run (`smollm2-neuromas.md`): one LoRA adapter per")
print("node (r 16, attention projections, lr 3e-4, bf16) on the shared base, 4 questions x 4 rollouts per step, nodes")
print("at temperature 0.5, the readout's reply ending in a guided `\\boxed{}` line, 48-token messages.")
print("The grown arm starts from the [2, 1] run's step-24 checkpoints through `comas grow --to 3,3,1`: node 3 (new, L1N3)")
print("copies node 0's adapter and Adam moments, the new layer's nodes copy the node below them, and for the first")
print(f"{bridge} steps the new layer reads only the node below it (identity wiring), then all of layer 1.")
print("Figures: `smollm2-neuromas-331/grown.png`, `smollm2-neuromas-331/scratch.png`.\n")

print("## Held-out accuracy\n")
print("The 16 held-out questions; the base model alone answers once per question, a [3, 3, 1] graph makes 7 calls.\n")
print("| | sampled (t = 0.7) | greedy |")
print("|---|---|---|")
print(f"| base model alone | {fmt(base('0.7'))} | {fmt(base('0'))} |")
print(f"| base model, self-consistency (5 samples and an aggregating call: 6 calls) | {fmt(consistency())} | – |")
for name, path in arms.items():
    _, evals = log(path)
    for e in evals:
        print(f"| {name}, after {e['after_steps']} steps | {fmt(mean(e, 'graph_accuracy'))} | {fmt(mean(e.get('greedy'), 'graph_accuracy'))} |")

print("\n## Per training step\n")
print("| step | grown: readouts right | grown: equal groups | scratch: readouts right | scratch: equal groups | grown rollout / train s | scratch rollout / train s |")
print("|---|---|---|---|---|---|---|")
g, _ = log(arms["[3, 3, 1] grown from [2, 1]"])
s, _ = log(arms["[3, 3, 1] from scratch"])
for i in range(max(len(g), len(s))):
    a = g[i] if i < len(g) else {}
    b = s[i] if i < len(s) else {}
    secs = lambda r: f"{fmt((r.get('seconds') or {}).get('rollout'), 0)} / {fmt((r.get('seconds') or {}).get('train'), 0)}"
    print(f"| {i} | {fmt(mean(a, 'graph_accuracy'))} | {a.get('equal_groups', '–')}/{a.get('groups', '–')} | {fmt(mean(b, 'graph_accuracy'))} | {b.get('equal_groups', '–')}/{b.get('groups', '–')} | {secs(a)} | {secs(b)} |")
def peaks(rows):
    last = rows[-1] if rows else {}
    return [((a.get("train") or {}).get("peak_rss_bytes") or 0) / 2**30 for a in last.get("agents", [])]


print("\n## Learner memory\n")
print("The grown arm ran one learner process per node (seven, each loading the base); the scratch arm ran one")
print("learner process for all seven adapters over one copy of the base (`comas local --neuromas-learners 1`, the")
print("default since this run). Peak resident memory at the last step, from the agents' step reports:\n")
gp, sp = peaks(g), peaks(s)
if gp:
    print(f"- grown, 7 processes: {' '.join(f'{x:.2f}' for x in gp)} GiB, {sum(gp):.2f} GiB in all;")
if sp:
    print(f"- scratch, 1 process: {max(sp):.2f} GiB.")

for name, rows in (("grown", g), ("scratch", s)):
    if rows:
        acc = [mean(r, "graph_accuracy") or 0 for r in rows]
        h = len(acc) // 2
        print(f"\n{name}: mean training accuracy of the readouts {sum(acc[:h]) / max(h, 1):.3f} in the first half of the steps, {sum(acc[h:]) / max(len(acc) - h, 1):.3f} in the second.")
print()
