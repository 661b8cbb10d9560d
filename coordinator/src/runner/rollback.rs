//! The `learners` stage, and rolling a job back to a step every learner can return to.
//!
//! A learner that restarts from a checkpoint older than the job's last step (step g of the
//! job's S, when `checkpoint_every` > 1 or its newest checkpoint was lost) would otherwise end
//! the job. Instead the job goes back to g: the other learners load their own checkpoints of
//! step g, the store forgets the steps from g on, the metrics log is written again from the
//! store, and steps g to S - 1 run again. A step's questions are a pure function of (seed,
//! step), and a checkpoint holds the optimizer's state, so the steps run again as they ran the
//! first time (an end-to-end test compares the final weights with an undisturbed run's).
use super::JobRun;
use crate::error::{CoordinatorError, Result};
use crate::learner_steps::check_learner;
use crate::metrics_log::MetricsLog;
use crate::progress::Update;

impl JobRun {
    /// Stage `learners`: every learner is at `step`, or at `step + 1` if it trained the step
    /// before a coordinator restart; returns where each one is. With `may_rewind`, learners
    /// behind `step` first take the job back to the oldest step among them, and `step` becomes
    /// that step.
    pub(super) async fn learners(&mut self, step: &mut u64, may_rewind: bool) -> Result<Vec<u64>> {
        self.ctx.report.live(Update::Enter("learners"));
        let mut at = Vec::with_capacity(self.links.len());
        let mut behind: Vec<(u32, u64)> = Vec::new();
        for link in self.links.iter_mut() {
            match check_learner(link, &self.job, *step).await {
                Err(CoordinatorError::LearnerBehind { agent, at: g, .. }) if may_rewind => {
                    behind.push((agent, g));
                }
                r => at.push(r?),
            }
        }
        let Some(to) = behind.iter().map(|&(_, g)| g).min() else { return Ok(at) };
        self.rewind(*step, to, &behind).await?;
        *step = to;
        let mut at = Vec::with_capacity(self.links.len());
        for link in self.links.iter_mut() {
            at.push(check_learner(link, &self.job, to).await?);
        }
        Ok(at)
    }

    /// Takes the job from `from` completed steps back to `to`, where the `behind` learners
    /// (agent, step) restarted.
    async fn rewind(&mut self, from: u64, to: u64, behind: &[(u32, u64)]) -> Result<()> {
        let who: Vec<String> =
            behind.iter().map(|(a, g)| format!("agent {a}'s at step {g}")).collect();
        let message = format!(
            "learners restarted from older checkpoints ({}): the job goes back from step {from} to step {to} and runs the steps after it again",
            who.join(", ")
        );
        tracing::warn!(job = %self.id, from, to, "{message}");
        for link in self.links.iter_mut() {
            if link.info().await?.global_step == to {
                continue;
            }
            link.load_step(to).await.map_err(|e| {
                CoordinatorError::Other(format!(
                    "the job cannot go back to step {to} ({}): {e}; keep more checkpoints (--keep-checkpoints), or restart every learner from a checkpoint of one and the same step",
                    who.join(", ")
                ))
            })?;
        }
        self.ctx.store.rewind(&self.id, to)?;
        let path = self.job.spec.output.dir.join("metrics.jsonl");
        self.log = MetricsLog::open(&self.ctx.store, &self.id, &path)?;
        self.target_versions = None;
        self.ctx.metrics.rollbacks.inc();
        self.ctx.report.event("warning", String::new(), message);
        Ok(())
    }
}
