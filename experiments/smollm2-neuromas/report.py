"""Writes the NeuroMAS SmolLM2 report from the job's metrics log and the base model's evaluations (stdout, markdown)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_report import base_accuracy, fmt, mean  # noqa: E402

metrics, out, steps, questions, rollouts, wall, cores = sys.argv[1:8]
rows = [json.loads(l) for l in open(metrics)]
step_rows = [r for r in rows if r["kind"] == "step"]
evals = [r for r in rows if r["kind"] == "eval"]




def base(t):
    return base_accuracy(out, t)


print("# NeuroMAS [2, 1] on SmolLM2-135M-Instruct\n")
print(f"Made by `bash experiments/smollm2-neuromas/run.sh` (STEPS={steps}, QUESTIONS={questions} per step, ROLLOUTS={rollouts}")
print(f"per question) on {cores} CPU cores, {int(wall) // 60} min {int(wall) % 60} s of wall time for the job, evaluations included.")
print("Two message nodes and a readout, one LoRA adapter per node (r 16 on the attention projections, lr 3e-4, bf16)")
print("on the shared base, so three agents and three learners; every node's sample of a rollout gets the readout's")
print("grade (1 right, 0 wrong), normalised over the task's rollouts (`group_norm`), with a k3 KL term (β 1e-3)")
print("against the base. Nodes sample at temperature 0.5, top_p 0.95 (at the spec's 1.0 the 135M model writes noise).")
print("The readout's reply ends with a guided `Final answer: \\boxed{}` line; the nodes write freely and pass")
print("at most 48 tokens on. The figure is `smollm2-neuromas/training.png`.\n")

print("## Held-out accuracy\n")
print("The 16 held-out questions (number pairs never seen in training). The base model alone answers each question")
print("once (`comas eval --setup vanilla`, 96 new tokens); the graph makes 3 calls per question.\n")
print("| | sampled (t = 0.7) | greedy |")
print("|---|---|---|")
print(f"| base model alone | {fmt(base('0.7'))} | {fmt(base('0'))} |")
for e in evals:
    print(f"| graph after {e['after_steps']} steps | {fmt(mean(e, 'graph_accuracy'))} | {fmt(mean(e.get('greedy'), 'graph_accuracy'))} |")

print("\n## Per training step\n")
print("| step | readouts right | mean reward | equal groups | messages cut L1 | tokens L1 | tokens L2 | agent rewards | rollout s | train s |")
print("|---|" + "---|" * 9)
for r in step_rows:
    cut = (r.get("truncation_rate") or {}).get("1") or {}
    tok = r.get("completion_tokens") or {}
    agents = " ".join(f"{fmt(a.get('reward_mean'))}" for a in r.get("agents", []))
    secs = r.get("seconds", {})
    print(
        f"| {r['step']} | {fmt(mean(r, 'graph_accuracy'))} | {fmt(mean(r, 'reward'))} | {r.get('equal_groups')}/{r.get('groups')} | "
        f"{fmt(cut.get('mean'))} | {fmt((tok.get('1') or {}).get('mean'), 0)} | {fmt((tok.get('2') or {}).get('mean'), 0)} | {agents} | "
        f"{fmt(secs.get('rollout'), 0)} | {fmt(secs.get('train'), 0)} |"
    )
print()
