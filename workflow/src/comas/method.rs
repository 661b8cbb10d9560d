//! CoMAS on the method seam: its `[comas]` table, one game per question instance with the
//! judges planned for the whole step, the zero-sum rewards, and how its figures are shown.
use crate::method::RecordFault;
use super::experience::{make_step_with, Finished};
use super::metrics::ComasMetrics;
use super::{plan_batch, CoMasConfig, Episode, InstancePlan, Trajectory};
use crate::error::WorkflowError;
use crate::error::{invalid, JobError};
use crate::method::{dataset_task, Chart, JobView, Line, Made, Method, PromptFit, ReplyRoom, RoomNeeds, Row, Samples, Speaker, StepContext, Summary, TaskRoom, Unit};
use crate::program::{PolicyTurn, Reply};
use crate::seed::PlanSeed;
use crate::task::TaskRecord;
use crate::train_config::TrainDefaults;
use crate::turn::{PromptMeter, Role};
use std::collections::HashMap;

/// CoMAS (spec comas.md).
pub struct CoMas;

impl crate::method::Episode for Episode {
    type Record = Trajectory;

    fn pending(&self) -> Vec<crate::program::Request> {
        self.next_turns().into_iter().map(crate::program::Request::Turn).collect()
    }

    fn submit(&mut self, replies: Vec<Reply>, meter: &dyn PromptMeter) -> Result<(), WorkflowError> {
        let mut outputs = Vec::with_capacity(replies.len());
        for r in replies {
            match r {
                Reply::Turn(t) => outputs.push(t),
                Reply::Tool(t) => return Err(WorkflowError::MalformedTurn { turn_index: t.call_index, message: "a CoMAS game runs no tools".into() }),
            }
        }
        self.submit_metered(outputs, meter)
    }

    fn is_done(&self) -> bool {
        Episode::is_done(self)
    }

    fn finish(self) -> Result<Trajectory, WorkflowError> {
        self.into_trajectory()
    }
}

impl crate::method::Record for Trajectory {
    fn turns(&self) -> u32 {
        self.turns.len() as u32
    }

    fn completion_tokens(&self) -> u64 {
        self.turns.iter().map(|t| t.completion_ids.len() as u64).sum()
    }

    fn policy_turns(&self) -> Vec<PolicyTurn> {
        Trajectory::policy_turns(self)
    }

    fn shift_versions(&mut self, by: u64) {
        self.turns.iter_mut().for_each(|t| t.policy_version += by);
    }
}

impl Method for CoMas {
    const NAME: &'static str = "comas";
    const CHART_GROUPS: &'static [&'static str] = &["judging"];

    type Config = CoMasConfig;
    type Task = TaskRecord;
    type Plan = InstancePlan;
    type Episode = Episode;
    type Record = Trajectory;
    type Metrics = ComasMetrics;

    fn configure(mut table: toml::Table, job: &JobView<'_>) -> Result<CoMasConfig, JobError> {
        let l = job.agents;
        if let Some(v) = table.get("num_agents") {
            if v.as_integer() != Some(i64::from(l)) {
                return Err(invalid("comas.num_agents", format!("is {v} but {l} [[agents]] are listed; leave it out, it follows the agent list")));
            }
        }
        table.insert("num_agents".into(), toml::Value::Integer(i64::from(l)));
        let cfg: CoMasConfig = crate::method::read_settings(toml::Value::Table(table), "comas")?;
        cfg.validate().map_err(|e| invalid("comas", e.to_string()))?;
        Ok(cfg)
    }

    fn train_defaults(c: &CoMasConfig) -> TrainDefaults {
        // Every experience carries its role's sampling temperature and is scored at it; this is
        // only the default for experiences that carry none (greedy roles).
        let t = Role::COMAS.iter().map(|&r| c.sampling.for_role(r).temperature).find(|&t| t > 0.0);
        TrainDefaults { temperature: Some(t.unwrap_or(1.0)), ..TrainDefaults::default() }
    }

    fn samples(c: &CoMasConfig, _agent: u32, episodes: u64) -> Samples {
        // Every agent solves once per round; the judge turns are spread evenly over the agents
        // (exact for the balanced assignment).
        let least = episodes * c.turns_per_instance() / u64::from(c.num_agents);
        Samples { least, most: least, why: format!("{episodes} episodes x {} turns / {} agents", c.turns_per_instance(), c.num_agents) }
    }

    fn room(c: &CoMasConfig) -> RoomNeeds {
        let replies = Role::COMAS
            .iter()
            .map(|&role| ReplyRoom {
                speaker: Speaker::Agents,
                key: format!("comas.sampling.{role}.max_new_tokens"),
                name: format!("sampling.{role}.max_new_tokens"),
                new_tokens: u64::from(c.sampling.for_role(role).max_new_tokens),
                beside: None,
            })
            .collect();
        let solver = u64::from(c.sampling.solver.max_new_tokens);
        RoomNeeds {
            replies,
            // A question is quoted whole in the solver's prompt.
            task: TaskRoom { tokens: solver, why: format!("sampling.solver.max_new_tokens {solver}") },
            prompt_max_len: c.prompt_max_len.map(|p| (u64::from(p), "comas.prompt_max_len".to_string())),
        }
    }

    fn for_evaluation(c: &CoMasConfig, instances: u32, temperature: f64) -> CoMasConfig {
        let mut c = c.clone();
        c.instances_per_question = instances;
        for s in [&mut c.sampling.solver, &mut c.sampling.evaluator, &mut c.sampling.scorer] {
            s.temperature = temperature;
        }
        c
    }

    fn copies(c: &CoMasConfig) -> u32 {
        c.instances_per_question
    }

    fn task(_: &CoMasConfig, index: usize, data: &[TaskRecord], _: PlanSeed) -> Result<TaskRecord, WorkflowError> {
        dataset_task(data, index)
    }

    fn plans(c: &CoMasConfig, episodes: usize, seed: PlanSeed) -> Result<Vec<InstancePlan>, WorkflowError> {
        Ok(plan_batch(c, episodes, seed)?.instances)
    }

    fn speakers(c: &CoMasConfig, _: &InstancePlan) -> Vec<u32> {
        (0..c.num_agents).collect()
    }

    fn prompt_fit(c: &CoMasConfig) -> PromptFit {
        // Spec 3.7: a prompt too long for the room loses quoted discussion blocks.
        PromptFit {
            max_len: c.prompt_max_len.map(|p| (p, "comas.prompt_max_len".to_string())),
            fitted: Role::COMAS.iter().map(|&r| (r, c.sampling.for_role(r).max_new_tokens)).collect(),
            agents: (0..c.num_agents).collect(),
        }
    }

    fn start(c: &CoMasConfig, task: &TaskRecord, plan: InstancePlan, instance: u32, seed: u64, meter: &dyn PromptMeter) -> Result<Episode, WorkflowError> {
        Episode::new_metered(c, task, instance, plan, seed, meter)
    }

    fn check(_: &CoMasConfig, t: &Trajectory) -> Result<(), RecordFault> {
        t.validate().map_err(|e| RecordFault::Shape(e.to_string()))
    }

    fn experience(c: &CoMasConfig, records: Vec<(String, Trajectory)>, step: &StepContext<'_>) -> Result<Made<ComasMetrics>, WorkflowError> {
        // The question's reference answer, for logging (and the verifier control's solvers).
        let by_id: HashMap<&str, &TaskRecord> = step.data.iter().map(|q| (q.id.as_str(), q)).collect();
        let finished: Vec<Finished> = records
            .into_iter()
            .map(|(episode_id, trajectory)| {
                let answer = by_id.get(trajectory.question_id.as_str()).map(|q| q.answer.clone()).unwrap_or_default();
                Finished { episode_id, trajectory, answer }
            })
            .collect();
        let warm_judges = step.step.is_some_and(|s| s < c.judge_warmup_steps);
        make_step_with(&finished, step.agents, step.with_temperatures.then_some(&c.sampling), c.reward, warm_judges)
    }

    fn watch(m: &ComasMetrics) -> Vec<String> {
        let mut parts = Vec::new();
        if let Some(p) = m.team.parse_failure_rate {
            parts.push(format!("invalid scores {:.0}%", p * 100.0));
        }
        if let Some(a) = m.team.accuracy.last_round {
            parts.push(format!("accuracy {:.0}%", a * 100.0));
        }
        if let Some(s) = m.team.judge_separation {
            parts.push(format!("judges separate {s:+.2}"));
        }
        parts
    }

    fn summary(m: &ComasMetrics) -> Summary {
        let accuracy = m.team.accuracy.last_round;
        let mut rows = vec![
            Row::new("held-out accuracy", accuracy, Unit::Share),
            Row::new("score parse rate", m.team.parse_failure_rate.map(|f| 1.0 - f), Unit::Share),
        ];
        for (role, r) in [("solver", m.team.reward.solver), ("evaluator", m.team.reward.evaluator), ("scorer", m.team.reward.scorer)] {
            rows.push(Row::new(format!("mean reward, {role}"), r.and_then(|s| s.mean), Unit::Signed));
        }
        Summary { accuracy, graded: Some(m.team.accuracy.last_round_graded), rows }
    }

    fn charts(steps: &[ComasMetrics]) -> Vec<Chart> {
        let line = |name: &str, colour: usize, f: &dyn Fn(&ComasMetrics) -> Option<f64>| Line {
            name: name.to_string(),
            colour: Some(colour),
            values: steps.iter().map(f).collect(),
        };
        vec![
            Chart {
                group: "judging",
                key: "judging.rates",
                title: "Score parse and approval rates",
                needs: "score_parse_rate or approval_rate in the step records",
                share: true,
                lines: vec![line("score parse rate", 0, &|m| m.team.score_parse_rate), line("approval rate", 1, &|m| m.team.approval_rate)],
            },
            Chart {
                group: "judging",
                key: "judging.correctness",
                title: "Solver reward: correct vs wrong",
                needs: "solver_reward_by_correctness.{correct,wrong}.mean in the step records",
                share: false,
                lines: vec![
                    line("correct", 2, &|m| m.team.solver_reward_by_correctness.correct.mean),
                    line("wrong", 3, &|m| m.team.solver_reward_by_correctness.wrong.mean),
                ],
            },
            Chart {
                group: "judging",
                key: "judging.separation",
                title: "Judge scores of right minus wrong solutions",
                needs: "judge_separation in the step records",
                share: false,
                lines: vec![line("E[score | right] - E[score | wrong]", 0, &|m| m.team.judge_separation)],
            },
        ]
    }
}
