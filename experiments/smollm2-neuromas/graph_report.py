"""Helpers shared by the NeuroMAS reports ([2, 1] here, [3, 3, 1] in smollm2-neuromas-331)."""
import json
import os


def mean(r, key):
    """The mean of a metric that is either a plain number or a {mean, ...} summary."""
    v = (r or {}).get(key) or {}
    return v.get("mean") if isinstance(v, dict) else v


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def base_accuracy(out, t):
    """The base model's accuracy from `comas eval` at temperature t (out/base-t/summary.json)."""
    p = os.path.join(out, f"base-{t}", "summary.json")
    if not os.path.exists(p):
        return None

    # One setup (vanilla): its accuracy, whatever the summary's nesting.
    def find(o):
        if isinstance(o, dict):
            if isinstance(o.get("accuracy"), (int, float)):
                return o["accuracy"]
            o = list(o.values())
        if isinstance(o, list):
            for v in o:
                a = find(v)
                if a is not None:
                    return a
        return None

    return find(json.load(open(p)))
