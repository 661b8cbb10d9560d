//! Rewards of the full method and both ablations on scripted trajectories, against numbers
//! worked out by hand.
mod common;

use comas_workflow::comas::{
    comas_rewards, CoMasConfig, JudgeReward, Trajectory, TurnReward, Variant,
};
use comas_workflow::{Role, TaskKind, TurnRequest};
use common::{run, single, tag};

fn play(config: &CoMasConfig, text: impl FnMut(&TurnRequest) -> String) -> Trajectory {
    let mut ep = single(config, TaskKind::Math, 11);
    run(&mut ep, text);
    ep.into_trajectory().unwrap()
}

/// Rewards of one role in (round, slot, judge) order.
fn of(rewards: &[TurnReward], t: &Trajectory, role: Role) -> Vec<f32> {
    let mut picked: Vec<(u32, u32, u32, f32)> = t
        .turns
        .iter()
        .zip(rewards)
        .filter(|(turn, _)| turn.role == role)
        .map(|(turn, r)| (turn.round, turn.slot, turn.judge_index, r.reward))
        .collect();
    picked.sort_by_key(|p| (p.0, p.1, p.2));
    picked.into_iter().map(|p| p.3).collect()
}

#[test]
fn full_variant_single_evaluation() {
    // Slot d of round 0 is scored by the scripted text below; slot 3 breaks the format.
    let config = CoMasConfig { num_agents: 4, num_rounds: 1, ..Default::default() };
    let t = play(&config, |r| match (r.role, r.slot) {
        (Role::Scorer, 0) => "sound. <score>3</score>".into(),
        (Role::Scorer, 1) => "<score>2</score>".into(),
        (Role::Scorer, 2) => "<score>1</score>".into(),
        (Role::Scorer, _) => "Score: 3".into(),
        _ => tag(r),
    });
    let rewards = comas_rewards(&t).unwrap();
    assert_eq!(rewards.len(), 12);
    assert_eq!(
        rewards.iter().map(|r| r.turn_index).collect::<Vec<_>>(),
        (0..12).collect::<Vec<_>>()
    );
    assert_eq!(of(&rewards, &t, Role::Solver), vec![1.0, 0.5, 0.0, 0.0]);
    assert_eq!(of(&rewards, &t, Role::Evaluator), vec![0.0, 0.5, 1.0, 0.0]);
    assert_eq!(of(&rewards, &t, Role::Scorer), vec![0.0, 0.0, 0.0, -1.0]);
    // Rewards are attributed to the turn's author.
    for (turn, r) in t.turns.iter().zip(&rewards) {
        assert_eq!((r.agent, r.role), (turn.agent, turn.role));
    }
}

#[test]
fn full_variant_zero_sum_per_slot() {
    let config = CoMasConfig::default();
    let t = play(&config, |r| {
        if r.role == Role::Scorer {
            format!("<score>{}</score>", 1 + (r.turn_index % 3))
        } else {
            tag(r)
        }
    });
    let rewards = comas_rewards(&t).unwrap();
    for s in t.turns_of(Role::Scorer) {
        let sol = rewards[s.about_solution.unwrap() as usize].reward;
        let ev = rewards[s.about_evaluation.unwrap() as usize].reward;
        assert_eq!(sol + ev, 1.0);
        assert_eq!(rewards[s.turn_index as usize].reward, 0.0);
    }
}

#[test]
fn full_variant_averages_valid_scores_when_n_is_two() {
    // Slot 0 gets scores [3, 2]; slot 1 gets [broken, 2]; slot 2 gets [broken, broken].
    let config =
        CoMasConfig { num_agents: 3, num_rounds: 1, evals_per_solution: 2, ..Default::default() };
    let t = play(&config, |r| match (r.role, r.slot, r.judge_index) {
        (Role::Scorer, 0, 0) => "<score>3</score>".into(),
        (Role::Scorer, 0, _) => "<score>2</score>".into(),
        (Role::Scorer, 1, 0) => "<score>4</score>".into(),
        (Role::Scorer, 1, _) => "<score>2</score>".into(),
        (Role::Scorer, _, _) => "no tag".into(),
        _ => tag(r),
    });
    let rewards = comas_rewards(&t).unwrap();
    // The broken score of slot 1 is left out, not replaced: mean of {0.5} = 0.5, not 0.25.
    assert_eq!(of(&rewards, &t, Role::Solver), vec![0.75, 0.5, 0.0]);
    // Each evaluator is paid from its own pair's score.
    assert_eq!(of(&rewards, &t, Role::Evaluator), vec![0.0, 0.5, 0.0, 0.5, 0.0, 0.0]);
    assert_eq!(of(&rewards, &t, Role::Scorer), vec![0.0, 0.0, -1.0, 0.0, -1.0, -1.0]);
}

#[test]
fn no_evaluation_variant_judge_rewards() {
    let script = |r: &TurnRequest| match (r.role, r.slot) {
        (Role::Scorer, 0) => "<score>3</score>".to_string(),
        (Role::Scorer, 1) => "<score>2</score>".to_string(),
        (Role::Scorer, 2) => "<score>1</score>".to_string(),
        (Role::Scorer, _) => "<score></score>".to_string(),
        _ => tag(r),
    };
    let zero_sum = CoMasConfig {
        num_rounds: 1,
        variant: Variant::NoEvaluation { judge_reward: JudgeReward::ZeroSum },
        ..Default::default()
    };
    let t = play(&zero_sum, script);
    let rewards = comas_rewards(&t).unwrap();
    assert_eq!(rewards.len(), 8);
    assert_eq!(of(&rewards, &t, Role::Solver), vec![1.0, 0.5, 0.0, 0.0]);
    assert_eq!(of(&rewards, &t, Role::Scorer), vec![0.0, 0.5, 1.0, -1.0]);

    let neutral = CoMasConfig {
        variant: Variant::NoEvaluation { judge_reward: JudgeReward::Neutral },
        ..zero_sum
    };
    let t = play(&neutral, script);
    let rewards = comas_rewards(&t).unwrap();
    assert_eq!(of(&rewards, &t, Role::Solver), vec![1.0, 0.5, 0.0, 0.0]);
    assert_eq!(of(&rewards, &t, Role::Scorer), vec![0.0, 0.0, 0.0, -1.0]);
}

#[test]
fn no_scoring_variant_agreement_rewards() {
    // Verdicts per slot (judge 0, 1, 2):
    //   slot 0: correct, correct, incorrect → solver 2/3; evaluators 1/2, 1/2, 0
    //   slot 1: correct, broken, incorrect  → solver 1/2; evaluators 0, −1, 0
    //   slot 2: correct, broken, broken     → solver 1;   evaluators 0 (nobody to agree with), −1, −1
    let config = CoMasConfig {
        num_agents: 3,
        num_rounds: 1,
        evals_per_solution: 3,
        variant: Variant::NoScoring,
        ..Default::default()
    };
    let verdicts = [
        ["correct", "correct", "incorrect"],
        ["correct", "maybe", "incorrect"],
        ["Correct", "", ""],
    ];
    let t = play(&config, |r| match r.role {
        Role::Evaluator => {
            let v = verdicts[r.slot as usize][r.judge_index as usize];
            format!("{} <judgment>{v}</judgment>", tag(r))
        }
        _ => tag(r),
    });
    let rewards = comas_rewards(&t).unwrap();
    assert_eq!(of(&rewards, &t, Role::Solver), vec![2.0 / 3.0, 0.5, 1.0]);
    assert_eq!(
        of(&rewards, &t, Role::Evaluator),
        vec![0.5, 0.5, 0.0, 0.0, -1.0, 0.0, 0.0, -1.0, -1.0]
    );
    assert_eq!(of(&rewards, &t, Role::Scorer), Vec::<f32>::new());
}

#[test]
fn no_scoring_with_no_valid_verdict_gives_the_solver_zero() {
    let config = CoMasConfig {
        num_agents: 1,
        num_rounds: 1,
        evals_per_solution: 2,
        variant: Variant::NoScoring,
        ..Default::default()
    };
    let t = play(&config, tag);
    let rewards = comas_rewards(&t).unwrap();
    assert_eq!(rewards.iter().map(|r| r.reward).collect::<Vec<_>>(), vec![0.0, -1.0, -1.0]);
}

#[test]
fn malformed_trajectory_gets_no_rewards() {
    let config = CoMasConfig { num_agents: 2, num_rounds: 1, ..Default::default() };
    let mut t = play(&config, tag);
    t.turns[4].score = Some(3);
    assert!(comas_rewards(&t).is_err());
    t.turns[4].score = None;
    t.variant = Variant::NoScoring;
    assert!(comas_rewards(&t)
        .unwrap_err()
        .to_string()
        .contains("scorer turn in a variant without scoring"));
}
