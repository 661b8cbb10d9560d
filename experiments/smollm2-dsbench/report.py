"""Writes the DSBench SmolLM2 report from the job's metrics log and saved episodes (stdout, markdown)."""
import glob
import json
import os
import sys

metrics, episodes, steps, questions, wall, cores = sys.argv[1:7]
rows = [json.loads(l) for l in open(metrics)]
rows = [r for r in rows if r["kind"] == "step"]
roles = ["data_engineer", "modeler", "analyst"]


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


print("# MAPPA DSBench on SmolLM2-135M-Instruct, coached by SmolLM2\n")
print(f"Made by `bash experiments/smollm2-dsbench/run.sh` (STEPS={steps}, QUESTIONS={questions} tasks per step, one")
print(f"episode each) on {cores} CPU cores, {int(wall) // 60} min {int(wall) % 60} s of wall time. Tasks: the shipped")
print("`data/dsbench-mini/tasks.jsonl`. The figure is `smollm2-dsbench/coaching.png`.\n")
print("## Per step\n")
print("| step | " + " | ".join(f"coach {r}" for r in roles) + " | actions (DE/M/A per episode) | tool runs ok | sandbox failures | submissions scored | s |")
print("|---|" + "---|" * (len(roles) + 5))
for r in rows:
    cs = [fmt(r["coach_score"].get(role, {}).get("mean")) for role in roles]
    acts = "/".join(fmt(r["actions"].get(role, {}).get("mean"), 1) for role in roles)
    t = r["tool_success_rate"]
    tool = "–" if t["count"] == 0 else f"{t['mean']:.2f} of {t['count']}"
    fails = ", ".join(f"{k} {v}" for k, v in sorted(r.get("sandbox_failures", {}).items())) or "–"
    ds = r.get("ds_success_rate", {})
    print(f"| {r['step']} | " + " | ".join(cs) + f" | {acts} | {tool} | {fails} | {fmt(ds.get('mean'))} of {ds.get('count', 0)} | {r['seconds']['total']:.0f} |")

print("\n## What the agents did\n")
files, outcomes = {}, []
for path in sorted(glob.glob(os.path.join(episodes, "step-*.jsonl"))):
    for line in open(path):
        rec = json.loads(line)["record"]
        o = rec.get("ds_outcome") or {}
        outcomes.append((rec["question_id"], o.get("success"), o.get("error"), o.get("metrics", {})))
        for a in rec["actions"]:
            for f in a.get("workspace", []):
                files[f] = files.get(f, 0) + 1
print("Files seen in the workspace when an agent acted (count of actions):", ", ".join(f"`{k}` {v}" for k, v in sorted(files.items())), "\n")
print("| task | submission scored | error / metrics |")
print("|---|---|---|")
for q, ok, err, m in outcomes:
    detail = err or ", ".join(f"{k} {v:.3f}" for k, v in sorted(m.items()) if not k.startswith("target_"))
    print(f"| {q} | {'yes' if ok else 'no'} | {detail} |")
print()
