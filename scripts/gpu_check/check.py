#!/usr/bin/env python3
"""The PyTorch side of scripts/gpu-check.sh: the models, the references and the comparisons.

Each subcommand reads and writes files under one work folder; gpu-check.sh runs the comas side
between them. Runs on the GPU machine's own Python (torch + transformers) or, with
`--device cpu` and `--size small`, on the reference environment here.

    check.py models     --size full|small --out W/models
    check.py reference  --models W/models --device D --out W/parity
    check.py parity     --parity W/parity                       (after comas score/generate)
    check.py prompts    --models W/models --count 128 --len 32 --out W/prompts.json
    check.py bandwidth  --device D --out W/bandwidth.json
    check.py batch      --model M --samples 16 --prompt-len 128 --completion-len 128 --out W/learner
    check.py diff       --a DIR --b DIR --out W/learner/diff.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

# The shapes of Qwen2.5-0.5B and Llama-3.2-1B (their config.json values), and small stand-ins
# with the same structure for the CPU run.
SHAPES = {
    "qwen2-0.5b": dict(
        cls="Qwen2",
        tokenizer="chatml",
        ids_from="qwen2-f32",
        full=dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768),
        small=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=512, max_position_embeddings=512),
        common=dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False),
    ),
    "llama-1b": dict(
        cls="Llama",
        tokenizer="llama3",
        ids_from="llama3-gqa",
        full=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072),
        small=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=512),
        common=dict(rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                    rope_scaling=dict(rope_type="llama3", factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                                      original_max_position_embeddings=8192)),
    ),
}
DTYPES = ("float32", "bfloat16")
PARITY_PROMPTS = 4
PARITY_NEW_TOKENS = 32


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tokenizer_vocab(model_dir: Path) -> int:
    """Ids below this are the tokenizer's own: prompts drawn from them decode to text."""
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    return len(tok["model"]["vocab"])


def cmd_models(a) -> int:
    import transformers

    out = Path(a.out)
    for name, spec in SHAPES.items():
        dst = out / name
        if (dst / "config.json").is_file():
            continue
        ids = json.loads((FIXTURES / "models" / spec["ids_from"] / "config.json").read_text())
        cfg_cls = getattr(transformers, spec["cls"] + "Config")
        model_cls = getattr(transformers, spec["cls"] + "ForCausalLM")
        config = cfg_cls(**spec[a.size], **spec["common"], bos_token_id=ids["bos_token_id"],
                         eos_token_id=ids["eos_token_id"], initializer_range=0.02)
        torch.manual_seed(0)
        device = "cuda" if a.size == "full" and torch.cuda.is_available() else "cpu"
        t0 = time.perf_counter()
        with torch.device(device):
            model = model_cls(config).to(torch.float32)
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(FIXTURES / "tokenizers" / spec["tokenizer"] / f, tmp / f)
        tmp.rename(dst)
        n = sum(p.numel() for p in model.parameters())
        print(f"{name}: {n / 1e6:.1f}M parameters, made in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        del model
    return 0


def load_hf(model_dir: Path, dtype: str, device: str):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    return m.to(device).eval()


def cmd_reference(a) -> int:
    """Log-probabilities of fixed completions and greedy continuations, from transformers."""
    out = Path(a.out)
    rng = random.Random(1)
    for model_dir in sorted(Path(a.models).iterdir()):
        if not (model_dir / "config.json").is_file():
            continue
        vocab = tokenizer_vocab(model_dir)
        items = []
        for i in range(PARITY_PROMPTS):
            prompt = [rng.randrange(vocab) for _ in range(rng.randrange(8, 48))]
            completion = [rng.randrange(vocab) for _ in range(24)]
            items.append({"id": i, "prompt_ids": prompt, "completion_ids": completion})
        folder = out / model_dir.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "score-input.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
        for dtype in DTYPES:
            model = load_hf(model_dir, dtype, a.device)
            logprobs, greedy = [], []
            with torch.inference_mode():
                for it in items:
                    ids = torch.tensor([it["prompt_ids"] + it["completion_ids"]], device=a.device)
                    logits = model(input_ids=ids).logits[0].float()
                    lp = torch.log_softmax(logits, dim=-1)
                    p = len(it["prompt_ids"])
                    target = ids[0, p:]
                    logprobs.append(lp[p - 1:-1].gather(1, target[:, None])[:, 0].tolist())
                    prompt = torch.tensor([it["prompt_ids"]], device=a.device)
                    gen = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                         max_new_tokens=PARITY_NEW_TOKENS, min_new_tokens=PARITY_NEW_TOKENS,
                                         eos_token_id=None, pad_token_id=0)
                    greedy.append(gen[0, p:].tolist())
            write_json(folder / f"reference-{dtype}.json", {"logprobs": logprobs, "greedy": greedy})
            del model
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()
    return 0


def cmd_parity(a) -> int:
    """comas against transformers for every model and dtype: log-prob differences, greedy runs."""
    out = {}
    for folder in sorted(Path(a.parity).iterdir()):
        if not folder.is_dir():
            continue
        for dtype in DTYPES:
            ref_path = folder / f"reference-{dtype}.json"
            score_path = folder / f"comas-score-{dtype}.jsonl"
            gen_path = folder / f"comas-greedy-{dtype}.jsonl"
            row = {}
            if ref_path.is_file() and score_path.is_file():
                ref = json.loads(ref_path.read_text())
                ours = [json.loads(line) for line in score_path.read_text().splitlines() if line.strip()]
                diffs = [abs(x - y) for r, o in zip(ref["logprobs"], ours) for x, y in zip(r, o["logprobs"])]
                row["max_logprob_diff"] = max(diffs)
                row["mean_logprob_diff"] = sum(diffs) / len(diffs)
            if ref_path.is_file() and gen_path.is_file():
                ref = json.loads(ref_path.read_text())
                ours = [json.loads(line)["generated_ids"] for line in gen_path.read_text().splitlines() if line.strip()]
                same = []
                for r, o in zip(ref["greedy"], ours):
                    k = next((i for i, (x, y) in enumerate(zip(r, o)) if x != y), min(len(r), len(o)))
                    same.append(k)
                row["greedy_equal"] = sum(1 for r, o in zip(ref["greedy"], ours) if r == o)
                row["greedy_total"] = len(ref["greedy"])
                row["greedy_common_prefix"] = same
            out[f"{folder.name}/{dtype}"] = row
    write_json(Path(a.parity) / "parity.json", out)
    print(json.dumps(out))
    return 0


def cmd_prompts(a) -> int:
    vocab = min(tokenizer_vocab(d) for d in Path(a.models).iterdir() if (d / "config.json").is_file())
    rng = random.Random(2)
    write_json(Path(a.out), [[rng.randrange(vocab) for _ in range(a.len)] for _ in range(a.count)])
    return 0


def cmd_bandwidth(a) -> int:
    """Bytes per second of a large copy (read + written) and of a large read (a sum), best of 5."""
    n = (1 << 30) // 4 if a.device.startswith("cuda") else (64 << 20)
    src = torch.ones(n, dtype=torch.float32, device=a.device)
    dst = torch.empty_like(src)

    def best(f) -> float:
        times = []
        for _ in range(6):
            sync(a.device)
            t0 = time.perf_counter()
            f()
            sync(a.device)
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    copy = best(lambda: dst.copy_(src))
    read = best(lambda: src.sum())
    res = {"device": a.device, "copy_bytes_per_s": 2 * 4 * n / copy, "read_bytes_per_s": 4 * n / read}
    if a.device.startswith("cuda"):
        res["name"] = torch.cuda.get_device_name()
    write_json(Path(a.out), res)
    print(json.dumps(res))
    return 0


LEARNER_KEYS = """estimator = "reinforce"
kl_coef = 0.0
lr = 1e-4
weight_decay = 0.0
max_grad_norm = 1.0
warmup_ratio = 0.0
min_lr_ratio = 1.0
total_steps = 10
train_batch_size = {samples}
micro_batch_size = {micro}
seed = 42
"""


def cmd_batch(a) -> int:
    """A learner batch of random token ids, and the configs: the reference's (shared keys only),
    comas's full fine-tuning and comas's LoRA (the `device` and `dtype` added)."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((Path(a.model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(3)
    lines = []
    for i in range(a.samples):
        lines.append(json.dumps({
            "prompt_ids": [rng.randrange(vocab) for _ in range(a.prompt_len)],
            "completion_ids": [rng.randrange(vocab) for _ in range(a.completion_len)],
            "reward": (i % 3) / 2.0,
            "finish_reason": "stop",
            "group": f"g{i // 4}",
        }))
    (out / "batch.jsonl").write_text("\n".join(lines) + "\n")
    shared = LEARNER_KEYS.format(samples=a.samples, micro=a.micro)
    (out / "reference.toml").write_text(shared)
    comas = shared + f'device = "{a.device}"\ndtype = "float32"\n'
    (out / "comas-full.toml").write_text(comas)
    lora = f'[lora]\nr = {a.lora_r}\nalpha = {2.0 * a.lora_r}\ntarget_modules = ["q_proj", "v_proj"]\n'
    (out / "comas-lora.toml").write_text(comas + lora)
    return 0


def cmd_diff(a) -> int:
    """The largest absolute difference over every tensor the two checkpoints share."""
    from safetensors import safe_open

    def tensors(folder: Path) -> dict:
        out = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(f, "pt") as h:
                for k in h.keys():
                    out[k] = h.get_tensor(k).float()
        return out

    x, y = tensors(Path(a.a)), tensors(Path(a.b))
    common = sorted(set(x) & set(y))
    worst = max(common, key=lambda k: (x[k] - y[k]).abs().max().item())
    res = {
        "tensors": len(common),
        "only_in_a": sorted(set(x) - set(y))[:5],
        "only_in_b": sorted(set(y) - set(x))[:5],
        "max_abs_diff": (x[worst] - y[worst]).abs().max().item(),
        "worst_tensor": worst,
    }
    write_json(Path(a.out), res)
    print(json.dumps(res))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("models")
    p.add_argument("--size", choices=["full", "small"], required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("reference")
    p.add_argument("--models", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("parity")
    p.add_argument("--parity", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("--models", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--len", type=int, required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("bandwidth")
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("batch")
    p.add_argument("--model", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--completion-len", type=int, default=128)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--out", required=True)
    p = sub.add_parser("diff")
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    return {
        "models": cmd_models, "reference": cmd_reference, "parity": cmd_parity, "prompts": cmd_prompts,
        "bandwidth": cmd_bandwidth, "batch": cmd_batch, "diff": cmd_diff,
    }[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
