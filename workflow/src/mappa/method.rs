//! MAPPA on the method seam: its `[mappa]` table (roles mapped to agents, the coach named by its
//! `[[frozen]]` entry), one chain per question instance, each coached action one sample for
//! the agent that acted (spec 5), and its coaching figures.
use crate::method::RecordFault;
use super::{action_rewards, Episode, MappaConfig, MappaMetrics, MappaTrajectory, NormScope, Pipeline};
use crate::error::WorkflowError;
use crate::error::{invalid, JobError};
use crate::mean::Mean;
use crate::method::{
    dataset_task, prompt_group, Chart, Experience, JobView, Line, Made, Method, ReplyRoom, RoomNeeds, Row, Samples, ShareTally, Shares, Speaker, StepContext, Summary,
    TaskRoom, Unit,
};
use crate::program::{PolicyTurn, Reply, Request};
use crate::seed::PlanSeed;
use crate::task::TaskRecord;
use crate::train_config::{TrainConfig, TrainDefaults};
use crate::turn::PromptMeter;

/// β of MAPPA's KL penalty in the reward when an agent's training settings leave it out.
pub const MAPPA_KL_COEF: f64 = 0.01;

/// MAPPA (spec mappa.md).
pub struct Mappa;

/// A step's figures: the coaching, and each agent's share.
pub type MappaStep = Shares<MappaMetrics>;

impl crate::method::Episode for Episode {
    type Record = MappaTrajectory;

    fn pending(&self) -> Vec<Request> {
        Episode::pending(self).to_vec()
    }

    fn submit(&mut self, replies: Vec<Reply>, _: &dyn PromptMeter) -> Result<(), WorkflowError> {
        Episode::submit(self, replies)
    }

    fn is_done(&self) -> bool {
        Episode::is_done(self)
    }

    fn finish(self) -> Result<MappaTrajectory, WorkflowError> {
        self.into_trajectory()
    }
}

impl crate::method::Record for MappaTrajectory {
    fn turns(&self) -> u32 {
        self.actions.len() as u32
    }

    fn completion_tokens(&self) -> u64 {
        MappaTrajectory::completion_tokens(self)
    }

    fn policy_turns(&self) -> Vec<PolicyTurn> {
        MappaTrajectory::policy_turns(self)
    }

    fn shift_versions(&mut self, by: u64) {
        self.actions.iter_mut().for_each(|a| a.sampled.policy_version += by);
    }
}

impl Method for Mappa {
    const NAME: &'static str = "mappa";
    const CALLS_FROZEN: bool = true;
    const CHART_GROUPS: &'static [&'static str] = &["coaching"];

    type Config = MappaConfig;
    type Task = TaskRecord;
    type Plan = ();
    type Episode = Episode;
    type Record = MappaTrajectory;
    type Metrics = MappaStep;

    /// The role → agent map defaults from the agent list, and the coach is named by its
    /// `[[frozen]]` entry.
    fn configure(mut table: toml::Table, job: &JobView<'_>) -> Result<MappaConfig, JobError> {
        let l = job.agents;
        if table.contains_key("coach_agent") {
            return Err(invalid("mappa.coach_agent", "is set by the job; name the coach's [[frozen]] model with `coach = \"NAME\"` instead"));
        }
        let coach = match table.remove("coach") {
            None => "coach".to_string(),
            Some(toml::Value::String(s)) => s,
            Some(v) => return Err(invalid("mappa.coach", format!("must be the name of a [[frozen]] model, got {v}"))),
        };
        let Some(c) = job.frozen.iter().position(|name| *name == coach) else {
            return Err(invalid("mappa.coach", format!("no [[frozen]] model is named {coach:?}; add one with name = {coach:?} and the coach's model folder")));
        };
        table.insert("coach_agent".into(), toml::Value::Integer(i64::from(l) + c as i64));
        // The pipeline's own defaults where the file leaves them out (DSBench: 4 / 4 / 4, 60 s).
        if let Some(p) = table.get("pipeline").cloned() {
            let pipeline: Pipeline = crate::method::read_settings(p, "mappa.pipeline")?;
            table
                .entry("max_turns")
                .or_insert_with(|| toml::Value::Array(pipeline.default_max_turns().into_iter().map(|t| toml::Value::Integer(i64::from(t))).collect()));
            table.entry("tool_timeout_secs").or_insert(toml::Value::Float(pipeline.default_tool_timeout_secs()));
        }
        if !table.contains_key("agents") {
            let agents: Vec<toml::Value> = match l {
                1 => vec![0; 3],
                3 => vec![0, 1, 2],
                _ => {
                    return Err(invalid(
                        "mappa.agents",
                        format!("the chain has 3 roles and the job lists {l} agents; list 1 or 3 [[agents]], or map roles to agents with `agents = [..]`"),
                    ))
                }
            }
            .into_iter()
            .map(toml::Value::Integer)
            .collect();
            table.insert("agents".into(), toml::Value::Array(agents));
        }
        let cfg: MappaConfig = crate::method::read_settings(toml::Value::Table(table), "mappa")?;
        cfg.validate().map_err(|(k, m)| invalid(format!("mappa.{k}"), m))?;
        if let Some(a) = cfg.agents.iter().find(|&&a| a >= l) {
            return Err(invalid("mappa.agents", format!("names agent {a} but the job lists {l} [[agents]]")));
        }
        if let Some(k) = (0..l).find(|k| !cfg.agents.contains(k)) {
            return Err(invalid("mappa.agents", format!("agent {k} plays no role, so it would never train; map a role to it or remove it")));
        }
        Ok(cfg)
    }

    fn train_defaults(c: &MappaConfig) -> TrainDefaults {
        // MAPPA keeps a k1 KL penalty in the reward (spec mappa.md §5).
        TrainDefaults { temperature: Some(crate::method::temperature_or_one(c.sampling.temperature)), kl_coef: Some(MAPPA_KL_COEF), ..TrainDefaults::default() }
    }

    /// The global scope pools whitening statistics, so every agent must whiten.
    fn check_training(c: &MappaConfig, train: &[TrainConfig]) -> Result<(), JobError> {
        if c.norm_scope != NormScope::Global {
            return Ok(());
        }
        match train.iter().enumerate().find(|(_, t)| !t.estimator.whitens()) {
            None => Ok(()),
            Some((k, t)) => Err(invalid(
                "mappa.norm_scope",
                format!(
                    "is global, which pools the statistics that advantages are whitened with, but agents[{k}].train.estimator = {} does not whiten; use reinforce or reinforce_baseline, or norm_scope = \"per_agent\"",
                    serde_json::to_string(&t.estimator).unwrap_or_default()
                ),
            )),
        }
    }

    /// At least one action per role the agent plays; at most every action its roles may take
    /// (a Code Executor calling its tool acts more than once).
    fn samples(c: &MappaConfig, agent: u32, episodes: u64) -> Samples {
        let roles = c.agents.iter().filter(|&&a| a == agent).count() as u64;
        let actions: u64 = c.agents.iter().zip(&c.max_turns).filter(|(&a, _)| a == agent).map(|(_, &t)| u64::from(t)).sum();
        Samples { least: roles * episodes, most: actions * episodes, why: format!("{episodes} episodes x {roles} roles, one action each at least") }
    }

    /// Each agent's actions and the coach's replies must leave room for a prompt in their
    /// models' contexts.
    fn room(c: &MappaConfig) -> RoomNeeds {
        let new = u64::from(c.max_new_tokens());
        let mut room = RoomNeeds::one_reply("mappa.sampling.max_new_tokens (the longest of any role)", "sampling.max_new_tokens", new);
        room.task = TaskRoom { tokens: new, why: format!("sampling.max_new_tokens {new}") };
        let agents = c.agents.iter().copied().max().map_or(0, |a| a + 1);
        room.replies.push(ReplyRoom {
            speaker: Speaker::Frozen(c.coach_agent.saturating_sub(agents) as usize),
            key: "mappa.coach_sampling.max_new_tokens".into(),
            name: "coach_sampling.max_new_tokens".into(),
            new_tokens: u64::from(c.coach_sampling.max_new_tokens),
            beside: None,
        });
        room.prompt_max_len = c.prompt_max_len.map(|p| (u64::from(p), "mappa.prompt_max_len".to_string()));
        room
    }

    /// A coach keeps its own sampling.
    fn for_evaluation(c: &MappaConfig, instances: u32, temperature: f64) -> MappaConfig {
        let mut c = c.clone();
        c.instances_per_question = instances;
        c.sampling.temperature = temperature;
        c.role_sampling.values_mut().for_each(|s| s.temperature = temperature);
        c
    }

    fn copies(c: &MappaConfig) -> u32 {
        c.instances_per_question
    }

    fn task(_: &MappaConfig, index: usize, data: &[TaskRecord], _: PlanSeed) -> Result<TaskRecord, WorkflowError> {
        dataset_task(data, index)
    }

    fn plans(_: &MappaConfig, episodes: usize, _: PlanSeed) -> Result<Vec<()>, WorkflowError> {
        Ok(vec![(); episodes])
    }

    fn speakers(c: &MappaConfig, _: &()) -> Vec<u32> {
        let mut a = c.agents.clone();
        a.push(c.coach_agent);
        a.sort_unstable();
        a.dedup();
        a
    }

    fn prompt_fit(c: &MappaConfig) -> crate::method::PromptFit {
        crate::method::PromptFit { max_len: c.prompt_max_len.map(|p| (p, "mappa.prompt_max_len".to_string())), ..Default::default() }
    }

    fn start(c: &MappaConfig, task: &TaskRecord, _: (), instance: u32, seed: u64, _: &dyn PromptMeter) -> Result<Episode, WorkflowError> {
        Episode::new(c, task, instance, seed)
    }

    fn check(c: &MappaConfig, t: &MappaTrajectory) -> Result<(), RecordFault> {
        t.validate(c.pipeline.roles(), &c.max_turns)
    }

    /// Each coached action is one sample for the agent that acted, with the exact context it
    /// saw as its prompt and R = w_p · scale · score (spec 5); actions the coach could not score
    /// are left out and counted.
    fn experience(c: &MappaConfig, records: Vec<(String, MappaTrajectory)>, step: &StepContext<'_>) -> Result<Made<MappaStep>, WorkflowError> {
        let mut tally = ShareTally::new(step.agents, true);
        for (episode_id, t) in &records {
            for (a, r) in t.actions.iter().zip(action_rewards(c, t)) {
                let what = format!("action {}", a.turn_index);
                let Some(reward) = r.reward else {
                    tally.drop_turn(a.agent, episode_id, &what)?;
                    continue;
                };
                // Only actions from one and the same state share a group (spec 5).
                let group = prompt_group(&t.question_id, a.role, a.step, &a.sampled.prompt_ids);
                let mut e = Experience::sampled(&a.sampled, reward, group, episode_id, a.turn_index, c.sampling_for(a.role).temperature);
                e.norm_group = match c.norm_scope {
                    NormScope::PerAgent | NormScope::Global => String::new(),
                    NormScope::PerAgentRole => a.role.as_str().to_string(),
                };
                tally.push(a.agent, e, episode_id, &what)?;
            }
        }
        let trajectories: Vec<&MappaTrajectory> = records.iter().map(|(_, t)| t).collect();
        let figures = MappaMetrics::of(c, &trajectories);
        let (per_agent, agents) = tally.finish();
        Ok(Made { per_agent, metrics: Shares { figures, agents }, pooled_whitening: c.norm_scope == NormScope::Global })
    }

    /// The coach score by role, the share of actions scored, tool runs that ran cleanly and the
    /// last agent's answers (logged only).
    fn watch(m: &MappaStep) -> Vec<String> {
        let mm = &m.figures;
        let by_role: Vec<String> = mm.coach_score.iter().map(|(role, s)| format!("{role} {}", s.mean.map_or("-".into(), |v| format!("{v:.1}")))).collect();
        let share = |s: Mean| s.mean.map_or("-".into(), |v| format!("{:.0}%", v * 100.0));
        let mut parts = vec![
            format!("coach {}", by_role.join(" ")),
            format!("scored {}/{}", mm.samples, mm.samples + mm.samples_dropped),
            format!("tool runs ok {} of {}", share(mm.tool_success_rate), mm.tool_calls),
        ];
        if mm.ds_success_rate.count > 0 {
            // DSBench: how many submissions could be scored, and their mean accuracy or error.
            let mut s = format!("submissions scored {}", share(mm.ds_success_rate));
            for (key, name) in [("accuracy", "accuracy"), ("rmse_pct_range", "RMSE % of range")] {
                if let Some(v) = mm.ds_metrics.get(key).and_then(|m| m.mean) {
                    s.push_str(&format!(" {name} {v:.2}"));
                }
            }
            parts.push(s);
        } else {
            parts.push(format!("answers right {}", share(mm.outcome_accuracy)));
        }
        parts
    }

    /// The last agent's answers, the tools and the coach's score per role.
    fn summary(m: &MappaStep) -> Summary {
        let mm = &m.figures;
        let accuracy = mm.outcome_accuracy.mean;
        let mut rows = vec![Row::new("answers right", accuracy, Unit::Share), Row::new("tool runs ok", mm.tool_success_rate.mean, Unit::Share)];
        rows.extend(mm.coach_score.iter().map(|(r, s)| Row::new(format!("coach score, {r}"), s.mean, Unit::Number)));
        Summary { accuracy, graded: Some(mm.outcome_accuracy.count), rows }
    }

    fn charts(steps: &[MappaStep]) -> Vec<Chart> {
        let mut roles: Vec<&String> = steps.iter().flat_map(|m| m.figures.coach_score.keys()).collect();
        roles.sort();
        roles.dedup();
        let scores = roles
            .iter()
            .map(|role| Line { name: role.to_string(), colour: None, values: steps.iter().map(|m| m.figures.coach_score.get(*role).and_then(|s| s.mean)).collect() })
            .collect();
        let kept = |m: &MappaStep| {
            let (kept, dropped) = (m.figures.samples as f64, m.figures.samples_dropped as f64);
            (kept + dropped > 0.0).then(|| kept / (kept + dropped))
        };
        let line = |name: &str, colour: usize, f: &dyn Fn(&MappaStep) -> Option<f64>| Line { name: name.into(), colour: Some(colour), values: steps.iter().map(f).collect() };
        vec![
            Chart {
                group: "coaching",
                key: "coaching.score",
                title: "Coach score (0-10) by role",
                needs: "coach_score.<role>.mean in the step records",
                share: false,
                lines: scores,
            },
            Chart {
                group: "coaching",
                key: "coaching.rates",
                title: "Tools, answers and scored actions",
                needs: "tool_success_rate, outcome_accuracy or samples in the step records",
                share: true,
                lines: vec![
                    line("tool success", 0, &|m| m.figures.tool_success_rate.mean),
                    line("answer correct (logged only)", 1, &|m| m.figures.outcome_accuracy.mean),
                    line("actions scored", 2, &kept),
                ],
            },
        ]
    }
}
