//! A scripted stand-in for a rollout worker: answers every request with text chosen by the test.
#![allow(dead_code)]
use comas_workflow::comas::{CoMasConfig, Episode, InstancePlan, PlanSeed};
use comas_workflow::{FinishReason, Role, TaskKind, TaskRecord, TurnOutput, TurnRequest};

pub fn question(id: &str, task: TaskKind) -> TaskRecord {
    TaskRecord {
        prompt: format!("  Question {id}?  "),
        answer: "42".into(),
        task,
        id: id.into(),
        source: None,
        files: Default::default(),
    }
}

pub fn output(req: &TurnRequest, text: &str) -> TurnOutput {
    TurnOutput {
        turn_index: req.turn_index,
        text: text.to_string(),
        raw_text: format!("{text}<|im_end|>"),
        prompt_ids: vec![1, 2, req.turn_index],
        completion_ids: vec![7, 8, 9],
        logprobs: vec![-0.5, -0.25, -1.0],
        finish_reason: FinishReason::Stop,
        policy_version: 3,
        constrained: Vec::new(),
    }
}

/// A text that names its turn: `S r0 d1`, `E r0 d1 k0`, `C r0 d1 k0`.
pub fn tag(req: &TurnRequest) -> String {
    match req.role {
        Role::Solver => format!("S r{} d{}", req.round, req.slot),
        Role::Evaluator => format!("E r{} d{} k{}", req.round, req.slot, req.judge_index),
        Role::Scorer => format!("C r{} d{} k{}", req.round, req.slot, req.judge_index),
        other => panic!("a CoMAS game asked for a {other} turn"),
    }
}

/// Drives the episode to the end; returns every group it handed out.
pub fn run(
    episode: &mut Episode,
    mut text: impl FnMut(&TurnRequest) -> String,
) -> Vec<Vec<TurnRequest>> {
    let mut groups = Vec::new();
    while !episode.is_done() {
        let group = episode.next_turns();
        let outputs = group.iter().map(|r| output(r, &text(r))).collect();
        episode.submit(outputs).expect("scripted outputs are accepted");
        groups.push(group);
    }
    groups
}

/// One episode outside any batch, with the plan taken from a one-instance batch.
pub fn single(config: &CoMasConfig, task: TaskKind, seed: u64) -> Episode {
    let plan: InstancePlan =
        comas_workflow::comas::plan_batch(config, 1, PlanSeed { global: seed, step: 0, shard: 0 })
            .unwrap()
            .instances
            .remove(0);
    Episode::new(config, &question("q", task), 0, plan, seed).unwrap()
}
