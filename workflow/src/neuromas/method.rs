//! NeuroMAS on the method seam: its `[neuromas]` table (one [[agents]] entry per adapter), G
//! rollouts of the graph as it stands per task, the readout's grade shared by every node of a
//! rollout (spec neuromas.md §5), and its figures.
use crate::method::RecordFault;
use super::metrics::NeuromasMetrics;
use super::reward::reward;
use super::{Episode, Graph, NeuromasConfig, NeuromasTrajectory, ParamSharing};
use crate::error::WorkflowError;
use crate::error::{invalid, JobError};
use crate::mean::Mean;
use crate::method::{dataset_task, Experience, JobView, Made, Method, ReplyRoom, RoomNeeds, Row, Samples, ShareTally, Shares, Speaker, StepContext, Summary, TaskRoom, Unit};
use crate::program::{PolicyTurn, Reply, Request};
use crate::seed::PlanSeed;
use crate::task::TaskRecord;
use crate::train_config::{Estimator, KlEstimator, TrainDefaults};
use crate::turn::PromptMeter;

/// β of NeuroMAS's k3 KL term in the loss (spec neuromas.md §5).
pub const NEUROMAS_KL_COEF: f64 = 1e-3;

/// NeuroMAS (spec neuromas.md).
pub struct Neuromas;

/// A step's figures: the rollouts, and each adapter's share.
pub type NeuromasStep = Shares<NeuromasMetrics>;

impl crate::method::Episode for Episode {
    type Record = NeuromasTrajectory;

    fn pending(&self) -> Vec<Request> {
        Episode::pending(self).to_vec()
    }

    fn submit(&mut self, replies: Vec<Reply>, meter: &dyn PromptMeter) -> Result<(), WorkflowError> {
        Episode::submit(self, replies, meter)
    }

    fn is_done(&self) -> bool {
        Episode::is_done(self)
    }

    fn finish(self) -> Result<NeuromasTrajectory, WorkflowError> {
        self.into_trajectory()
    }
}

impl crate::method::Record for NeuromasTrajectory {
    fn turns(&self) -> u32 {
        self.turns.len() as u32
    }

    fn completion_tokens(&self) -> u64 {
        NeuromasTrajectory::completion_tokens(self)
    }

    fn policy_turns(&self) -> Vec<PolicyTurn> {
        NeuromasTrajectory::policy_turns(self)
    }

    fn shift_versions(&mut self, by: u64) {
        self.turns.iter_mut().for_each(|t| t.sampled.policy_version += by);
    }
}

/// Nodes agent `agent`'s adapter plays in one rollout.
fn nodes_of(c: &NeuromasConfig, agent: u32) -> u64 {
    match c.graph() {
        Ok(g) => g.nodes().into_iter().filter(|&node| c.agent_of(node) == agent).count() as u64,
        Err(_) => 0,
    }
}

impl Method for Neuromas {
    const NAME: &'static str = "neuromas";

    type Config = NeuromasConfig;
    type Task = TaskRecord;
    type Plan = Graph;
    type Episode = Episode;
    type Record = NeuromasTrajectory;
    type Metrics = NeuromasStep;

    /// The settings, with one [[agents]] entry per adapter the graph needs.
    fn configure(table: toml::Table, job: &JobView<'_>) -> Result<NeuromasConfig, JobError> {
        let cfg: NeuromasConfig = crate::method::read_settings(toml::Value::Table(table), "neuromas")?;
        cfg.validate().map_err(|(k, m)| invalid(format!("neuromas.{k}"), m))?;
        if cfg.rollouts_per_task < 2 {
            return Err(invalid(
                "neuromas.rollouts_per_task",
                format!("is {}: the group advantage needs at least 2 rollouts of each task", cfg.rollouts_per_task),
            ));
        }
        let graph = cfg.graph().map_err(|(k, m)| invalid(format!("neuromas.{k}"), m))?;
        let want = cfg.agents(&graph);
        if job.agents != want {
            let how = match cfg.param_sharing {
                ParamSharing::PerNode => "one adapter per node",
                ParamSharing::PerLayer => "one adapter per layer",
                ParamSharing::Shared => "one adapter for every node",
            };
            let name = serde_json::to_string(&cfg.param_sharing).unwrap_or_default();
            return Err(invalid("agents", format!("neuromas.param_sharing = {:?} trains {how}: list {want} [[agents]], not {}", name.trim_matches('"'), job.agents)));
        }
        Ok(cfg)
    }

    /// The terminal reward normalised over the G rollouts of a task, and a k3 KL term in the
    /// loss, β = 1e-3, against the backbone (spec §5).
    fn train_defaults(c: &NeuromasConfig) -> TrainDefaults {
        TrainDefaults {
            temperature: Some(crate::method::temperature_or_one(c.sampling.temperature)),
            estimator: Some(Estimator::GroupNorm),
            kl_coef: Some(NEUROMAS_KL_COEF),
            kl_in_loss: Some(true),
            kl_estimator: Some(KlEstimator::K3),
        }
    }

    /// An adapter's share is its own nodes' (layers differ in width).
    fn samples(c: &NeuromasConfig, agent: u32, episodes: u64) -> Samples {
        let nodes = nodes_of(c, agent);
        Samples { least: nodes * episodes, most: nodes * episodes, why: format!("{episodes} rollouts x {nodes} nodes") }
    }

    /// A node's reply must leave room in every agent's context for its prompt, which holds the
    /// task and up to one message of `max_msg_tokens` from each input (the widest fan-in of the
    /// graph, once a grown graph's bridges have ended); a task must fit what is left.
    fn room(c: &NeuromasConfig) -> RoomNeeds {
        let fan_in = c.graph_at(u64::MAX).map_or(0, |g| g.nodes().iter().map(|n| g.inputs(n.layer, n.index).len() as u64).max().unwrap_or(0));
        let new = u64::from(c.max_new_tokens());
        let messages = fan_in * u64::from(c.max_msg_tokens);
        RoomNeeds {
            replies: vec![ReplyRoom {
                speaker: Speaker::Agents,
                key: "neuromas.sampling.max_new_tokens (the larger of it and readout_sampling's)".into(),
                name: "max_new_tokens".into(),
                new_tokens: new,
                beside: Some((messages, format!("{fan_in} input messages of max_msg_tokens {}", c.max_msg_tokens))),
            }],
            task: TaskRoom { tokens: new + messages, why: format!("max_new_tokens {new} and {fan_in} messages of {} tokens", c.max_msg_tokens) },
            prompt_max_len: None,
        }
    }

    fn for_evaluation(c: &NeuromasConfig, instances: u32, temperature: f64) -> NeuromasConfig {
        let mut c = c.clone();
        c.rollouts_per_task = instances;
        c.sampling.temperature = temperature;
        if let Some(r) = &mut c.readout_sampling {
            r.temperature = temperature;
        }
        c
    }

    fn copies(c: &NeuromasConfig) -> u32 {
        c.rollouts_per_task
    }

    fn task(_: &NeuromasConfig, index: usize, data: &[TaskRecord], _: PlanSeed) -> Result<TaskRecord, WorkflowError> {
        dataset_task(data, index)
    }

    /// The plan of a rollout is the graph as it stands at the step.
    fn plans(c: &NeuromasConfig, episodes: usize, seed: PlanSeed) -> Result<Vec<Graph>, WorkflowError> {
        let graph = c.graph_at(seed.step).map_err(|(k, m)| WorkflowError::PlanMismatch(format!("neuromas.{k}: {m}")))?;
        Ok(vec![graph; episodes])
    }

    fn speakers(c: &NeuromasConfig, graph: &Graph) -> Vec<u32> {
        (0..c.agents(graph)).collect()
    }

    fn start(c: &NeuromasConfig, task: &TaskRecord, graph: Graph, instance: u32, seed: u64, _: &dyn PromptMeter) -> Result<Episode, WorkflowError> {
        Episode::new(c, &graph, task, instance, seed)
    }

    fn check(c: &NeuromasConfig, t: &NeuromasTrajectory) -> Result<(), RecordFault> {
        t.validate(c)
    }

    /// Each rollout's readout is graded once, and every node's sample of the rollout becomes one
    /// experience for the node's adapter with that same reward. The group of `group_norm` is the
    /// task and the node, so each node's advantage is its rollout's reward normalised over the
    /// task's G rollouts.
    fn experience(c: &NeuromasConfig, records: Vec<(String, NeuromasTrajectory)>, step: &StepContext<'_>) -> Result<Made<NeuromasStep>, WorkflowError> {
        let mut tally = ShareTally::new(step.agents, false);
        for (episode_id, t) in &records {
            let r = reward(c, t);
            for turn in &t.turns {
                let group = format!("{}/node{}", t.task.id, turn.node.uid);
                let e = Experience::sampled(&turn.sampled, r, group, episode_id, turn.turn_index, c.sampling_of(&t.graph, turn.node).temperature);
                tally.push(turn.agent, e, episode_id, &format!("node {}", turn.node.position()))?;
            }
        }
        let all: Vec<&NeuromasTrajectory> = records.iter().map(|(_, t)| t).collect();
        let (per_agent, agents) = tally.finish();
        Ok(Made { per_agent, metrics: Shares { figures: NeuromasMetrics::of(c, &all), agents }, pooled_whitening: false })
    }

    /// Readouts right, readouts without a box, task groups whose rollouts all scored alike, and
    /// the share of messages cut per layer.
    fn watch(m: &NeuromasStep) -> Vec<String> {
        let g = &m.figures;
        let pct = |s: Mean| s.mean.map_or("-".into(), |v| format!("{:.0}%", v * 100.0));
        let cut: Vec<String> = g.truncation_rate.iter().map(|(layer, r)| format!("L{layer} {}", pct(*r))).collect();
        vec![
            format!("graph right {}", pct(g.graph_accuracy)),
            format!("no box {}", pct(g.no_box_rate)),
            format!("equal groups {}/{}", g.equal_groups, g.groups),
            format!("messages cut {}", cut.join(" ")),
        ]
    }

    fn summary(m: &NeuromasStep) -> Summary {
        let g = &m.figures;
        let accuracy = g.graph_accuracy.mean;
        let rows = vec![
            Row::new("held-out accuracy", accuracy, Unit::Share),
            Row::new("readouts without a box", g.no_box_rate.mean, Unit::Share),
            Row::new("mean reward", g.reward.mean, Unit::Signed),
        ];
        Summary { accuracy, graded: Some(g.graph_accuracy.count), rows }
    }
}
