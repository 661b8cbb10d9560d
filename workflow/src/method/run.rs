//! The machinery's side of the seam, written once for every method: a step's episode specs, an
//! episode spec read back on a worker, a returned record parsed and checked, and a step's
//! experience making with its policy-version check. The registry calls these with the method of
//! the job.
use super::{Episode, Made, Method, Record, RecordFault, StepContext, StepOutput};
use crate::error::WorkflowError;
use crate::program::PolicyTurn;
use crate::seed::PlanSeed;
use crate::task::TaskRecord;
use crate::turn::PromptMeter;

/// One episode of a step, as an episode spec carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedEpisode {
    /// Its place in the step: the copies of the q-th task are instances q·copies ..
    /// (q + 1)·copies.
    pub instance: u32,
    pub seed: u64,
    pub task_json: String,
    pub plan_json: String,
}

/// The episodes of the `chosen` tasks, `copies` of each, in instance order.
pub(crate) fn plan_episodes<M: Method>(
    config: &M::Config,
    chosen: &[usize],
    data: &[TaskRecord],
    seed: PlanSeed,
) -> Result<Vec<PlannedEpisode>, WorkflowError> {
    let copies = M::copies(config) as usize;
    let n = chosen.len().checked_mul(copies).filter(|&n| u32::try_from(n).is_ok()).ok_or_else(
        || WorkflowError::BatchTooLarge(format!("{} tasks x {copies} episodes", chosen.len())),
    )?;
    let plans = M::plans(config, n, seed)?;
    if plans.len() != n {
        return Err(WorkflowError::PlanMismatch(format!("{} plans for {n} episodes", plans.len())));
    }
    let mut out = Vec::with_capacity(n);
    let mut plans = plans.into_iter();
    for &index in chosen {
        let task_json =
            serde_json::to_string(&M::task(config, index, data, seed)?).expect("a task serialises");
        for plan in plans.by_ref().take(copies) {
            let instance = out.len() as u32;
            out.push(PlannedEpisode {
                instance,
                seed: M::episode_seed(config, seed, instance),
                task_json: task_json.clone(),
                plan_json: serde_json::to_string(&plan).expect("a plan serialises"),
            });
        }
    }
    Ok(out)
}

/// An episode spec, read on a worker: the method's settings, the task, the episode's plan.
pub struct Start<M: Method> {
    pub config: M::Config,
    pub task: M::Task,
    pub plan: M::Plan,
    pub instance: u32,
    pub seed: u64,
}

impl<M: Method> Clone for Start<M> {
    fn clone(&self) -> Self {
        Start {
            config: self.config.clone(),
            task: self.task.clone(),
            plan: self.plan.clone(),
            instance: self.instance,
            seed: self.seed,
        }
    }
}

impl<M: Method> std::fmt::Debug for Start<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Start")
            .field("method", &M::NAME)
            .field("instance", &self.instance)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

/// An episode spec's settings, task and plan; an error names the field that is wrong.
pub(crate) fn decode<M: Method>(
    config_json: &str,
    task_json: &str,
    plan_json: &str,
) -> Result<(M::Config, M::Task, M::Plan), String> {
    fn field<T: serde::de::DeserializeOwned>(name: &str, json: &str) -> Result<T, String> {
        serde_json::from_str(json).map_err(|e| format!("`{name}` is not valid: {e}"))
    }
    // An episode without a plan may leave the field empty.
    let plan_json = if plan_json.trim().is_empty() { "null" } else { plan_json };
    Ok((
        field("config_json", config_json)?,
        field("question_json", task_json)?,
        field("plan_json", plan_json)?,
    ))
}

/// Starts the episode of a decoded spec.
pub(crate) fn start_episode<M: Method>(
    config: &M::Config,
    task: &M::Task,
    plan: &M::Plan,
    instance: u32,
    seed: u64,
    meter: &dyn PromptMeter,
) -> Result<M::Episode, WorkflowError> {
    let e = M::start(config, task, plan.clone(), instance, seed, meter)?;
    Ok(e)
}

/// A worker's record, parsed and checked by the method.
pub(crate) fn parse_record<M: Method>(
    config: &M::Config,
    json: &str,
) -> Result<M::Record, RecordFault> {
    let r: M::Record = serde_json::from_str(json).map_err(|e| RecordFault::Json(e.to_string()))?;
    M::check(config, &r)?;
    Ok(r)
}

/// Every turn carries the policy version its agent's step expects (`versions[agent]`).
pub fn check_turn_versions(
    turns: &[PolicyTurn],
    episode: &str,
    versions: &[u64],
) -> Result<(), String> {
    for turn in turns {
        let want = versions.get(turn.agent as usize).copied();
        if want != Some(turn.policy_version) {
            return Err(format!(
                "episode {episode}: turn {} ({} of agent {}) was sampled with policy version {}, but this step uses version {}",
                turn.turn_index,
                turn.role,
                turn.agent,
                turn.policy_version,
                want.map_or("none".to_string(), |v| v.to_string())
            ));
        }
    }
    Ok(())
}

/// A step's experiences and figures. With `versions`, a turn sampled with any other version
/// than its agent's is refused.
pub(crate) fn experience_of<M: Method>(
    config: &M::Config,
    records: Vec<(String, M::Record)>,
    step: &StepContext<'_>,
    versions: Option<&[u64]>,
) -> Result<StepOutput, WorkflowError> {
    if let Some(v) = versions {
        for (episode, r) in &records {
            check_turn_versions(&r.policy_turns(), episode, v)
                .map_err(WorkflowError::MalformedTrajectory)?;
        }
    }
    let Made { per_agent, metrics, pooled_whitening } = M::experience(config, records, step)?;
    if per_agent.len() != step.agents as usize && M::TRAINS {
        return Err(WorkflowError::MalformedTrajectory(format!(
            "experiences for {} agents, the job has {}",
            per_agent.len(),
            step.agents
        )));
    }
    Ok(StepOutput { per_agent, metrics: with_method(M::NAME, &metrics)?, pooled_whitening })
}

/// A method's figures as a metrics record carries them: its name under `method`, first.
pub(crate) fn with_method(
    name: &str,
    metrics: &impl serde::Serialize,
) -> Result<serde_json::Value, WorkflowError> {
    let value = serde_json::to_value(metrics)
        .map_err(|e| WorkflowError::MalformedTrajectory(format!("the step's figures: {e}")))?;
    let serde_json::Value::Object(fields) = value else {
        return Err(WorkflowError::MalformedTrajectory(
            "a method's figures must be a JSON object".into(),
        ));
    };
    let mut out = serde_json::Map::with_capacity(fields.len() + 1);
    out.insert("method".into(), serde_json::Value::String(name.to_string()));
    out.extend(fields.into_iter().filter(|(k, _)| k != "method"));
    Ok(serde_json::Value::Object(out))
}

/// Reads a method's figures back from a metrics record. A record whose per-agent figures are
/// damaged (a hand-edited log) still gives the team's.
pub(crate) fn read_metrics<M: Method>(record: &serde_json::Value) -> Option<M::Metrics> {
    serde_json::from_value(record.clone()).ok().or_else(|| {
        let mut team = record.clone();
        team.as_object_mut()?.remove("agents")?;
        serde_json::from_value(team).ok()
    })
}

/// Drives an episode to its end with `reply` answering every request: for tests of a method's
/// protocol without a worker.
pub fn play<E: Episode>(
    mut episode: E,
    meter: &dyn PromptMeter,
    mut reply: impl FnMut(&crate::program::Request) -> crate::program::Reply,
) -> Result<E::Record, WorkflowError> {
    while !episode.is_done() {
        let replies = episode.pending().iter().map(&mut reply).collect();
        episode.submit(replies, meter)?;
    }
    episode.finish()
}
