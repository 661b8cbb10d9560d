"""Writes the MAPPA SmolLM2 report's tables from the job's metrics log (stdout, markdown)."""
import json
import sys

metrics, steps, questions, wall, cores = sys.argv[1:6]
steps_rows, evals = [], []
for line in open(metrics):
    r = json.loads(line)
    (steps_rows if r["kind"] == "step" else evals).append(r)
roles = ["problem_solver", "code_executor", "verifier"]


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


print("# MAPPA on SmolLM2-135M-Instruct, coached by SmolLM2\n")
print(f"Made by `bash experiments/smollm2-mappa/run.sh` (STEPS={steps}, QUESTIONS={questions}) on {cores} CPU cores,")
print(f"{int(wall) // 60} min {int(wall) % 60} s of wall time. The job file is written by the script; the figure is")
print("`smollm2-mappa/coaching.png` (`comas plot --panels coaching,rewards,training,times`).\n")
print("## Coach score (0–10) per role, by step\n")
print("| step | " + " | ".join(roles) + " | actions scored | tool runs ok | Executor actions / episode | answer right (logged) | s |")
print("|---|" + "---|" * (len(roles) + 5))
for r in steps_rows:
    cs = [fmt(r["coach_score"].get(role, {}).get("mean")) for role in roles]
    kept = r["samples"] / max(1, r["samples"] + r["samples_dropped"])
    tools = r["tool_success_rate"]
    tool = "–" if tools["count"] == 0 else f"{tools['mean']:.2f} of {tools['count']}"
    print(f"| {r['step']} | " + " | ".join(cs) + f" | {kept:.2f} | {tool} | {fmt(r['actions']['code_executor']['mean'])} | {fmt(r['outcome_accuracy']['mean'])} | {r['seconds']['total']:.0f} |")
if evals:
    print("\n## Held-out questions (16, temperature 0.6), before and after\n")
    print("| after steps | " + " | ".join(roles) + " | answer right | tool runs ok |")
    print("|---|" + "---|" * (len(roles) + 2))
    for r in evals:
        cs = [fmt(r["coach_score"].get(role, {}).get("mean")) for role in roles]
        print(f"| {r['after_steps']} | " + " | ".join(cs) + f" | {fmt(r['outcome_accuracy']['mean'])} | {fmt(r['tool_success_rate']['mean'])} |")
print()
