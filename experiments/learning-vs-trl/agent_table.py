"""The `[[agents]]` table of a comas job from the study's settings: the optimizer, schedule,
truncation and LoRA every arm of the learning study and of comas-same-budget trains with.
Imported by both run.sh scripts' job writers."""


def agent_table(s, model, train_batch_size, head=""):
    """One agent on `model`; `head`: lines that open its [agents.train] table (the estimator)."""
    targets = ", ".join(f'"{t}"' for t in s["lora_targets"])
    return f'''[[agents]]
model = "{model}"
[agents.train]
{head}lr = {s["lr"]}
lr_schedule = "cosine"
warmup_ratio = 0.0
min_lr_ratio = 1.0
adam_betas = [{s["adam_betas"][0]}, {s["adam_betas"][1]}]
weight_decay = 0.0
max_grad_norm = {s["max_grad_norm"]}
mask_truncated = {"true" if s.get("mask_truncated", False) else "false"}
train_batch_size = {train_batch_size}
micro_batch_size = {s["micro_batch_size"]}
dtype = "float32"
[agents.train.lora]
r = {s["lora_r"]}
alpha = {float(s["lora_alpha"])}
target_modules = [{targets}]'''
