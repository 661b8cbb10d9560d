//! The job file (TOML): agents, method, data, schedule, output. Parsing and every check that
//! needs no file system live here, so the coordinator (at submit time) and each learner (at
//! start) resolve an agent's training settings with the same code and get the same numbers.
//!
//! - `spec`: the file's parts, as written;
//! - `check`: a spec checked into a [`Job`], the method's settings read by the method;
//! - `train`: each agent's training settings, the method's defaults under the agent's own;
//! - `order`: which questions each step plays.
mod check;
mod order;
pub mod overrides;
pub mod reference;
mod spec;
mod train;

#[cfg(test)]
mod tests;

pub use order::step_questions;
pub use spec::{
    AgentSpec, DataSpec, EvalSpec, FrozenSpec, JobSpec, OutputSpec, RolloutEngine, RolloutSpec,
    ScheduleSpec, SyncMode, TrackingSpec, DEFAULT_MAX_POLICY_LAG, DEFAULT_METHOD,
};

pub use crate::error::{invalid, JobError};
use crate::method::{Samples, TaskSource};
use crate::registry::MethodConfig;
use crate::train_config::TrainConfig;

/// A checked job: the spec with its method's settings and every agent's training settings
/// resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub spec: JobSpec,
    /// The method with its settings.
    pub method: MethodConfig,
    pub train: Vec<TrainConfig>,
    pub total_steps: u64,
    pub steps_per_epoch: u64,
    /// Tasks the steps draw from: the data set's questions, the generated tasks of all steps,
    /// or the listed ones.
    pub dataset_len: usize,
}

impl Job {
    /// Episodes per step.
    pub fn episodes_per_step(&self) -> u64 {
        match self.method.task_source() {
            TaskSource::Listed(n) => n as u64,
            TaskSource::Dataset | TaskSource::Generated => {
                u64::from(self.spec.schedule.questions_per_step) * u64::from(self.method.copies())
            }
        }
    }

    /// Turns agent `k` speaks per step.
    pub fn samples(&self, k: usize) -> Samples {
        self.method.samples(k as u32, self.episodes_per_step())
    }

    /// Agent ids of the frozen models, after the trained agents'.
    pub fn frozen_agent(&self, index: usize) -> u32 {
        (self.spec.agents.len() + index) as u32
    }

    /// The job's method as evaluation runs it: every policy sampled at `temperature`, the eval
    /// instance count.
    pub fn eval_method_at(&self, temperature: f64) -> MethodConfig {
        let instances = self.spec.eval.as_ref().map_or(1, |e| e.instances_per_question);
        self.method.for_evaluation(instances, temperature)
    }

    /// Held-out tasks of an evaluation: the first `eval.max_questions` generated ones, or the
    /// `available` questions of the held-out data set.
    pub fn eval_tasks(&self, available: usize) -> usize {
        match (self.method.task_source(), &self.spec.eval) {
            (TaskSource::Generated, Some(e)) => e.max_questions,
            _ => available,
        }
    }

    /// Whether an evaluation is due once `completed` steps are done.
    pub fn eval_due(&self, completed: u64) -> bool {
        self.spec.eval.as_ref().is_some_and(|e| {
            if completed == 0 {
                e.at_start
            } else {
                completed % e.every_steps == 0 || completed == self.total_steps
            }
        })
    }

    /// Task indices of step `step`: of the data set (epoch e = step / steps_per_epoch uses its
    /// own permutation when shuffling, and the last partial batch of an epoch is dropped), of
    /// the generated stream (fresh every step), or every listed task.
    pub fn step_questions(&self, step: u64) -> Vec<usize> {
        let q = self.spec.schedule.questions_per_step as usize;
        match self.method.task_source() {
            TaskSource::Listed(n) => (0..n).collect(),
            TaskSource::Generated => (step as usize * q..(step as usize + 1) * q).collect(),
            TaskSource::Dataset => {
                step_questions(self.dataset_len, q, self.spec.seed, self.spec.data.shuffle, step)
            }
        }
    }
}
