"""Writes the CoSIR SmolLM2 report from the job's metrics log and saved episodes (stdout, markdown)."""
import glob
import json
import os
import sys

metrics, episodes, steps, tables, wall, cores = sys.argv[1:7]
rows = [json.loads(l) for l in open(metrics)]
step_rows = [r for r in rows if r["kind"] == "step"]
evals = [r for r in rows if r["kind"] == "eval"]


def mean(r, key):
    v = r.get(key) or {}
    return v.get("mean") if isinstance(v, dict) else v


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def term(r, t):
    return (r.get("reward_terms", {}).get(t) or {}).get("mean")


print("# CoSIR partial_table on SmolLM2-135M-Instruct\n")
print(f"Made by `bash experiments/smollm2-cosir/run.sh` (STEPS={steps}, TABLES={tables} fresh tables per step, one game")
print(f"each) on {cores} CPU cores, {int(wall) // 60} min {int(wall) % 60} s of wall time, evaluations included. Three seats,")
print("one shared LoRA policy (r 16, lr 3e-4, bf16), tables of 3 options x 3 criteria with scores 0-5, 2 rounds of")
print("messages then private finals. Guided tails end every message with one SHARE or REQUEST line and every final")
print("turn with one FINAL line; the model picks the cell, the value and the option. The figure is")
print("`smollm2-cosir/sharing.png`.\n")

print("## Held-out tables, before and after training\n")
print("12 tables of the evaluation stream (the same 12 both times), sampled at temperature 0.7.\n")
keys = [
    ("team accuracy", "team_accuracy"),
    ("seat accuracy", "individual_accuracy"),
    ("private cells disclosed", "disclosure_rate"),
    ("requests answered within a round", "request_fulfilment_rate"),
    ("received information used (final choice is the posterior's argmax)", "use_rate"),
    ("valid shares per game", "valid_shares_per_episode"),
    ("false claims per SHARE", "false_claim_rate"),
    ("wasted requests per REQUEST", "wasted_request_rate"),
    ("messages breaking the format", "format_violation_rate"),
    ("team surprisal at the end (nats)", "surprisal_final"),
]
print("| | " + " | ".join(f"after {e['after_steps']} steps" for e in evals) + " |")
print("|---|" + "---|" * len(evals))
for label, key in keys:
    print(f"| {label} | " + " | ".join(fmt(mean(e, key)) for e in evals) + " |")
for t in ["share", "request", "use", "outcome", "format", "false_claims"]:
    print(f"| reward term `{t}` (mean per turn) | " + " | ".join(fmt(term(e, t), 3) for e in evals) + " |")

print("\n## Per training step\n")
print("| step | team acc | disclosed | answered | used | valid shares/game | false/SHARE | wasted/REQUEST | format | share | request | use | outcome | tables kept | s |")
print("|---|" + "---|" * 14)
for r in step_rows:
    print(
        f"| {r['step']} | {fmt(mean(r, 'team_accuracy'))} | {fmt(mean(r, 'disclosure_rate'))} | {fmt(mean(r, 'request_fulfilment_rate'))} | "
        f"{fmt(mean(r, 'use_rate'))} | {fmt(mean(r, 'valid_shares_per_episode'))} | {fmt(mean(r, 'false_claim_rate'))} | "
        f"{fmt(mean(r, 'wasted_request_rate'))} | {fmt(mean(r, 'format_violation_rate'))} | {fmt(term(r, 'share'), 3)} | "
        f"{fmt(term(r, 'request'), 3)} | {fmt(term(r, 'use'))} | {fmt(term(r, 'outcome'))} | {fmt(r.get('table_acceptance_rate'), 3)} | "
        f"{r['seconds']['total']:.0f} |"
    )

print("\n## What the seats said\n")
paths = sorted(glob.glob(os.path.join(episodes, "step-*.jsonl")))
for label, path in [("first step", paths[0]), ("last step", paths[-1])] if paths else []:
    rec = json.loads(open(path).readline())["record"]
    t = rec["table"]
    print(f"The first game of the {label} ({os.path.basename(path)}, table `{t['id']}`, best option {t['options'][t['answer']]}):\n")
    print("```")
    for turn in rec["turns"]:
        msg = turn["message"].replace("\n", " / ")
        if len(msg) > 220:
            msg = msg[:220] + "…"
        print(f"[agent_{turn['seat'] + 1} {turn['role']}] {msg}")
    print("```\n")
