"""Step and rollout seconds of the prompt-sharing runs (run.sh), on against off per round.
The first step of a run is left out (it warms the process up); medians over the rest."""
import argparse
import json
import pathlib
import statistics


def steps(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    return [r for r in recs if r.get("kind") == "step" and r["step"] > 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", help="also write the table and figures here as JSON")
    a = ap.parse_args()
    rows, out = [], {}
    for d in sorted(pathlib.Path(a.runs).glob("*-r*")):
        m = d / "comas-s1/out/metrics.jsonl"
        if not m.exists():
            continue
        st = steps(m)
        if not st:
            continue
        med = lambda k: statistics.median(s["seconds"][k] for s in st)
        toks = statistics.median(s["generated_tokens"] for s in st)
        out[d.name] = {"steps": len(st), "rollout_s": med("rollout"), "train_s": med("train"),
                       "total_s": med("total"), "generated_tokens": toks}
    print("| run | steps | rollout s | train s | step s | generated tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, v in out.items():
        print(f"| {k} | {v['steps']} | {v['rollout_s']:.1f} | {v['train_s']:.1f} | "
              f"{v['total_s']:.1f} | {v['generated_tokens']:.0f} |")
    for r in sorted({k.split("-r")[1] for k in out}):
        on, off = out.get(f"on-r{r}"), out.get(f"off-r{r}")
        if on and off:
            print(f"round {r}: rollout on/off {on['rollout_s'] / off['rollout_s']:.3f}, "
                  f"step on/off {on['total_s'] / off['total_s']:.3f}")
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
