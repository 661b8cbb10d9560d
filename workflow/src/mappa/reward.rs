//! Coach verdicts → per-action rewards (spec 5), and the step's metrics as a typed record.
//! R = process_weight · reward_scale · score + outcome_weight · outcome; an action whose coach
//! gave no score has no reward and is left out of training. The learner does the rest of
//! spec 5 (KL in the reward, reward-to-go within the action, whitening, the clipped loss).
use super::config::MappaConfig;
use super::trajectory::MappaTrajectory;
pub use crate::mean::Mean;
use crate::mean::Sum;
use crate::turn::Role;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub struct ActionReward {
    pub turn_index: u32,
    pub agent: u32,
    pub role: Role,
    pub reward: Option<f64>,
}

pub fn action_rewards(config: &MappaConfig, t: &MappaTrajectory) -> Vec<ActionReward> {
    t.actions
        .iter()
        .map(|a| ActionReward {
            turn_index: a.turn_index,
            agent: a.agent,
            role: a.role,
            reward: a.coach.process_score.map(|s| config.process_weight * config.reward_scale * s + config.outcome_weight * a.coach.outcome.unwrap_or(0.0)),
        })
        .collect()
}

/// What one step of MAPPA episodes did (spec: coach score by role, outcome for logging only,
/// tool-call success, sandbox failures by reason). Read back leniently: a field a record lacks
/// takes its default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MappaMetrics {
    pub episodes: u64,
    /// Actions with a reward, sent to the learners.
    pub samples: u64,
    /// Actions left out because the coach gave no score.
    pub samples_dropped: u64,
    /// Mean reward of the scored actions, overall and by role.
    pub reward_mean: Option<f64>,
    pub reward: BTreeMap<String, Mean>,
    /// The coach's 0–10 process score by role.
    pub coach_score: BTreeMap<String, Mean>,
    /// Actions per episode by role.
    pub actions: BTreeMap<String, Mean>,
    /// The last agent's boxed answer against the reference (logging only, never a reward).
    pub outcome_accuracy: Mean,
    /// The coach's own correctness flag for the last agent, and how often it agrees with the grader.
    pub coach_outcome: Mean,
    pub coach_agreement: Mean,
    pub coach_retries: u64,
    pub coach_fallbacks: u64,
    pub tool_calls: u64,
    /// Share of program runs that exited cleanly.
    pub tool_success_rate: Mean,
    /// Failed runs by failure key (`timeout`, `exit_code`, ...).
    pub sandbox_failures: BTreeMap<String, u64>,
    /// Actions whose tool call could not be read.
    pub malformed_calls: u64,
    pub generated_tokens: u64,
    /// DSBench: share of episodes whose submission was evaluated (spec 7's success), the coach's
    /// score by task type and role (`classification/analyst`: spec 9 warns of a coach biased by
    /// task type), and the mean of each computed metric.
    pub ds_success_rate: Mean,
    pub coach_score_by_task_type: BTreeMap<String, Mean>,
    pub ds_metrics: BTreeMap<String, Mean>,
}

impl MappaMetrics {
    pub fn of(config: &MappaConfig, trajectories: &[&MappaTrajectory]) -> Self {
        let mut m = MappaMetrics { episodes: trajectories.len() as u64, ..Default::default() };
        let (mut reward, mut tools, mut outcome, mut coach_outcome, mut agree) =
            (Sum::default(), Sum::default(), Sum::default(), Sum::default(), Sum::default());
        let mut score: BTreeMap<String, Sum> = BTreeMap::new();
        let mut by_role: BTreeMap<String, Sum> = BTreeMap::new();
        let mut per_episode: BTreeMap<String, Sum> = BTreeMap::new();
        let (mut ds_success, mut by_type, mut ds_metrics) = (Sum::default(), BTreeMap::<String, Sum>::new(), BTreeMap::<String, Sum>::new());
        for t in trajectories {
            if let Some(o) = &t.ds_outcome {
                ds_success.push(f64::from(u8::from(o.success)));
                for (k, v) in &o.metrics {
                    ds_metrics.entry(k.clone()).or_default().push(*v);
                }
                let kind = match o.kind {
                    Some(crate::mappa::DataKind::Classification) => "classification",
                    Some(crate::mappa::DataKind::Regression) => "regression",
                    None => "unknown",
                };
                for a in &t.actions {
                    if let Some(s) = a.coach.process_score {
                        by_type.entry(format!("{kind}/{}", a.role.as_str())).or_default().push(s);
                    }
                }
            }
            for r in action_rewards(config, t) {
                match r.reward {
                    Some(v) => {
                        m.samples += 1;
                        reward.push(v);
                        by_role.entry(r.role.as_str().into()).or_default().push(v);
                    }
                    None => m.samples_dropped += 1,
                }
            }
            for &role in config.pipeline.roles() {
                per_episode.entry(role.as_str().into()).or_default().push(t.actions.iter().filter(|a| a.role == role).count() as f64);
            }
            for a in &t.actions {
                if let Some(s) = a.coach.process_score {
                    score.entry(a.role.as_str().into()).or_default().push(s);
                }
                m.coach_retries += u64::from(a.coach.retry_attempted);
                m.coach_fallbacks += u64::from(a.coach.fallback_used);
                m.malformed_calls += u64::from(a.malformed_call);
                m.generated_tokens += a.sampled.completion_ids.len() as u64;
                for run in &a.tool_runs {
                    m.tool_calls += 1;
                    tools.push(f64::from(u8::from(run.is_none())));
                    if let Some(f) = run {
                        *m.sandbox_failures.entry(f.clone()).or_default() += 1;
                    }
                }
            }
            if let Some(ok) = t.outcome_correct {
                outcome.push(f64::from(u8::from(ok)));
            }
            if let Some(c) = t.actions.last().and_then(|a| a.coach.outcome) {
                coach_outcome.push(c);
                if let Some(ok) = t.outcome_correct {
                    agree.push(f64::from(u8::from((c >= 0.5) == ok)));
                }
            }
        }
        m.reward_mean = reward.mean().mean;
        m.reward = by_role.into_iter().map(|(k, s)| (k, s.mean())).collect();
        m.tool_success_rate = tools.mean();
        m.outcome_accuracy = outcome.mean();
        m.coach_outcome = coach_outcome.mean();
        m.coach_agreement = agree.mean();
        m.coach_score = score.into_iter().map(|(k, s)| (k, s.mean())).collect();
        m.actions = per_episode.into_iter().map(|(k, s)| (k, s.mean())).collect();
        m.ds_success_rate = ds_success.mean();
        m.coach_score_by_task_type = by_type.into_iter().map(|(k, s)| (k, s.mean())).collect();
        m.ds_metrics = ds_metrics.into_iter().map(|(k, s)| (k, s.mean())).collect();
        m
    }
}
