//! A step's episodes on the coordinator's side of the method seam: the specs the workers run
//! (stable ids, settings, tasks, plans, seeds), the records read back and put in spec order,
//! saved for inspection, and turned into experiences by the method's own reward code.
use crate::error::{CoordinatorError, Result};
use crate::experience::StepBatch;
use comas_proto::v1 as pb;
use comas_workflow::job::Job;
use comas_workflow::method::StepContext;
use comas_workflow::program::{MethodConfig, Record};
use comas_workflow::seed::PlanSeed;
use comas_workflow::task::TaskRecord;
use std::collections::HashMap;

pub(crate) use comas_workflow::seed::EVAL_SHARD;

/// Stable episode ids: the same (job, step, instance) gets the same id after a restart, so an
/// episode stored before the restart is recognised and never run or counted again.
pub(crate) fn episode_id(job_id: &str, step: u64, instance: u32) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("{job_id}/{step}/{instance}").as_bytes())
        .to_string()
}

/// The episodes of training step `step`.
pub(crate) fn step_specs(
    job: &Job,
    job_id: &str,
    step: u64,
    questions: &[TaskRecord],
) -> Result<Vec<pb::EpisodeSpec>> {
    let chosen = job.step_questions(step);
    let seed = PlanSeed { global: job.spec.seed, step, shard: 0 };
    episode_specs(&job.method, &chosen, questions, seed, |i| episode_id(job_id, step, i))
}

/// The episodes of the `chosen` tasks, as the method plans them.
pub(crate) fn episode_specs(
    method: &MethodConfig,
    chosen: &[usize],
    questions: &[TaskRecord],
    seed: PlanSeed,
    id_of: impl Fn(u32) -> String,
) -> Result<Vec<pb::EpisodeSpec>> {
    let planned = method
        .episodes(chosen, questions, seed)
        .map_err(|e| CoordinatorError::Rollout(format!("planning step {}: {e}", seed.step)))?;
    let config_json = method.config_json();
    Ok(planned
        .into_iter()
        .map(|p| pb::EpisodeSpec {
            episode_id: id_of(p.instance),
            config_json: config_json.clone(),
            question_json: p.task_json,
            plan_json: p.plan_json,
            instance: p.instance,
            seed: p.seed,
            method: method.name().to_string(),
        })
        .collect())
}

/// A stored record (it passed the same check when it arrived; versions are checked again when
/// the step's experiences are made).
pub(crate) fn parse_record(job: &Job, json: &str, episode: &str) -> Result<Record> {
    crate::experience::check_record(&job.method, json, episode, None)
        .map_err(|e| CoordinatorError::Rollout(e.to_string()))
}

/// Keeps a step's records in `output.dir/episodes/step-NNNNN.jsonl` (with `output.save_episodes`),
/// so what the agents said can be read after the store has let go of them.
pub(crate) fn save_episodes(job: &Job, step: u64, records: &[(String, Record)]) -> Result<()> {
    /// One line of the file.
    #[derive(serde::Serialize)]
    struct Saved<'a> {
        episode_id: &'a str,
        record: &'a Record,
    }
    let dir = job.spec.output.dir.join("episodes");
    let lines = records
        .iter()
        .map(|(episode_id, record)| serde_json::to_string(&Saved { episode_id, record }))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| CoordinatorError::Other(e.to_string()))?;
    std::fs::create_dir_all(&dir)
        .and_then(|()| {
            crate::files::write_lines(&dir.join(format!("step-{step:05}.jsonl")), &lines)
        })
        .map_err(|e| {
            CoordinatorError::Other(format!(
                "cannot save the episodes of step {step} in {}: {e}",
                dir.display()
            ))
        })
}

/// The episodes of `specs` in spec order (so every run builds the same batches).
pub(crate) fn in_spec_order(
    specs: &[pb::EpisodeSpec],
    mut done: HashMap<String, Record>,
) -> Result<Vec<(String, Record)>> {
    specs
        .iter()
        .map(|s| {
            let r = done.remove(&s.episode_id).ok_or_else(|| {
                CoordinatorError::Rollout(format!(
                    "episode {} is missing after the rollout",
                    s.episode_id
                ))
            })?;
            Ok((s.episode_id.clone(), r))
        })
        .collect()
}

/// Rewards, experiences and metrics of a step's records, by the method's own formulation:
/// training step `step`'s (each experience then carries its turn's temperature), or an
/// evaluation's (`None`).
pub(crate) fn make_batch(
    method: &MethodConfig,
    records: Vec<(String, Record)>,
    questions: &[TaskRecord],
    num_agents: u32,
    versions: Option<&[u64]>,
    step: Option<u64>,
) -> Result<StepBatch> {
    let step = StepContext {
        agents: num_agents,
        data: questions,
        with_temperatures: step.is_some(),
        step,
    };
    let out = method
        .experience(records, &step, versions)
        .map_err(|e| CoordinatorError::Rollout(e.to_string()))?;
    Ok(StepBatch::from(out))
}
