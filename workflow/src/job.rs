//! The job file (TOML): agents, method, data, schedule, output. Parsing and every check that
//! needs no file system live here, so the coordinator (at submit time) and each learner (at
//! start) resolve an agent's training settings with the same code and get the same numbers.
use crate::comas::CoMasConfig;
use crate::cosir::CosirConfig;
use crate::eval::{EvalJobConfig, EvalQuestion, EvalSettings};
use crate::mappa::MappaConfig;
use crate::neuromas::NeuromasConfig;
use crate::program::{MethodConfig, Settings};
use crate::seed::derive_seed;
use crate::train_config::{canonical_dtype, OldLogprobs, TrainConfig};
use crate::turn::Role;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// A model that serves a role but is never trained (a coach, a judge, a user proxy): the
/// workers load it beside the agents, and no learner is attached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrozenSpec {
    /// How the method's settings refer to it (`[mappa] coach = "coach"`).
    pub name: String,
    /// Model folder (Hugging Face layout), as seen by the workers; absent for a model that an
    /// `endpoint` serves.
    #[serde(default)]
    pub model: Option<PathBuf>,
    /// Optional PEFT adapter applied on top.
    #[serde(default)]
    pub adapter: Option<PathBuf>,
    /// Base URL of an OpenAI-compatible chat-completions server that answers this model's turns
    /// instead of the workers (`http://judge:8000/v1`: vLLM, TGI, `comas serve`).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The name the endpoint serves the model under (default: `name`).
    #[serde(default)]
    pub endpoint_model: Option<String>,
    /// The environment variable, on the workers, holding the endpoint's API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Tries per endpoint call, with a backoff of min(2^try, 300) s, before the turn is
    /// answered empty (default 8).
    #[serde(default)]
    pub max_attempts: Option<u32>,
}

impl FrozenSpec {
    /// A frozen model the workers load from `model`.
    pub fn local(name: impl Into<String>, model: PathBuf, adapter: Option<PathBuf>) -> Self {
        Self { name: name.into(), model: Some(model), adapter, endpoint: None, endpoint_model: None, api_key_env: None, max_attempts: None }
    }

    fn check(&self, k: usize) -> Result<(), JobError> {
        let field = |f: &str| format!("frozen[{k}].{f}");
        match (&self.model, &self.endpoint) {
            (Some(_), Some(_)) => return Err(invalid(field("endpoint"), "give either a model folder or an endpoint, not both")),
            (None, None) => return Err(invalid(field("model"), "give the model folder the workers load, or an `endpoint` that serves the model")),
            (None, Some(url)) => {
                if !url.starts_with("http://") && !url.starts_with("https://") {
                    return Err(invalid(field("endpoint"), format!("{url:?} is not an http:// or https:// URL (e.g. http://judge:8000/v1)")));
                }
                if self.adapter.is_some() {
                    return Err(invalid(field("adapter"), "an endpoint model has no adapter here; the endpoint serves the model as it is"));
                }
            }
            (Some(_), None) => {
                if self.endpoint_model.is_some() || self.api_key_env.is_some() || self.max_attempts.is_some() {
                    return Err(invalid(
                        field("endpoint"),
                        "endpoint_model, api_key_env and max_attempts are for a model behind an `endpoint`; this one has a model folder",
                    ));
                }
            }
        }
        if self.max_attempts == Some(0) {
            return Err(invalid(field("max_attempts"), "must be at least 1"));
        }
        Ok(())
    }
}

/// A job that cannot run. `field` is the key path in the job file (`agents[1].train.lr`).
#[derive(Debug, Clone, PartialEq, Error)]
pub enum JobError {
    #[error("job file is not valid TOML or has a wrong key: {0}")]
    Syntax(String),
    #[error("`{field}`: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> JobError {
    JobError::Invalid { field: field.into(), message: message.into() }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    #[default]
    Comas,
    Mappa,
    /// No training: the rollout workers play an evaluation setup (spec §8.2) on benchmark
    /// questions with frozen models (`comas eval --coordinator`).
    Eval,
    /// The CoSIR information game on generated tables (spec cosir.md).
    Cosir,
    /// A layered graph of role-less nodes trained from the final reward (spec neuromas.md).
    Neuromas,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Comas => "comas",
            Method::Mappa => "mappa",
            Method::Eval => "eval",
            Method::Cosir => "cosir",
            Method::Neuromas => "neuromas",
        }
    }

    /// The method named in an episode spec; empty means CoMAS (specs from before the field).
    pub fn from_wire(name: &str) -> Result<Method, String> {
        match name {
            "" | "comas" => Ok(Method::Comas),
            "mappa" => Ok(Method::Mappa),
            "eval" => Ok(Method::Eval),
            "cosir" => Ok(Method::Cosir),
            "neuromas" => Ok(Method::Neuromas),
            other => Err(format!("unknown method {other:?}: expected \"comas\", \"mappa\", \"cosir\", \"neuromas\" or \"eval\"")),
        }
    }
}

/// How rollout and training take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// Rollout, then training, then the weight broadcast: every turn is sampled by the
    /// weights it trains.
    #[default]
    Synchronous,
    /// The workers run the episodes of steps s + 1 … s + `max_policy_lag` while the learners
    /// train step s; the new weights swap in between turns when they are published. A turn
    /// trains at most `max_policy_lag` versions behind the learner; older ones are dropped and
    /// counted.
    Async,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    /// Training questions: JSONL (or a JSON array) of records {prompt, answer, task, id}. An
    /// evaluation job has none (its questions are in `[evaluate]`).
    #[serde(default)]
    pub train: PathBuf,
    /// Reshuffle the questions every epoch (seeded by the job seed and the epoch).
    #[serde(default = "yes")]
    pub shuffle: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Required for training; an evaluation job runs all its questions in one step.
    #[serde(default)]
    pub questions_per_step: u32,
    /// Training steps; give this or `epochs`.
    pub steps: Option<u64>,
    /// Passes over the data set (the last partial batch of an epoch is dropped).
    pub epochs: Option<u64>,
    #[serde(default)]
    pub sync: SyncMode,
    /// Async mode: the most versions a trained turn's policy may be behind the learner's.
    #[serde(default)]
    pub max_policy_lag: Option<u64>,
    /// Learners checkpoint after every this many steps (and after the last one).
    #[serde(default = "one")]
    pub checkpoint_every: u64,
    /// A leased episode that has not come back after this long is handed to another worker
    /// (default: the coordinator's `--episode-timeout-secs`).
    #[serde(default)]
    pub episode_timeout_secs: Option<u64>,
    /// An episode that fails this many times fails the job.
    #[serde(default = "three")]
    pub max_episode_attempts: u32,
    /// How long a step waits for an unreachable learner (e.g. one restarting from its checkpoint).
    #[serde(default = "learner_timeout")]
    pub learner_timeout_secs: u64,
    /// How long queued episodes wait for a ready worker before the job fails (default: the
    /// coordinator's `--worker-wait-secs`).
    #[serde(default)]
    pub worker_wait_secs: Option<u64>,
}

/// The policy lag an async job allows when `max_policy_lag` is not given.
pub const DEFAULT_MAX_POLICY_LAG: u64 = 1;

impl ScheduleSpec {
    /// The lag bound: 0 for a synchronous job.
    pub fn policy_lag(&self) -> u64 {
        match self.sync {
            SyncMode::Synchronous => 0,
            SyncMode::Async => self.max_policy_lag.unwrap_or(DEFAULT_MAX_POLICY_LAG),
        }
    }
}

impl Default for ScheduleSpec {
    /// What a file with no `[schedule]` gets (an evaluation job needs none).
    fn default() -> Self {
        toml::from_str("").expect("every schedule key has a default")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// Weights dtype on the rollout workers.
    #[serde(default = "float32")]
    pub dtype: String,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self { dtype: float32() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// The job's folder: metrics log, and one export folder per agent at the end.
    pub dir: PathBuf,
    /// Write each agent's final model (or adapter) to `dir/agent-K` when the job ends.
    #[serde(default = "yes")]
    pub export: bool,
    /// Keep every step's episode records in `dir/episodes/step-NNNNN.jsonl`.
    #[serde(default)]
    pub save_episodes: bool,
}

/// In-training evaluation (spec 6.3): the same CoMAS game on held-out questions, no training,
/// every `every_steps` steps, after the last step, and (with `at_start`) before the first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// Held-out questions, same record format as the training data (CoSIR: none; its held-out
    /// tables are generated, `max_questions` of them).
    #[serde(default)]
    pub data: PathBuf,
    #[serde(default = "five")]
    pub every_steps: u64,
    /// Evaluate the base models before the first step too.
    #[serde(default = "yes")]
    pub at_start: bool,
    /// Use only the first this many questions; 0 = all.
    #[serde(default)]
    pub max_questions: usize,
    #[serde(default = "one_u32")]
    pub instances_per_question: u32,
    /// Sampling temperature of every role during evaluation (spec 6.1: 0.7).
    #[serde(default = "eval_temperature")]
    pub temperature: f64,
    /// Also play the game greedily (temperature 0, every role); its metrics go under `greedy`
    /// in the same evaluation record.
    #[serde(default)]
    pub greedy: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Must equal the agent's position in the list when given.
    pub id: Option<u32>,
    /// Base model folder (Hugging Face layout), as seen by learners and workers.
    pub model: PathBuf,
    /// PEFT adapter to start from (LoRA agents only).
    pub adapter: Option<PathBuf>,
    /// A learner checkpoint (`step-N` folder, LoRA) to start from: its adapter and optimizer
    /// moments, with the job's own step count and schedule (what `comas grow` writes).
    #[serde(default)]
    pub init_from: Option<PathBuf>,
    /// gRPC address of this agent's learner (filled in by `comas local`).
    pub learner: Option<String>,
    /// The agent's own training settings (see `TrainConfig`); kept raw until resolved, so a
    /// setting left out can be derived from the job (LR horizon, temperature).
    #[serde(default)]
    pub train: toml::Table,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub method: Method,
    /// Method settings; `num_agents` is taken from the agent list.
    #[serde(default)]
    pub comas: toml::Table,
    /// MAPPA settings (`method = "mappa"`); see `MappaConfig`.
    #[serde(default)]
    pub mappa: toml::Table,
    /// CoSIR settings (`method = "cosir"`); see `CosirConfig`. Its tables are generated, so
    /// it has no `[data]`.
    #[serde(default)]
    pub cosir: toml::Table,
    /// NeuroMAS settings (`method = "neuromas"`); see `NeuromasConfig`. One [[agents]] entry
    /// per adapter (`param_sharing`).
    #[serde(default)]
    pub neuromas: toml::Table,
    /// An evaluation job's setup, sampling and questions (`method = "eval"`); see
    /// `EvalSettings` and `EvalQuestion`. The team is the `[[frozen]]` list.
    #[serde(default)]
    pub evaluate: toml::Table,
    /// Frozen models the method may call; their agent ids follow the trained agents'.
    #[serde(default)]
    pub frozen: Vec<FrozenSpec>,
    #[serde(default)]
    pub data: DataSpec,
    #[serde(default)]
    pub schedule: ScheduleSpec,
    #[serde(default)]
    pub rollout: RolloutSpec,
    pub output: OutputSpec,
    pub eval: Option<EvalSpec>,
    /// Missing is the same as empty: `check` then says what to add.
    #[serde(default)]
    pub agents: Vec<AgentSpec>,
}

fn yes() -> bool {
    true
}
fn one() -> u64 {
    1
}
fn five() -> u64 {
    5
}
fn one_u32() -> u32 {
    1
}
fn eval_temperature() -> f64 {
    0.7
}
fn three() -> u32 {
    3
}
fn learner_timeout() -> u64 {
    600
}
fn float32() -> String {
    "float32".into()
}
fn default_seed() -> u64 {
    42
}

/// β of MAPPA's KL penalty in the reward when a MAPPA agent's training settings leave it out.
pub const MAPPA_KL_COEF: f64 = 0.01;

/// A checked job: the spec with its method config and every agent's training settings resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub spec: JobSpec,
    /// The CoMAS game (the defaults for a job of another method; never played there).
    pub comas: CoMasConfig,
    /// Set for `method = "mappa"`.
    pub mappa: Option<MappaConfig>,
    /// Set for `method = "eval"`.
    pub evaluate: Option<EvalJobConfig>,
    /// Set for `method = "cosir"`.
    pub cosir: Option<CosirConfig>,
    /// Set for `method = "neuromas"`.
    pub neuromas: Option<NeuromasConfig>,
    pub train: Vec<TrainConfig>,
    pub total_steps: u64,
    pub steps_per_epoch: u64,
    pub dataset_len: usize,
}

impl JobSpec {
    pub fn from_toml(text: &str) -> Result<Self, JobError> {
        toml::from_str(text).map_err(|e| JobError::Syntax(e.to_string().trim_end().to_string()))
    }

    /// Makes relative paths absolute against `base` (the job file's folder).
    pub fn resolve_paths(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if !self.data.train.as_os_str().is_empty() {
            fix(&mut self.data.train);
        }
        fix(&mut self.output.dir);
        if let Some(e) = self.eval.as_mut().filter(|e| !e.data.as_os_str().is_empty()) {
            fix(&mut e.data);
        }
        for a in &mut self.agents {
            fix(&mut a.model);
            if let Some(ad) = &mut a.adapter {
                fix(ad);
            }
            if let Some(c) = &mut a.init_from {
                fix(c);
            }
        }
        for f in &mut self.frozen {
            if let Some(m) = &mut f.model {
                fix(m);
            }
            if let Some(ad) = &mut f.adapter {
                fix(ad);
            }
        }
    }

    /// Every path the job names, with its key in the file: what the servers will read or write.
    pub fn paths(&self) -> Vec<(String, PathBuf)> {
        let mut out = Vec::new();
        if !self.data.train.as_os_str().is_empty() {
            out.push(("data.train".into(), self.data.train.clone()));
        }
        out.push(("output.dir".into(), self.output.dir.clone()));
        if let Some(e) = self.eval.as_ref().filter(|e| !e.data.as_os_str().is_empty()) {
            out.push(("eval.data".into(), e.data.clone()));
        }
        for (k, a) in self.agents.iter().enumerate() {
            out.push((format!("agents[{k}].model"), a.model.clone()));
            if let Some(ad) = &a.adapter {
                out.push((format!("agents[{k}].adapter"), ad.clone()));
            }
            if let Some(c) = &a.init_from {
                out.push((format!("agents[{k}].init_from"), c.clone()));
            }
        }
        for (k, f) in self.frozen.iter().enumerate() {
            if let Some(m) = &f.model {
                out.push((format!("frozen[{k}].model"), m.clone()));
            }
            if let Some(ad) = &f.adapter {
                out.push((format!("frozen[{k}].adapter"), ad.clone()));
            }
        }
        out
    }

    /// The paths that must be absolute before the job can run anywhere.
    pub fn relative_paths(&self) -> Vec<(String, PathBuf)> {
        self.paths().into_iter().filter(|(_, p)| p.is_relative()).collect()
    }

    fn comas_config(&self) -> Result<CoMasConfig, JobError> {
        let l = self.agents.len() as u32;
        if let Some(v) = self.comas.get("num_agents") {
            if v.as_integer() != Some(i64::from(l)) {
                return Err(invalid("comas.num_agents", format!("is {v} but {l} [[agents]] are listed; leave it out, it follows the agent list")));
            }
        }
        let mut table = self.comas.clone();
        table.insert("num_agents".into(), toml::Value::Integer(i64::from(l)));
        let cfg: CoMasConfig = toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| invalid("comas", e.message().to_string()))?;
        cfg.validate().map_err(|e| invalid("comas", e.to_string()))?;
        Ok(cfg)
    }

    /// The CoSIR settings, with as many [[agents]] as its seat policy trains.
    fn cosir_config(&self) -> Result<CosirConfig, JobError> {
        let cfg: CosirConfig = toml::Value::Table(self.cosir.clone()).try_into().map_err(|e: toml::de::Error| invalid("cosir", e.message().to_string()))?;
        cfg.validate().map_err(|(k, m)| invalid(format!("cosir.{k}"), m))?;
        let want = cfg.num_agents() as usize;
        if self.agents.len() != want {
            return Err(invalid(
                "agents",
                match cfg.seat_policy {
                    crate::cosir::config::SeatPolicy::Shared => {
                        format!("cosir.seat_policy = \"shared\" trains one policy for every seat; list 1 [[agents]], not {}", self.agents.len())
                    }
                    crate::cosir::config::SeatPolicy::PerSeat => {
                        format!("cosir.seat_policy = \"per_seat\" trains one agent per seat; list {want} [[agents]] (cosir.agents), not {}", self.agents.len())
                    }
                },
            ));
        }
        Ok(cfg)
    }

    /// The NeuroMAS settings, with one [[agents]] entry per adapter the graph needs.
    fn neuromas_config(&self) -> Result<NeuromasConfig, JobError> {
        let cfg: NeuromasConfig =
            toml::Value::Table(self.neuromas.clone()).try_into().map_err(|e: toml::de::Error| invalid("neuromas", e.message().to_string()))?;
        cfg.validate().map_err(|(k, m)| invalid(format!("neuromas.{k}"), m))?;
        if cfg.rollouts_per_task < 2 {
            return Err(invalid(
                "neuromas.rollouts_per_task",
                format!("is {}: the group advantage needs at least 2 rollouts of each task", cfg.rollouts_per_task),
            ));
        }
        let graph = cfg.graph().map_err(|(k, m)| invalid(format!("neuromas.{k}"), m))?;
        let want = cfg.agents(&graph) as usize;
        if self.agents.len() != want {
            let how = match cfg.param_sharing {
                crate::neuromas::ParamSharing::PerNode => "one adapter per node",
                crate::neuromas::ParamSharing::PerLayer => "one adapter per layer",
                crate::neuromas::ParamSharing::Shared => "one adapter for every node",
            };
            return Err(invalid(
                "agents",
                format!(
                    "neuromas.param_sharing = {:?} trains {how}: list {want} [[agents]], not {}",
                    serde_json::to_string(&cfg.param_sharing).unwrap_or_default().trim_matches('"'),
                    self.agents.len()
                ),
            ));
        }
        Ok(cfg)
    }

    /// The MAPPA settings: the role → agent map defaults from the agent list, and the coach is
    /// named by its `[[frozen]]` entry.
    fn mappa_config(&self) -> Result<MappaConfig, JobError> {
        let l = self.agents.len() as u32;
        let mut table = self.mappa.clone();
        if table.contains_key("coach_agent") {
            return Err(invalid("mappa.coach_agent", "is set by the job; name the coach's [[frozen]] model with `coach = \"NAME\"` instead"));
        }
        let coach = match table.remove("coach") {
            None => "coach".to_string(),
            Some(toml::Value::String(s)) => s,
            Some(v) => return Err(invalid("mappa.coach", format!("must be the name of a [[frozen]] model, got {v}"))),
        };
        let Some(c) = self.frozen.iter().position(|f| f.name == coach) else {
            return Err(invalid("mappa.coach", format!("no [[frozen]] model is named {coach:?}; add one with name = {coach:?} and the coach's model folder")));
        };
        table.insert("coach_agent".into(), toml::Value::Integer(i64::from(l) + c as i64));
        // The pipeline's own defaults where the file leaves them out (DSBench: 4 / 4 / 4, 60 s).
        if let Some(p) = table.get("pipeline").cloned() {
            let pipeline: crate::mappa::Pipeline = p.try_into().map_err(|e: toml::de::Error| invalid("mappa.pipeline", e.message().to_string()))?;
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
        let cfg: MappaConfig = toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| invalid("mappa", e.message().to_string()))?;
        cfg.validate().map_err(|(k, m)| invalid(format!("mappa.{k}"), m))?;
        if let Some(a) = cfg.agents.iter().find(|&&a| a >= l) {
            return Err(invalid("mappa.agents", format!("names agent {a} but the job lists {l} [[agents]]")));
        }
        if let Some(k) = (0..l).find(|k| !cfg.agents.contains(k)) {
            return Err(invalid("mappa.agents", format!("agent {k} plays no role, so it would never train; map a role to it or remove it")));
        }
        Ok(cfg)
    }

    fn check_frozen_and_rollout(&self) -> Result<(), JobError> {
        for (k, f) in self.frozen.iter().enumerate() {
            if f.name.trim().is_empty() || self.frozen[..k].iter().any(|g| g.name == f.name) {
                return Err(invalid(format!("frozen[{k}].name"), format!("{:?} must be a non-empty name no other [[frozen]] model has", f.name)));
            }
            f.check(k)?;
        }
        crate::train_config::check_dtype(&self.rollout.dtype).map_err(|e| invalid("rollout.dtype", e.0))
    }

    /// An evaluation job: a team of frozen models, one step of one episode per question.
    fn check_eval(&self) -> Result<Job, JobError> {
        if !self.agents.is_empty() {
            return Err(invalid("agents", "an evaluation job trains nothing; list the team's models as [[frozen]] tables instead"));
        }
        if self.frozen.is_empty() {
            return Err(invalid("frozen", "list the team's models as [[frozen]] tables (team member m is played by model m mod their count)"));
        }
        if !self.comas.is_empty() || !self.mappa.is_empty() || self.eval.is_some() {
            return Err(invalid("method", "is eval, which uses no [comas], [mappa] or [eval] settings; remove them"));
        }
        if !self.data.train.as_os_str().is_empty() {
            return Err(invalid("data.train", "an evaluation job takes its questions from [[evaluate.questions]]; remove [data]"));
        }
        let s = &self.schedule;
        if s.steps.unwrap_or(1) != 1 || s.epochs.is_some() || s.questions_per_step != 0 {
            return Err(invalid("schedule", "an evaluation job runs all its questions once, in one step; leave out steps, epochs and questions_per_step"));
        }
        self.check_frozen_and_rollout()?;
        let mut table = self.evaluate.clone();
        if table.contains_key("members") {
            return Err(invalid("evaluate.members", "is set by the job: it is the number of [[frozen]] models"));
        }
        let questions: Vec<EvalQuestion> = match table.remove("questions") {
            None => Vec::new(),
            Some(v) => v.try_into().map_err(|e: toml::de::Error| invalid("evaluate.questions", e.message().to_string()))?,
        };
        table.insert("members".into(), toml::Value::Integer(self.frozen.len() as i64));
        let settings: EvalSettings = toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| invalid("evaluate", e.message().to_string()))?;
        let cfg = EvalJobConfig { settings, questions };
        cfg.validate().map_err(|(k, m)| invalid(format!("evaluate.{k}"), m))?;
        let n = cfg.questions.len();
        Ok(Job {
            spec: self.clone(),
            comas: CoMasConfig::default(),
            mappa: None,
            evaluate: Some(cfg),
            cosir: None,
            neuromas: None,
            train: Vec::new(),
            total_steps: 1,
            steps_per_epoch: 1,
            dataset_len: n,
        })
    }

    /// Checks everything that needs no file system; `dataset_len` is the number of questions
    /// (ignored for an evaluation job, whose questions are in the file).
    pub fn check(&self, dataset_len: usize) -> Result<Job, JobError> {
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        if self.method == Method::Eval {
            return self.check_eval();
        }
        if !self.evaluate.is_empty() {
            return Err(invalid("evaluate", format!("is set but method is {}; set method = \"eval\" for an evaluation job", self.method.as_str())));
        }
        let cosir = self.method == Method::Cosir;
        if cosir && !self.data.train.as_os_str().is_empty() {
            return Err(invalid("data.train", "is set but CoSIR generates its tables; remove [data]"));
        }
        if !cosir && self.data.train.as_os_str().is_empty() {
            return Err(invalid("data.train", "give the file of training questions"));
        }
        if self.agents.is_empty() {
            return Err(invalid("agents", "list at least one [[agents]] table"));
        }
        for (k, a) in self.agents.iter().enumerate() {
            if let Some(id) = a.id {
                if id as usize != k {
                    return Err(invalid(
                        format!("agents[{k}].id"),
                        format!("is {id}; agent ids are their positions in the list (0, 1, ...), so this one must be {k}"),
                    ));
                }
            }
        }
        if !cosir && !self.cosir.is_empty() {
            return Err(invalid("cosir", format!("is set but method is {}; set method = \"cosir\"", self.method.as_str())));
        }
        if self.method != Method::Neuromas && !self.neuromas.is_empty() {
            return Err(invalid("neuromas", format!("is set but method is {}; set method = \"neuromas\"", self.method.as_str())));
        }
        let (comas, mappa) = match self.method {
            Method::Cosir => {
                if !self.comas.is_empty() || !self.mappa.is_empty() || !self.frozen.is_empty() {
                    return Err(invalid("method", "is cosir, which uses no [comas] or [mappa] settings and no [[frozen]] models; remove them"));
                }
                (CoMasConfig { num_agents: self.agents.len() as u32, ..CoMasConfig::default() }, None)
            }
            Method::Comas => {
                if !self.mappa.is_empty() || !self.frozen.is_empty() {
                    return Err(invalid("method", "is comas, which uses no [mappa] settings and no [[frozen]] models; remove them or set method = \"mappa\""));
                }
                (self.comas_config()?, None)
            }
            Method::Mappa => {
                if !self.comas.is_empty() {
                    return Err(invalid("comas", "is set but method is mappa; move the settings to [mappa]"));
                }
                let cfg = CoMasConfig { num_agents: self.agents.len() as u32, ..CoMasConfig::default() };
                (cfg, Some(self.mappa_config()?))
            }
            Method::Neuromas => {
                if !self.comas.is_empty() || !self.mappa.is_empty() || !self.frozen.is_empty() {
                    return Err(invalid("method", "is neuromas, which uses no [comas] or [mappa] settings and no [[frozen]] models; remove them"));
                }
                (CoMasConfig { num_agents: self.agents.len() as u32, ..CoMasConfig::default() }, None)
            }
            Method::Eval => unreachable!("checked above"),
        };
        let neuromas = if self.method == Method::Neuromas { Some(self.neuromas_config()?) } else { None };
        self.check_frozen_and_rollout()?;
        let s = &self.schedule;
        let q = u64::from(s.questions_per_step);
        if q == 0 {
            return Err(invalid("schedule.questions_per_step", "must be at least 1"));
        }
        let cosir_config = if cosir { Some(self.cosir_config()?) } else { None };
        // CoSIR draws fresh tables every step: a virtual data set of one epoch.
        let dataset_len = match (cosir, s.steps, s.epochs) {
            (false, ..) => dataset_len,
            (true, Some(n), None) => usize::try_from(n.saturating_mul(q)).map_err(|_| invalid("schedule.steps", "is too large"))?,
            (true, ..) => return Err(invalid("schedule", "CoSIR draws new tables every step: give `steps`, not `epochs`")),
        };
        if dataset_len == 0 {
            return Err(invalid("data.train", "the data set has no questions"));
        }
        if q > dataset_len as u64 {
            return Err(invalid("schedule.questions_per_step", format!("is {q} but the data set has only {dataset_len} questions")));
        }
        let steps_per_epoch = dataset_len as u64 / q;
        let total_steps = match (s.steps, s.epochs) {
            (Some(_), Some(_)) => return Err(invalid("schedule", "give `steps` or `epochs`, not both")),
            (None, None) => return Err(invalid("schedule", "give `steps` (training steps) or `epochs` (passes over the data)")),
            (Some(n), None) => n,
            (None, Some(e)) => e.checked_mul(steps_per_epoch).ok_or_else(|| invalid("schedule.epochs", "is too large"))?,
        };
        if total_steps == 0 {
            return Err(invalid(if s.steps.is_some() { "schedule.steps" } else { "schedule.epochs" }, "must be at least 1"));
        }
        if s.checkpoint_every == 0 {
            return Err(invalid("schedule.checkpoint_every", "must be at least 1"));
        }
        if s.max_episode_attempts == 0 {
            return Err(invalid("schedule.max_episode_attempts", "must be at least 1"));
        }
        match (s.sync, s.max_policy_lag) {
            (SyncMode::Synchronous, Some(_)) => {
                return Err(invalid(
                    "schedule.max_policy_lag",
                    "bounds the policy lag of sync = \"async\"; a synchronous job trains every turn on its own weights",
                ))
            }
            (SyncMode::Async, Some(0)) => {
                return Err(invalid("schedule.max_policy_lag", "must be at least 1: rollout overlaps training, so a turn may be one version behind"))
            }
            _ => {}
        }
        for (name, v) in [
            ("episode_timeout_secs", s.episode_timeout_secs.unwrap_or(1)),
            ("learner_timeout_secs", s.learner_timeout_secs),
            ("worker_wait_secs", s.worker_wait_secs.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(invalid(format!("schedule.{name}"), "must be at least 1"));
            }
        }
        if let Some(e) = &self.eval {
            if e.every_steps == 0 || e.instances_per_question == 0 {
                return Err(invalid("eval", "`every_steps` and `instances_per_question` must be at least 1"));
            }
            if !(e.temperature >= 0.0 && e.temperature.is_finite()) {
                return Err(invalid("eval.temperature", format!("must be finite and >= 0, got {}", e.temperature)));
            }
        }
        if let Some(e) = &self.eval {
            match (cosir, e.data.as_os_str().is_empty()) {
                (true, false) => return Err(invalid("eval.data", "is set but CoSIR evaluates on generated tables; give their number as eval.max_questions")),
                (true, true) if e.max_questions == 0 => return Err(invalid("eval.max_questions", "give the number of held-out tables to evaluate on")),
                (false, true) => return Err(invalid("eval.data", "give the file of held-out questions")),
                _ => {}
            }
        }
        let mut job = Job {
            spec: self.clone(),
            comas,
            mappa,
            evaluate: None,
            cosir: cosir_config,
            neuromas,
            train: Vec::new(),
            total_steps,
            steps_per_epoch,
            dataset_len,
        };
        job.train = (0..self.agents.len()).map(|k| job.agent_train(k)).collect::<Result<_, _>>()?;
        // An agent started from a checkpoint is served its adapter, so workers decode with the
        // weights the learner starts from.
        for (k, a) in job.spec.agents.iter_mut().enumerate() {
            let Some(from) = &a.init_from else { continue };
            if job.train[k].lora.is_none() {
                return Err(invalid(
                    format!("agents[{k}].init_from"),
                    "starts a LoRA adapter from a learner checkpoint: add the [agents.train.lora] table it was trained with",
                ));
            }
            if a.adapter.is_some() {
                return Err(invalid(format!("agents[{k}].init_from"), "already names the adapter (its adapter/ folder): drop agents.adapter"));
            }
            a.adapter = Some(from.join("adapter"));
        }
        if job.mappa.as_ref().is_some_and(|m| m.norm_scope == crate::mappa::NormScope::Global) {
            if let Some((k, t)) = job.train.iter().enumerate().find(|(_, t)| !t.estimator.whitens()) {
                return Err(invalid(
                    "mappa.norm_scope",
                    format!(
                        "is global, which pools the statistics that advantages are whitened with, but agents[{k}].train.estimator = {} does not whiten; use reinforce or reinforce_baseline, or norm_scope = \"per_agent\"",
                        serde_json::to_string(&t.estimator).unwrap_or_default()
                    ),
                ));
            }
        }
        Ok(job)
    }
}

impl Job {
    /// The method and its settings.
    pub fn settings(&self) -> Settings<'_> {
        match (&self.mappa, &self.evaluate, &self.cosir, &self.neuromas) {
            (Some(m), ..) => Settings::Mappa(m),
            (None, Some(e), ..) => Settings::Eval(&e.settings),
            (None, None, Some(c), _) => Settings::Cosir(c),
            (None, None, None, Some(n)) => Settings::Neuromas(n),
            (None, None, None, None) => Settings::Comas(&self.comas),
        }
    }

    /// Episodes per step.
    pub fn episodes_per_step(&self) -> u64 {
        if self.evaluate.is_some() {
            return self.dataset_len as u64;
        }
        u64::from(self.spec.schedule.questions_per_step) * u64::from(self.settings().instances_per_question())
    }

    /// Turns each agent speaks per step. CoMAS: every agent solves once per round, and the judge
    /// turns are spread evenly over the agents (exact for the balanced assignment). MAPPA: at
    /// least one action per role the agent plays (more with tool calls).
    pub fn samples_per_agent(&self) -> u64 {
        if self.evaluate.is_some() {
            return 0;
        }
        if let Some(c) = &self.cosir {
            return self.episodes_per_step() * cosir_turns_per_agent(c);
        }
        if self.neuromas.is_some() {
            return (0..self.spec.agents.len()).map(|k| self.neuromas_nodes_of(k)).min().unwrap_or(0) * self.episodes_per_step();
        }
        match &self.mappa {
            Some(m) => {
                (0..self.spec.agents.len() as u32).map(|k| m.agents.iter().filter(|&&a| a == k).count() as u64).min().unwrap_or(0) * self.episodes_per_step()
            }
            None => self.episodes_per_step() * self.comas.turns_per_instance() / u64::from(self.comas.num_agents),
        }
    }

    /// Most turns agent `k` can speak in a step: the LR schedule's horizon, so that an agent
    /// that acts more often than its least (a MAPPA Code Executor calling its tool) does not
    /// reach the end of its schedule early.
    pub fn most_samples_of(&self, k: usize) -> u64 {
        match &self.mappa {
            Some(m) => {
                let actions: u64 = m.agents.iter().zip(&m.max_turns).filter(|(&a, _)| a as usize == k).map(|(_, &t)| u64::from(t)).sum();
                actions * self.episodes_per_step()
            }
            None if self.neuromas.is_some() => self.neuromas_nodes_of(k) * self.episodes_per_step(),
            None => self.samples_per_agent(),
        }
    }

    /// Nodes agent `k`'s adapter plays in one rollout.
    fn neuromas_nodes_of(&self, k: usize) -> u64 {
        let Some(n) = &self.neuromas else { return 0 };
        match n.graph() {
            Ok(g) => g.nodes().into_iter().filter(|&node| n.agent_of(node) as usize == k).count() as u64,
            Err(_) => 0,
        }
    }

    /// The CoSIR game of evaluation episodes: every seat sampled at `temperature`.
    fn eval_cosir_at(&self, c: &CosirConfig, temperature: f64) -> CosirConfig {
        let mut c = c.clone();
        if let Some(e) = &self.spec.eval {
            c.instances_per_question = e.instances_per_question;
        }
        c.sampling.temperature = temperature;
        if let Some(f) = &mut c.final_sampling {
            f.temperature = temperature;
        }
        c
    }

    /// Agent ids of the frozen models, after the trained agents'.
    pub fn frozen_agent(&self, index: usize) -> u32 {
        (self.spec.agents.len() + index) as u32
    }

    /// Turns of each role in one step, all agents together.
    pub fn turns_per_step(&self, role: Role) -> u64 {
        self.episodes_per_step() * self.comas.turns_per_round_of(role) * u64::from(self.comas.num_rounds)
    }

    /// Resolves agent `k`'s training settings: the LR horizon defaults to the optimizer steps
    /// the job will really take (spec 6.2), and the log-prob temperature to the rollout one.
    fn agent_train(&self, k: usize) -> Result<TrainConfig, JobError> {
        let field = format!("agents[{k}].train");
        let raw = &self.spec.agents[k].train;
        let mut table = raw.clone();
        if !raw.contains_key("temperature") {
            // Every experience carries its role's sampling temperature and is scored at it;
            // this is only the default for experiences that carry none (greedy roles).
            let t = match (&self.mappa, &self.cosir, &self.neuromas) {
                (Some(m), ..) => Some(m.sampling.temperature).filter(|&t| t > 0.0).unwrap_or(1.0),
                (None, Some(c), _) => Some(c.sampling.temperature).filter(|&t| t > 0.0).unwrap_or(1.0),
                (None, None, Some(n)) => Some(n.sampling.temperature).filter(|&t| t > 0.0).unwrap_or(1.0),
                (None, None, None) => Role::COMAS.iter().map(|&r| self.comas.sampling.for_role(r).temperature).find(|&t| t > 0.0).unwrap_or(1.0),
            };
            table.insert("temperature".into(), toml::Value::Float(t));
        }
        if self.mappa.is_some() && !raw.contains_key("kl_coef") {
            // MAPPA keeps a k1 KL penalty in the reward (spec mappa.md §5).
            table.insert("kl_coef".into(), toml::Value::Float(MAPPA_KL_COEF));
        }
        if self.neuromas.is_some() {
            // NeuroMAS (spec §5): the terminal reward normalised over the G rollouts of a task,
            // and a k3 KL term in the loss, β = 1e-3, against the backbone.
            for (k, v) in [
                ("estimator", toml::Value::String("group_norm".into())),
                ("kl_coef", toml::Value::Float(NEUROMAS_KL_COEF)),
                ("kl_in_loss", toml::Value::Boolean(true)),
                ("kl_estimator", toml::Value::String("k3".into())),
            ] {
                if !raw.contains_key(k) {
                    table.insert(k.into(), v);
                }
            }
        }
        if self.cosir.is_some() {
            // CoSIR keeps a k3 KL term in the loss, β = 1e-3, against drift in free text (spec §5).
            for (k, v) in
                [("kl_coef", toml::Value::Float(COSIR_KL_COEF)), ("kl_in_loss", toml::Value::Boolean(true)), ("kl_estimator", toml::Value::String("k3".into()))]
            {
                if !raw.contains_key(k) {
                    table.insert(k.into(), v);
                }
            }
        }
        if !raw.contains_key("seed") {
            table.insert("seed".into(), toml::Value::Integer(derive_seed(&[self.spec.seed, k as u64]) as i64 & i64::MAX));
        }
        let text = toml::to_string(&table).map_err(|e| invalid(&field, e.to_string()))?;
        let mut cfg = TrainConfig::from_toml(&text)
            .map_err(|e| invalid(&field, e.to_string().replace("TOML parse error at line 1, column 1\n  |\n1 | \n  | ^\n", "")))?;
        // A NeuroMAS adapter's share is its own nodes' (layers differ in width).
        let samples = if self.neuromas.is_some() { self.most_samples_of(k) } else { self.samples_per_agent() };
        if cfg.train_batch_size as u64 > samples {
            return Err(invalid(
                format!("{field}.train_batch_size"),
                match (&self.mappa, &self.cosir) {
                    _ if self.neuromas.is_some() => format!(
                        "is {} but agent {k} plays only {samples} node turns per step ({} rollouts x {} nodes); lower it or raise schedule.questions_per_step",
                        cfg.train_batch_size,
                        self.episodes_per_step(),
                        self.neuromas_nodes_of(k)
                    ),
                    (_, Some(c)) => format!("is {} but agent {k} speaks only {samples} turns per step ({} games x {} turns); lower it or raise schedule.questions_per_step", cfg.train_batch_size, self.episodes_per_step(), cosir_turns_per_agent(c)),
                    (Some(_), None) => format!("is {} but agent {k} may act only {samples} times per step ({} episodes, one action per role at least); lower it or raise schedule.questions_per_step", cfg.train_batch_size, self.episodes_per_step()),
                    (None, None) => format!("is {} but agent {k} speaks only {samples} turns per step ({} episodes x {} turns / {} agents); lower it or raise schedule.questions_per_step", cfg.train_batch_size, self.episodes_per_step(), self.comas.turns_per_instance(), self.comas.num_agents),
                },
            ));
        }
        if cfg.micro_batch_size > cfg.train_batch_size {
            return Err(invalid(format!("{field}.micro_batch_size"), format!("is {} but train_batch_size is {}", cfg.micro_batch_size, cfg.train_batch_size)));
        }
        if self.spec.agents[k].adapter.is_some() && cfg.lora.is_none() {
            return Err(invalid(format!("agents[{k}].adapter"), "an adapter needs a [agents.train.lora] table with its settings"));
        }
        if !raw.contains_key("total_steps") {
            let per_step = self.most_samples_of(k).div_ceil(cfg.train_batch_size as u64) * cfg.max_epochs as u64;
            cfg.total_steps = (per_step * self.total_steps).max(1);
        }
        // The sampler ran the same weights: when it also used the learner's dtype on the CPU,
        // its log-probs stand for ℓ^old and the recompute pass can go (exact in f32; in bf16
        // other matrix shapes round differently, measured approx_kl ~0.003 on SmolLM2).
        // (Truncated importance sampling needs the recomputed ℓ^old to weigh.)
        if !raw.contains_key("old_logprobs")
            && cfg.tis_cap == 0.0
            && cfg.device == "cpu"
            && canonical_dtype(&self.spec.rollout.dtype) == canonical_dtype(&cfg.dtype)
        {
            cfg.old_logprobs = OldLogprobs::Sampler;
        }
        Ok(cfg)
    }

    /// The CoMAS settings of evaluation episodes: the job's game, the eval temperature for every
    /// role and the eval instance count.
    pub fn eval_comas(&self) -> Option<CoMasConfig> {
        let e = self.spec.eval.as_ref()?;
        Some(self.eval_comas_at(e.temperature))
    }

    /// The job's method as evaluation runs it: every policy sampled at `temperature`, the eval
    /// instance count. A MAPPA coach keeps its own sampling.
    pub fn eval_method_at(&self, temperature: f64) -> MethodConfig {
        if let Some(c) = &self.cosir {
            return MethodConfig::Cosir(self.eval_cosir_at(c, temperature));
        }
        if let Some(n) = &self.neuromas {
            let mut n = n.clone();
            if let Some(e) = &self.spec.eval {
                n.rollouts_per_task = e.instances_per_question;
            }
            n.sampling.temperature = temperature;
            if let Some(r) = &mut n.readout_sampling {
                r.temperature = temperature;
            }
            return MethodConfig::Neuromas(n);
        }
        match &self.mappa {
            None => MethodConfig::Comas(self.eval_comas_at(temperature)),
            Some(m) => {
                let mut m = m.clone();
                if let Some(e) = &self.spec.eval {
                    m.instances_per_question = e.instances_per_question;
                }
                m.sampling.temperature = temperature;
                m.role_sampling.values_mut().for_each(|s| s.temperature = temperature);
                MethodConfig::Mappa(m)
            }
        }
    }

    /// The evaluation game with every role sampled at `temperature` (0 = greedy).
    pub fn eval_comas_at(&self, temperature: f64) -> CoMasConfig {
        let mut c = self.comas.clone();
        if let Some(e) = &self.spec.eval {
            c.instances_per_question = e.instances_per_question;
        }
        for s in [&mut c.sampling.solver, &mut c.sampling.evaluator, &mut c.sampling.scorer] {
            s.temperature = temperature;
        }
        c
    }

    /// Whether an evaluation is due once `completed` steps are done.
    pub fn eval_due(&self, completed: u64) -> bool {
        self.spec.eval.as_ref().is_some_and(|e| if completed == 0 { e.at_start } else { completed % e.every_steps == 0 || completed == self.total_steps })
    }

    /// Data set indices of step `step`'s questions: epoch e = step / steps_per_epoch uses its own
    /// permutation (when shuffling), and the last partial batch of an epoch is dropped.
    pub fn step_questions(&self, step: u64) -> Vec<usize> {
        if self.evaluate.is_some() {
            return (0..self.dataset_len).collect();
        }
        if self.cosir.is_some() {
            // Fresh tables every step: table indices step·q .. (step + 1)·q.
            let q = self.spec.schedule.questions_per_step as usize;
            return (step as usize * q..(step as usize + 1) * q).collect();
        }
        step_questions(self.dataset_len, self.spec.schedule.questions_per_step as usize, self.spec.seed, self.spec.data.shuffle, step)
    }
}

const DATA_ORDER_TAG: u64 = 101;

/// CoSIR's KL coefficient (in the loss, k3; spec cosir.md §5).
pub const COSIR_KL_COEF: f64 = 1e-3;
/// β of NeuroMAS's k3 KL term in the loss (spec neuromas.md §5).
pub const NEUROMAS_KL_COEF: f64 = 1e-3;

/// Turns one trained agent speaks in a CoSIR game: every seat's (shared policy) or its own seat's.
fn cosir_turns_per_agent(c: &CosirConfig) -> u64 {
    let seats = match c.seat_policy {
        crate::cosir::config::SeatPolicy::Shared => u64::from(c.agents),
        crate::cosir::config::SeatPolicy::PerSeat => 1,
    };
    seats * u64::from(c.turns_per_seat())
}

pub fn step_questions(n: usize, per_step: usize, seed: u64, shuffle: bool, step: u64) -> Vec<usize> {
    let per_epoch = (n / per_step).max(1) as u64;
    let (epoch, index) = (step / per_epoch, (step % per_epoch) as usize);
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(derive_seed(&[seed, DATA_ORDER_TAG, epoch])));
    }
    order[index * per_step..(index + 1) * per_step].to_vec()
}

#[cfg(test)]
mod tests {
    /// The shipped cluster job parses, checks, and trains every 7B agent with LoRA: full
    /// fine-tuning of 7B does not fit one 80 GB GPU per learner.
    #[test]
    fn the_cluster_job_is_valid_and_uses_lora() {
        let text = include_str!("../../deploy/k8s/overlays/cluster/job.toml");
        let job = super::JobSpec::from_toml(text).unwrap().check(2000).unwrap();
        assert_eq!(job.train.len(), 3);
        assert!(job.train.iter().all(|t| t.lora.as_ref().is_some_and(|l| l.r == 64 && l.target_modules.len() == 7)));
    }

    use super::*;

    const JOB: &str = r#"
name = "t"
[data]
train = "data.jsonl"
[schedule]
questions_per_step = 2
steps = 3
[output]
dir = "out"
[comas]
num_rounds = 2
instances_per_question = 2
[[agents]]
model = "m0"
[agents.train]
train_batch_size = 4
micro_batch_size = 2
lr = 1e-5
[[agents]]
model = "m1"
learner = "http://127.0.0.1:1"
[agents.train]
train_batch_size = 24
"#;

    const MAPPA_JOB: &str = r#"
name = "m"
method = "mappa"
[data]
train = "data.jsonl"
[schedule]
questions_per_step = 2
steps = 3
[output]
dir = "out"
[mappa]
agents = [0, 1, 0]
[mappa.role_sampling.code_executor]
max_new_tokens = 64
[[frozen]]
name = "coach"
model = "coach"
[[agents]]
model = "m0"
[agents.train]
train_batch_size = 4
[[agents]]
model = "m1"
[agents.train]
train_batch_size = 4
"#;

    #[test]
    fn a_mappa_job_maps_roles_to_agents_and_names_its_coach() {
        let job = JobSpec::from_toml(MAPPA_JOB).unwrap().check(10).unwrap();
        let m = job.mappa.as_ref().unwrap();
        assert_eq!((m.agents.clone(), m.coach_agent, job.frozen_agent(0)), (vec![0, 1, 0], 2, 2));
        assert_eq!(m.sampling_for(Role::CodeExecutor).max_new_tokens, 64);
        assert_eq!(job.train[1].kl_coef, MAPPA_KL_COEF);
        // The LR horizon counts every action an agent may take: agent 0 plays two roles of one
        // action each, agent 1 the Executor with up to two; 4 episodes, batches of 4, 3 steps.
        assert_eq!((job.most_samples_of(0), job.most_samples_of(1)), (8, 8));
        assert_eq!((job.train[0].total_steps, job.train[1].total_steps), (6, 6));
        // Two questions, two instances each; agent 1 acts at least once per episode.
        assert_eq!((job.episodes_per_step(), job.samples_per_agent()), (4, 4));
        let json = job.settings().config_json();
        assert!(json.contains("\"code_executor\":{"), "{json}");
        let err = |text: String| JobSpec::from_toml(&text).unwrap().check(10).unwrap_err().to_string();
        assert!(err(MAPPA_JOB.replace("name = \"coach\"", "name = \"judge\"")).contains("no [[frozen]] model is named \"coach\""));
        assert!(err(MAPPA_JOB.replace("agents = [0, 1, 0]", "agents = [0, 0, 0]")).contains("agent 1 plays no role"));
        assert!(err(MAPPA_JOB.replace("agents = [0, 1, 0]", "agents = [0, 1]")).contains("`mappa.agents`"));
        assert!(err(MAPPA_JOB.replace("method = \"mappa\"", "")).contains("uses no [mappa] settings"));
        assert!(err(MAPPA_JOB.replace("train_batch_size = 4\n[[agents]]", "train_batch_size = 9\n[[agents]]")).contains("may act only 4 times per step"));
        // DSBench takes its own defaults: 4 actions per role, 60 s per run.
        let ds_job = MAPPA_JOB.replace("[mappa]\n", "[mappa]\npipeline = \"ds_bench\"\n").replace("code_executor", "modeler");
        let ds = JobSpec::from_toml(&ds_job).unwrap().check(10).unwrap();
        let m = ds.mappa.as_ref().unwrap();
        assert_eq!((m.max_turns.clone(), m.tool_timeout_secs, m.role_at(2)), (vec![4, 4, 4], 60.0, Role::Analyst));
        assert!(err(MAPPA_JOB.replace("[mappa]\n", "[mappa]\npipeline = \"kaggle\"\n")).contains("`mappa.pipeline`"));
        // A coach behind an endpoint: no folder to load; http or https.
        let served = |frozen: &str| MAPPA_JOB.replace("name = \"coach\"\nmodel = \"coach\"\n", frozen);
        let job = JobSpec::from_toml(&served("name = \"coach\"\nendpoint = \"http://judge:8000/v1\"\n")).unwrap().check(10).unwrap();
        assert_eq!((job.spec.frozen[0].model.as_ref(), job.spec.paths().iter().filter(|(k, _)| k.starts_with("frozen")).count()), (None, 0));
        assert!(JobSpec::from_toml(&served("name = \"coach\"\nendpoint = \"https://api.example.com/v1\"\n")).unwrap().check(10).is_ok());
        assert!(err(served("name = \"coach\"\nendpoint = \"ftp://judge/v1\"\n")).contains("not an http:// or https:// URL"));
        assert!(err(served("name = \"coach\"\n")).contains("give the model folder the workers load, or an `endpoint`"));
        assert!(err(served("name = \"coach\"\nmodel = \"coach\"\nendpoint = \"http://j/v1\"\n")).contains("not both"));
        assert!(err(served("name = \"coach\"\nmodel = \"coach\"\napi_key_env = \"KEY\"\n")).contains("for a model behind an `endpoint`"));
        // The global scope pools whitening statistics, so every agent must whiten.
        let global = MAPPA_JOB.replace("[mappa]\n", "[mappa]\nnorm_scope = \"global\"\n");
        assert_eq!(JobSpec::from_toml(&global).unwrap().check(10).unwrap().mappa.unwrap().norm_scope, crate::mappa::NormScope::Global);
        let grpo = global.replacen("train_batch_size = 4\n", "train_batch_size = 4\nestimator = \"group_norm\"\n", 2);
        assert!(err(grpo).contains("agents[0].train.estimator = \"group_norm\" does not whiten"));
    }

    const NEUROMAS_JOB: &str = r#"
name = "n"
method = "neuromas"
[data]
train = "train.jsonl"
[schedule]
questions_per_step = 2
steps = 3
[output]
dir = "out"
[neuromas]
rollouts_per_task = 4
param_sharing = "per_layer"
[neuromas.topology]
layers = [3, 1]
[[agents]]
model = "m"
[agents.train]
train_batch_size = 8
[[agents]]
model = "m"
[agents.train]
train_batch_size = 8
"#;

    #[test]
    fn a_neuromas_job_lists_one_agent_per_adapter_and_trains_with_group_norm() {
        let job = JobSpec::from_toml(NEUROMAS_JOB).unwrap().check(10).unwrap();
        let n = job.neuromas.as_ref().unwrap();
        assert_eq!((n.rollouts_per_task, job.episodes_per_step(), job.settings().method()), (4, 8, Method::Neuromas));
        // Agent 0 plays the 3 nodes of layer 1 in each of the 8 rollouts, agent 1 the readout.
        assert_eq!((job.most_samples_of(0), job.most_samples_of(1), job.samples_per_agent()), (24, 8, 8));
        let t = &job.train[0];
        assert_eq!(
            (t.estimator, t.kl_coef, t.kl_in_loss, t.kl_estimator),
            (crate::train_config::Estimator::GroupNorm, NEUROMAS_KL_COEF, true, crate::train_config::KlEstimator::K3)
        );
        let err = |text: String| JobSpec::from_toml(&text).unwrap().check(10).unwrap_err().to_string();
        assert!(err(NEUROMAS_JOB.replace("per_layer", "per_node")).contains("trains one adapter per node: list 4 [[agents]], not 2"));
        assert!(err(NEUROMAS_JOB.replace("layers = [3, 1]", "layers = [3, 2]")).contains("`neuromas.topology.layers`"));
        assert!(err(NEUROMAS_JOB.replace("rollouts_per_task = 4", "rollouts_per_task = 1")).contains("at least 2 rollouts"));
        let guided = NEUROMAS_JOB.replace("[neuromas.topology]", "[neuromas.sampling]\nmax_new_tokens = 12\nguided_suffix = 'x'\n[neuromas.topology]");
        assert!(err(guided).contains("`neuromas.sampling`: guided_suffix needs max_new_tokens above"));
        let big = NEUROMAS_JOB.replace("train_batch_size = 8", "train_batch_size = 24");
        assert!(JobSpec::from_toml(&big)
            .unwrap()
            .check(10)
            .unwrap_err()
            .to_string()
            .contains("agent 1 plays only 8 node turns per step (8 rollouts x 1 nodes)"));
        assert!(err(NEUROMAS_JOB.replace("method = \"neuromas\"\n", "")).contains("`neuromas`: is set but method is comas"));
        // Evaluation plays the graph with the eval instance count and temperature.
        let e = JobSpec::from_toml(&NEUROMAS_JOB.replace("[output]", "[eval]\ndata = \"held.jsonl\"\n[output]")).unwrap().check(10).unwrap();
        match e.eval_method_at(0.0) {
            MethodConfig::Neuromas(c) => assert_eq!((c.rollouts_per_task, c.sampling.temperature), (1, 0.0)),
            other => panic!("{other:?}"),
        }
    }

    const COSIR_JOB: &str = r#"
name = "c"
method = "cosir"
[schedule]
questions_per_step = 4
steps = 3
[output]
dir = "out"
[cosir]
agents = 3
rounds = 2
[[agents]]
model = "m0"
[agents.train]
train_batch_size = 12
"#;

    #[test]
    fn a_cosir_job_generates_its_tables_and_trains_one_shared_policy() {
        let job = JobSpec::from_toml(COSIR_JOB).unwrap().check(0).unwrap();
        let c = job.cosir.as_ref().unwrap();
        assert_eq!((c.agents, c.rounds, job.total_steps, job.episodes_per_step()), (3, 2, 3, 4));
        // One policy plays all three seats, (2 rounds + final) turns each: 9 per game.
        assert_eq!((job.samples_per_agent(), job.most_samples_of(0)), (36, 36));
        assert_eq!(job.step_questions(2), vec![8, 9, 10, 11]);
        assert_eq!((job.train[0].kl_coef, job.train[0].kl_in_loss), (COSIR_KL_COEF, true));
        assert_eq!(job.settings().method(), Method::Cosir);
        let err = |text: String| JobSpec::from_toml(&text).unwrap().check(0).unwrap_err().to_string();
        assert!(err(COSIR_JOB.replace("rounds = 2", "rounds = 2\nseat_policy = \"per_seat\"")).contains("list 3 [[agents]] (cosir.agents), not 1"));
        assert!(err(COSIR_JOB.replace("agents = 3", "agents = 9")).contains("`cosir.agents`"));
        assert!(err(COSIR_JOB.replace("steps = 3", "epochs = 3")).contains("give `steps`, not `epochs`"));
        assert!(err(COSIR_JOB.replace("[output]", "[data]\ntrain = \"x.jsonl\"\n[output]")).contains("CoSIR generates its tables"));
        assert!(err(COSIR_JOB.replace("train_batch_size = 12", "train_batch_size = 40")).contains("speaks only 36 turns per step (4 games x 9 turns)"));
        assert!(err(COSIR_JOB.replace("[output]", "[eval]\nevery_steps = 1\n[output]")).contains("`eval.max_questions`"));
        // Held-out tables name no file: resolving paths leaves eval.data empty, and no path is relative.
        let mut spec = JobSpec::from_toml(&COSIR_JOB.replace("[output]", "[eval]\nmax_questions = 4\n[output]")).unwrap();
        spec.resolve_paths(Path::new("/base"));
        assert_eq!((spec.relative_paths().len(), spec.eval.as_ref().unwrap().data.as_os_str().is_empty()), (0, true));
        spec.check(0).unwrap();
        assert!(err(COSIR_JOB.replace("[cosir]", "[cosir]\nw_shares = 1.0")).contains("`cosir`"));
    }

    const EVAL_JOB: &str = r#"
name = "e"
method = "eval"
[evaluate]
setup = "debate"
max_new_tokens = 32
[[evaluate.questions]]
index = 3
id = "a"
query = "1 + 1?"
[[evaluate.questions]]
index = 5
id = "b"
query = "2 + 2?"
[[frozen]]
name = "m0"
model = "m"
[[frozen]]
name = "m1"
model = "n"
adapter = "lora"
[output]
dir = "out"
"#;

    #[test]
    fn an_evaluation_job_is_one_step_of_frozen_models_and_inline_questions() {
        let job = JobSpec::from_toml(EVAL_JOB).unwrap().check(0).unwrap();
        let e = job.evaluate.as_ref().unwrap();
        assert_eq!((e.settings.members, e.settings.max_new_tokens, e.settings.temperature), (2, 32, crate::eval::EVAL_TEMPERATURE));
        assert_eq!(e.questions.iter().map(|q| q.index).collect::<Vec<_>>(), vec![3, 5]);
        assert_eq!((job.total_steps, job.episodes_per_step(), job.samples_per_agent(), job.step_questions(0)), (1, 2, 0, vec![0, 1]));
        assert_eq!((job.settings().method(), job.frozen_agent(1)), (Method::Eval, 1));
        assert!(job.train.is_empty());
        let err = |text: String| JobSpec::from_toml(&text).unwrap().check(0).unwrap_err().to_string();
        assert!(err(EVAL_JOB.replace("[output]", "[[agents]]\nmodel = \"m\"\n[output]")).contains("trains nothing"));
        assert!(err(EVAL_JOB.replace("[output]", "[schedule]\nsteps = 2\n[output]")).contains("in one step"));
        assert!(err(EVAL_JOB.replace("index = 5", "index = 3")).contains("index 3 is given twice"));
        assert!(err(EVAL_JOB.replace("setup = \"debate\"", "setup = \"chat\"")).contains("`evaluate`"));
        assert!(err(EVAL_JOB.replace("[evaluate]", "[evaluate]\nmembers = 1")).contains("number of [[frozen]] models"));
        let no_team: String = EVAL_JOB.split("[[frozen]]").next().unwrap().to_string() + "[output]\ndir = \"out\"\n";
        assert!(err(no_team).contains("[[frozen]] tables"));
        // A training job needs its data; the [evaluate] table belongs to evaluation jobs only.
        assert!(err(JOB.replace("[data]\ntrain = \"data.jsonl\"", "")).contains("`data.train`"));
        assert!(err(JOB.replace("[output]", "[evaluate]\nsetup = \"vanilla\"\n[output]")).contains("method = \"eval\""));
    }

    #[test]
    fn resolves_counts_and_per_agent_settings() {
        let job = JobSpec::from_toml(JOB).unwrap().check(10).unwrap();
        assert_eq!(job.comas.num_agents, 2);
        assert_eq!(job.total_steps, 3);
        assert_eq!(job.episodes_per_step(), 4);
        // l = 2, R = 2, n = 1: 12 turns per instance, 48 per step, 24 per agent.
        assert_eq!(job.samples_per_agent(), 24);
        assert_eq!(job.turns_per_step(Role::Scorer), 16);
        // LR horizon: ceil(24 / 4) = 6 optimizer steps per step for agent 0, 1 for agent 1.
        assert_eq!(job.train[0].total_steps, 18);
        assert_eq!(job.train[1].total_steps, 3);
        assert_eq!(job.train[0].lr, 1e-5);
        assert_eq!(job.train[0].temperature, 1.0);
        assert_ne!(job.train[0].seed, job.train[1].seed);
    }

    #[test]
    fn errors_name_the_field() {
        let err = |text: &str, n: usize| JobSpec::from_toml(text).and_then(|s| s.check(n)).unwrap_err().to_string();
        let e = err(&JOB.replace("steps = 3", "steps = 3\nwarp = 9"), 10);
        assert!(e.contains("warp"), "{e}");
        let e = err(&JOB.replace("lr = 1e-5", "lr = 1e-5\nuse_ttrl = true"), 10);
        assert!(e.contains("agents[0].train") && e.contains("use_ttrl"), "{e}");
        let e = err(JOB, 1);
        assert!(e.contains("questions_per_step") && e.contains("only 1"), "{e}");
        let e = err(&JOB.replace("train_batch_size = 24", "train_batch_size = 25"), 10);
        assert!(e.contains("agents[1].train.train_batch_size") && e.contains("24 turns"), "{e}");
        let e = err(&JOB.replace("num_rounds = 2", "num_rounds = 2\nnum_agents = 3"), 10);
        assert!(e.contains("comas.num_agents"), "{e}");
        let e = err(&JOB.replace("steps = 3", "steps = 3\nepochs = 1"), 10);
        assert!(e.contains("not both"), "{e}");
        let e = err(&JOB.replace("steps = 3", "steps = 3\nsync = \"async\"\nmax_policy_lag = 0"), 10);
        assert!(e.contains("schedule.max_policy_lag") && e.contains("at least 1"), "{e}");
        let e = err(&JOB.replace("steps = 3", "steps = 3\nmax_policy_lag = 2"), 10);
        assert!(e.contains("schedule.max_policy_lag") && e.contains("synchronous"), "{e}");
        let e = err(&JOB.replace("steps = 3", "steps = 3\nsync = \"later\""), 10);
        assert!(e.contains("sync"), "{e}");
        let e = err(&JOB.replace("model = \"m1\"", "model = \"m1\"\nid = 0"), 10);
        assert!(e.contains("agents[1].id"), "{e}");
    }

    #[test]
    fn epochs_drop_the_last_partial_batch_and_reshuffle() {
        let job = JobSpec::from_toml(&JOB.replace("steps = 3", "epochs = 2")).unwrap().check(5).unwrap();
        assert_eq!((job.steps_per_epoch, job.total_steps), (2, 4));
        let e0: Vec<usize> = (0..2).flat_map(|s| job.step_questions(s)).collect();
        let e1: Vec<usize> = (2..4).flat_map(|s| job.step_questions(s)).collect();
        for e in [&e0, &e1] {
            let mut sorted = e.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 4, "no question twice within an epoch: {e:?}");
        }
        assert_ne!(e0, e1, "each epoch has its own order");
        assert_eq!(step_questions(5, 2, 7, false, 3), vec![2, 3]);
        assert_eq!(job.step_questions(1), job.step_questions(1));
    }

    #[test]
    fn evaluation_is_due_at_start_every_k_steps_and_at_the_end() {
        let text = JOB.replace("[[agents]]\nmodel = \"m0\"", "[eval]\ndata = \"test.jsonl\"\nevery_steps = 2\n[[agents]]\nmodel = \"m0\"");
        let job = JobSpec::from_toml(&text.replace("steps = 3", "steps = 5")).unwrap().check(10).unwrap();
        let due: Vec<u64> = (0..=5).filter(|&k| job.eval_due(k)).collect();
        assert_eq!(due, vec![0, 2, 4, 5]);
        let c = job.eval_comas().unwrap();
        assert_eq!((c.instances_per_question, c.sampling.scorer.temperature), (1, 0.7));
        assert_eq!(c.sampling.solver.max_new_tokens, job.comas.sampling.solver.max_new_tokens);
        let e = JobSpec::from_toml(&text.replace("every_steps = 2", "every_steps = 0")).unwrap().check(10).unwrap_err().to_string();
        assert!(e.contains("eval"), "{e}");
        let mut spec = JobSpec::from_toml(&text).unwrap();
        assert_eq!(spec.relative_paths().len(), 5);
        spec.resolve_paths(Path::new("/j"));
        assert_eq!(spec.eval.unwrap().data, PathBuf::from("/j/test.jsonl"));
        assert!(JobSpec::from_toml(JOB).unwrap().check(10).unwrap().eval_comas().is_none());
        let greedy = JobSpec::from_toml(&text.replace("every_steps = 2", "every_steps = 2\ngreedy = true")).unwrap().check(10).unwrap();
        assert!(greedy.spec.eval.as_ref().unwrap().greedy);
        assert_eq!(greedy.eval_comas_at(0.0).sampling.solver.temperature, 0.0);
    }

    #[test]
    fn the_reward_source_is_a_comas_option() {
        let job = JobSpec::from_toml(JOB).unwrap().check(10).unwrap();
        assert_eq!(job.comas.reward, crate::comas::RewardSource::Comas);
        let job = JobSpec::from_toml(&JOB.replace("num_rounds = 2", "num_rounds = 2\nreward = \"verifier\"")).unwrap().check(10).unwrap();
        assert_eq!(job.comas.reward, crate::comas::RewardSource::Verifier);
        let e = JobSpec::from_toml(&JOB.replace("num_rounds = 2", "num_rounds = 2\nreward = \"oracle\"")).and_then(|s| s.check(10)).unwrap_err().to_string();
        assert!(e.contains("oracle") && e.contains("verifier"), "{e}");
    }

    #[test]
    fn relative_paths_resolve_against_the_job_folder() {
        let mut spec = JobSpec::from_toml(JOB).unwrap();
        assert_eq!(spec.relative_paths().len(), 4);
        spec.resolve_paths(Path::new("/jobs/x"));
        assert!(spec.relative_paths().is_empty());
        assert_eq!(spec.agents[1].model, PathBuf::from("/jobs/x/m1"));
    }
}
