//! Starting all episodes of one rollout shard for one step: each question becomes
//! `instances_per_question` independent instances, planned together (spec 3.1, 3.3).
use super::assignment::{plan_batch, PlanSeed};
use super::config::CoMasConfig;
use super::episode::Episode;
use crate::error::WorkflowError;
pub use crate::seed::episode_seed;
use crate::task::TaskRecord;

/// One episode per instance, in instance order: the copies of question q are instances
/// `q * instances_per_question ..` `(q + 1) * instances_per_question`.
pub fn start_batch(config: &CoMasConfig, questions: &[TaskRecord], seed: PlanSeed) -> Result<Vec<Episode>, WorkflowError> {
    config.validate()?;
    let copies = config.instances_per_question as usize;
    let count =
        questions.len().checked_mul(copies).ok_or_else(|| WorkflowError::BatchTooLarge(format!("{} questions x {copies} instances", questions.len())))?;
    // plan_batch bounds the instance count far below u32::MAX.
    let plan = plan_batch(config, count, seed)?;
    plan.instances
        .into_iter()
        .enumerate()
        .map(|(i, instance_plan)| {
            let instance = i as u32;
            Episode::new(config, &questions[i / copies], instance, instance_plan, episode_seed(seed, instance))
        })
        .collect()
}
