//! The rollout's reward (spec neuromas.md §5): the benchmark's grade of the readout's last
//! `\boxed{}` answer, 1 or 0, or `NO_BOX_REWARD` for a readout without one when
//! `format_penalty` is on. Every node's sample of the rollout gets this same reward.
use super::config::{NeuromasConfig, NO_BOX_REWARD};
use super::episode::NeuromasTrajectory;
use crate::grade::{is_correct, last_boxed};

pub fn reward(cfg: &NeuromasConfig, t: &NeuromasTrajectory) -> f64 {
    let Some(readout) = t.readout() else { return 0.0 };
    let answer = crate::turn::without_thinking(&readout.text);
    if last_boxed(&answer).is_none() {
        return if cfg.format_penalty { NO_BOX_REWARD } else { 0.0 };
    }
    match is_correct(t.task.task, &answer, &t.task.answer) {
        Some(true) => 1.0,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neuromas::episode::NodeTurn;
    use crate::neuromas::prompts::Message;
    use crate::neuromas::topology::{Graph, TopologySpec};
    use crate::task::{TaskKind, TaskRecord};
    use crate::turn::{FinishReason, Sampled};

    fn rollout(readout: &str) -> NeuromasTrajectory {
        let graph = Graph::new(TopologySpec { layers: vec![1, 1], ..TopologySpec::default() }).unwrap();
        let turn = |i: u32, text: &str| NodeTurn {
            turn_index: i,
            node: graph.nodes()[i as usize],
            agent: i,
            sampled: Sampled {
                prompt_ids: vec![1],
                completion_ids: vec![2],
                logprobs: vec![-1.0],
                constrained: Vec::new(),
                finish_reason: FinishReason::Stop,
                policy_version: 0,
            },
            text: text.into(),
            message: Message { text: text.into(), truncated: false },
        };
        let task = TaskRecord { prompt: "3 + 4?".into(), answer: "7".into(), task: TaskKind::Math, id: "q".into(), source: None, files: Default::default() };
        NeuromasTrajectory { task, instance: 0, turns: vec![turn(0, "think 7"), turn(1, readout)], graph }
    }

    #[test]
    fn the_readout_is_graded_and_an_unboxed_one_is_penalised() {
        let cfg = NeuromasConfig::default();
        assert_eq!(reward(&cfg, &rollout("so \\boxed{7}")), 1.0);
        assert_eq!(reward(&cfg, &rollout("\\boxed{8}")), 0.0);
        // The box inside thinking does not count: the answer is what the readout says.
        assert_eq!(reward(&cfg, &rollout("<think>\\boxed{7}</think>seven")), NO_BOX_REWARD);
        let lenient = NeuromasConfig { format_penalty: false, ..NeuromasConfig::default() };
        assert_eq!(reward(&lenient, &rollout("seven")), 0.0);
    }
}
