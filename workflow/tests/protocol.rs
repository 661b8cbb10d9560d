//! The CoMAS protocol driven end to end by a scripted worker.
mod common;

use comas_workflow::comas::{
    plan_batch, start_batch, Assignment, CoMasConfig, DiscussionSource, Episode, JudgeReward,
    PlanSeed, Trajectory, Variant,
};
use comas_workflow::{PromptMeter, Role, SamplingSpec, TaskKind, TurnRequest, WorkflowError};
use common::{output, question, run, single, tag};
use std::collections::HashSet;

fn roles(group: &[TurnRequest]) -> HashSet<Role> {
    group.iter().map(|r| r.role).collect()
}

fn count(t: &Trajectory, role: Role) -> usize {
    t.turns_of(role).count()
}

#[test]
fn main_run_turn_counts_and_barrier_order() {
    let config =
        CoMasConfig { num_agents: 4, num_rounds: 2, evals_per_solution: 1, ..Default::default() };
    let mut ep = single(&config, TaskKind::Math, 1);
    let groups = run(&mut ep, tag);
    let order: Vec<(Role, u32, usize)> =
        groups.iter().map(|g| (g[0].role, g[0].round, g.len())).collect();
    assert_eq!(
        order,
        vec![
            (Role::Solver, 0, 4),
            (Role::Evaluator, 0, 4),
            (Role::Scorer, 0, 4),
            (Role::Solver, 1, 4),
            (Role::Evaluator, 1, 4),
            (Role::Scorer, 1, 4),
        ]
    );
    assert!(groups.iter().all(|g| roles(g).len() == 1));
    let indices: Vec<u32> = groups.iter().flatten().map(|r| r.turn_index).collect();
    assert_eq!(indices, (0..24).collect::<Vec<_>>());

    let t = ep.into_trajectory().unwrap();
    assert_eq!(
        (count(&t, Role::Solver), count(&t, Role::Evaluator), count(&t, Role::Scorer)),
        (8, 8, 8)
    );
    for agent in 0..4 {
        assert_eq!(t.turns_of(Role::Solver).filter(|x| x.agent == agent).count(), 2);
    }
    // Solver d of every round is agent d, in slot d.
    for s in t.turns_of(Role::Solver) {
        assert_eq!(s.agent, s.slot);
    }
    // Links: evaluator → solution of its slot; scorer → that solution and its evaluation.
    for e in t.turns_of(Role::Evaluator) {
        let s = &t.turns[e.about_solution.unwrap() as usize];
        assert_eq!((s.role, s.round, s.slot), (Role::Solver, e.round, e.slot));
    }
    for c in t.turns_of(Role::Scorer) {
        let e = &t.turns[c.about_evaluation.unwrap() as usize];
        assert_eq!(
            (e.role, e.round, e.slot, e.about_solution),
            (Role::Evaluator, c.round, c.slot, c.about_solution)
        );
    }
    let first = &t.turns[0];
    assert_eq!(
        (first.prompt_ids.clone(), first.policy_version, first.text.as_str()),
        (vec![1, 2, 0], 3, "S r0 d0")
    );
}

#[test]
fn every_request_is_one_user_message_with_role_sampling_and_distinct_seeds() {
    let mut config = CoMasConfig::default();
    config.sampling.evaluator = SamplingSpec { temperature: 0.7, ..Default::default() };
    config.sampling.scorer = SamplingSpec { top_k: 5, max_new_tokens: 512, ..Default::default() };
    let mut ep = single(&config, TaskKind::Science, 2);
    let groups = run(&mut ep, tag);
    let all: Vec<&TurnRequest> = groups.iter().flatten().collect();
    for r in &all {
        assert_eq!(r.messages.len(), 1);
        assert_eq!(r.messages[0].role, "user");
        assert_eq!(&r.sampling, config.sampling.for_role(r.role));
    }
    assert_eq!(all.iter().find(|r| r.role == Role::Evaluator).unwrap().sampling.temperature, 0.7);
    assert_eq!(all.iter().find(|r| r.role == Role::Scorer).unwrap().sampling.max_new_tokens, 512);
    let seeds: HashSet<u64> = all.iter().map(|r| r.seed).collect();
    assert_eq!(seeds.len(), all.len());
    // All solvers of a round get the same prompt.
    for g in groups.iter().filter(|g| g[0].role == Role::Solver) {
        assert!(g.iter().all(|r| r.messages == g[0].messages));
    }
}

#[test]
fn balanced_assignment_across_a_batch() {
    let config = CoMasConfig::default();
    let questions: Vec<_> =
        ["a", "b", "c"].iter().map(|id| question(id, TaskKind::Coding)).collect();
    let mut episodes =
        start_batch(&config, &questions, PlanSeed { global: 42, step: 5, shard: 0 }).unwrap();
    assert_eq!(episodes.len(), 12);
    let ids: Vec<&str> = episodes.iter().map(|e| e.question().id.as_str()).collect();
    assert_eq!(ids, ["a", "a", "a", "a", "b", "b", "b", "b", "c", "c", "c", "c"]);
    let mut tally = vec![[[0usize; 4]; 3]; 2]; // [round][role][agent]
    let mut first_seeds = Vec::new();
    for ep in &mut episodes {
        let groups = run(ep, tag);
        first_seeds.push(groups[0][0].seed);
        for r in groups.iter().flatten() {
            tally[r.round as usize][r.role as usize][r.agent as usize] += 1;
        }
    }
    for round in &tally {
        assert_eq!(round[Role::Solver as usize], [12; 4]);
        assert_eq!(round[Role::Evaluator as usize], [12; 4]);
        assert_eq!(round[Role::Scorer as usize], [12; 4]);
    }
    // The copies of one question are independent discussions: their sampler seeds differ.
    assert_eq!(first_seeds.iter().collect::<HashSet<_>>().len(), 12);
    let trajectories: Vec<Trajectory> =
        episodes.into_iter().map(|e| e.into_trajectory().unwrap()).collect();
    assert_eq!(
        trajectories.iter().map(|t| t.instance).collect::<Vec<_>>(),
        (0..12).collect::<Vec<_>>()
    );
}

#[test]
fn episodes_follow_their_plan_and_exclude_self() {
    let config = CoMasConfig {
        exclude_self: true,
        assignment: Assignment::IidUniform,
        ..Default::default()
    };
    let plan = plan_batch(&config, 1, PlanSeed { global: 3, step: 1, shard: 0 })
        .unwrap()
        .instances
        .remove(0);
    let mut ep = Episode::new(&config, &question("q", TaskKind::Math), 0, plan.clone(), 9).unwrap();
    for r in run(&mut ep, tag).iter().flatten() {
        let (round, slot) = (r.round as usize, r.slot as usize);
        match r.role {
            Role::Evaluator => assert_eq!(r.agent, plan.rounds[round].evaluators[slot][0]),
            Role::Scorer => assert_eq!(r.agent, plan.rounds[round].scorers[slot][0]),
            Role::Solver => continue,
            other => panic!("a CoMAS game asked for a {other} turn"),
        }
        assert_ne!(r.agent, r.slot);
    }
}

fn padded(r: &TurnRequest) -> String {
    format!("  {}\n", tag(r))
}

const HEAD: &str = "Problem:\nQuestion q?\n\nDiscussion so far (use it only as a reference; it may contain mistakes):\n";
const MATH_TAIL: &str = "\n\nSolve the problem step by step. Write your final answer inside \\boxed{}, for example \\boxed{n}.";

#[test]
fn round_zero_and_chronological_discussion_render_exactly() {
    let config = CoMasConfig {
        num_agents: 2,
        discussion_source: DiscussionSource::LastKPairsChronological,
        ..Default::default()
    };
    let mut ep = single(&config, TaskKind::Math, 4);
    let groups = run(&mut ep, padded);
    assert_eq!(groups[0][0].messages[0].content, format!("{HEAD}(Empty discussion){MATH_TAIL}"));
    let expected = "=== Discussion 1 ===\nSolution: S r0 d0\nEvaluation: E r0 d0 k0\n\n\
                    === Discussion 2 ===\nSolution: S r0 d1\nEvaluation: E r0 d1 k0";
    assert_eq!(groups[3][0].messages[0].content, format!("{HEAD}{expected}{MATH_TAIL}"));
    // Evaluators and scorers quote stripped text and see no discussion by default.
    assert_eq!(
        groups[1][1].messages[0].content.split("\n\n").take(2).collect::<Vec<_>>(),
        ["Problem:\nQuestion q?", "Solution to check:\nS r0 d1"]
    );
    assert!(groups[2][1].messages[0]
        .content
        .starts_with("Problem:\nQuestion q?\n\nSolution:\nS r0 d1\n\nEvaluation of the solution:\nE r0 d1 k0\n\nDecide whether"));
    let t = ep.into_trajectory().unwrap();
    assert_eq!(t.discussions, vec!["(Empty discussion)".to_string(), expected.to_string()]);
}

#[test]
fn sampled_discussion_uses_previous_round_without_replacement() {
    let config =
        CoMasConfig { num_agents: 4, num_rounds: 3, num_references: 2, ..Default::default() };
    let mut orders = HashSet::new();
    for seed in 0..40 {
        let mut ep = single(&config, TaskKind::Math, seed);
        run(&mut ep, tag);
        let t = ep.into_trajectory().unwrap();
        for round in 1..3u32 {
            let blocks: Vec<&str> = t.discussions[round as usize].split("\n\n").collect();
            assert_eq!(blocks.len(), 2);
            let mut slots = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                let lines: Vec<&str> = b.lines().collect();
                assert_eq!(lines[0], format!("=== Discussion {} ===", i + 1));
                let sol = lines[1].strip_prefix("Solution: S r").unwrap();
                let (r, d) = sol.split_once(" d").unwrap();
                assert_eq!(
                    r.parse::<u32>().unwrap(),
                    round - 1,
                    "only the previous round is quoted"
                );
                // The evaluation shown is the one written about that very solution.
                assert_eq!(lines[2], format!("Evaluation: E r{} d{d} k0", round - 1));
                slots.push(d.parse::<u32>().unwrap());
            }
            assert_ne!(slots[0], slots[1], "no pair is drawn twice");
            orders.insert((slots[0], slots[1]));
        }
    }
    assert!(orders.len() > 6, "the draw varies with the seed: {orders:?}");
}

#[test]
fn prev_round_sample_of_two_pairs_renders_one_of_two_orders() {
    let config = CoMasConfig { num_agents: 2, ..Default::default() };
    let a = "=== Discussion 1 ===\nSolution: S r0 d0\nEvaluation: E r0 d0 k0\n\n=== Discussion 2 ===\nSolution: S r0 d1\nEvaluation: E r0 d1 k0";
    let b = "=== Discussion 1 ===\nSolution: S r0 d1\nEvaluation: E r0 d1 k0\n\n=== Discussion 2 ===\nSolution: S r0 d0\nEvaluation: E r0 d0 k0";
    let mut seen = HashSet::new();
    for seed in 0..30 {
        let mut ep = single(&config, TaskKind::Math, seed);
        let groups = run(&mut ep, padded);
        let prompt = &groups[3][0].messages[0].content;
        let d = prompt.strip_prefix(HEAD).unwrap().strip_suffix(MATH_TAIL).unwrap().to_string();
        assert!(d == a || d == b, "{d}");
        seen.insert(d);
    }
    assert_eq!(seen.len(), 2);
}

#[test]
fn quoting_options() {
    let raw = CoMasConfig {
        num_agents: 1,
        quote_raw_completion: true,
        discussion_source: DiscussionSource::LastKPairsChronological,
        ..Default::default()
    };
    let mut ep = single(&raw, TaskKind::Math, 0);
    let groups = run(&mut ep, tag);
    assert!(groups[1][0].messages[0].content.contains("Solution to check:\nS r0 d0<|im_end|>\n\n"));
    assert!(groups[3][0].messages[0]
        .content
        .contains("Solution: S r0 d0<|im_end|>\nEvaluation: E r0 d0 k0<|im_end|>\n\nSolve"));

    let sees = CoMasConfig {
        num_agents: 1,
        evaluator_sees_discussion: true,
        discussion_source: DiscussionSource::LastKPairsChronological,
        ..Default::default()
    };
    let mut ep = single(&sees, TaskKind::Coding, 0);
    let groups = run(&mut ep, tag);
    assert!(groups[1][0].messages[0].content.starts_with(
        "Problem:\nQuestion q?\n\nDiscussion so far (use it only as a reference; it may contain mistakes):\n(Empty discussion)\n\nSolution to check:\nS r0 d0\n\n"
    ));
    assert!(groups[4][0].messages[0]
        .content
        .contains("mistakes):\n=== Discussion 1 ===\nSolution: S r0 d0\nEvaluation: E r0 d0 k0\n\nSolution to check:\nS r1 d0\n\n"));
    // Default: no discussion for evaluators.
    let mut ep = single(&CoMasConfig::default(), TaskKind::Math, 0);
    let groups = run(&mut ep, tag);
    assert!(groups[4].iter().all(|r| !r.messages[0].content.contains("Discussion")));
}

#[test]
fn same_seed_same_plan_and_prompts_other_seed_differs() {
    let config = CoMasConfig { num_agents: 4, num_rounds: 3, ..Default::default() };
    let questions = vec![question("a", TaskKind::Math), question("b", TaskKind::Science)];
    let drive = |seed: PlanSeed| -> Vec<Vec<TurnRequest>> {
        let mut eps = start_batch(&config, &questions, seed).unwrap();
        eps.iter_mut().flat_map(|e| run(e, tag)).collect()
    };
    let s = PlanSeed { global: 42, step: 3, shard: 0 };
    assert_eq!(plan_batch(&config, 8, s).unwrap(), plan_batch(&config, 8, s).unwrap());
    let a = drive(s);
    assert_eq!(a, drive(s));
    let b = drive(PlanSeed { step: 4, ..s });
    assert_ne!(a, b);
    let agents =
        |g: &Vec<Vec<TurnRequest>>| g.iter().flatten().map(|r| r.agent).collect::<Vec<_>>();
    let prompts = |g: &Vec<Vec<TurnRequest>>| {
        g.iter().flatten().map(|r| r.messages.clone()).collect::<Vec<_>>()
    };
    assert_ne!(agents(&a), agents(&b), "assignment changes with the seed");
    assert_ne!(prompts(&a), prompts(&b), "discussion draws change with the seed");
}

#[test]
fn no_evaluation_variant_turns() {
    let config = CoMasConfig {
        variant: Variant::NoEvaluation { judge_reward: JudgeReward::ZeroSum },
        ..Default::default()
    };
    let mut ep = single(&config, TaskKind::Math, 5);
    let groups = run(&mut ep, padded);
    let order: Vec<(Role, usize)> = groups.iter().map(|g| (g[0].role, g.len())).collect();
    assert_eq!(
        order,
        vec![(Role::Solver, 4), (Role::Scorer, 4), (Role::Solver, 4), (Role::Scorer, 4)]
    );
    let judge = &groups[1][2];
    assert_eq!((judge.about_solution, judge.about_evaluation), (Some(2), None));
    assert!(judge.messages[0].content.starts_with(
        "Problem:\nQuestion q?\n\nSolution:\nS r0 d2\n\nDecide whether the solution is correct"
    ));
    // Solvers of round 1 see solutions without evaluations.
    assert!(groups[2][0].messages[0].content.contains("=== Discussion 2 ===\nSolution: S r0 d"));
    assert!(!groups[2][0].messages[0].content.contains("Evaluation:"));
    let t = ep.into_trajectory().unwrap();
    assert_eq!(
        (count(&t, Role::Solver), count(&t, Role::Evaluator), count(&t, Role::Scorer)),
        (8, 0, 8)
    );
}

#[test]
fn no_scoring_variant_turns() {
    let config =
        CoMasConfig { variant: Variant::NoScoring, evals_per_solution: 2, ..Default::default() };
    let mut ep = single(&config, TaskKind::Coding, 6);
    let groups = run(&mut ep, |r| format!("{} <judgment>correct</judgment>", tag(r)));
    let order: Vec<(Role, usize)> = groups.iter().map(|g| (g[0].role, g.len())).collect();
    assert_eq!(
        order,
        vec![(Role::Solver, 4), (Role::Evaluator, 8), (Role::Solver, 4), (Role::Evaluator, 8)]
    );
    let e = &groups[1][3];
    assert_eq!((e.slot, e.judge_index, e.about_solution), (1, 1, Some(1)));
    assert!(e.messages[0]
        .content
        .contains("<judgment>correct</judgment> or <judgment>incorrect</judgment>"));
    let t = ep.into_trajectory().unwrap();
    assert_eq!(
        (count(&t, Role::Solver), count(&t, Role::Evaluator), count(&t, Role::Scorer)),
        (8, 16, 0)
    );
    assert!(t.turns_of(Role::Evaluator).all(|e| e.judgment.is_some()));
}

#[test]
fn several_evaluations_per_solution_in_the_full_variant() {
    let config =
        CoMasConfig { num_agents: 3, num_rounds: 1, evals_per_solution: 2, ..Default::default() };
    let mut ep = single(&config, TaskKind::Math, 7);
    let groups = run(&mut ep, tag);
    assert_eq!(groups.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 6, 6]);
    // Scorer (slot d, judge k) scores evaluation (slot d, judge k).
    for c in &groups[2] {
        let e = groups[1].iter().find(|e| Some(e.turn_index) == c.about_evaluation).unwrap();
        assert_eq!((e.slot, e.judge_index), (c.slot, c.judge_index));
        assert!(c.messages[0].content.contains(&format!(
            "Evaluation of the solution:\nE r0 d{} k{}\n",
            c.slot, c.judge_index
        )));
    }
}

#[test]
fn scores_are_extracted_on_scorer_turns() {
    let config = CoMasConfig { num_agents: 2, num_rounds: 1, ..Default::default() };
    let mut ep = single(&config, TaskKind::Math, 8);
    run(&mut ep, |r| match (r.role, r.slot) {
        (Role::Scorer, 0) => "fine <SCORE> 2 </SCORE>".into(),
        (Role::Scorer, _) => "I give it a 3".into(),
        _ => "<score>3</score>".into(),
    });
    let t = ep.into_trajectory().unwrap();
    let scores: Vec<Option<u8>> = t.turns.iter().map(|x| x.score).collect();
    assert_eq!(scores, vec![None, None, None, None, Some(2), None]);
    let json = serde_json::to_string(&t).unwrap();
    let back: Trajectory = serde_json::from_str(&json).unwrap();
    assert_eq!(back, t);
    assert!(json.contains(r#""role":"scorer""#) && json.contains(r#""finish_reason":"stop""#));
}

#[test]
fn submit_rejects_bad_groups_without_changing_state() {
    let config = CoMasConfig { num_agents: 2, num_rounds: 1, ..Default::default() };
    let mut ep = single(&config, TaskKind::Math, 0);
    let group = ep.next_turns();
    assert_eq!(group.iter().map(|r| r.turn_index).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(ep.next_turns(), group, "asking again returns the same group");

    let mut stray = output(&group[0], "x");
    stray.turn_index = 5;
    let err = ep.submit(vec![output(&group[0], "a"), stray]).unwrap_err();
    assert!(matches!(err, WorkflowError::UnknownTurn { turn_index: 5, first: 0, end: 2 }));
    assert_eq!(err.to_string(), "turn 5 is not pending (the pending turns are 0..2)");

    let err = ep.submit(vec![output(&group[1], "a"), output(&group[1], "b")]).unwrap_err();
    assert!(matches!(err, WorkflowError::DuplicateTurn(1)));

    let err = ep.submit(vec![output(&group[1], "a")]).unwrap_err();
    assert!(matches!(&err, WorkflowError::MissingTurns(m) if m == &vec![0]));
    assert!(matches!(ep.submit(vec![]), Err(WorkflowError::MissingTurns(m)) if m == vec![0, 1]));

    let mut short = output(&group[0], "a");
    short.logprobs.pop();
    let err = ep.submit(vec![short, output(&group[1], "b")]).unwrap_err();
    assert!(matches!(err, WorkflowError::LogprobCount { turn_index: 0, logprobs: 2, tokens: 3 }));

    assert!(ep.turns().is_empty());
    assert_eq!(ep.next_turns(), group);
    let err = ep.clone().into_trajectory().unwrap_err();
    assert_eq!(
        err.to_string(),
        "the episode is not finished: 2 solver turn(s) of round 0 are still pending"
    );

    // Out-of-order submission is fine.
    ep.submit(vec![output(&group[1], "b"), output(&group[0], "a")]).unwrap();
    assert_eq!(ep.turns().iter().map(|t| t.text.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
    assert_eq!(ep.stage(), Some(Role::Evaluator));
    run(&mut ep, tag);
    assert!(ep.next_turns().is_empty());
    assert!(matches!(ep.submit(vec![]), Err(WorkflowError::EpisodeFinished)));
    assert_eq!(ep.into_trajectory().unwrap().turns.len(), 6);
}

#[test]
fn episode_rejects_bad_config_and_plan() {
    let config = CoMasConfig::default();
    let plan = plan_batch(&config, 1, PlanSeed::default()).unwrap().instances.remove(0);
    let q = question("q", TaskKind::Math);
    let bad = CoMasConfig { variant: Variant::NoScoring, ..Default::default() };
    let err = Episode::new(&bad, &q, 0, plan.clone(), 0).unwrap_err();
    assert!(matches!(err, WorkflowError::Config(_)));
    assert!(err.to_string().contains("evals_per_solution >= 2"));
    let three = CoMasConfig { num_agents: 3, ..Default::default() };
    let err = Episode::new(&three, &q, 0, plan.clone(), 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "assignment plan does not fit the config: round 0: 4 slots of evaluators, expected 3"
    );
    let no_eval = CoMasConfig {
        variant: Variant::NoEvaluation { judge_reward: JudgeReward::Neutral },
        ..Default::default()
    };
    assert!(matches!(Episode::new(&no_eval, &q, 0, plan, 0), Err(WorkflowError::PlanMismatch(_))));
}

#[test]
fn tampered_trajectories_are_rejected() {
    let config = CoMasConfig { num_agents: 2, num_rounds: 1, ..Default::default() };
    let mut ep = single(&config, TaskKind::Math, 0);
    run(&mut ep, |r| if r.role == Role::Scorer { "<score>2</score>".into() } else { tag(r) });
    let t = ep.into_trajectory().unwrap();
    t.validate().unwrap();

    let mut x = t.clone();
    x.turns[4].score = Some(3);
    assert_eq!(
        x.validate().unwrap_err().to_string(),
        "malformed trajectory: turn 4: stored score Some(3) but the text gives Some(2)"
    );
    let mut x = t.clone();
    x.turns.pop();
    assert_eq!(
        x.validate().unwrap_err().to_string(),
        "malformed trajectory: round 0 has 1 scorer turns, expected 2"
    );
    let mut x = t.clone();
    x.turns[2].about_solution = Some(1);
    assert!(x
        .validate()
        .unwrap_err()
        .to_string()
        .contains("about_solution 1 is not the solution of round 0 slot 0"));
    let mut x = t.clone();
    x.turns[5].about_evaluation = Some(2);
    assert!(x
        .validate()
        .unwrap_err()
        .to_string()
        .contains("about_evaluation 2 is not evaluation 0"));
    let mut x = t;
    x.turns[3].agent = 9;
    assert!(x.validate().unwrap_err().to_string().contains("agent 9"));
}

/// Fits a prompt when it is at most `solver` (solver turns) or `evaluator` characters long.
struct CharLimit {
    solver: usize,
    evaluator: usize,
}

impl PromptMeter for CharLimit {
    fn fits(&self, role: Role, text: &str) -> bool {
        text.len() <= if role == Role::Solver { self.solver } else { self.evaluator }
    }
}

fn run_metered(config: &CoMasConfig, meter: &CharLimit) -> (Vec<Vec<TurnRequest>>, Trajectory) {
    let plan = comas_workflow::comas::plan_batch(
        config,
        1,
        comas_workflow::comas::PlanSeed { global: 4, step: 0, shard: 0 },
    )
    .unwrap()
    .instances
    .remove(0);
    let mut ep =
        Episode::new_metered(config, &common::question("q", TaskKind::Math), 0, plan, 4, meter)
            .unwrap();
    let mut groups = Vec::new();
    while !ep.is_done() {
        let group = ep.next_turns();
        ep.submit_metered(group.iter().map(|r| common::output(r, &padded(r))).collect(), meter)
            .unwrap();
        groups.push(group);
    }
    (groups, ep.into_trajectory().unwrap())
}

#[test]
fn a_prompt_too_long_loses_whole_discussion_blocks_oldest_first() {
    let config = CoMasConfig {
        num_agents: 2,
        discussion_source: DiscussionSource::LastKPairsChronological,
        evaluator_sees_discussion: true,
        ..Default::default()
    };
    let unlimited = CharLimit { solver: usize::MAX, evaluator: usize::MAX };
    let (groups, t) = run_metered(&config, &unlimited);
    let full = groups[3][0].messages[0].content.len();
    assert_eq!(t.truncated_prompts(), 0);
    assert!(t.turns.iter().all(|t| t.blocks_cut == 0));

    // One character short of the full solver prompt: the older block (slot 0) goes, whole.
    let (groups, t) = run_metered(&config, &CharLimit { solver: full - 1, evaluator: usize::MAX });
    let newer = "=== Discussion 1 ===\nSolution: S r0 d1\nEvaluation: E r0 d1 k0";
    assert_eq!(groups[3][0].messages[0].content, format!("{HEAD}{newer}{MATH_TAIL}"));
    assert_eq!(t.discussions[1], newer);
    let cut: Vec<(Role, u32, u32)> = t
        .turns
        .iter()
        .filter(|t| t.blocks_cut > 0)
        .map(|t| (t.role, t.round, t.blocks_cut))
        .collect();
    assert_eq!(cut, vec![(Role::Solver, 1, 1), (Role::Solver, 1, 1)]);
    // Evaluators that see the discussion see the block the solvers saw.
    assert!(
        groups[4][0].messages[0].content.contains(newer)
            && !groups[4][0].messages[0].content.contains("S r0 d0\n")
    );

    // Nothing fits: every block is cut, the rest of the prompt stays (the worker refuses it).
    let (groups, t) = run_metered(&config, &CharLimit { solver: 1, evaluator: 1 });
    assert_eq!(groups[3][0].messages[0].content, format!("{HEAD}(Empty discussion){MATH_TAIL}"));
    assert_eq!(t.discussions[1], "(Empty discussion)");
    assert_eq!(t.truncated_prompts(), 2);
    assert!(t
        .turns
        .iter()
        .filter(|t| t.role == Role::Solver && t.round == 1)
        .all(|t| t.blocks_cut == 2));
    // The solution under review is never cut from an evaluator's prompt.
    assert!(groups[4][1].messages[0].content.contains("Solution to check:\nS r1 d1"));
}
