//! The seam between a method and the machinery (DESIGN.md, "Methods behind one seam"). A method
//! is one type that implements [`Method`]: its settings and job-file table, how a step's
//! episodes are planned, the episode program the workers run, the check of a returned record,
//! the rewards, experiences and typed figures made from a step's records, its training
//! defaults, how many turns each agent speaks, how much prompt room it needs, and how its
//! figures are shown. The registry (`crate::registry`, one line per method in `lib.rs`) lists
//! the methods; the coordinator, the workers, the learners and the command line reach a method
//! only through it.
pub mod experience;
pub mod fault;
pub(crate) mod registry;
pub mod room;
pub(crate) mod run;
pub mod show;

pub use experience::{
    prompt_group, AgentShare, Experience, Made, ShareTally, Shares, StepContext, StepOutput,
};
pub use fault::RecordFault;
pub use room::{PromptFit, ReplyRoom, RoomNeeds, Speaker, TaskRoom};
pub use run::{check_turn_versions, play, PlannedEpisode, Start};
pub(crate) use run::{decode, experience_of, plan_episodes, start_episode};
pub use show::{Chart, Line, Row, Summary, Unit};

use crate::error::JobError;
use crate::error::WorkflowError;
use crate::program::{PolicyTurn, Reply, Request};
use crate::seed::PlanSeed;
use crate::task::TaskRecord;
use crate::train_config::{TrainConfig, TrainDefaults};
use crate::turn::PromptMeter;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// Task `index` of the data set.
pub fn dataset_task(data: &[TaskRecord], index: usize) -> Result<TaskRecord, WorkflowError> {
    data.get(index).cloned().ok_or_else(|| {
        WorkflowError::PlanMismatch(format!(
            "task {index} is past the {} questions of the data set",
            data.len()
        ))
    })
}

/// The temperature a learner scores turns at when they carry none: the sampling one, or 1 for
/// greedy sampling.
pub fn temperature_or_one(t: f64) -> f64 {
    if t > 0.0 {
        t
    } else {
        1.0
    }
}

/// Settings read from a table of the job file (a method's `[grpo]`, an agent's
/// `[agents.train]`, a list inside one); `at` is where the value sits (`grpo`,
/// `agents[0].train`). A wrong value's error names its whole dotted key (`grpo.group_size`),
/// not only the table.
pub fn read_settings<T: DeserializeOwned>(value: toml::Value, at: &str) -> Result<T, JobError> {
    value.try_into().map_err(|e: toml::de::Error| {
        let (key, message) = error_key(&e);
        let field = match key {
            Some(k) if at.is_empty() => k,
            Some(k) => format!("{at}.{k}"),
            None => at.to_string(),
        };
        crate::error::invalid(field, message)
    })
}

/// The dotted key a `toml` error of a value read (not a document parse) was raised under, and
/// its message. `toml` keeps the key path private and writes it only in its `Display`, as
/// "MESSAGE\nin `a.b`\n" (pinned by a test: a `toml` that writes it otherwise falls back to
/// the message alone).
pub fn error_key(e: &toml::de::Error) -> (Option<String>, String) {
    let message = e.message().trim_end().to_string();
    let text = e.to_string();
    let key = text
        .strip_prefix(e.message())
        .map(|rest| rest.trim())
        .and_then(|rest| rest.strip_prefix("in `"))
        .and_then(|rest| rest.strip_suffix('`'))
        .filter(|k| !k.is_empty() && !k.contains('\n'))
        .map(str::to_string);
    (key, message)
}

/// Where a method's tasks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSource {
    /// The job's data set (`[data] train`, and `[eval] data` for held-out questions).
    Dataset,
    /// Drawn by the method from the job seed, fresh every step (no data set).
    Generated,
    /// Listed in the method's own table: all of them, once, in one step.
    Listed(usize),
}

/// What the rest of the job file says that a method's settings depend on.
#[derive(Debug, Clone, Copy)]
pub struct JobView<'a> {
    /// Trained agents (`[[agents]]`); their ids are 0..agents.
    pub agents: u32,
    /// The names of the frozen models (`[[frozen]]`); frozen model i has agent id `agents + i`.
    pub frozen: &'a [&'a str],
}

/// How many turns an agent speaks in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    /// The fewest: an agent's `train_batch_size` may not ask for more.
    pub least: u64,
    /// The most: the horizon of its learning-rate schedule, so that an agent that sometimes
    /// speaks more (a tool call) does not reach the end of its schedule early.
    pub most: u64,
    /// How `least` comes about, for messages ("4 episodes x 6 turns").
    pub why: String,
}

/// One running episode: it hands out groups of requests and takes the whole group's replies.
pub trait Episode: Send + 'static {
    type Record;
    /// The pending group; empty once the episode is done.
    fn pending(&self) -> Vec<Request>;
    /// Takes the replies of the whole pending group (checked by `program::take_replies`).
    fn submit(&mut self, replies: Vec<Reply>, meter: &dyn PromptMeter)
        -> Result<(), WorkflowError>;
    fn is_done(&self) -> bool;
    /// The record of the finished episode.
    fn finish(self) -> Result<Self::Record, WorkflowError>;
}

/// A finished episode as a worker sends it back: the method's own record, as JSON.
pub trait Record:
    Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// Turns of the trained agents (an evaluation's calls).
    fn turns(&self) -> u32;
    /// Tokens generated in those turns.
    fn completion_tokens(&self) -> u64;
    /// Every trained turn, for the policy-version check.
    fn policy_turns(&self) -> Vec<PolicyTurn>;
    /// Shifts every policy version (a test fault: a worker that reports stale turns).
    fn shift_versions(&mut self, by: u64);
}

/// Everything a method is. Pure code: no model, no I/O.
pub trait Method: Sized + 'static {
    /// `method = "NAME"` in a job file; the name episode specs and step records carry.
    const NAME: &'static str;
    /// The job file's table of the method's settings.
    const TABLE: &'static str = Self::NAME;
    /// Whether the method trains agents (an evaluation job plays frozen models only).
    const TRAINS: bool = true;
    /// Whether the method calls `[[frozen]]` models (a coach, a team of frozen members).
    const CALLS_FROZEN: bool = false;

    /// The settings, as the method's table gives them and every episode spec carries them.
    /// Its table's settings; the schema renders the table in docs/job-file.md.
    type Config: Clone
        + Debug
        + PartialEq
        + Serialize
        + DeserializeOwned
        + schemars::JsonSchema
        + Send
        + Sync
        + 'static;
    /// What one episode works on: a question, a generated table, a benchmark item.
    type Task: Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static;
    /// What the coordinator decides for each episode beyond its task (CoMAS: who judges whom).
    type Plan: Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static;
    type Episode: Episode<Record = Self::Record>;
    type Record: Record;
    /// A step's (or an evaluation's) figures, as its record in the metrics log carries them.
    type Metrics: Serialize + DeserializeOwned + Default;

    // The job file.

    /// The settings from the method's table, checked against the rest of the job; errors name
    /// the key (`comas.num_agents`).
    fn configure(table: toml::Table, job: &JobView<'_>) -> Result<Self::Config, JobError>;

    fn task_source(_config: &Self::Config) -> TaskSource {
        TaskSource::Dataset
    }

    /// Defaults of the agents' training settings (each agent's own table wins).
    fn train_defaults(config: &Self::Config) -> TrainDefaults;

    /// Checks the agents' resolved training settings against the method's.
    fn check_training(_config: &Self::Config, _train: &[TrainConfig]) -> Result<(), JobError> {
        Ok(())
    }

    /// Turns agent `agent` speaks in a step of `episodes` episodes.
    fn samples(config: &Self::Config, agent: u32, episodes: u64) -> Samples;

    /// What the models' contexts must hold, checked at submit.
    fn room(config: &Self::Config) -> RoomNeeds;

    /// The settings of held-out evaluation episodes: `instances` copies of each task, every
    /// trained policy sampled at `temperature` (0: greedy).
    fn for_evaluation(config: &Self::Config, instances: u32, temperature: f64) -> Self::Config;

    // Planning a step (coordinator).

    /// Episodes per task.
    fn copies(config: &Self::Config) -> u32;

    /// Task `index`: of the data set `data`, or drawn from `seed` (generated tasks), or listed.
    fn task(
        config: &Self::Config,
        index: usize,
        data: &[TaskRecord],
        seed: PlanSeed,
    ) -> Result<Self::Task, WorkflowError>;

    /// The plans of a step's `episodes` episodes, in instance order.
    fn plans(
        config: &Self::Config,
        episodes: usize,
        seed: PlanSeed,
    ) -> Result<Vec<Self::Plan>, WorkflowError>;

    /// The seed of one episode (its sampling and any draws it makes).
    fn episode_seed(_config: &Self::Config, seed: PlanSeed, instance: u32) -> u64 {
        crate::seed::episode_seed(seed, instance)
    }

    // Running an episode (worker).

    /// Every agent the episode may ask to speak, trained or frozen.
    fn speakers(config: &Self::Config, plan: &Self::Plan) -> Vec<u32>;

    /// How the worker fits the episode's prompts.
    fn prompt_fit(_config: &Self::Config) -> PromptFit {
        PromptFit::default()
    }

    /// Starts an episode; its first group is pending at once.
    fn start(
        config: &Self::Config,
        task: &Self::Task,
        plan: Self::Plan,
        instance: u32,
        seed: u64,
        meter: &dyn PromptMeter,
    ) -> Result<Self::Episode, WorkflowError>;

    // A step's records (coordinator).

    /// The method's checks of a returned record (the policy versions are checked apart).
    fn check(config: &Self::Config, record: &Self::Record) -> Result<(), RecordFault>;

    /// Rewards, experiences per agent and the step's figures, from the step's records in spec
    /// order.
    fn experience(
        config: &Self::Config,
        records: Vec<(String, Self::Record)>,
        step: &StepContext<'_>,
    ) -> Result<Made<Self::Metrics>, WorkflowError>;

    // Showing it (command line).

    /// The method's own figures on `comas watch`'s step and evaluation lines.
    fn watch(metrics: &Self::Metrics) -> Vec<String>;

    /// The accuracy of a step or evaluation and the rows of a before/after table.
    fn summary(metrics: &Self::Metrics) -> Summary;

    /// The panel groups `comas plot` draws only for this method (`--panels NAME`).
    const CHART_GROUPS: &'static [&'static str] = &[];

    /// The method's own panels, one value per step record.
    fn charts(_steps: &[Self::Metrics]) -> Vec<Chart> {
        Vec::new()
    }
}
