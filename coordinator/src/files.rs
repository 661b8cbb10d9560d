//! The submit-time checks that need the file system: model folders, tokenizer against model
//! vocabulary, the data set (with the line of a broken record), the output folder. They run on
//! the coordinator, which therefore needs the same view of these paths as learners and workers
//! (a shared volume in a cluster).
use crate::error::{CoordinatorError, Result};
use comas_service::AllowedRoots;
use comas_workflow::job::{Job, JobSpec, Method};
use comas_workflow::task::{load_dataset, location_of, TaskRecord};
use comas_workflow::Role;
use std::path::{Path, PathBuf};

pub use comas_service::write_atomic;

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
pub fn load_job(text: &str, base_dir: &str, roots: &AllowedRoots) -> Result<Loaded> {
    let mut spec = JobSpec::from_toml(text)?;
    if base_dir.is_empty() {
        if let Some((field, p)) = spec.relative_paths().into_iter().next() {
            return Err(bad(&field, format!("`{}` is relative; use absolute paths or submit with a base folder", p.display())));
        }
    } else {
        spec.resolve_paths(Path::new(base_dir));
    }
    // Before any file is opened: a path outside the roots is not even looked at.
    for (field, path) in spec.paths() {
        roots.check(&path).map_err(|e| bad(&field, e.to_string()))?;
    }
    for (k, a) in spec.agents.iter().enumerate() {
        if let Some(c) = &a.init_from {
            check_init_checkpoint(&format!("agents[{k}].init_from"), c)?;
        }
    }
    let models = spec
        .agents
        .iter()
        .enumerate()
        .map(|(k, a)| check_policy(&format!("agents[{k}]"), &a.model, a.adapter.clone().or_else(|| a.init_from.as_ref().map(|c| c.join("adapter"))).as_deref()))
        .collect::<Result<Vec<_>>>()?;
    // A model behind an endpoint has no folder here to check.
    let frozen = spec
        .frozen
        .iter()
        .enumerate()
        .map(|(k, f)| f.model.as_ref().map(|m| check_policy(&format!("frozen[{k}]"), m, f.adapter.as_deref())).transpose())
        .collect::<Result<Vec<_>>>()?;
    if spec.method == Method::Eval {
        // The questions are in the file, and each call is shortened to fit its model's context.
        let job = spec.check(0)?;
        check_output_dir(&job.spec.output.dir)?;
        return Ok(Loaded { job, questions: Vec::new(), eval_questions: Vec::new() });
    }
    if spec.method == Method::Cosir {
        // Generated tables: check that the settings can produce one, and leave room for turns.
        let job = spec.check(0)?;
        if let Some(c) = &job.cosir {
            comas_workflow::cosir::Table::generate(c, 0, "check").map_err(|e| bad("cosir", e))?;
            if let Some(m) = models.iter().find(|m| u64::from(c.sampling.max_new_tokens) >= m.context) {
                return Err(bad(
                    "cosir.sampling.max_new_tokens",
                    format!("is {}, but the model in {} holds {} tokens; leave room for the prompt", c.sampling.max_new_tokens, m.dir.display(), m.context),
                ));
            }
        }
        check_output_dir(&job.spec.output.dir)?;
        return Ok(Loaded { job, questions: Vec::new(), eval_questions: Vec::new() });
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
    let room = match (&job.mappa, &job.neuromas) {
        (Some(m), _) => check_mappa_context(m, &models, &frozen)?,
        (None, Some(n)) => check_neuromas_context(n, &models)?,
        (None, None) => check_context(&job, &models)?,
    };
    check_records(&room, &questions, "data.train", &job.spec.data.train)?;
    if let Some(e) = &job.spec.eval {
        check_records(&room, &eval_questions, "eval.data", &e.data)?;
    }
    check_output_dir(&job.spec.output.dir)?;
    Ok(Loaded { job, questions, eval_questions })
}

/// Found now, not after the last step: the folder must take metrics and the final export.
fn check_output_dir(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| bad("output.dir", format!("cannot create {}: {e}", out.display())))?;
    let probe = out.join(format!(".comas-write-check-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&probe, b"").map_err(|e| bad("output.dir", format!("cannot write in {}: {e}", out.display())))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// What submit-time checks need of a model: its context and its tokenizer.
struct ModelRoom {
    dir: PathBuf,
    /// `max_position_embeddings` (32768 when config.json leaves it out, as the model loader does).
    context: u64,
    tokenizer: tokenizers::Tokenizer,
}

/// The room a problem has: the tightest limit over the models and the job, and what sets it.
struct Room<'a> {
    tokens: u64,
    why: String,
    models: &'a [ModelRoom],
}

/// Every role's max_new_tokens must leave room for a prompt in every agent's context, and
/// `prompt_max_len` plus it must fit there too.
fn check_context<'a>(job: &Job, models: &'a [ModelRoom]) -> Result<Room<'a>> {
    let Some((k, m)) = models.iter().enumerate().min_by_key(|(_, m)| m.context) else {
        return Err(bad("agents", "the job lists no agents".into()));
    };
    let held = format!("agent {k}'s model holds {} tokens (max_position_embeddings in {})", m.context, m.dir.join("config.json").display());
    let solver_new = u64::from(job.comas.sampling.solver.max_new_tokens);
    for role in Role::COMAS {
        let new = u64::from(job.comas.sampling.for_role(role).max_new_tokens);
        if new >= m.context {
            return Err(bad(&format!("comas.sampling.{role}.max_new_tokens"), format!("is {new}, but {held}; leave room for the prompt")));
        }
        if let Some(p) = job.comas.prompt_max_len.map(u64::from) {
            if p + new > m.context {
                return Err(bad(
                    "comas.prompt_max_len",
                    format!("{p} prompt tokens plus sampling.{role}.max_new_tokens {new} is {}, but {held}; lower one of them", p + new),
                ));
            }
        }
    }
    Ok(match job.comas.prompt_max_len.map(u64::from) {
        Some(p) => Room { tokens: p, why: "comas.prompt_max_len".into(), models },
        None => Room { tokens: m.context - solver_new, why: format!("{held}, less sampling.solver.max_new_tokens {solver_new}"), models },
    })
}

/// MAPPA's room: each agent's actions and the coach's replies must leave room for a prompt in
/// their models' contexts; a problem must fit the agents' prompt room.
fn check_mappa_context<'a>(m: &comas_workflow::mappa::MappaConfig, models: &'a [ModelRoom], frozen: &[Option<ModelRoom>]) -> Result<Room<'a>> {
    let Some((k, agent)) = models.iter().enumerate().min_by_key(|(_, m)| m.context) else {
        return Err(bad("agents", "the job lists no agents".into()));
    };
    let held =
        |who: String, r: &ModelRoom| format!("{who}'s model holds {} tokens (max_position_embeddings in {})", r.context, r.dir.join("config.json").display());
    let new = u64::from(m.max_new_tokens());
    if new >= agent.context {
        return Err(bad(
            "mappa.sampling.max_new_tokens (the longest of any role)",
            format!("is {new}, but {}; leave room for the prompt", held(format!("agent {k}"), agent)),
        ));
    }
    let coach_new = u64::from(m.coach_sampling.max_new_tokens);
    let coach = (m.coach_agent as usize).saturating_sub(models.len());
    if let Some(c) = frozen.get(coach).and_then(Option::as_ref).filter(|c| coach_new >= c.context) {
        return Err(bad(
            "mappa.coach_sampling.max_new_tokens",
            format!("is {coach_new}, but {}; leave room for the prompt", held(format!("frozen[{coach}]"), c)),
        ));
    }
    Ok(match m.prompt_max_len.map(u64::from) {
        Some(p) if p + new > agent.context => {
            return Err(bad(
                "mappa.prompt_max_len",
                format!("{p} prompt tokens plus sampling.max_new_tokens {new} is {}, but {}; lower one of them", p + new, held(format!("agent {k}"), agent)),
            ));
        }
        Some(p) => Room { tokens: p, why: "mappa.prompt_max_len".into(), models },
        None => Room { tokens: agent.context - new, why: format!("{}, less sampling.max_new_tokens {new}", held(format!("agent {k}"), agent)), models },
    })
}

/// NeuroMAS's room: a node's reply must leave room in every agent's context for its prompt,
/// which holds the task and up to one message of `max_msg_tokens` from each input (the widest
/// fan-in of the graph); a task must fit what is left.
fn check_neuromas_context<'a>(n: &comas_workflow::neuromas::NeuromasConfig, models: &'a [ModelRoom]) -> Result<Room<'a>> {
    let Some((k, agent)) = models.iter().enumerate().min_by_key(|(_, m)| m.context) else {
        return Err(bad("agents", "the job lists no agents".into()));
    };
    // Once its bridges end, a grown graph's nodes read their whole input layers.
    let graph = n.graph_at(u64::MAX).map_err(|(key, m)| bad(&format!("neuromas.{key}"), m))?;
    let fan_in = graph.nodes().iter().map(|node| graph.inputs(node.layer, node.index).len() as u64).max().unwrap_or(0);
    let new = u64::from(n.max_new_tokens());
    let messages = fan_in * u64::from(n.max_msg_tokens);
    let held = format!("agent {k}'s model holds {} tokens (max_position_embeddings in {})", agent.context, agent.dir.join("config.json").display());
    if new + messages >= agent.context {
        return Err(bad(
            "neuromas.sampling.max_new_tokens (the larger of it and readout_sampling's)",
            format!(
                "{new} new tokens plus {fan_in} input messages of max_msg_tokens {} is {}, but {held}; lower one of them",
                n.max_msg_tokens,
                new + messages
            ),
        ));
    }
    Ok(Room {
        tokens: agent.context - new - messages,
        why: format!("{held}, less max_new_tokens {new} and {fan_in} messages of {} tokens", n.max_msg_tokens),
        models,
    })
}

/// A problem that alone is longer than a prompt may be can never run: refuse it, naming its
/// line. Only problems with more bytes than the limit has tokens are tokenized, since a token
/// covers at least one byte.
fn check_records(room: &Room<'_>, questions: &[TaskRecord], field: &str, path: &Path) -> Result<()> {
    for (i, q) in questions.iter().enumerate() {
        if (q.prompt.len() as u64) <= room.tokens {
            continue;
        }
        for m in room.models {
            let n = m.tokenizer.encode(q.prompt.as_str(), false).map(|e| e.len() as u64).unwrap_or(u64::MAX);
            if n > room.tokens {
                let at = std::fs::read_to_string(path).map(|t| location_of(&t, i).to_string()).unwrap_or_else(|_| format!("record {}", i + 1));
                return Err(bad(
                    field,
                    format!(
                        "{} {at} (id `{}`): the problem alone is {n} tokens for {}, but a prompt may have at most {} ({}); shorten or drop it",
                        path.display(),
                        q.id,
                        m.dir.display(),
                        room.tokens,
                        room.why
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A learner checkpoint an agent starts from: complete, with a LoRA adapter and Adam moments.
fn check_init_checkpoint(field: &str, dir: &Path) -> Result<()> {
    for f in ["COMPLETE", "state.json", "optimizer.safetensors", "adapter/adapter_config.json"] {
        if !dir.join(f).is_file() {
            return Err(bad(field, format!("{} has no {f}: give a complete LoRA checkpoint folder (step-N) of a learner", dir.display())));
        }
    }
    Ok(())
}

/// A policy's model folder and, if it has one, its PEFT adapter folder; `field` names the entry
/// (`agents[1]`).
fn check_policy(field: &str, model: &Path, adapter: Option<&Path>) -> Result<ModelRoom> {
    let room = check_model(&format!("{field}.model"), model)?;
    if let Some(ad) = adapter {
        for f in ["adapter_config.json", "adapter_model.safetensors"] {
            if !ad.join(f).is_file() {
                return Err(bad(&format!("{field}.adapter"), format!("{} has no {f}", ad.display())));
            }
        }
    }
    Ok(room)
}

/// A model folder needs config.json, weights and a tokenizer whose ids all have embeddings.
fn check_model(field: &str, dir: &Path) -> Result<ModelRoom> {
    if dir.is_file() {
        return Err(bad(field, format!("{} is a file; give the model's folder (with config.json, model.safetensors and tokenizer.json)", dir.display())));
    }
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
    let context = json
        .get("max_position_embeddings")
        .or_else(|| json.get("text_config").and_then(|t| t.get("max_position_embeddings")))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(32768);
    Ok(ModelRoom { dir: dir.to_path_buf(), context, tokenizer: tok })
}
