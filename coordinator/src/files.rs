//! The submit-time checks that need the file system: model folders, tokenizer against model
//! vocabulary, the data set (with the line of a broken record), the output folder. They run on
//! the coordinator, which therefore needs the same view of these paths as learners and workers
//! (a shared volume in a cluster).
use crate::error::{CoordinatorError, Result};
use comas_service::AllowedRoots;
use comas_workflow::dataset::load_records;
use comas_workflow::job::{Job, JobSpec};
use comas_workflow::method::{RoomNeeds, Speaker, TaskSource};
use comas_workflow::task::{location_of, TaskRecord};
use std::path::{Path, PathBuf};

pub use comas_service::write_atomic;

/// Writes JSON lines atomically: the job's metrics log when a run rewrites it from the store,
/// and saved episodes.
pub(crate) fn write_lines(path: &Path, lines: &[String]) -> std::io::Result<()> {
    let mut text = String::new();
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    write_atomic(path, text.as_bytes())
}

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
            return Err(bad(
                &field,
                format!(
                    "`{}` is relative; use absolute paths or submit with a base folder",
                    p.display()
                ),
            ));
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
        .map(|(k, a)| {
            check_policy(
                &format!("agents[{k}]"),
                &a.model,
                a.adapter
                    .clone()
                    .or_else(|| a.init_from.as_ref().map(|c| c.join("adapter")))
                    .as_deref(),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    // A model behind an endpoint has no folder here to check.
    let frozen = spec
        .frozen
        .iter()
        .enumerate()
        .map(|(k, f)| {
            f.model
                .as_ref()
                .map(|m| check_policy(&format!("frozen[{k}]"), m, f.adapter.as_deref()))
                .transpose()
        })
        .collect::<Result<Vec<_>>>()?;
    // A method that generates or lists its tasks has no data set to read.
    let dataset = !spec.data.train.as_os_str().is_empty();
    let questions = if dataset {
        load_records(&spec.data.train, &spec.data.columns())
            .map_err(|e| bad("data.train", format!("{}: {e}", spec.data.train.display())))?
    } else {
        Vec::new()
    };
    let mut eval_questions = Vec::new();
    if let Some(e) = spec.eval.as_ref().filter(|e| !e.data.as_os_str().is_empty()) {
        eval_questions = load_records(&e.data, &spec.data.columns())
            .map_err(|err| bad("eval.data", format!("{}: {err}", e.data.display())))?;
        if e.max_questions > 0 {
            eval_questions.truncate(e.max_questions);
        }
        if eval_questions.is_empty() {
            return Err(bad("eval.data", format!("{} has no questions", e.data.display())));
        }
    }
    let job = spec.check(questions.len())?;
    let room = check_room(&job.method.room(), &models, &frozen)?;
    if job.method.task_source() == TaskSource::Dataset {
        check_records(&room, &questions, "data.train", &job.spec.data.train)?;
        if let Some(e) = &job.spec.eval {
            check_records(&room, &eval_questions, "eval.data", &e.data)?;
        }
    }
    check_output_dir(&job.spec.output.dir)?;
    Ok(Loaded { job, questions, eval_questions })
}

/// Found now, not after the last step: the folder must take metrics and the final export.
fn check_output_dir(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)
        .map_err(|e| bad("output.dir", format!("cannot create {}: {e}", out.display())))?;
    let probe = out.join(format!(".comas-write-check-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&probe, b"")
        .map_err(|e| bad("output.dir", format!("cannot write in {}: {e}", out.display())))?;
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

/// The method's replies must leave room for a prompt in their speakers' contexts, and with the
/// job's prompt limit they must fit there too. Returns what is left for a task's prompt in the
/// trained agents' tightest context.
fn check_room<'a>(
    needs: &RoomNeeds,
    models: &'a [ModelRoom],
    frozen: &[Option<ModelRoom>],
) -> Result<Room<'a>> {
    let Some((k, tightest)) = models.iter().enumerate().min_by_key(|(_, m)| m.context) else {
        // A job that trains nothing: each call is fitted to its model's context.
        return Ok(Room { tokens: u64::MAX, why: String::new(), models });
    };
    let held = |who: String, r: &ModelRoom| {
        format!(
            "{who}'s model holds {} tokens (max_position_embeddings in {})",
            r.context,
            r.dir.join("config.json").display()
        )
    };
    for reply in &needs.replies {
        // A model behind an endpoint has no folder here to check.
        let (who, room) = match reply.speaker {
            Speaker::Agents => (format!("agent {k}"), tightest),
            Speaker::Frozen(i) => match frozen.get(i).and_then(Option::as_ref) {
                Some(r) => (format!("frozen[{i}]"), r),
                None => continue,
            },
        };
        let beside = reply.beside.as_ref().map_or(0, |(tokens, _)| *tokens);
        if reply.new_tokens + beside >= room.context {
            let what = match &reply.beside {
                None => format!(
                    "is {}, but {}; leave room for the prompt",
                    reply.new_tokens,
                    held(who, room)
                ),
                Some((_, desc)) => {
                    format!(
                        "{} new tokens plus {desc} is {}, but {}; lower one of them",
                        reply.new_tokens,
                        reply.new_tokens + beside,
                        held(who, room)
                    )
                }
            };
            return Err(bad(&reply.key, what));
        }
        if let (Some((p, key)), Speaker::Agents) = (&needs.prompt_max_len, reply.speaker) {
            if p + reply.new_tokens > room.context {
                return Err(bad(
                    key,
                    format!(
                        "{p} prompt tokens plus {} {} is {}, but {}; lower one of them",
                        reply.name,
                        reply.new_tokens,
                        p + reply.new_tokens,
                        held(who, room)
                    ),
                ));
            }
        }
    }
    Ok(match &needs.prompt_max_len {
        Some((p, key)) => Room { tokens: *p, why: key.clone(), models },
        None => Room {
            tokens: tightest.context.saturating_sub(needs.task.tokens),
            why: format!("{}, less {}", held(format!("agent {k}"), tightest), needs.task.why),
            models,
        },
    })
}

/// A problem that alone is longer than a prompt may be can never run: refuse it, naming its
/// line. Only problems with more bytes than the limit has tokens are tokenized, since a token
/// covers at least one byte.
fn check_records(
    room: &Room<'_>,
    questions: &[TaskRecord],
    field: &str,
    path: &Path,
) -> Result<()> {
    for (i, q) in questions.iter().enumerate() {
        if (q.prompt.len() as u64) <= room.tokens {
            continue;
        }
        for m in room.models {
            let n = m
                .tokenizer
                .encode(q.prompt.as_str(), false)
                .map(|e| e.len() as u64)
                .unwrap_or(u64::MAX);
            if n > room.tokens {
                let at = std::fs::read_to_string(path)
                    .map(|t| location_of(&t, i).to_string())
                    .unwrap_or_else(|_| format!("record {}", i + 1));
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
            return Err(bad(
                field,
                format!(
                    "{} has no {f}: give a complete LoRA checkpoint folder (step-N) of a learner",
                    dir.display()
                ),
            ));
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
                return Err(bad(
                    &format!("{field}.adapter"),
                    format!("{} has no {f}", ad.display()),
                ));
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
    let text = std::fs::read_to_string(&config)
        .map_err(|e| bad(field, format!("cannot read {}: {e}", config.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad(field, format!("{} is not valid JSON: {e}", config.display())))?;
    let vocab = json
        .get("vocab_size")
        .or_else(|| json.get("text_config").and_then(|t| t.get("vocab_size")))
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| bad(field, format!("{} has no vocab_size", config.display())))?;
    let has_weights = dir.join("model.safetensors").is_file()
        || dir.join("model.safetensors.index.json").is_file();
    if !has_weights {
        return Err(bad(
            field,
            format!("{} has no model.safetensors or model.safetensors.index.json", dir.display()),
        ));
    }
    let tok_path = dir.join("tokenizer.json");
    let tok = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| bad(field, format!("cannot load {}: {e}", tok_path.display())))?;
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
