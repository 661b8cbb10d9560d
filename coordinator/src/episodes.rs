//! A step's episodes on the coordinator's side of the method seam: the specs the workers run
//! (stable ids, settings, plans, seeds), the records read back and put in spec order, saved
//! for inspection, and turned into experiences by the method's own reward code.
use crate::error::{CoordinatorError, Result};
use crate::experience::{make_step, Finished, StepBatch};
use crate::mappa_experience::make_mappa_step;
use comas_proto::v1 as pb;
use comas_workflow::comas::{episode_seed, plan_batch, PlanSeed};
use comas_workflow::cosir::{CosirConfig, Table};
use comas_workflow::eval::{EvalJobConfig, EvalRunMetrics};
use comas_workflow::job::{Job, Method};
use comas_workflow::program::{Record, Settings};
use comas_workflow::seed::derive_seed;
use comas_workflow::task::TaskRecord;
use std::collections::HashMap;

/// Stable episode ids: the same (job, step, instance) gets the same id after a restart, so an
/// episode stored before the restart is recognised and never run or counted again.
pub(crate) fn episode_id(job_id: &str, step: u64, instance: u32) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("{job_id}/{step}/{instance}").as_bytes()).to_string()
}

/// Evaluation episodes draw from their own seed stream, apart from every training step's.
pub(crate) const EVAL_SHARD: u64 = 1 << 32;

pub(crate) fn step_specs(job: &Job, job_id: &str, step: u64, questions: &[TaskRecord]) -> Result<Vec<pb::EpisodeSpec>> {
    if let Some(e) = &job.evaluate {
        return Ok(eval_specs(job_id, step, e));
    }
    let chosen = job.step_questions(step);
    let seed = PlanSeed { global: job.spec.seed, step, shard: 0 };
    episode_specs(job.settings(), &chosen, questions, seed, |i| episode_id(job_id, step, i))
}

/// An evaluation job's episodes: one per question, which carries its benchmark index (the
/// calls' seeds follow from it and the run seed, as on one machine).
fn eval_specs(job_id: &str, step: u64, e: &EvalJobConfig) -> Vec<pb::EpisodeSpec> {
    let config_json = Settings::Eval(&e.settings).config_json();
    e.questions
        .iter()
        .enumerate()
        .map(|(i, q)| pb::EpisodeSpec {
            episode_id: episode_id(job_id, step, i as u32),
            config_json: config_json.clone(),
            question_json: serde_json::to_string(q).expect("question serialises"),
            plan_json: String::new(),
            instance: i as u32,
            seed: e.settings.seed,
            method: Method::Eval.as_str().to_string(),
        })
        .collect()
}

/// The episodes of the `chosen` questions, `instances_per_question` copies each; a CoMAS game
/// also gets each instance's judge assignment.
pub(crate) fn episode_specs(
    settings: Settings<'_>,
    chosen: &[usize],
    questions: &[TaskRecord],
    seed: PlanSeed,
    id_of: impl Fn(u32) -> String,
) -> Result<Vec<pb::EpisodeSpec>> {
    let copies = settings.instances_per_question() as usize;
    let n = chosen.len() * copies;
    let plans: Vec<String> = match settings {
        Settings::Comas(comas) => plan_batch(comas, n, seed)
            .map_err(|e| CoordinatorError::Rollout(format!("planning step {}: {e}", seed.step)))?
            .instances
            .iter()
            .map(|p| serde_json::to_string(p).expect("plan serialises"))
            .collect(),
        Settings::Mappa(_) => vec![String::new(); n],
        // The plan of a CoSIR game is its table, drawn from the table's own seed.
        Settings::Cosir(cosir) => {
            let mut plans = Vec::with_capacity(n);
            for &index in chosen {
                let table = cosir_table(cosir, seed, index)?;
                let json = serde_json::to_string(&table).expect("table serialises");
                plans.extend(std::iter::repeat_n(json, copies));
            }
            plans
        }
        // The plan of a NeuroMAS rollout is the graph as it stands.
        Settings::Neuromas(cfg) => {
            let graph = cfg.graph_at(seed.step).map_err(|(k, m)| CoordinatorError::Other(format!("neuromas.{k}: {m}")))?;
            vec![serde_json::to_string(&graph).expect("graph serialises"); n]
        }
        Settings::Eval(_) => return Err(CoordinatorError::Other("an evaluation job's episodes come from its own questions".into())),
    };
    let generated = matches!(settings, Settings::Cosir(_));
    let config_json = settings.config_json();
    let method = settings.method().as_str().to_string();
    Ok(plans
        .into_iter()
        .enumerate()
        .map(|(i, plan_json)| {
            let instance = i as u32;
            pb::EpisodeSpec {
                episode_id: id_of(instance),
                config_json: config_json.clone(),
                question_json: if generated { String::new() } else { serde_json::to_string(&questions[chosen[i / copies]]).expect("record serialises") },
                plan_json,
                instance,
                seed: episode_seed(seed, instance),
                method: method.clone(),
            }
        })
        .collect())
}

/// Table `index` of a CoSIR job's stream `seed.shard` (training tables, or the fixed held-out
/// ones of the evaluation shard): the same index always gives the same table.
pub(crate) fn cosir_table(config: &CosirConfig, seed: PlanSeed, index: usize) -> Result<Table> {
    let prefix = if seed.shard == EVAL_SHARD { "eval-table" } else { "table" };
    Table::generate(config, derive_seed(&[seed.global, COSIR_TABLE_TAG, seed.shard, index as u64]), &format!("{prefix}-{index}"))
        .map_err(|e| CoordinatorError::Rollout(format!("drawing CoSIR table {index}: {e}")))
}

/// Seed stream of CoSIR tables.
const COSIR_TABLE_TAG: u64 = 0xC051_7AB1;

/// A stored record (it passed the same check when it arrived; versions are checked again when
/// the step's experiences are made).
pub(crate) fn parse_record(job: &Job, json: &str, episode: &str) -> Result<Record> {
    crate::experience::check_record(&job.settings().record_kind(), json, episode, None).map_err(CoordinatorError::Rollout)
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
        .and_then(|()| crate::runner::write_lines(&dir.join(format!("step-{step:05}.jsonl")), &lines))
        .map_err(|e| CoordinatorError::Other(format!("cannot save the episodes of step {step} in {}: {e}", dir.display())))
}

/// The episodes of `specs` in spec order (so every run builds the same batches).
pub(crate) fn in_spec_order(specs: &[pb::EpisodeSpec], mut done: HashMap<String, Record>) -> Result<Vec<(String, Record)>> {
    specs
        .iter()
        .map(|s| {
            let r = done.remove(&s.episode_id).ok_or_else(|| CoordinatorError::Rollout(format!("episode {} is missing after the rollout", s.episode_id)))?;
            Ok((s.episode_id.clone(), r))
        })
        .collect()
}

/// Rewards, experiences and metrics of a step's records, by the method's own formulation. A
/// CoMAS turn carries its role's temperature when `with_temperatures`.
pub(crate) fn make_batch(
    settings: Settings<'_>,
    records: Vec<(String, Record)>,
    questions: &[TaskRecord],
    num_agents: u32,
    versions: Option<&[u64]>,
    with_temperatures: bool,
) -> Result<StepBatch> {
    let wrong = |id: &str| CoordinatorError::Rollout(format!("episode {id} came back as another method's record"));
    let made = match settings {
        Settings::Comas(comas) => {
            let by_id: HashMap<&str, &TaskRecord> = questions.iter().map(|q| (q.id.as_str(), q)).collect();
            let finished = records
                .into_iter()
                .map(|(episode_id, r)| match r {
                    Record::Comas(t) => {
                        // The question's reference answer, for logging only.
                        let answer = by_id.get(t.question_id.as_str()).map(|q| q.answer.clone()).unwrap_or_default();
                        Ok(Finished { episode_id, trajectory: t, answer })
                    }
                    Record::Mappa(_) | Record::Eval(_) | Record::Cosir(_) | Record::Neuromas(_) => Err(wrong(&episode_id)),
                })
                .collect::<Result<Vec<_>>>()?;
            make_step(&finished, num_agents, versions, with_temperatures.then_some(&comas.sampling), comas.reward)
        }
        Settings::Mappa(mappa) => {
            let finished = records
                .into_iter()
                .map(|(episode_id, r)| match r {
                    Record::Mappa(t) => Ok((episode_id, t)),
                    Record::Comas(_) | Record::Eval(_) | Record::Cosir(_) | Record::Neuromas(_) => Err(wrong(&episode_id)),
                })
                .collect::<Result<Vec<_>>>()?;
            make_mappa_step(&finished, mappa, num_agents, versions)
        }
        Settings::Cosir(cosir) => {
            let finished = records
                .into_iter()
                .map(|(episode_id, r)| match r {
                    Record::Cosir(t) => Ok((episode_id, t)),
                    _ => Err(wrong(&episode_id)),
                })
                .collect::<Result<Vec<_>>>()?;
            crate::cosir_experience::make_cosir_step(&finished, cosir, num_agents, versions)
        }
        Settings::Neuromas(neuromas) => {
            let finished = records
                .into_iter()
                .map(|(episode_id, r)| match r {
                    Record::Neuromas(t) => Ok((episode_id, t)),
                    _ => Err(wrong(&episode_id)),
                })
                .collect::<Result<Vec<_>>>()?;
            crate::neuromas_experience::make_neuromas_step(&finished, neuromas, num_agents, versions)
        }
        Settings::Eval(_) => {
            let transcripts = records
                .iter()
                .map(|(episode_id, r)| match r {
                    Record::Eval(t) => Ok(t),
                    Record::Comas(_) | Record::Mappa(_) | Record::Cosir(_) | Record::Neuromas(_) => Err(wrong(episode_id)),
                })
                .collect::<Result<Vec<_>>>()?;
            let metrics = serde_json::to_value(EvalRunMetrics::of(transcripts)).map_err(|e| CoordinatorError::Other(e.to_string()))?;
            // Nothing trains: the graded answers go back to the client, which grades them.
            Ok(StepBatch { per_agent: Vec::new(), metrics, pooled_whitening: false })
        }
    };
    made.map_err(|e| CoordinatorError::Rollout(e.to_string()))
}
