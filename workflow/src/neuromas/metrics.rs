//! What a step (or an evaluation) of NeuroMAS rollouts did (spec neuromas.md §5, §7): accuracy
//! of the readouts, the format penalty's share, groups whose rollouts all scored alike (their
//! advantage is 0), and per layer the message truncation rate and completion length. A typed
//! record shared by the coordinator, `comas watch` and the tests.
use super::config::{NeuromasConfig, NO_BOX_REWARD};
use super::episode::NeuromasTrajectory;
use super::reward::reward;
use crate::mean::{Mean, Sum};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Read back leniently: a field a record lacks takes its default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NeuromasMetrics {
    /// Rollouts (episodes).
    pub episodes: u64,
    /// Share of rollouts whose readout answer is right.
    pub graph_accuracy: Mean,
    /// Share of readouts without a `\boxed{}` answer.
    pub no_box_rate: Mean,
    pub reward: Mean,
    /// Tasks whose G rollouts all got the same reward, of all tasks.
    pub equal_groups: u64,
    pub groups: u64,
    /// By layer (1-based, as a string key): messages cut to `max_msg_tokens`, and completion
    /// tokens per node.
    pub truncation_rate: BTreeMap<String, Mean>,
    pub completion_tokens: BTreeMap<String, Mean>,
    pub generated_tokens: u64,
}

impl NeuromasMetrics {
    pub fn of(cfg: &NeuromasConfig, rollouts: &[&NeuromasTrajectory]) -> Self {
        let mut m = NeuromasMetrics { episodes: rollouts.len() as u64, ..Default::default() };
        let (mut right, mut no_box, mut rewards) = (Sum::default(), Sum::default(), Sum::default());
        let mut by_task: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut cut: BTreeMap<String, Sum> = BTreeMap::new();
        let mut tokens: BTreeMap<String, Sum> = BTreeMap::new();
        for t in rollouts {
            let r = reward(cfg, t);
            rewards.push(r);
            right.push(f64::from(u8::from(r == 1.0)));
            no_box.push(f64::from(u8::from(cfg.format_penalty && r == NO_BOX_REWARD)));
            by_task.entry(t.task.id.as_str()).or_default().push(r);
            for turn in &t.turns {
                let layer = turn.node.layer.to_string();
                cut.entry(layer.clone()).or_default().push(f64::from(u8::from(turn.message.truncated)));
                tokens.entry(layer).or_default().push(turn.sampled.completion_ids.len() as f64);
            }
            m.generated_tokens += t.completion_tokens();
        }
        m.graph_accuracy = right.mean();
        m.no_box_rate = no_box.mean();
        m.reward = rewards.mean();
        m.groups = by_task.len() as u64;
        m.equal_groups = by_task.values().filter(|rs| rs.windows(2).all(|w| w[0] == w[1])).count() as u64;
        m.truncation_rate = cut.into_iter().map(|(k, s)| (k, s.mean())).collect();
        m.completion_tokens = tokens.into_iter().map(|(k, s)| (k, s.mean())).collect();
        m
    }
}
