//! The job file's parts (TOML): agents, the method and its table, data, schedule, rollout,
//! output, in-training evaluation, frozen models. Unknown keys are errors; the method's table
//! is kept raw until the method reads it.
use super::{invalid, JobError};
use crate::registry;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A model that serves a role but is never trained (a coach, a judge, a user proxy): the
/// workers load it beside the agents, and no learner is attached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
        Self {
            name: name.into(),
            model: Some(model),
            adapter,
            endpoint: None,
            endpoint_model: None,
            api_key_env: None,
            max_attempts: None,
        }
    }

    pub(super) fn check(&self, k: usize) -> Result<(), JobError> {
        let field = |f: &str| format!("frozen[{k}].{f}");
        match (&self.model, &self.endpoint) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    field("endpoint"),
                    "give either a model folder or an endpoint, not both",
                ))
            }
            (None, None) => return Err(invalid(
                field("model"),
                "give the model folder the workers load, or an `endpoint` that serves the model",
            )),
            (None, Some(url)) => {
                if !url.starts_with("http://") && !url.starts_with("https://") {
                    return Err(invalid(
                        field("endpoint"),
                        format!(
                            "{url:?} is not an http:// or https:// URL (e.g. http://judge:8000/v1)"
                        ),
                    ));
                }
                if self.adapter.is_some() {
                    return Err(invalid(field("adapter"), "an endpoint model has no adapter here; the endpoint serves the model as it is"));
                }
            }
            (Some(_), None) => {
                if self.endpoint_model.is_some()
                    || self.api_key_env.is_some()
                    || self.max_attempts.is_some()
                {
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

/// How rollout and training take turns.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
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

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    /// Training questions: JSONL, a JSON array, a parquet file or a folder of parquet shards,
    /// of rows {prompt, answer, task, id} (other column names: the `*_key` settings). An
    /// evaluation job has none (its questions are in `[evaluate]`).
    #[serde(default)]
    pub train: PathBuf,
    /// Reshuffle the questions every epoch (seeded by the job seed and the epoch).
    #[serde(default = "yes")]
    pub shuffle: bool,
    /// The column of the question (default `prompt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_key: Option<String>,
    /// The column of the reference answer (default `answer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_key: Option<String>,
    /// The column of the question's id (default: `id`, or `row-N` where there is none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_key: Option<String>,
    /// A column of chat messages whose last user message is the question, in place of
    /// `prompt_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_key: Option<String>,
    /// The task of every row without a `task` column: math, coding, science or data_science.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

impl DataSpec {
    /// How rows of the data sets (training and held-out) are read into task records.
    pub fn columns(&self) -> crate::dataset::Columns {
        let d = crate::dataset::Columns::default();
        crate::dataset::Columns {
            prompt: self.prompt_key.clone().unwrap_or(d.prompt),
            answer: self.answer_key.clone().unwrap_or(d.answer),
            id: self.id_key.clone(),
            task_column: d.task_column,
            task: self.task.clone(),
            messages: self.messages_key.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// Weights dtype on the rollout workers.
    #[serde(default = "float32")]
    pub dtype: String,
    /// What generates the turns on every worker: `comas` (its own engine) or `vllm` (a vLLM
    /// server per base model); unset, each worker's `--engine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<RolloutEngine>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RolloutEngine {
    Comas,
    Vllm,
}

impl RolloutEngine {
    pub fn name(self) -> &'static str {
        match self {
            RolloutEngine::Comas => "comas",
            RolloutEngine::Vllm => "vllm",
        }
    }
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self { dtype: float32(), engine: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// Experiment tracking besides the job's own metrics log and TensorBoard file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrackingSpec {
    /// An MLflow tracking server (`http://host:5000`): the job's parameters, every step's and
    /// evaluation's metrics, the job file, the metrics log and its figure (`plot.png`) as
    /// artifacts, and the run's end state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<String>,
    /// The MLflow experiment (created if missing; default: the job's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
    /// The MLflow run's name (default: the job's name and id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_name: Option<String>,
}

/// In-training evaluation (spec 6.3): the same CoMAS game on held-out questions, no training,
/// every `every_steps` steps, after the last step, and (with `at_start`) before the first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// Held-out questions, same record format as the training data (CoSIR: none; its held-out
    /// tables are generated, `max_questions` of them).
    #[serde(default)]
    pub data: PathBuf,
    /// Evaluate after every this many steps.
    #[serde(default = "five")]
    pub every_steps: u64,
    /// Evaluate the base models before the first step too.
    #[serde(default = "yes")]
    pub at_start: bool,
    /// Use only the first this many questions; 0 = all.
    #[serde(default)]
    pub max_questions: usize,
    /// Games played per held-out question.
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    #[schemars(with = "crate::train_config::TrainConfig")]
    pub train: toml::Table,
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
pub(super) fn default_seed() -> u64 {
    42
}

/// The method a job file without `method` runs.
pub const DEFAULT_METHOD: &str = "comas";

/// A job file, parsed: every part typed but the agents' training tables and the method's own
/// table, which are resolved by `check`.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub name: String,
    pub seed: u64,
    /// `method = "NAME"`, one of `registry::NAMES` (default `DEFAULT_METHOD`).
    pub method: String,
    /// The method's own table (`[comas]`, `[mappa]`, `[evaluate]`, ...), raw until the method
    /// reads it.
    pub settings: toml::Table,
    /// Frozen models the method may call; their agent ids follow the trained agents'.
    pub frozen: Vec<FrozenSpec>,
    pub data: DataSpec,
    pub schedule: ScheduleSpec,
    pub rollout: RolloutSpec,
    pub output: OutputSpec,
    pub eval: Option<EvalSpec>,
    pub tracking: TrackingSpec,
    /// Missing is the same as empty: `check` then says what to add.
    pub agents: Vec<AgentSpec>,
}

/// The keys of a job file besides the methods' tables.
const KEYS: &[&str] = &[
    "name", "seed", "method", "frozen", "data", "schedule", "rollout", "output", "eval",
    "tracking", "agents",
];

/// A job file as read: its typed parts, every method table it has, and the first key that is
/// neither (with where it starts in the text).
struct JobFile {
    spec: JobSpec,
    tables: Vec<(String, toml::Value)>,
    unknown: Option<(String, usize)>,
}

impl<'de> Deserialize<'de> for JobFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(JobFileVisitor)
    }
}

struct JobFileVisitor;

impl<'de> serde::de::Visitor<'de> for JobFileVisitor {
    type Value = JobFile;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a job file")
    }

    // Field by field, so that a wrong value deep in a part keeps the position toml gives it.
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<JobFile, A::Error> {
        use serde::de::Error;
        let (mut name, mut seed, mut method, mut frozen, mut data, mut schedule) =
            (None, None, None, None, None, None);
        let (mut rollout, mut output, mut eval, mut agents, mut tables, mut unknown) =
            (None, None, None, None, Vec::new(), None);
        let mut tracking = None;
        while let Some(key) = map.next_key::<toml::Spanned<String>>()? {
            let at = key.span().start;
            let key = key.into_inner();
            match key.as_str() {
                "name" => name = Some(map.next_value()?),
                "seed" => seed = Some(map.next_value()?),
                "method" => method = Some(map.next_value()?),
                "frozen" => frozen = Some(map.next_value()?),
                "data" => data = Some(map.next_value()?),
                "schedule" => schedule = Some(map.next_value()?),
                "rollout" => rollout = Some(map.next_value()?),
                "output" => output = Some(map.next_value()?),
                "eval" => eval = Some(map.next_value()?),
                "tracking" => tracking = Some(map.next_value()?),
                "agents" => agents = Some(map.next_value()?),
                k if registry::TABLES.contains(&k) => tables.push((key, map.next_value()?)),
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    unknown.get_or_insert((key, at));
                }
            }
        }
        let spec = JobSpec {
            name: name.ok_or_else(|| A::Error::missing_field("name"))?,
            seed: seed.unwrap_or_else(default_seed),
            method: method.unwrap_or_else(|| DEFAULT_METHOD.to_string()),
            settings: toml::Table::new(),
            frozen: frozen.unwrap_or_default(),
            data: data.unwrap_or_default(),
            schedule: schedule.unwrap_or_default(),
            rollout: rollout.unwrap_or_default(),
            output: output.ok_or_else(|| A::Error::missing_field("output"))?,
            eval,
            tracking: tracking.unwrap_or_default(),
            agents: agents.unwrap_or_default(),
        };
        Ok(JobFile { spec, tables, unknown })
    }
}

impl JobSpec {
    /// Parses a job file. A method's table in a job of another method is an error: its
    /// settings would be silently ignored.
    pub fn from_toml(text: &str) -> Result<Self, JobError> {
        Self::parse(text, true)
    }

    /// [`JobSpec::from_toml`]; without `lines`, a syntax error leaves out where in `text` it
    /// is (for a text that is not the user's file: the file with command-line overrides).
    pub(super) fn parse(text: &str, lines: bool) -> Result<Self, JobError> {
        let JobFile { mut spec, tables, unknown } =
            toml::from_str(text).map_err(|e: toml::de::Error| {
                let shown = if lines { e.to_string() } else { e.message().to_string() };
                JobError::Syntax(shown.trim_end().to_string())
            })?;
        if let Some((key, at)) = unknown {
            let line = text[..at.min(text.len())].matches('\n').count() + 1;
            let known: Vec<&str> = KEYS.iter().chain(registry::TABLES).copied().collect();
            let at = if lines { format!("line {line}: ") } else { String::new() };
            return Err(JobError::Syntax(format!(
                "{at}unknown field `{key}`, expected one of `{}`",
                known.join("`, `")
            )));
        }
        if !registry::is_method(&spec.method) {
            return Err(invalid("method", registry::unknown(&spec.method)));
        }
        let own = registry::TABLES
            [registry::NAMES.iter().position(|n| *n == spec.method).expect("a registered name")];
        for (table, value) in tables {
            if table != own {
                let of = registry::NAMES[registry::TABLES
                    .iter()
                    .position(|t| *t == table)
                    .expect("a registered table")];
                return Err(invalid(
                    &table,
                    format!(
                        "is set but method is {}; set method = \"{of}\" or remove it",
                        spec.method
                    ),
                ));
            }
            let toml::Value::Table(t) = value else {
                return Err(invalid(
                    &table,
                    format!("must be a table of the {} settings", spec.method),
                ));
            };
            spec.settings = t;
        }
        Ok(spec)
    }

    /// The job file's text (the method's table under its name).
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
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

    /// The name of the method's table in the job file.
    pub fn table(&self) -> &'static str {
        registry::NAMES.iter().position(|n| *n == self.method).map_or("", |i| registry::TABLES[i])
    }
}

impl Serialize for JobSpec {
    /// The same keys a job file has; the method's table under its name.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeMap};
        fn value<T: Serialize, E: Error>(v: &T) -> Result<toml::Value, E> {
            toml::Value::try_from(v).map_err(E::custom)
        }
        let mut entries: Vec<(&str, toml::Value)> = vec![
            ("name", toml::Value::String(self.name.clone())),
            ("seed", toml::Value::Integer(self.seed as i64)),
            ("method", toml::Value::String(self.method.clone())),
            ("frozen", value(&self.frozen)?),
            ("data", value(&self.data)?),
            ("schedule", value(&self.schedule)?),
            ("rollout", value(&self.rollout)?),
            ("output", value(&self.output)?),
            ("agents", value(&self.agents)?),
        ];
        if let Some(e) = &self.eval {
            entries.push(("eval", value(e)?));
        }
        if self.tracking != TrackingSpec::default() {
            entries.push(("tracking", value(&self.tracking)?));
        }
        if !self.settings.is_empty() {
            entries.push((self.table(), toml::Value::Table(self.settings.clone())));
        }
        let mut map = s.serialize_map(Some(entries.len()))?;
        for (k, v) in &entries {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}
