//! What a step (or an evaluation) of GRPO episodes did: accuracy, readable answers, rewards,
//! lengths, and the groups whose answers all earned the same reward (under `group_norm` their
//! advantage is 0: they teach nothing).
use super::config::GrpoConfig;
use super::episode::GrpoRecord;
use super::reward::{grade, Graded};
use crate::mean::{Mean, Sum};
use crate::turn::FinishReason;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Read back leniently: a field a record lacks takes its default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrpoMetrics {
    pub episodes: u64,
    pub answers: u64,
    /// Share of answers the grader passes.
    pub accuracy: Mean,
    /// Share of answers the grader can read (a box, a letter, a code block).
    pub readable_rate: Mean,
    pub reward: Mean,
    /// Share of answers cut at `max_new_tokens`.
    pub truncation_rate: Mean,
    /// Tokens per answer.
    pub completion_tokens: Mean,
    /// The overlong penalty taken off, per answer.
    pub overlong_penalty: Mean,
    /// (question, agent) groups whose answers all earned the same reward, of all groups.
    pub equal_groups: u64,
    pub groups: u64,
    /// Share of groups with at least one right answer (pass@G).
    pub pass_at_group: Mean,
    /// Share of right answers by agent.
    pub accuracy_by_agent: BTreeMap<String, Mean>,
    /// Code answers' failed test runs by failure key (`timeout`, `exit_code`, ...).
    pub test_failures: BTreeMap<String, u64>,
    pub generated_tokens: u64,
}

impl GrpoMetrics {
    /// The figures of `records`, each answer graded as `grade` does.
    pub fn of(cfg: &GrpoConfig, records: &[&GrpoRecord]) -> GrpoMetrics {
        let mut m = GrpoMetrics { episodes: records.len() as u64, ..Default::default() };
        let (mut right, mut readable, mut reward) = (Sum::default(), Sum::default(), Sum::default());
        let (mut cut, mut tokens, mut over) = (Sum::default(), Sum::default(), Sum::default());
        let mut by_agent: BTreeMap<String, Sum> = BTreeMap::new();
        let mut groups: BTreeMap<(&str, u32), Vec<Graded>> = BTreeMap::new();
        for r in records {
            for a in &r.answers {
                let g = grade(r.grader, &cfg.reward, cfg.sampling.max_new_tokens, a, &r.task.answer);
                m.answers += 1;
                right.push(f64::from(u8::from(g.correct)));
                readable.push(f64::from(u8::from(g.readable)));
                reward.push(g.reward);
                cut.push(f64::from(u8::from(a.sampled.finish_reason == FinishReason::Length)));
                tokens.push(a.sampled.completion_ids.len() as f64);
                over.push(g.overlong);
                by_agent.entry(a.agent.to_string()).or_default().push(f64::from(u8::from(g.correct)));
                groups.entry((r.task.id.as_str(), a.agent)).or_default().push(g);
                if let Some(f) = &a.test_failure {
                    *m.test_failures.entry(f.clone()).or_default() += 1;
                }
            }
            m.generated_tokens += r.completion_tokens();
        }
        let mut pass = Sum::default();
        for g in groups.values() {
            pass.push(f64::from(u8::from(g.iter().any(|x| x.correct))));
        }
        m.groups = groups.len() as u64;
        m.equal_groups = groups.values().filter(|g| g.windows(2).all(|w| w[0].reward == w[1].reward)).count() as u64;
        m.pass_at_group = pass.mean();
        (m.accuracy, m.readable_rate, m.reward) = (right.mean(), readable.mean(), reward.mean());
        (m.truncation_rate, m.completion_tokens, m.overlong_penalty) = (cut.mean(), tokens.mean(), over.mean());
        m.accuracy_by_agent = by_agent.into_iter().map(|(k, s)| (k, s.mean())).collect();
        m
    }
}
