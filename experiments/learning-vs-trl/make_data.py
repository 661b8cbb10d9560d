#!/usr/bin/env python3
"""Arithmetic word problems in five levels, for the learning study: training questions
(comas's task records) and a held-out set (comas eval's benchmark records), from disjoint number
combinations (a combination of numbers and level is in one of the two only). Seeded: the same
files every run.

    python3 experiments/learning-vs-trl/make_data.py OUT_DIR [--mix graded] [--train-per-level 200 --heldout-per-level 48]

Mix `classic` (the pilots'):
  1  small sum                (a + b, a in 1..9, b in 1..30)
  2  two-digit sum or change  (a + b or a - b, two-digit)
  3  product                  (a x b, a in 2..9, b in 3..40)
  4  two steps                (a + b - c, two-digit a)
  5  two steps with a product (a x b + c, b and c two-digit)
Mix `graded` (starts where SmolLM2-135M can: it gets one-digit sums right 15-20 % of the time):
  1  one-digit sum or change  (a + b, or a - b with b < a; a, b in 1..9)
  2  two-digit and one-digit  (a + b or a - b, a in 10..50, b in 1..9)
  3  two-digit sum or change  (classic level 2)
  4  small product            (a x b, a in 2..9, b in 2..15)
  5  two steps                (classic level 4)
Levels train on as many questions each: in the graded mix, as many as its smallest level has
left after its held-out share (64), unless fewer are asked for.
"""
import argparse
import itertools
import json
import pathlib
import random

# The instruction every prompt ends with (comas: [grpo] prompt_suffix; TRL: appended).
SUFFIX = " Put the final number in \\boxed{}."

NAMES = ["Mia", "Omar", "Lena", "Raj", "Ana", "Tom", "Yuki", "Ben", "Sara", "Ivan", "Zoe", "Kofi"]
THINGS = ["marbles", "stickers", "books", "coins", "apples", "cards", "shells", "pencils"]


def graded_combos(level):
    """Every number combination of a level of the graded mix, as (a, b, c); c = 1: a change."""
    if level == 1:
        return [(a, b, s) for a in range(1, 10) for b in range(1, 10) for s in (0, 1) if s == 0 or b < a]
    if level == 2:
        return [(a, b, s) for a in range(10, 51) for b in range(1, 10) for s in (0, 1)]
    if level == 3:
        return combos(2)
    if level == 4:
        return [(a, b, 0) for a in range(2, 10) for b in range(2, 16)]
    return combos(4)


def graded_words(rng, level, a, b, c):
    """A word problem of the graded mix's `level` on (a, b, c), and its answer."""
    if level in (1, 2, 3):
        return words(rng, 2, a, b, c)
    if level == 4:
        return words(rng, 3, a, b, c)
    return words(rng, 4, a, b, c)


def combos(level):
    """Every number combination of a classic level, as (a, b, c)."""
    if level == 1:
        return [(a, b, 0) for a in range(1, 10) for b in range(1, 31)]
    if level == 2:
        return [(a, b, s) for a in range(10, 100) for b in range(10, 100) for s in (0, 1) if s == 0 or a > b]
    if level == 3:
        return [(a, b, 0) for a in range(2, 10) for b in range(3, 41)]
    if level == 4:
        return [(a, b, c) for a in range(10, 60) for b in range(2, 30) for c in range(2, 30) if c < a + b]
    return [(a, b, c) for a in range(2, 10) for b in range(10, 26) for c in range(10, 60)]


def words(rng, level, a, b, c):
    """A word problem of `level` on (a, b, c), and its answer."""
    who, what = rng.choice(NAMES), rng.choice(THINGS)
    if level == 1:
        return f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?", a + b
    if level == 2:
        if c == 0:
            return f"{who} has {a} {what} and finds {b} more. How many {what} does {who} have now?", a + b
        return f"{who} has {a} {what} and gives {b} of them away. How many {what} does {who} have left?", a - b
    if level == 3:
        return f"{who} buys {a} boxes with {b} {what} in each box. How many {what} does {who} buy?", a * b
    if level == 4:
        return f"{who} has {a} {what}, gets {b} more and then gives away {c}. How many {what} does {who} have now?", a + b - c
    return f"{who} buys {a} packs of {b} {what} and already had {c}. How many {what} does {who} have now?", a * b + c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--train-per-level", type=int, default=200)
    ap.add_argument("--heldout-per-level", type=int, default=48)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--mix", choices=["classic", "graded"], default="classic")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    make_combos, make_words = (combos, words) if args.mix == "classic" else (graded_combos, graded_words)
    train, heldout = [], []
    per_level = args.train_per_level
    if args.mix == "graded":
        per_level = min(per_level, min(len(make_combos(level)) for level in range(1, 6)) - args.heldout_per_level)
    for level in range(1, 6):
        pool = make_combos(level)
        rng.shuffle(pool)
        need = per_level + args.heldout_per_level
        if len(pool) < need and args.mix == "classic":
            raise SystemExit(f"level {level} has {len(pool)} combinations, fewer than {need}")
        if len(pool) < 2 * args.heldout_per_level:
            raise SystemExit(f"level {level} has {len(pool)} combinations, too few for {args.heldout_per_level} held-out and as many to train on")
        for i, (a, b, c) in enumerate(pool[: args.heldout_per_level]):
            q, ans = make_words(rng, level, a, b, c)
            heldout.append({"query": q + SUFFIX, "gt": str(ans), "tag": f"arithmetic-L{level}", "id": f"held-L{level}-{i:03d}"})
        for i, (a, b, c) in enumerate(pool[args.heldout_per_level : need]):
            q, ans = make_words(rng, level, a, b, c)
            train.append({"prompt": q, "answer": str(ans), "task": "math", "id": f"train-L{level}-{i:04d}"})
    rng.shuffle(train)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in heldout))
    print(f"{len(train)} training and {len(heldout)} held-out questions in {out}")


if __name__ == "__main__":
    main()
