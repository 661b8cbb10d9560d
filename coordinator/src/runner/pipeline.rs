//! Async mode (`sync = "async"`): the rollouts of the next steps run on the workers while the
//! learners train the current one, as deep as the job's `max_policy_lag` allows.
use super::{finish_rollout, plan_rollout, JobRun, RolloutSide, StepTimes};
use crate::error::{CoordinatorError, Result};
use crate::experience::StepBatch;
use comas_workflow::program::Record;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch;

/// One agent's turns of a step in async mode, as the metrics log gives them.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct AgentLag {
    /// Turns the step's episodes produced.
    pub produced: u64,
    /// Of those, the turns trained on.
    pub trained: u64,
    /// Turns further behind than the bound, never trained on.
    pub dropped: u64,
    /// Trained turns by how many versions their policy was behind the learner's.
    pub lag: BTreeMap<u64, u64>,
}

/// The `policy_lag` record of an async step.
#[derive(Debug, Serialize)]
struct PolicyLag {
    bound: u64,
    agents: Vec<AgentLag>,
}

/// Drops every experience whose policy is more than `bound` versions behind the learner that
/// trains `step` (which holds version `step`), and records in the step's metrics each agent's
/// trained turns by lag and its dropped turns.
pub(super) fn bound_lag(batch: &mut StepBatch, step: u64, bound: u64) -> Vec<AgentLag> {
    let mut agents = Vec::with_capacity(batch.per_agent.len());
    for exps in &mut batch.per_agent {
        let mut lag: BTreeMap<u64, u64> = BTreeMap::new();
        let produced = exps.len() as u64;
        exps.retain(|e| {
            let behind = step.saturating_sub(e.policy_version);
            let keep = behind <= bound && e.policy_version <= step;
            if keep {
                *lag.entry(behind).or_default() += 1;
            }
            keep
        });
        let trained = exps.len() as u64;
        agents.push(AgentLag { produced, trained, dropped: produced - trained, lag });
    }
    let record = PolicyLag { bound, agents };
    if let (Some(m), Ok(v)) = (batch.metrics.as_object_mut(), serde_json::to_value(&record)) {
        m.insert("policy_lag".into(), v);
    }
    record.agents
}

/// The steps whose rollouts may start once the learners hold version `step` (the rollouts up
/// to `queued` are running already): every later step t with t − `step` ≤ `bound`, below
/// `total`. This is the admission rule: a turn of step t is sampled by version `step` or a
/// newer one, and trained when its learner holds version t, so it is at most t − `step`
/// versions behind. Every agent trains every step, so all agents hold the same version here
/// and the rule holds for each of them.
pub(super) fn admitted(
    step: u64,
    queued: Option<u64>,
    bound: u64,
    total: u64,
) -> std::ops::Range<u64> {
    let from = queued.map_or(step + 1, |q| q + 1).max(step + 1);
    let to = (step + bound + 1).min(total);
    from..to.max(from)
}

/// The workers' busy time: seconds during which at least one of the job's rollouts (or
/// evaluations) ran.
#[derive(Clone, Default)]
pub(super) struct RolloutClock(Arc<Mutex<ClockState>>);

#[derive(Default)]
struct ClockState {
    running: usize,
    since: Option<Instant>,
    busy: f64,
}

/// Counts a rollout as running until dropped (also when its task is aborted).
pub(super) struct Running(RolloutClock);

impl RolloutClock {
    fn state(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn start(&self) -> Running {
        let mut s = self.state();
        if s.running == 0 {
            s.since = Some(Instant::now());
        }
        s.running += 1;
        Running(self.clone())
    }

    /// Busy seconds so far, the running stretch included.
    pub(super) fn busy(&self) -> f64 {
        let s = self.state();
        s.busy + s.since.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.running -= 1;
        if s.running == 0 {
            if let Some(t) = s.since.take() {
                s.busy += t.elapsed().as_secs_f64();
            }
        }
    }
}

/// The rollout of a later step, running beside training; aborted if dropped (the step failed
/// or the job was cancelled).
struct Ahead {
    step: u64,
    task: tokio::task::JoinHandle<(Result<Vec<(String, Record)>>, StepTimes)>,
}

impl Ahead {
    /// Starts `step`'s rollout on whatever versions the workers hold.
    fn spawn(side: RolloutSide, step: u64, mut cancel: watch::Receiver<bool>) -> Self {
        let task = tokio::spawn(async move {
            let mut times = StepTimes::default();
            let r = match plan_rollout(&side, step, &mut times) {
                Ok(planned) => {
                    finish_rollout(&side, step, planned, None, true, &mut cancel, &mut times).await
                }
                Err(e) => Err(e),
            };
            (r, times)
        });
        Self { step, task }
    }

    async fn join(mut self) -> Result<(Vec<(String, Record)>, StepTimes)> {
        let (r, times) = (&mut self.task)
            .await
            .map_err(|e| CoordinatorError::Other(format!("rollout task: {e}")))?;
        Ok((r?, times))
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl JobRun {
    /// Async mode: while the learners train step s, the rollouts of steps s + 1 … s + N (N =
    /// `max_policy_lag`) run on the workers with the weights they hold, oldest step first; a
    /// new version swaps in between turns when its broadcast brings it. A trained turn is thus
    /// at most N versions behind its learner, and the experience stage drops (and counts) any
    /// turn past the bound all the same. An evaluation runs beside the rollouts ahead, queued
    /// before them; a step resumed after a restart runs its rollout first, alone.
    pub(super) async fn run_async(mut self, mut step: u64) -> Result<()> {
        let total = self.job.total_steps;
        let bound = self.job.spec.schedule.policy_lag();
        let mut ahead: VecDeque<Ahead> = VecDeque::new();
        loop {
            let start = self.step_start();
            // Rollouts ahead were sampled with weights a rollback would discard: only a job
            // with none under way goes back to an older step.
            let at = self.learners(&mut step, ahead.is_empty()).await?;
            if step >= total {
                self.evaluate_if_due(step, &at).await?;
                break;
            }
            let mut times = StepTimes::default();
            let records = match ahead.pop_front() {
                Some(a) if a.step == step => {
                    let (records, t) = a.join().await?;
                    times.rollout = t.rollout;
                    times.store += t.store;
                    records
                }
                Some(a) => {
                    return Err(CoordinatorError::Other(format!(
                        "the rollout ahead is of step {}, not of step {step}",
                        a.step
                    )))
                }
                None => self.rollout(step, &at, &mut times).await?,
            };
            self.evaluate_if_due(step, &at).await?;
            let batch = self.experience(step, records, &mut times)?;
            for next in admitted(step, ahead.back().map(|a| a.step), bound, total) {
                ahead.push_back(Ahead::spawn(self.rollout_side(), next, self.cancel.clone()));
            }
            let trained = self.train(step, &batch, &at, &mut times).await?;
            let sync = self.broadcast(step, &trained, &mut times).await?;
            self.commit(step, batch.metrics, &start, &trained, &sync, &times)?;
            step += 1;
        }
        self.export().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experience::StepBatch;
    use comas_proto::v1 as pb;

    #[test]
    fn rollouts_are_admitted_up_to_the_lag_bound_and_the_last_step() {
        // Bound 1: one step ahead, none after the last.
        assert_eq!(admitted(0, None, 1, 4), 1..2);
        assert_eq!(admitted(3, None, 1, 4), 4..4);
        // Bound 3 from step 0: steps 1, 2 and 3; one step later only step 4 is new.
        assert_eq!(admitted(0, None, 3, 10), 1..4);
        assert_eq!(admitted(1, Some(3), 3, 10), 4..5);
        // Near the end, nothing past the last step.
        assert_eq!(admitted(7, Some(9), 3, 10), 10..10);
        assert_eq!(admitted(8, Some(9), 3, 10).count(), 0);
    }

    #[test]
    fn turns_past_the_bound_are_dropped_and_counted_per_agent() {
        let exp = |v: u64| pb::Experience { policy_version: v, ..Default::default() };
        let mut batch = StepBatch {
            per_agent: vec![vec![exp(5), exp(4), exp(3), exp(2), exp(6)], vec![exp(5), exp(5)]],
            metrics: serde_json::json!({}),
            pooled_whitening: false,
        };
        let agents = bound_lag(&mut batch, 5, 2);
        assert_eq!(
            agents[0],
            AgentLag {
                produced: 5,
                trained: 3,
                dropped: 2,
                lag: BTreeMap::from([(0, 1), (1, 1), (2, 1)])
            }
        );
        assert_eq!(
            agents[1],
            AgentLag { produced: 2, trained: 2, dropped: 0, lag: BTreeMap::from([(0, 2)]) }
        );
        let kept: Vec<u64> = batch.per_agent[0].iter().map(|e| e.policy_version).collect();
        assert_eq!(kept, [5, 4, 3]);
        assert_eq!(batch.metrics["policy_lag"]["bound"], 2);
        assert_eq!(batch.metrics["policy_lag"]["agents"][0]["dropped"], 2);
        assert_eq!(batch.metrics["policy_lag"]["agents"][0]["lag"]["2"], 1);
    }

    #[test]
    fn the_clock_counts_overlapping_rollouts_once() {
        let clock = RolloutClock::default();
        let t0 = Instant::now();
        let a = clock.start();
        std::thread::sleep(std::time::Duration::from_millis(40));
        let b = clock.start();
        std::thread::sleep(std::time::Duration::from_millis(40));
        drop(a);
        drop(b);
        let wall = t0.elapsed().as_secs_f64();
        let busy = clock.busy();
        // Two overlapping rollouts count their union once: at least the 80 ms slept, at most
        // the wall time around them (their sum would exceed it).
        assert!(busy >= 0.08 && busy <= wall, "busy {busy} s in {wall} s");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(clock.busy(), busy, "no rollout runs: the clock stands still");
    }
}
