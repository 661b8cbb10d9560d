//! CoMAS experience making: the reward formulation turns each finished trajectory into one
//! reward per turn, and each turn becomes an experience for the agent that spoke it. The step's
//! figures (rewards by agent and role, scores, accuracy, lengths) come from the same data.
use super::reward::graded_solutions;
use super::metrics::{Accuracy, ByCorrectness, ByRole, ComasAgentFigures, ComasFigures, ComasMetrics, ScoreHist};
use crate::mean::Sum;
use super::{rewards, Judgment, RewardSource, RoleSampling, Trajectory, TrajectoryTurn, Variant, WarmUpWeights};
use crate::error::WorkflowError;
use crate::method::{prompt_group, Experience, Made};
use crate::turn::{FinishReason, Role};
use std::collections::HashMap;

/// One finished episode with its question's reference answer (logging and the verifier control).
pub struct Finished {
    pub episode_id: String,
    pub trajectory: Trajectory,
    pub answer: String,
}

/// One value per CoMAS role from a map of accumulators; a role without turns has none.
fn by_role<T>(m: &HashMap<Role, Sum>, f: impl Fn(&Sum) -> Option<T>) -> ByRole<T> {
    let of = |r: Role| m.get(&r).and_then(&f);
    ByRole { solver: of(Role::Solver), evaluator: of(Role::Evaluator), scorer: of(Role::Scorer) }
}

#[derive(Default)]
struct Tally {
    reward: HashMap<Role, Sum>,
    all: Sum,
    scores: [u64; 4],
    len: HashMap<Role, Sum>,
    truncated: u64,
    turns: u64,
    /// 1 per truncated turn, 0 otherwise, by role.
    truncated_by_role: HashMap<Role, Sum>,
    /// 1 per valid verdict that passes its solution (a score of 3, or "correct" under
    /// no_scoring), 0 per other valid verdict.
    approval: Sum,
    /// Solver rewards split by whether the solution was right (graded for logging only).
    solver_reward_correct: Sum,
    solver_reward_wrong: Sum,
    correct_first: Sum,
    correct_last: Sum,
    /// The scores judges gave right and wrong solutions (a no_scoring verdict counts as 3 for
    /// correct, 1 for incorrect): how much they tell the two apart.
    judged_right: Sum,
    judged_wrong: Sum,
    versions: std::collections::BTreeSet<u64>,
}

impl Tally {
    fn figures(&self) -> ComasFigures {
        let judged: u64 = self.scores.iter().sum();
        ComasFigures {
            reward_mean: self.all.value(),
            reward: by_role(&self.reward, |a| Some(a.spread())),
            score_hist: ScoreHist { one: self.scores[1], two: self.scores[2], three: self.scores[3], invalid: self.scores[0] },
            parse_failure_rate: (judged > 0).then(|| self.scores[0] as f64 / judged as f64),
            score_parse_rate: (judged > 0).then(|| 1.0 - self.scores[0] as f64 / judged as f64),
            approval_rate: self.approval.value(),
            solver_reward_by_correctness: ByCorrectness { correct: self.solver_reward_correct.spread(), wrong: self.solver_reward_wrong.spread() },
            accuracy: Accuracy { first_round: self.correct_first.value(), last_round: self.correct_last.value(), last_round_graded: self.correct_last.count() },
            judge_score_by_correctness: ByCorrectness { correct: self.judged_right.spread(), wrong: self.judged_wrong.spread() },
            judge_separation: self.judged_right.value().zip(self.judged_wrong.value()).map(|(r, w)| r - w),
            completion_len: by_role(&self.len, Sum::value),
            truncation_rate: (self.turns > 0).then(|| self.truncated as f64 / self.turns as f64),
            truncation_rate_by_role: by_role(&self.truncated_by_role, Sum::value),
            policy_versions: self.versions.iter().copied().collect(),
        }
    }
}

/// The group of a turn: its question, role and round, and a hash of its exact prompt tokens.
fn group_key(question: &str, turn: &TrajectoryTurn) -> String {
    prompt_group(question, turn.role, turn.round, &turn.prompt_ids)
}

/// Rewards, experiences and figures of one step's episodes. With `sampling`, each experience
/// carries its role's sampling temperature for the learner. `source` says where solver rewards
/// come from (the judges, or the answer for the verifier control).
pub fn make_step(episodes: &[Finished], num_agents: u32, sampling: Option<&RoleSampling>, source: RewardSource) -> Result<Made<ComasMetrics>, WorkflowError> {
    make_step_with(episodes, num_agents, sampling, source, false)
}

/// As [`make_step`]; with `warm_judges`, scorers are paid for agreeing with the answer, right
/// and wrong solutions weighing alike over the step (`reward::warm_up_judges`).
pub fn make_step_with(
    episodes: &[Finished],
    num_agents: u32,
    sampling: Option<&RoleSampling>,
    source: RewardSource,
    warm_judges: bool,
) -> Result<Made<ComasMetrics>, WorkflowError> {
    let mut per_agent: Vec<Vec<Experience>> = vec![Vec::new(); num_agents as usize];
    let mut agents: Vec<Tally> = (0..num_agents).map(|_| Tally::default()).collect();
    let mut total = Tally::default();
    let mut turn_counts: HashMap<Role, u64> = HashMap::new();
    let mut tokens = 0u64;
    let weights = warm_judges.then(|| WarmUpWeights::balanced(episodes.iter().map(|ep| (&ep.trajectory, ep.answer.as_str()))));
    for ep in episodes {
        let t = &ep.trajectory;
        if t.num_agents != num_agents {
            return Err(WorkflowError::MalformedTrajectory(format!("episode {} has {} agents, the job {num_agents}", ep.episode_id, t.num_agents)));
        }
        let mut turn_rewards = rewards(t, source, &ep.answer)?;
        if let Some(w) = weights {
            super::warm_up_judges(t, &ep.answer, w, &mut turn_rewards);
        }
        // Whether each solution is right (graded for logging only), by its turn index.
        let right = graded_solutions(t, &ep.answer);
        for (turn, r) in t.turns.iter().zip(&turn_rewards) {
            let reward = f64::from(r.reward);
            *turn_counts.entry(turn.role).or_default() += 1;
            tokens += turn.completion_ids.len() as u64;
            per_agent[turn.agent as usize].push(Experience {
                prompt_ids: turn.prompt_ids.clone(),
                completion_ids: turn.completion_ids.clone(),
                reward,
                finish_reason: turn.finish_reason,
                // Group estimators compare turns that answered one and the same prompt: the
                // question's instances in round 0, but not turns whose quoted texts differ.
                group: group_key(&t.question_id, turn),
                norm_group: String::new(),
                temperature: sampling.map(|s| s.for_role(turn.role).temperature).filter(|&t| t > 0.0),
                sampling_logprobs: turn.logprobs.clone(),
                episode_id: ep.episode_id.clone(),
                turn_id: turn.turn_index,
                policy_version: turn.policy_version,
                constrained: turn.constrained.clone(),
            });
            for tally in [&mut agents[turn.agent as usize], &mut total] {
                tally.reward.entry(turn.role).or_default().push(reward);
                tally.all.push(reward);
                tally.len.entry(turn.role).or_default().push(turn.completion_ids.len() as f64);
                tally.turns += 1;
                tally.versions.insert(turn.policy_version);
                tally.truncated += u64::from(turn.finish_reason == FinishReason::Length);
                tally.truncated_by_role.entry(turn.role).or_default().push(f64::from(u8::from(turn.finish_reason == FinishReason::Length)));
                if turn.role == Role::Scorer {
                    tally.scores[turn.score.map_or(0, usize::from)] += 1;
                }
                let verdict = match (t.variant, turn.role) {
                    (Variant::NoScoring, Role::Evaluator) => turn.judgment.map(|j| j == Judgment::Correct),
                    (Variant::NoScoring, _) => None,
                    (_, Role::Scorer) => turn.score.map(|s| s == 3),
                    _ => None,
                };
                if let Some(pass) = verdict {
                    tally.approval.push(f64::from(u8::from(pass)));
                }
                let judged = match (t.variant, turn.role) {
                    (Variant::NoScoring, Role::Evaluator) => turn.judgment.map(|j| if j == Judgment::Correct { 3.0 } else { 1.0 }),
                    (Variant::NoScoring, _) => None,
                    (_, Role::Scorer) => turn.score.map(f64::from),
                    _ => None,
                };
                if let (Some(score), Some(&ok)) = (judged, turn.about_solution.and_then(|s| right.get(&s))) {
                    if ok { &mut tally.judged_right } else { &mut tally.judged_wrong }.push(score);
                }
                if turn.role == Role::Solver {
                    if let Some(&ok) = right.get(&turn.turn_index) {
                        if ok { &mut tally.solver_reward_correct } else { &mut tally.solver_reward_wrong }.push(reward);
                        let v = f64::from(u8::from(ok));
                        if turn.round == 0 {
                            tally.correct_first.push(v);
                        }
                        if turn.round + 1 == t.num_rounds {
                            tally.correct_last.push(v);
                        }
                    }
                }
            }
        }
    }
    let count = |r: Role| Some(turn_counts.get(&r).copied().unwrap_or(0));
    let metrics = ComasMetrics {
        team: total.figures(),
        episodes: episodes.len(),
        turns: ByRole { solver: count(Role::Solver), evaluator: count(Role::Evaluator), scorer: count(Role::Scorer) },
        generated_tokens: tokens,
        prompts_truncated: episodes.iter().map(|e| e.trajectory.truncated_prompts()).sum(),
        agents: agents.iter().enumerate().map(|(k, a)| ComasAgentFigures { figures: a.figures(), agent: k as u32 }).collect(),
    };
    Ok(Made { per_agent, metrics, pooled_whitening: false })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comas::{comas_rewards, start_batch, CoMasConfig};
    use crate::method::StepContext;
    use crate::registry::MethodConfig;
    use crate::seed::PlanSeed;
    use crate::{TaskKind, TaskRecord, TurnOutput};
    use serde_json::json;

    /// Plays one instance with scripted texts; every turn is 3 tokens long at policy version 7.
    pub(crate) fn played(cfg: &CoMasConfig, text: impl Fn(&crate::TurnRequest) -> String) -> Trajectory {
        let q = TaskRecord { prompt: "1+1?".into(), answer: "2".into(), task: TaskKind::Math, id: "q1".into(), source: None, files: Default::default() };
        let mut ep = start_batch(cfg, &[q], PlanSeed { global: 1, step: 0, shard: 0 }).unwrap().remove(0);
        while !ep.is_done() {
            let outs = ep
                .next_turns()
                .iter()
                .map(|r| TurnOutput {
                    turn_index: r.turn_index,
                    text: text(r),
                    raw_text: text(r),
                    prompt_ids: vec![1, 2, r.turn_index],
                    completion_ids: vec![5, 6, 7],
                    logprobs: vec![-0.5; 3],
                    finish_reason: FinishReason::Stop,
                    policy_version: 7,
                    constrained: Vec::new(),
                })
                .collect();
            ep.submit(outs).unwrap();
        }
        ep.into_trajectory().unwrap()
    }

    #[test]
    fn a_group_is_one_prompt() {
        let cfg = CoMasConfig { num_agents: 2, num_rounds: 1, instances_per_question: 1, ..Default::default() };
        let t = played(&cfg, |_| "x".into());
        let a = &t.turns[0];
        let same = a.clone();
        let mut other = a.clone();
        other.prompt_ids.push(99);
        assert_eq!(group_key("q1", a), group_key("q1", &same));
        assert_ne!(group_key("q1", a), group_key("q1", &other), "a different prompt is another group");
        assert_ne!(group_key("q1", a), group_key("q2", a));
    }

    #[test]
    fn turns_go_to_their_agents_with_the_comas_rewards() {
        let cfg = CoMasConfig { num_agents: 2, num_rounds: 1, instances_per_question: 1, ..Default::default() };
        // Slot 0 scored 3 (solver 1.0, evaluator 0.0), slot 1 broken (0, 0, scorer -1).
        let t = played(&cfg, |r| match (r.role, r.slot) {
            (Role::Solver, 0) => "so \\boxed{2}".into(),
            (Role::Solver, _) => "\\boxed{3}".into(),
            (Role::Scorer, 0) => "<score>3</score>".into(),
            (Role::Scorer, _) => "no score".into(),
            _ => "fine".into(),
        });
        let speakers: Vec<(u32, Role, u32, f32)> = {
            let rewards = comas_rewards(&t).unwrap();
            t.turns.iter().zip(&rewards).map(|(x, r)| (x.agent, x.role, x.slot, r.reward)).collect()
        };
        let finished = [Finished { episode_id: "e1".into(), trajectory: t.clone(), answer: "2".into() }];
        // Through the seam: sampled with version 7, a step that expects version 6 for agent 1
        // refuses it, by turn; a record cut short is not valid JSON.
        let method = MethodConfig::CoMas(cfg.clone());
        let json = serde_json::to_string(&t).unwrap();
        let record = method.parse_record(&json).unwrap();
        assert!(method.parse_record(&json[..json.len() / 2]).unwrap_err().to_string().contains("not valid JSON"));
        let q = TaskRecord { prompt: "1+1?".into(), answer: "2".into(), task: TaskKind::Math, id: "q1".into(), source: None, files: Default::default() };
        let step = StepContext { agents: 2, data: std::slice::from_ref(&q), with_temperatures: true, step: Some(0) };
        let err = method.experience(vec![("e1".into(), record.clone())], &step, Some(&[7, 6])).err().expect("a stale turn is refused").to_string();
        assert!(err.contains("episode e1: turn 1 (solver of agent 1) was sampled with policy version 7, but this step uses version 6"), "{err}");
        let seam = method.experience(vec![("e1".into(), record)], &step, Some(&[7, 7])).unwrap();
        assert_eq!(seam.metrics["method"], "comas");
        let b = make_step(&finished, 2, Some(&cfg.sampling), RewardSource::Comas).unwrap();
        assert_eq!(seam.per_agent, b.per_agent, "the seam makes what the method makes");
        assert_eq!(b.per_agent.iter().map(Vec::len).sum::<usize>(), 6, "l=2, R=1: 2 solutions, 2 evaluations, 2 scores");
        for (agent, exps) in b.per_agent.iter().enumerate() {
            let mine: Vec<&(u32, Role, u32, f32)> = speakers.iter().filter(|s| s.0 == agent as u32).collect();
            assert_eq!(exps.len(), mine.len());
            for (e, s) in exps.iter().zip(mine) {
                assert_eq!(e.reward, f64::from(s.3));
                assert_eq!(e.completion_ids, vec![5, 6, 7]);
                assert_eq!(e.policy_version, 7);
                assert_eq!(e.episode_id, "e1");
                // Scripted prompts differ per turn ([1, 2, turn]), so every turn is its own group.
                assert!(e.group.starts_with(&format!("q1/{}/r0/", s.1.as_str())), "{}", e.group);
                assert_eq!(e.temperature, Some(cfg.sampling.for_role(s.1).temperature));
            }
        }
        let by_slot = |role: Role, slot: u32| speakers.iter().find(|s| s.1 == role && s.2 == slot).unwrap().3;
        assert_eq!((by_slot(Role::Solver, 0), by_slot(Role::Evaluator, 0), by_slot(Role::Scorer, 0)), (1.0, 0.0, 0.0));
        assert_eq!((by_slot(Role::Solver, 1), by_slot(Role::Evaluator, 1), by_slot(Role::Scorer, 1)), (0.0, 0.0, -1.0));
        let m = &serde_json::to_value(&b.metrics).unwrap();
        assert_eq!(m["score_hist"], json!({"1": 0, "2": 0, "3": 1, "invalid": 1}));
        assert_eq!(m["parse_failure_rate"], json!(0.5));
        // Solver of slot 0 answered 2 (right), slot 1 answered 3 (wrong).
        assert_eq!(m["accuracy"]["last_round"], json!(0.5));
        assert_eq!(m["turns"], json!({"solver": 2, "evaluator": 2, "scorer": 2}));
        assert_eq!(m["reward"]["solver"]["mean"], json!(0.5));
        assert_eq!(m["reward"]["scorer"]["mean"], json!(-0.5));
        assert_eq!(m["agents"][0]["policy_versions"], json!([7]));
        assert_eq!(m["generated_tokens"], json!(18));
        assert_eq!(m["prompts_truncated"], json!(0));
        // One valid score, a 3: the judges passed every solution they could judge.
        assert_eq!(m["approval_rate"], json!(1.0));
        assert_eq!(m["score_parse_rate"], json!(0.5));
        assert_eq!(m["solver_reward_by_correctness"]["correct"], json!({"mean": 1.0, "std": 0.0, "count": 1}));
        assert_eq!(m["solver_reward_by_correctness"]["wrong"], json!({"mean": 0.0, "std": 0.0, "count": 1}));
        assert_eq!(m["truncation_rate_by_role"], json!({"solver": 0.0, "evaluator": 0.0, "scorer": 0.0}));
        // The right solution was scored 3; the wrong one's score could not be read.
        assert_eq!((m["accuracy"]["last_round_graded"].clone(), m["judge_separation"].clone()), (json!(2), json!(null)));
        assert_eq!(m["judge_score_by_correctness"]["correct"], json!({"mean": 3.0, "std": 0.0, "count": 1}));
    }

    #[test]
    fn the_verifier_control_pays_solvers_from_the_answer_only() {
        let cfg = CoMasConfig { num_agents: 2, num_rounds: 1, instances_per_question: 1, ..Default::default() };
        // The judges pass the wrong solution (slot 0: 3 scored) and fail the right one (slot 1: 1).
        let t = played(&cfg, |r| match (r.role, r.slot) {
            (Role::Solver, 0) => "\\boxed{5}".into(),
            (Role::Solver, _) => "\\boxed{2}".into(),
            (Role::Scorer, 0) => "<score>3</score>".into(),
            (Role::Scorer, _) => "<score>1</score>".into(),
            _ => "fine".into(),
        });
        let finished = [Finished { episode_id: "e1".into(), trajectory: t.clone(), answer: "2".into() }];
        let by = |source: RewardSource| -> Vec<(Role, u32, f64)> {
            let b = make_step(&finished, 2, None, source).unwrap();
            b.per_agent
                .iter()
                .flatten()
                .map(|e| {
                    let turn = t.turns.iter().find(|x| x.turn_index == e.turn_id).unwrap();
                    (turn.role, turn.slot, e.reward)
                })
                .collect()
        };
        let comas = by(RewardSource::Comas);
        let verifier = by(RewardSource::Verifier);
        let get = |v: &[(Role, u32, f64)], role: Role, slot: u32| v.iter().find(|x| x.0 == role && x.1 == slot).unwrap().2;
        assert_eq!((get(&comas, Role::Solver, 0), get(&comas, Role::Solver, 1)), (1.0, 0.0));
        assert_eq!((get(&verifier, Role::Solver, 0), get(&verifier, Role::Solver, 1)), (0.0, 1.0));
        for role in [Role::Evaluator, Role::Scorer] {
            for slot in 0..2 {
                assert_eq!(get(&comas, role, slot), get(&verifier, role, slot), "{role} {slot} keeps its CoMAS reward");
            }
        }
        let m = serde_json::to_value(make_step(&finished, 2, None, RewardSource::Comas).unwrap().metrics).unwrap();
        assert_eq!(m["approval_rate"], json!(0.5));
        // The judges' reward runs against correctness here: 0 for the right answer, 1 for the wrong.
        assert_eq!(m["solver_reward_by_correctness"]["correct"]["mean"], json!(0.0));
        assert_eq!(m["solver_reward_by_correctness"]["wrong"]["mean"], json!(1.0));
        // E[score | right] - E[score | wrong] = 1 - 3: the judges run against correctness.
        assert_eq!(m["judge_separation"], json!(-2.0));
    }

    /// The judges' warm-up pays each scorer for agreeing with the answer, only in the first
    /// `judge_warmup_steps` training steps, and leaves every other turn's reward as it was.
    #[test]
    fn warming_judges_pays_scorers_for_agreeing_with_the_answer() {
        let cfg = CoMasConfig { num_agents: 2, num_rounds: 1, instances_per_question: 1, judge_warmup_steps: 2, ..Default::default() };
        // Slot 0: right, scored 3 (agrees); slot 1: wrong, scored 3 (disagrees).
        let t = played(&cfg, |r| match (r.role, r.slot) {
            (Role::Solver, 0) => "\\boxed{2}".into(),
            (Role::Solver, _) => "\\boxed{5}".into(),
            (Role::Scorer, _) => "<score>3</score>".into(),
            _ => "fine".into(),
        });
        let reward_of = |b: &Made<ComasMetrics>, role: Role, slot: u32| {
            let turn = t.turns.iter().find(|x| x.role == role && x.slot == slot).unwrap();
            b.per_agent.iter().flatten().find(|e| e.turn_id == turn.turn_index).unwrap().reward
        };
        let finished = [Finished { episode_id: "e1".into(), trajectory: t.clone(), answer: "2".into() }];
        let comas = make_step(&finished, 2, None, RewardSource::Comas).unwrap();
        let warm = make_step_with(&finished, 2, None, RewardSource::Comas, true).unwrap();
        assert_eq!((reward_of(&comas, Role::Scorer, 0), reward_of(&comas, Role::Scorer, 1)), (0.0, 0.0));
        assert_eq!((reward_of(&warm, Role::Scorer, 0), reward_of(&warm, Role::Scorer, 1)), (1.0, 0.0));
        for (role, slot) in [(Role::Solver, 0), (Role::Solver, 1), (Role::Evaluator, 0), (Role::Evaluator, 1)] {
            assert_eq!(reward_of(&warm, role, slot), reward_of(&comas, role, slot), "{role} {slot}");
        }
        // Through the seam: steps 0 and 1 warm the judges, step 2 and evaluations do not.
        let method = MethodConfig::CoMas(cfg);
        let record = method.parse_record(&serde_json::to_string(&t).unwrap()).unwrap();
        let q = TaskRecord { prompt: "1+1?".into(), answer: "2".into(), task: TaskKind::Math, id: "q1".into(), source: None, files: Default::default() };
        let scorer_0 = t.turns.iter().find(|x| x.role == Role::Scorer && x.slot == 0).unwrap().turn_index;
        let paid = |step: Option<u64>| {
            let ctx = StepContext { agents: 2, data: std::slice::from_ref(&q), with_temperatures: false, step };
            let out = method.experience(vec![("e1".into(), record.clone())], &ctx, None).unwrap();
            out.per_agent.iter().flatten().find(|e| e.turn_id == scorer_0).unwrap().reward
        };
        assert_eq!((paid(Some(0)), paid(Some(1)), paid(Some(2)), paid(None)), (1.0, 1.0, 0.0, 0.0));
    }

    /// Right and wrong solutions weigh alike in a warm-up step: with 1 right solution of 4, a
    /// scorer that always says 1 or always says 3 earns 0.5 a turn on average, one that tells
    /// them apart earns 1.
    #[test]
    fn warming_judges_pays_telling_right_from_wrong_not_a_constant_score() {
        let cfg = CoMasConfig { num_agents: 2, num_rounds: 1, instances_per_question: 1, judge_warmup_steps: 1, ..Default::default() };
        // Episode A: slot 0 right, slot 1 wrong; episode B: both wrong.
        let play = |right_slot: Option<u32>, score: &dyn Fn(bool) -> u8| {
            played(&cfg, |r| match r.role {
                Role::Solver if Some(r.slot) == right_slot => "\\boxed{2}".into(),
                Role::Solver => "\\boxed{5}".into(),
                Role::Scorer => format!("<score>{}</score>", score(Some(r.slot) == right_slot)),
                _ => "fine".into(),
            })
        };
        let paid = |score: &dyn Fn(bool) -> u8| {
            let finished = [
                Finished { episode_id: "a".into(), trajectory: play(Some(0), score), answer: "2".into() },
                Finished { episode_id: "b".into(), trajectory: play(None, score), answer: "2".into() },
            ];
            let weights = WarmUpWeights::balanced(finished.iter().map(|f| (&f.trajectory, f.answer.as_str())));
            assert_eq!(weights, WarmUpWeights { right: 2.0, wrong: 4.0 / 6.0 });
            let made = make_step_with(&finished, 2, None, RewardSource::Comas, true).unwrap();
            let scorers: Vec<f64> = finished
                .iter()
                .flat_map(|f| f.trajectory.turns.iter().filter(|x| x.role == Role::Scorer).map(move |x| (&f.episode_id, x.turn_index)))
                .map(|(ep, turn)| made.per_agent.iter().flatten().find(|e| &e.episode_id == ep && e.turn_id == turn).unwrap().reward)
                .collect();
            assert_eq!(scorers.len(), 4);
            scorers.iter().sum::<f64>() / 4.0
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        close(paid(&|_| 1), 0.5);
        close(paid(&|_| 3), 0.5);
        close(paid(&|_| 2), 0.5);
        close(paid(&|right| if right { 3 } else { 1 }), 1.0);
        close(paid(&|right| if right { 1 } else { 3 }), 0.0);
    }
}
