//! The submit-time checks that need the file system: model folders, tokenizer against model
//! vocabulary, the data set (with the line of a broken record), the output folder. They run on
//! the coordinator, which therefore needs the same view of these paths as learners and workers
//! (a shared volume in a cluster).
use crate::error::{CoordinatorError, Result};
use comas_workflow::job::{Job, JobSpec};
use comas_workflow::task::{load_dataset, TaskRecord};
use std::path::Path;

fn bad(field: &str, message: String) -> CoordinatorError {
    CoordinatorError::Files(format!("`{field}`: {message}"))
}

/// A checked job with its training questions and its held-out evaluation questions (if any).
pub struct Loaded {
    pub job: Job,
    pub questions: Vec<TaskRecord>,
    pub eval_questions: Vec<TaskRecord>,
}

/// Parses, resolves and checks a submitted job file, and loads its data sets.
pub fn load_job(text: &str, base_dir: &str) -> Result<Loaded> {
    let mut spec = JobSpec::from_toml(text)?;
    if base_dir.is_empty() {
        if let Some((field, p)) = spec.relative_paths().into_iter().next() {
            return Err(bad(&field, format!("`{}` is relative; use absolute paths or submit with a base folder", p.display())));
        }
    } else {
        spec.resolve_paths(Path::new(base_dir));
    }
    for (k, a) in spec.agents.iter().enumerate() {
        check_model(&format!("agents[{k}].model"), &a.model)?;
        if let Some(ad) = &a.adapter {
            for f in ["adapter_config.json", "adapter_model.safetensors"] {
                if !ad.join(f).is_file() {
                    return Err(bad(&format!("agents[{k}].adapter"), format!("{} has no {f}", ad.display())));
                }
            }
        }
    }
    let questions = load_dataset(&spec.data.train).map_err(|e| bad("data.train", format!("{}: {e}", spec.data.train.display())))?;
    let mut eval_questions = Vec::new();
    if let Some(e) = &spec.eval {
        eval_questions = load_dataset(&e.data).map_err(|err| bad("eval.data", format!("{}: {err}", e.data.display())))?;
        if e.max_questions > 0 {
            eval_questions.truncate(e.max_questions);
        }
        if eval_questions.is_empty() {
            return Err(bad("eval.data", format!("{} has no questions", e.data.display())));
        }
    }
    let job = spec.check(questions.len())?;
    let out = &job.spec.output.dir;
    std::fs::create_dir_all(out).map_err(|e| bad("output.dir", format!("cannot create {}: {e}", out.display())))?;
    Ok(Loaded { job, questions, eval_questions })
}

/// A model folder needs config.json, weights and a tokenizer whose ids all have embeddings.
fn check_model(field: &str, dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        return Err(bad(field, format!("model folder {} does not exist", dir.display())));
    }
    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config).map_err(|e| bad(field, format!("cannot read {}: {e}", config.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(field, format!("{} is not valid JSON: {e}", config.display())))?;
    let vocab = json
        .get("vocab_size")
        .or_else(|| json.get("text_config").and_then(|t| t.get("vocab_size")))
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| bad(field, format!("{} has no vocab_size", config.display())))?;
    let has_weights = dir.join("model.safetensors").is_file() || dir.join("model.safetensors.index.json").is_file();
    if !has_weights {
        return Err(bad(field, format!("{} has no model.safetensors or model.safetensors.index.json", dir.display())));
    }
    let tok_path = dir.join("tokenizer.json");
    let tok = tokenizers::Tokenizer::from_file(&tok_path).map_err(|e| bad(field, format!("cannot load {}: {e}", tok_path.display())))?;
    let tok_vocab = tok.get_vocab_size(true) as u64;
    if tok_vocab > vocab {
        return Err(bad(
            field,
            format!("tokenizer.json has {tok_vocab} entries but config.json's vocab_size is {vocab}: the tokenizer does not belong to these weights"),
        ));
    }
    Ok(())
}
