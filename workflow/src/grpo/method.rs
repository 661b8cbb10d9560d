//! GRPO on the method seam: the `[grpo]` table, G episodes per question in which every agent
//! answers once, each answer one sample for its agent with the grader's reward, grouped by
//! question and agent, and its figures.
use crate::method::RecordFault;
use super::config::GrpoConfig;
use super::episode::{Episode, GrpoRecord};
use super::metrics::GrpoMetrics;
use super::reward::grade;
use crate::error::WorkflowError;
use crate::error::{invalid, JobError};
use crate::mean::Mean;
use crate::method::{
    dataset_task, temperature_or_one, Chart, Experience, JobView, Line, Made, Method, PromptFit, RoomNeeds, Row, Samples, ShareTally, Shares, StepContext,
    Summary, Unit,
};
use crate::program::{PolicyTurn, Reply, Request};
use crate::seed::PlanSeed;
use crate::task::TaskRecord;
use crate::train_config::{Estimator, TrainDefaults};
use crate::turn::PromptMeter;

/// GRPO: single-agent reinforcement learning with verifiable rewards.
pub struct Grpo;

/// A step's figures: the answers, and each agent's share.
pub type GrpoStep = Shares<GrpoMetrics>;

impl crate::method::Episode for Episode {
    type Record = GrpoRecord;

    fn pending(&self) -> Vec<Request> {
        Episode::pending(self).to_vec()
    }

    fn submit(&mut self, replies: Vec<Reply>, _: &dyn PromptMeter) -> Result<(), WorkflowError> {
        Episode::submit(self, replies)
    }

    fn is_done(&self) -> bool {
        Episode::is_done(self)
    }

    fn finish(self) -> Result<GrpoRecord, WorkflowError> {
        self.into_record()
    }
}

impl crate::method::Record for GrpoRecord {
    fn turns(&self) -> u32 {
        self.answers.len() as u32
    }

    fn completion_tokens(&self) -> u64 {
        GrpoRecord::completion_tokens(self)
    }

    fn policy_turns(&self) -> Vec<PolicyTurn> {
        GrpoRecord::policy_turns(self)
    }

    fn shift_versions(&mut self, by: u64) {
        self.answers.iter_mut().for_each(|a| a.sampled.policy_version += by);
    }
}

fn pct(m: Mean) -> String {
    m.mean.map_or("-".into(), |v| format!("{:.0}%", v * 100.0))
}

impl Method for Grpo {
    const NAME: &'static str = "grpo";
    const CHART_GROUPS: &'static [&'static str] = &["grading"];

    type Config = GrpoConfig;
    type Task = TaskRecord;
    type Plan = ();
    type Episode = Episode;
    type Record = GrpoRecord;
    type Metrics = GrpoStep;

    /// The settings, with one answering agent per [[agents]] entry.
    fn configure(mut table: toml::Table, job: &JobView<'_>) -> Result<GrpoConfig, JobError> {
        if table.contains_key("agents") {
            return Err(invalid("grpo.agents", "is set by the job: every [[agents]] entry answers every question"));
        }
        table.insert("agents".into(), toml::Value::Integer(i64::from(job.agents)));
        let cfg: GrpoConfig = crate::method::read_settings(toml::Value::Table(table), "grpo")?;
        cfg.validate().map_err(|(k, m)| invalid(format!("grpo.{k}"), m))?;
        Ok(cfg)
    }

    /// GRPO's advantage: each answer's reward normalised over the G answers its agent gave
    /// the question. No KL term by default, as TRL's GRPOTrainer (β = 0: no reference model).
    fn train_defaults(c: &GrpoConfig) -> TrainDefaults {
        TrainDefaults { temperature: Some(temperature_or_one(c.sampling.temperature)), estimator: Some(Estimator::GroupNorm), ..TrainDefaults::default() }
    }

    fn samples(_: &GrpoConfig, _agent: u32, episodes: u64) -> Samples {
        Samples { least: episodes, most: episodes, why: format!("{episodes} episodes x 1 answer") }
    }

    fn room(c: &GrpoConfig) -> RoomNeeds {
        let mut room = RoomNeeds::one_reply("grpo.sampling.max_new_tokens", "sampling.max_new_tokens", u64::from(c.sampling.max_new_tokens));
        room.prompt_max_len = c.prompt_max_len.map(|p| (u64::from(p), "grpo.prompt_max_len".to_string()));
        room
    }

    fn for_evaluation(c: &GrpoConfig, instances: u32, temperature: f64) -> GrpoConfig {
        GrpoConfig { group_size: instances, sampling: crate::turn::SamplingSpec { temperature, ..c.sampling.clone() }, ..c.clone() }
    }

    fn copies(c: &GrpoConfig) -> u32 {
        c.group_size
    }

    fn task(_: &GrpoConfig, index: usize, data: &[TaskRecord], _: PlanSeed) -> Result<TaskRecord, WorkflowError> {
        dataset_task(data, index)
    }

    fn plans(_: &GrpoConfig, episodes: usize, _: PlanSeed) -> Result<Vec<()>, WorkflowError> {
        Ok(vec![(); episodes])
    }

    fn speakers(c: &GrpoConfig, _: &()) -> Vec<u32> {
        (0..c.agents).collect()
    }

    fn prompt_fit(c: &GrpoConfig) -> PromptFit {
        PromptFit { max_len: c.prompt_max_len.map(|p| (p, "grpo.prompt_max_len".to_string())), ..PromptFit::default() }
    }

    fn start(c: &GrpoConfig, task: &TaskRecord, _: (), instance: u32, seed: u64, _: &dyn PromptMeter) -> Result<Episode, WorkflowError> {
        Episode::new(c, task, instance, seed)
    }

    fn check(c: &GrpoConfig, r: &GrpoRecord) -> Result<(), RecordFault> {
        r.validate(c)
    }

    /// Every answer is one sample for its agent with the grader's reward; the answers one agent
    /// gave one question form the group its advantage is normalised over.
    fn experience(c: &GrpoConfig, records: Vec<(String, GrpoRecord)>, step: &StepContext<'_>) -> Result<Made<GrpoStep>, WorkflowError> {
        let mut tally = ShareTally::new(step.agents, false);
        for (episode_id, r) in &records {
            for a in &r.answers {
                let g = grade(r.grader, &c.reward, c.sampling.max_new_tokens, a, &r.task.answer);
                let group = format!("{}/a{}", r.task.id, a.agent);
                let e = Experience::sampled(&a.sampled, g.reward, group, episode_id, a.turn_index, c.sampling.temperature);
                tally.push(a.agent, e, episode_id, &format!("answer {}", a.turn_index))?;
            }
        }
        let all: Vec<&GrpoRecord> = records.iter().map(|(_, r)| r).collect();
        let (per_agent, agents) = tally.finish();
        Ok(Made { per_agent, metrics: Shares { figures: GrpoMetrics::of(c, &all), agents }, pooled_whitening: false })
    }

    /// Answers right and readable, pass@G, the groups that teach nothing and the length.
    fn watch(m: &GrpoStep) -> Vec<String> {
        let g = &m.figures;
        vec![
            format!("right {}", pct(g.accuracy)),
            format!("readable {}", pct(g.readable_rate)),
            format!("pass@group {}", pct(g.pass_at_group)),
            format!("equal groups {}/{}", g.equal_groups, g.groups),
            format!("length {}", g.completion_tokens.mean.map_or("-".into(), |v| format!("{v:.0}"))),
        ]
    }

    fn summary(m: &GrpoStep) -> Summary {
        let g = &m.figures;
        let accuracy = g.accuracy.mean;
        let rows = vec![
            Row::new("held-out accuracy", accuracy, Unit::Share),
            Row::new("readable answers", g.readable_rate.mean, Unit::Share),
            Row::new("cut at max_new_tokens", g.truncation_rate.mean, Unit::Share),
            Row::new("mean reward", g.reward.mean, Unit::Signed),
            Row::new("answer tokens", g.completion_tokens.mean, Unit::Number),
        ];
        Summary { accuracy, graded: Some(g.accuracy.count), rows }
    }

    fn charts(steps: &[GrpoStep]) -> Vec<Chart> {
        let line = |name: &str, colour: usize, f: &dyn Fn(&GrpoMetrics) -> Option<f64>| Line {
            name: name.into(),
            colour: Some(colour),
            values: steps.iter().map(|s| f(&s.figures)).collect(),
        };
        let equal = |g: &GrpoMetrics| (g.groups > 0).then(|| g.equal_groups as f64 / g.groups as f64);
        vec![Chart {
            group: "grading",
            key: "grading.rates",
            title: "Answers: right, readable, cut; groups that teach nothing",
            needs: "accuracy, readable_rate, truncation_rate or equal_groups in the step records",
            share: true,
            lines: vec![
                line("right", 0, &|g| g.accuracy.mean),
                line("readable", 1, &|g| g.readable_rate.mean),
                line("pass@group", 2, &|g| g.pass_at_group.mean),
                line("cut at max_new_tokens", 3, &|g| g.truncation_rate.mean),
                line("groups of equal rewards", 4, &equal),
            ],
        }]
    }
}
