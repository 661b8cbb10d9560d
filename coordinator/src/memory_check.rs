//! The memory estimate shown at submit: what each learner and each rollout worker will hold
//! (see `comas_workflow::memory`), checked against the memory that each reachable learner
//! reports for its device. A learner that is not up yet is not waited for.
use crate::learners::LearnerLink;
use comas_workflow::job::Job;
use comas_workflow::memory::{dtype_bytes, human_bytes, learner_memory, LearnerMemory, ModelDims};
use comas_workflow::train_config::canonical_dtype;
use std::collections::BTreeSet;
use std::time::Duration;

/// How long submit waits for a learner's answer about its memory.
const ASK_LEARNER: Duration = Duration::from_secs(2);

fn dims_of(dir: &std::path::Path) -> Result<ModelDims, String> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    ModelDims::from_config_json(&text).map_err(|e| format!("{}: {e}", p.display()))
}

fn parts(m: &LearnerMemory) -> String {
    let mut out = vec![format!("{} weights", human_bytes(m.weights))];
    for (bytes, what) in [
        (m.reference, "KL reference"),
        (m.gradients, "gradients"),
        (m.optimizer, "optimizer state"),
        (m.snapshot, "adapter snapshot"),
    ] {
        if bytes > 0 {
            out.push(format!("{} {what}", human_bytes(bytes)));
        }
    }
    out.join(", ")
}

/// Lines for the user: one per learner, one for the workers, and a warning for each learner
/// whose estimate exceeds the memory it reports.
pub async fn memory_notes(job: &Job) -> Vec<String> {
    let mut notes = Vec::new();
    let mut asks = tokio::task::JoinSet::new();
    for (k, a) in job.spec.agents.iter().enumerate() {
        let address = a.learner.clone().unwrap_or_default();
        asks.spawn(async move {
            let mut link = LearnerLink::new(k as u32, &address, Duration::ZERO);
            let info =
                tokio::time::timeout(ASK_LEARNER, link.info()).await.ok().and_then(Result::ok);
            (k, info)
        });
    }
    let mut infos = vec![None; job.spec.agents.len()];
    while let Some(Ok((k, info))) = asks.join_next().await {
        infos[k] = info;
    }
    // Each model's config.json, read once for the learners' and the workers' estimates.
    let dims: Vec<Result<ModelDims, String>> =
        job.spec.agents.iter().map(|a| dims_of(&a.model)).collect();
    for (k, d) in dims.iter().enumerate() {
        let dims = match d {
            Ok(d) => d,
            Err(e) => {
                notes.push(format!("agent {k}'s learner: no memory estimate ({e})"));
                continue;
            }
        };
        let m = learner_memory(dims, &job.train[k]);
        let has = infos[k].as_ref().filter(|i| i.memory_total_bytes > 0);
        let of = match has {
            Some(i) => format!("; its device ({}) has {}", i.device, human_bytes(i.memory_total_bytes)),
            None => "; the learner did not say how much memory it has (not up yet?), so this was not checked".into(),
        };
        notes.push(format!(
            "agent {k}'s learner needs about {} ({}) plus activations{of}",
            human_bytes(m.total()),
            parts(&m)
        ));
        if let Some(i) = has.filter(|i| m.total() > i.memory_total_bytes) {
            notes.push(format!(
                "warning: agent {k}'s learner needs about {} but its device ({}) has {}; train a LoRA adapter (agents[{k}].train.lora), use dtype = \"bfloat16\", or give it a larger device",
                human_bytes(m.total()),
                i.device,
                human_bytes(i.memory_total_bytes)
            ));
        }
    }
    notes.extend(worker_note(job, &dims));
    notes
}

/// On CPU, f32 and bf16 decode keep a packed copy of the decode linears
/// (`model/src/decode_linear.rs`): the clause that says so, empty for other dtypes.
fn packed_note(dtype: &str, packed_bytes: u64) -> String {
    if matches!(canonical_dtype(dtype), Some("bfloat16" | "float32")) {
        format!("; a CPU worker also keeps {} of packed decode weights (COMAS_DECODE_LINEAR=aten saves it)", human_bytes(packed_bytes))
    } else {
        String::new()
    }
}

/// A worker holds each agent's weights (agents that train a LoRA adapter on the same base
/// share that base) and a KV cache per base model, sized by its --max-batch-tokens.
fn worker_note(job: &Job, dims: &[Result<ModelDims, String>]) -> Option<String> {
    let b = dtype_bytes(&job.spec.rollout.dtype);
    let (mut weights, mut kv_per_token, mut models, mut packed) = (0u64, 0u64, 0usize, 0u64);
    let mut shared = BTreeSet::new();
    for (k, a) in job.spec.agents.iter().enumerate() {
        let dims = dims[k].as_ref().ok()?;
        let lora = job.train[k].lora.as_ref();
        let own = lora.is_none() && a.adapter.is_none();
        if own || shared.insert(a.model.clone()) {
            weights += dims.parameters() * b;
            packed += dims.decode_linear_parameters() * b;
            kv_per_token += dims.kv_bytes_per_token(b);
            models += 1;
        }
        if let Some(l) = lora {
            weights += dims.lora_parameters(l.r.max(0) as u64, &l.target_modules) * b;
        }
    }
    let packed_note = packed_note(&job.spec.rollout.dtype, packed);
    Some(format!(
        "each rollout worker holds about {} of weights ({models} base model{}, {}) plus {} of KV cache per 1,000 tokens of its --max-batch-tokens{packed_note}",
        human_bytes(weights),
        if models == 1 { "" } else { "s" },
        job.spec.rollout.dtype,
        human_bytes(kv_per_token * 1000)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_and_bf16_workers_are_told_about_the_packed_copy() {
        assert_eq!(packed_note("bfloat16", 3 << 29), "; a CPU worker also keeps 1.50 GiB of packed decode weights (COMAS_DECODE_LINEAR=aten saves it)");
        assert_eq!(packed_note("bf16", 512), "; a CPU worker also keeps 512 B of packed decode weights (COMAS_DECODE_LINEAR=aten saves it)");
        assert_eq!(packed_note("f32", 512), "; a CPU worker also keeps 512 B of packed decode weights (COMAS_DECODE_LINEAR=aten saves it)");
        assert_eq!(packed_note("float32", 3 << 29), "; a CPU worker also keeps 1.50 GiB of packed decode weights (COMAS_DECODE_LINEAR=aten saves it)");
        assert_eq!(packed_note("float16", 3 << 29), "");
    }
}
