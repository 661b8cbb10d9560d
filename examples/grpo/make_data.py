#!/usr/bin/env python3
"""Writes the example's data: two-step arithmetic word problems (a + b - c, a * b + c, ...),
train.jsonl and held-out test.jsonl from disjoint number combinations. Seeded: the same files
every run.

    python3 examples/grpo/make_data.py
"""
import json
import pathlib
import random

NAMES = ["Mia", "Omar", "Lena", "Raj", "Ana", "Tom", "Yuki", "Ben"]
THINGS = ["marbles", "stickers", "books", "coins", "apples", "cards"]


def problem(rng, a, b, c, kind):
    who, what = rng.choice(NAMES), rng.choice(THINGS)
    if kind == 0:
        text = f"{who} has {a} {what}, gets {b} more and gives away {c}. How many {what} does {who} have now?"
        answer = a + b - c
    elif kind == 1:
        text = f"{who} buys {a} bags of {b} {what} each and finds {c} more. How many {what} does {who} have?"
        answer = a * b + c
    else:
        text = f"{who} has {a} {what} and {b} friends each give {c} more. How many {what} does {who} have now?"
        answer = a + b * c
    return text, answer


def main():
    rng = random.Random(7)
    combos = [(a, b, c, k) for a in range(2, 20) for b in range(2, 10) for c in range(1, 10) for k in range(3)]
    rng.shuffle(combos)
    # A combination is in one file only.
    splits = {"train.jsonl": combos[:256], "test.jsonl": combos[256:320]}
    here = pathlib.Path(__file__).parent
    for name, items in splits.items():
        lines = []
        for i, (a, b, c, k) in enumerate(items):
            if k == 0 and a + b < c:
                c = a + b
            text, answer = problem(rng, a, b, c, k)
            lines.append(json.dumps({"prompt": text, "answer": str(answer), "task": "math", "id": f"{name.split('.')[0]}-{i:04d}"}))
        (here / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
