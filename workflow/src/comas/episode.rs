//! The CoMAS interaction protocol for one instance as a synchronous state machine (spec 3.2).
//!
//! Every round runs up to three barrier groups: all solver turns, then all evaluator turns, then
//! all scorer turns (the ablations drop one of the last two). The episode hands out one group at a
//! time and moves on only when the whole group has been submitted, so a caller can run the turns
//! of a group (and of many episodes) in one decode batch.
use super::assignment::InstancePlan;
use super::config::{CoMasConfig, Variant};
use super::discussion::{select_pairs, PairRef};
use super::prompts::{evaluator_prompt, judge_prompt, render_discussion, scorer_prompt, solver_prompt, verdict_prompt, DiscussionEntry};
use super::score::{extract_judgment, extract_score};
use super::trajectory::{Trajectory, TrajectoryTurn};
use crate::error::WorkflowError;
use crate::seed::{derive_seed, rng_for, tag};
use crate::task::TaskRecord;
use crate::turn::{ChatMessage, PromptMeter, Role, TurnOutput, TurnRequest, Unmetered};

#[derive(Debug, Clone)]
pub struct Episode {
    config: CoMasConfig,
    question: TaskRecord,
    instance: u32,
    plan: InstancePlan,
    seed: u64,
    round: u32,
    /// The role whose group is pending; `None` once the episode is finished.
    stage: Option<Role>,
    pending: Vec<TurnRequest>,
    /// Submitted turns; `turns[i].turn_index == i` because groups complete in order.
    turns: Vec<TrajectoryTurn>,
    discussions: Vec<String>,
    /// The pairs quoted in each round's discussion block, after any cut.
    shown: Vec<Vec<PairRef>>,
    /// Turn index of each solution, `[round][slot]`.
    solutions: Vec<Vec<u32>>,
    /// Turn index of each evaluation, `[round][slot][judge]`.
    evaluations: Vec<Vec<Vec<u32>>>,
}

impl Episode {
    /// Starts the episode of one instance; the first group (round-0 solvers) is pending at once.
    /// `seed` drives the discussion sampling and the per-turn sampler seeds.
    pub fn new(config: &CoMasConfig, question: &TaskRecord, instance: u32, plan: InstancePlan, seed: u64) -> Result<Self, WorkflowError> {
        Self::new_metered(config, question, instance, plan, seed, &Unmetered)
    }

    /// Like [`Episode::new`], with prompts fitted by `meter` (spec 3.7): a prompt that does not
    /// fit loses quoted discussion blocks, oldest first, until it fits or none is left.
    pub fn new_metered(
        config: &CoMasConfig,
        question: &TaskRecord,
        instance: u32,
        plan: InstancePlan,
        seed: u64,
        meter: &dyn PromptMeter,
    ) -> Result<Self, WorkflowError> {
        config.validate()?;
        plan.check(config)?;
        let mut episode = Episode {
            config: config.clone(),
            question: question.clone(),
            instance,
            plan,
            seed,
            round: 0,
            stage: Some(Role::Solver),
            pending: Vec::new(),
            turns: Vec::new(),
            discussions: Vec::new(),
            shown: Vec::new(),
            solutions: Vec::new(),
            evaluations: Vec::new(),
        };
        episode.open_group(meter);
        Ok(episode)
    }

    pub fn config(&self) -> &CoMasConfig {
        &self.config
    }

    pub fn instance(&self) -> u32 {
        self.instance
    }

    pub fn question(&self) -> &TaskRecord {
        &self.question
    }

    /// The round of the pending group (the last round once finished).
    pub fn round(&self) -> u32 {
        self.round
    }

    /// The role of the pending group; `None` once finished.
    pub fn stage(&self) -> Option<Role> {
        self.stage
    }

    /// The pending barrier group. Calling it again before `submit` returns the same requests, so
    /// a group lost with a worker can be handed out again. Empty once the episode is finished.
    pub fn next_turns(&self) -> Vec<TurnRequest> {
        self.pending.clone()
    }

    pub fn pending(&self) -> &[TurnRequest] {
        &self.pending
    }

    /// Turns submitted so far, in turn-index order.
    pub fn turns(&self) -> &[TrajectoryTurn] {
        &self.turns
    }

    pub fn is_done(&self) -> bool {
        self.stage.is_none()
    }

    /// Accepts the outputs of the whole pending group, in any order. Nothing changes when the
    /// outputs are rejected (unknown, duplicate or missing turn, wrong logprob count).
    pub fn submit(&mut self, outputs: Vec<TurnOutput>) -> Result<(), WorkflowError> {
        self.submit_metered(outputs, &Unmetered)
    }

    /// Like [`Episode::submit`], fitting the next group's prompts with `meter`.
    pub fn submit_metered(&mut self, outputs: Vec<TurnOutput>, meter: &dyn PromptMeter) -> Result<(), WorkflowError> {
        let Some(first) = self.pending.first().map(|t| t.turn_index) else {
            return Err(WorkflowError::EpisodeFinished);
        };
        let end = first + self.pending.len() as u32;
        let mut by_position: Vec<Option<TurnOutput>> = (0..self.pending.len()).map(|_| None).collect();
        for out in outputs {
            if !(first..end).contains(&out.turn_index) {
                return Err(WorkflowError::UnknownTurn { turn_index: out.turn_index, first, end });
            }
            let position = (out.turn_index - first) as usize;
            if by_position[position].is_some() {
                return Err(WorkflowError::DuplicateTurn(out.turn_index));
            }
            if out.logprobs.len() != out.completion_ids.len() {
                return Err(WorkflowError::LogprobCount { turn_index: out.turn_index, logprobs: out.logprobs.len(), tokens: out.completion_ids.len() });
            }
            if let Err(f) = crate::turn::check_constrained(&out.constrained, &out.completion_ids) {
                return Err(WorkflowError::MalformedTurn { turn_index: out.turn_index, message: f.to_string() });
            }
            by_position[position] = Some(out);
        }
        let missing: Vec<u32> = (first..end).filter(|&i| by_position[(i - first) as usize].is_none()).collect();
        if !missing.is_empty() {
            return Err(WorkflowError::MissingTurns(missing));
        }
        let no_scoring = self.config.variant == Variant::NoScoring;
        for (request, out) in self.pending.drain(..).zip(by_position.into_iter().flatten()) {
            let score = (request.role == Role::Scorer).then(|| extract_score(&out.text)).flatten();
            let judgment = (no_scoring && request.role == Role::Evaluator).then(|| extract_judgment(&out.text)).flatten();
            self.turns.push(TrajectoryTurn {
                turn_index: request.turn_index,
                agent: request.agent,
                role: request.role,
                round: request.round,
                slot: request.slot,
                judge_index: request.judge_index,
                about_solution: request.about_solution,
                about_evaluation: request.about_evaluation,
                prompt: request.messages.into_iter().map(|m| m.content).collect::<Vec<_>>().join("\n"),
                prompt_ids: out.prompt_ids,
                completion_ids: out.completion_ids,
                logprobs: out.logprobs,
                finish_reason: out.finish_reason,
                policy_version: out.policy_version,
                constrained: out.constrained,
                blocks_cut: request.blocks_cut,
                text: out.text,
                raw_text: out.raw_text,
                score,
                judgment,
            });
        }
        self.advance(meter);
        Ok(())
    }

    /// The finished record. Fails while turns are still pending.
    pub fn into_trajectory(self) -> Result<Trajectory, WorkflowError> {
        if let Some(role) = self.stage {
            return Err(WorkflowError::EpisodeNotFinished { round: self.round, role, pending: self.pending.len() });
        }
        let trajectory = Trajectory {
            question_id: self.question.id,
            task: self.question.task,
            instance: self.instance,
            num_agents: self.config.num_agents,
            num_rounds: self.config.num_rounds,
            evals_per_solution: self.config.evals_per_solution,
            variant: self.config.variant,
            discussions: self.discussions,
            turns: self.turns,
        };
        // Cheap, and turns an internal slip into an error instead of a wrong reward later.
        trajectory.validate()?;
        Ok(trajectory)
    }

    fn advance(&mut self, meter: &dyn PromptMeter) {
        let Some(role) = self.stage else { return };
        let roles = self.config.variant.roles();
        let next_in_round = roles.iter().skip_while(|&&r| r != role).nth(1).copied();
        self.stage = match next_in_round {
            Some(next) => Some(next),
            None if self.round + 1 < self.config.num_rounds => {
                self.round += 1;
                Some(Role::Solver)
            }
            None => None,
        };
        if self.stage.is_some() {
            self.open_group(meter);
        }
    }

    fn open_group(&mut self, meter: &dyn PromptMeter) {
        match self.stage {
            Some(Role::Solver) => self.open_solvers(meter),
            Some(Role::Evaluator) => self.open_evaluators(meter),
            Some(Role::Scorer) => self.open_scorers(),
            Some(_) | None => {}
        }
    }

    fn quote(&self, turn_index: u32) -> &str {
        // Every quoted index was recorded from a submitted group, so the lookup cannot miss.
        match self.turns.get(turn_index as usize) {
            Some(t) if self.config.quote_raw_completion => &t.raw_text,
            Some(t) => &t.text,
            None => "",
        }
    }

    fn next_index(&self) -> u32 {
        (self.turns.len() + self.pending.len()) as u32
    }

    #[allow(clippy::too_many_arguments)]
    fn push_request(
        &mut self,
        agent: u32,
        role: Role,
        slot: u32,
        judge_index: u32,
        about_solution: Option<u32>,
        about_evaluation: Option<u32>,
        prompt: String,
        blocks_cut: u32,
    ) -> u32 {
        let turn_index = self.next_index();
        self.pending.push(TurnRequest {
            turn_index,
            agent,
            role,
            round: self.round,
            slot,
            judge_index,
            about_solution,
            about_evaluation,
            messages: vec![ChatMessage::user(prompt)],
            sampling: self.config.sampling.for_role(role).clone(),
            seed: derive_seed(&[self.seed, tag::TURN_SAMPLING, u64::from(turn_index)]),
            blocks_cut,
        });
        turn_index
    }

    /// All finished pairs of earlier rounds in chronological order.
    fn history(&self) -> Vec<PairRef> {
        let mut pairs = Vec::new();
        for (r, slots) in self.solutions.iter().enumerate() {
            for (d, &solution) in slots.iter().enumerate() {
                match self.evaluations.get(r).and_then(|e| e.get(d)) {
                    Some(evals) if !evals.is_empty() => pairs.extend(evals.iter().map(|&e| PairRef { round: r as u32, solution, evaluation: Some(e) })),
                    _ => pairs.push(PairRef { round: r as u32, solution, evaluation: None }),
                }
            }
        }
        pairs
    }

    fn open_solvers(&mut self, meter: &dyn PromptMeter) {
        let r = self.round;
        let mut rng = rng_for(&[self.seed, tag::DISCUSSION, u64::from(r)]);
        let kappa = self.config.num_references as usize;
        let chosen = select_pairs(self.config.discussion_source, kappa, r, &self.history(), &mut rng);
        let (task, problem) = (self.question.task, self.question.prompt.as_str());
        let (shown, discussion, prompt) = fit_discussion(self, &chosen, |d| solver_prompt(task, problem, d), |p| meter.fits(Role::Solver, p));
        let cut = (chosen.len() - shown.len()) as u32;
        self.discussions.push(discussion);
        self.shown.push(shown);
        let indices: Vec<u32> = (0..self.config.num_agents).map(|d| self.push_request(d, Role::Solver, d, 0, None, None, prompt.clone(), cut)).collect();
        self.solutions.push(indices);
    }

    fn open_evaluators(&mut self, meter: &dyn PromptMeter) {
        let r = self.round as usize;
        let see = self.config.evaluator_sees_discussion;
        let mut round_evals = Vec::with_capacity(self.config.num_agents as usize);
        for d in 0..self.config.num_agents as usize {
            let solution = self.solutions[r][d];
            let (task, problem, quoted) = (self.question.task, self.question.prompt.as_str(), self.quote(solution));
            let render = |discussion: Option<&str>| match self.config.variant {
                Variant::NoScoring => verdict_prompt(task, problem, quoted, discussion),
                _ => evaluator_prompt(task, problem, quoted, discussion),
            };
            // An evaluator that sees the discussion sees the solvers' blocks, cut the same way
            // if its longer prompt needs it; the solution under review is never cut.
            let (prompt, cut) = if see {
                let pairs = &self.shown[r];
                let (kept, _, prompt) = fit_discussion(self, pairs, |dsc| render(Some(dsc)), |p| meter.fits(Role::Evaluator, p));
                (prompt, (pairs.len() - kept.len()) as u32)
            } else {
                (render(None), 0)
            };
            let judges = self.plan.rounds[r].evaluators[d].clone();
            let slot_evals: Vec<u32> = judges
                .iter()
                .enumerate()
                .map(|(k, &agent)| self.push_request(agent, Role::Evaluator, d as u32, k as u32, Some(solution), None, prompt.clone(), cut))
                .collect();
            round_evals.push(slot_evals);
        }
        self.evaluations.push(round_evals);
    }

    fn open_scorers(&mut self) {
        let r = self.round as usize;
        let task = self.question.task;
        for d in 0..self.config.num_agents as usize {
            let solution = self.solutions[r][d];
            let judges = self.plan.rounds[r].scorers[d].clone();
            for (k, &agent) in judges.iter().enumerate() {
                let (prompt, evaluation) = if self.config.variant.has_evaluators() {
                    let evaluation = self.evaluations[r][d][k];
                    let p = scorer_prompt(task, &self.question.prompt, self.quote(solution), self.quote(evaluation));
                    (p, Some(evaluation))
                } else {
                    (judge_prompt(task, &self.question.prompt, self.quote(solution)), None)
                };
                self.push_request(agent, Role::Scorer, d as u32, k as u32, Some(solution), evaluation, prompt, 0);
            }
        }
    }
}

/// The pairs to quote, the discussion block and the prompt that `render` makes of it: all of
/// `pairs` if the prompt `fits`, else with whole pairs left out, oldest first (lowest solution
/// turn index), the rest in their order (spec 3.7). With every pair cut the block reads as an
/// empty discussion; whether that prompt fits is for the caller to find out.
fn fit_discussion(episode: &Episode, pairs: &[PairRef], render: impl Fn(&str) -> String, fits: impl Fn(&str) -> bool) -> (Vec<PairRef>, String, String) {
    let mut by_age: Vec<usize> = (0..pairs.len()).collect();
    by_age.sort_by_key(|&i| (pairs[i].round, pairs[i].solution, pairs[i].evaluation));
    let mut kept = pairs.to_vec();
    for cut in 0..=pairs.len() {
        if cut > 0 {
            let oldest = pairs[by_age[cut - 1]];
            kept.retain(|p| *p != oldest);
        }
        let entries: Vec<DiscussionEntry<'_>> =
            kept.iter().map(|p| DiscussionEntry { solution: episode.quote(p.solution), evaluation: p.evaluation.map(|e| episode.quote(e)) }).collect();
        let discussion = render_discussion(&entries);
        let prompt = render(&discussion);
        if cut == pairs.len() || fits(&prompt) {
            return (kept, discussion, prompt);
        }
    }
    unreachable!("the last pass returns")
}
