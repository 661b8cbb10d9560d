#!/usr/bin/env python3
"""Times one full learner training step in PyTorch, as the baseline for the Rust learner bench.

    .venv-ref/bin/python learner/benches/torch_step.py --model DIR --batch FILE.jsonl \
        --config FILE.toml --threads N --repeats 3 [--device cpu|cuda] [--ref-model DIR] [--lora-r R]

One step = what tests/fixtures/learner/ref_step.py does for a global step (the same code,
imported): experience forward (ℓ^old, and ℓ^ref when kl_coef > 0), advantages, every optimizer
step of the batch (forward, loss, backward, grad clip, AdamW). Model loading and the reference
copy are not timed. One untimed warm-up run, then --repeats timed runs, each starting from the
initial weights again. With --lora-r R > 0 the model is wrapped in a PEFT LoRA adapter on q/v
(alpha 2R, no dropout), so only the adapter trains, as the Rust learner's `[lora]` table does.
Prints one JSON line:

    {"tokens": Σ len(prompt)+len(completion) over the batch, "seconds": best run, "tokens_per_s": ...}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "learner"))

import torch  # noqa: E402

import ref_step  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="time one PyTorch learner step")
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ref-model", default=None, help="reference checkpoint (default: copy of the initial weights)")
    ap.add_argument("--lora-r", type=int, default=0, help="train a LoRA adapter of this rank on q/v (0: full fine-tuning)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights dtype (bf16: plain bf16 AdamW)")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="transformers attention implementation")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    torch.set_num_threads(args.threads)
    cfg = ref_step.load_config(args.config)
    samples = ref_step.load_batch(args.batch)
    torch.manual_seed(int(cfg["seed"]))
    model = ref_step.load_model(args.model, args.device, getattr(torch, args.dtype), args.attn)
    if args.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        lc = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
        model = get_peft_model(model, lc)
    ref_model = ref_step.make_reference_model(model, cfg, args.ref_model, args.device)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tokens = sum(len(s["prompt_ids"]) + len(s["completion_ids"]) for s in samples)

    def one_run() -> float:
        with torch.no_grad():
            model.load_state_dict(initial)
        sync(args.device)
        start = time.perf_counter()
        ref_step.train_global_step(model, ref_model, samples, cfg, args.device)
        sync(args.device)
        return time.perf_counter() - start

    warm = one_run()
    times = [one_run() for _ in range(args.repeats)]
    best = min(times)
    print(f"torch_step: warm-up {warm:.3f}s, runs {', '.join(f'{t:.3f}' for t in times)}s, "
          f"{len(samples)} samples, threads {args.threads}, device {args.device}, {args.dtype}, attention {args.attn}", file=sys.stderr)
    print(json.dumps({"tokens": tokens, "seconds": best, "tokens_per_s": tokens / best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
