#!/usr/bin/env python3
"""The reference run: TRL's GRPOTrainer with a PEFT LoRA on SmolLM2-135M-Instruct, with the
settings of comas's run (settings.json, shared with run.sh). Resumable: a run that finds
checkpoints in its output folder continues from the newest. Writes each step's mean reward,
seconds and peak memory to steps.jsonl.

    .venv-trl/bin/python experiments/learning-vs-trl/trl_grpo.py --model DIR --data DIR \
        --settings settings.json --seed S --out runs/trl-sS
"""
import argparse
import json
import os
import re
import pathlib
import resource
import time

from answers import last_box


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--settings", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=None, help="override the settings' steps (smoke tests)")
    args = ap.parse_args()
    s = json.loads(pathlib.Path(args.settings).read_text())
    steps = args.steps or s["steps"]

    import torch
    from datasets import load_dataset
    from math_verify import parse, verify
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(s["threads"])
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    data = load_dataset("json", data_files=str(pathlib.Path(args.data) / "train.jsonl"), split="train")
    # The question as the user message, the instruction after it: what comas's grpo sends.
    data = data.map(lambda r: {"prompt": [{"role": "user", "content": r["prompt"] + s["prompt_suffix"]}], "reference": r["answer"]})

    def correct(completions, reference, **_):
        """1 for a right final answer, 0 otherwise: math-verify on the reference as LaTeX math,
        as comas's grader reads it; with `answer_in_box`, on the last box's content alone."""
        out = []
        for c, gt in zip(completions, reference):
            text = c[0]["content"] if isinstance(c, list) else c
            if s.get("answer_in_box", False):
                b = last_box(text)
                out.append(1.0 if b is not None and verify(parse(f"${gt}$"), parse(f"$\\boxed{{{b}}}$")) else 0.0)
            else:
                out.append(1.0 if verify(parse(f"${gt}$"), parse(text)) else 0.0)
        return out

    def formatted(completions, **_):
        """`format_reward` for a reply with a boxed answer (reasoning in <think> left out)."""
        out = []
        for c in completions:
            text = c[0]["content"] if isinstance(c, list) else c
            text = re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.S)
            out.append(s["format_reward"] if last_box(text) is not None else 0.0)
        return out

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    lora = LoraConfig(r=s["lora_r"], lora_alpha=s["lora_alpha"], target_modules=s["lora_targets"], lora_dropout=0.0, task_type="CAUSAL_LM")
    per_step = s["questions_per_step"] * s["group_size"]
    cfg = GRPOConfig(
        output_dir=str(out),
        seed=args.seed,
        max_steps=steps,
        learning_rate=s["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=s["adam_betas"][0],
        adam_beta2=s["adam_betas"][1],
        weight_decay=0.0,
        max_grad_norm=s["max_grad_norm"],
        # One optimizer update per step on all of its completions, like comas's
        # train_batch_size = questions x G.
        per_device_train_batch_size=s["micro_batch_size"],
        gradient_accumulation_steps=per_step // s["micro_batch_size"],
        num_generations=s["group_size"],
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=bool(s.get("mask_truncated", False)),
        logging_steps=1,
        save_strategy="steps",
        save_steps=s["checkpoint_every"],
        report_to=[],
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        # comas trains without activation checkpointing; TRL turns it on by default.
        gradient_checkpointing=False,
    )

    class StepLog(TrainerCallback):
        """Each step's reward, wall time and peak memory, one JSON line each."""

        def __init__(self):
            self.started = None

        def on_step_begin(self, a, state, control, **kw):
            self.started = time.time()

        def on_log(self, a, state, control, logs=None, **kw):
            if logs is None or "reward" not in logs:
                return
            rec = {
                "step": state.global_step - 1,
                "reward": logs.get("reward"),
                "correct": logs.get("rewards/correct/mean"),
                "seconds": time.time() - self.started if self.started else None,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "completion_length": logs.get("completions/mean_length", logs.get("completion_length")),
                "clipped_ratio": logs.get("completions/clipped_ratio"),
            }
            with open(out / "steps.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")

    trainer = GRPOTrainer(model=model, reward_funcs=[correct, formatted], args=cfg, train_dataset=data, processing_class=tok, peft_config=lora, callbacks=[StepLog()])
    resume = any(p.name.startswith("checkpoint-") for p in out.iterdir())
    trainer.train(resume_from_checkpoint=True if resume else None)
    (out / "DONE").write_text(str(steps))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
