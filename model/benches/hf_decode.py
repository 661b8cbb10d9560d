"""Decode throughput of transformers' generate() on a model folder, for the side-by-side bench.

Prints one JSON line per batch size: {"batch", "new_tokens", "seconds", "tokens_per_s",
"prefill_seconds"}, the last the best time of a call that makes one token (the prefill alone).
Greedy, no stopping (EOS disabled), the same prompt token ids as the Rust side.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, GenerationConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, help="JSON file: list of token-id lists (one batch of the largest size)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype), attn_implementation="sdpa").to(args.device).eval()
    prompts = json.load(open(args.prompts))
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=args.new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
    )
    for b in [int(x) for x in args.batches.split(",")]:
        ids = torch.tensor(prompts[:b], dtype=torch.long, device=args.device)
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, generation_config=GenerationConfig(
                do_sample=False, max_new_tokens=4, eos_token_id=None, pad_token_id=0))
            best = best_time(model, ids, mask, gen, args.repeats)
            first = GenerationConfig(do_sample=False, max_new_tokens=1, eos_token_id=None, pad_token_id=0, bos_token_id=None)
            prefill = best_time(model, ids, mask, first, args.repeats)
        n = b * args.new_tokens
        print(json.dumps({"batch": b, "new_tokens": n, "seconds": best, "tokens_per_s": n / best, "prefill_seconds": prefill}), flush=True)


def best_time(model, ids, mask, gen, repeats):
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        if out.is_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        assert out.shape[1] == ids.shape[1] + gen.max_new_tokens
        best = dt if best is None else min(best, dt)
    return best


if __name__ == "__main__":
    main()
