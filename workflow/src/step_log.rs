//! The records of a job's metrics log (`metrics.jsonl`, one JSON object a line): what every
//! method's step and evaluation records share, typed. A record's own figures (its method's
//! `Method::Metrics`, read by the registry with `method`'s name) stay a map beside the shared
//! fields, so the log keeps one flat object a line whatever the method, as before it was typed.
//!
//! A line holds the same fields with the same values as when the coordinator assembled the
//! record as a JSON value; only the order of the keys differs: the shared fields come first
//! (`kind`, `job_id`, `step`, ...), then the method's figures.
use crate::moments::Moments;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    Step(StepLog),
    Eval(EvalLog),
}

/// A committed training step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepLog {
    #[serde(default)]
    pub job_id: String,
    pub step: u64,
    #[serde(default)]
    pub unix_time: f64,
    /// Tokens generated per second of the rollout stage.
    #[serde(default)]
    pub tokens_per_s: f64,
    /// Absent only in records that were not written by a coordinator (tests, hand-made logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<StepSeconds>,
    /// Time within the step that the workers and the learners stood idle (absent in records of
    /// older jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_seconds: Option<IdleSeconds>,
    /// The moments every agent's advantages were whitened with, per norm group, when pooled
    /// over all agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooled_whitening: Option<BTreeMap<String, PooledMoments>>,
    /// Each agent's figures and training report, in agent order (absent when the method
    /// logs none per agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<AgentStep>>,
    /// The method's own figures, `method` (its name) among them.
    #[serde(flatten)]
    pub figures: Map<String, Value>,
}

/// The stage times of a step, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepSeconds {
    pub rollout: f64,
    pub experience: f64,
    pub train: f64,
    pub broadcast: f64,
    /// The coordinator's own work: planning, storing, committing.
    pub coordinator: f64,
    pub total: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct IdleSeconds {
    /// No rollout or evaluation ran.
    pub workers: f64,
    /// No learner trained.
    pub learners: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PooledMoments {
    pub tokens: u64,
    pub mean: f64,
    pub std: f64,
}

/// One agent in a step record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentStep {
    /// The weights the workers pulled after the step.
    #[serde(default)]
    pub weight_sync: WeightSync,
    /// The policy version the learner published.
    #[serde(default)]
    pub version: u64,
    /// The learner's report of the step: null when the learner trained the step before a
    /// restart and no longer keeps its report.
    #[serde(default)]
    pub train: Option<TrainReport>,
    /// The method's figures of this agent (`agent`, its rewards, ...).
    #[serde(flatten)]
    pub figures: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WeightSync {
    /// Bytes pulled by all workers.
    pub bytes: u64,
    /// Bytes the learner itself sent (the rest came through the relay of workers).
    pub learner_bytes: u64,
    /// The slowest worker's seconds.
    pub seconds: f64,
}

/// What a learner reports of one training step.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct TrainReport {
    pub global_step: u64,
    pub optimizer_steps: u64,
    pub samples: usize,
    /// Prompt + completion tokens processed by the training forward passes.
    pub tokens: usize,
    pub completion_tokens: usize,
    /// pg_loss + β·kl_loss, averaged over the optimizer steps.
    pub loss: f64,
    pub pg_loss: f64,
    pub kl_loss: f64,
    /// Masked mean KL estimate (in the reward or in the loss, whichever is used).
    pub kl: f64,
    pub clip_frac: f64,
    /// Masked mean of ℓ^old − ℓ^θ.
    pub approx_kl: f64,
    pub entropy: f64,
    /// Mean entropy of the first completion token's distribution (a cheap probe of whether
    /// policies that start alike, such as NeuroMAS nodes, are specialising).
    pub first_token_entropy: f64,
    /// Truncated importance sampling (`tis_cap`): the mean weight over trained tokens and the
    /// fraction cut to the cap.
    pub tis_weight_mean: Option<f64>,
    pub tis_truncated_frac: Option<f64>,
    /// LoRA: ‖scale·B·A‖ over every adapted projection (the Frobenius norm of the whole weight
    /// change), after the step.
    pub adapter_norm: Option<f64>,
    /// Global gradient norm before clipping (mean over optimizer steps), and the largest.
    pub grad_norm: f64,
    pub grad_norm_max: f64,
    /// Learning rate of the last update.
    pub lr: f64,
    pub advantage_mean: f64,
    pub return_mean: f64,
    pub return_std: f64,
    pub singleton_groups: usize,
    pub truncated: usize,
    /// Samples left out of the loss (`mask_truncated`: cut at max_new_tokens).
    pub masked_samples: usize,
    /// Samples in the loss whose every token's advantage is 0 (a group whose rewards were all
    /// equal, under a group estimator): they move nothing.
    pub zero_advantage_samples: usize,
    /// No sample carried a policy gradient: every one masked or with a zero advantage. The
    /// weights then move only by a KL term in the loss, if there is one.
    pub no_gradient: bool,
    /// Mean |ℓ^old − ℓ^sampler| over tokens that came with sampler log-probs (not measured
    /// when the sampler's log-probs are ℓ^old).
    pub sampler_mismatch: Option<f64>,
    /// ℓ^old came from the sampler (`old_logprobs = "sampler"`), with no recompute pass.
    pub old_logprobs_from_sampler: bool,
    /// The process's peak resident memory so far (Linux; 0 elsewhere).
    pub peak_rss_bytes: u64,
    /// Optimizer steps skipped because their loss or gradient was not finite (their gradients
    /// are dropped, as DeepSpeed and Megatron do).
    pub skipped_steps: u64,
    /// Moments of this learner's returns per norm group (before any pooling).
    pub return_moments: BTreeMap<String, Moments>,
    pub seconds: f64,
    pub tokens_per_s: f64,
}

/// A held-out evaluation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalLog {
    #[serde(default)]
    pub job_id: String,
    /// The training steps the evaluated weights had taken (`step` repeats it for readers of
    /// older logs).
    pub after_steps: u64,
    #[serde(default)]
    pub step: u64,
    /// The sampling temperature of the evaluation game (0: greedy).
    #[serde(default)]
    pub temperature: f64,
    #[serde(default)]
    pub unix_time: f64,
    #[serde(default)]
    pub seconds: EvalSeconds,
    /// The same game played greedily (`[eval] greedy = true`): the method's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greedy: Option<Map<String, Value>>,
    /// The method's own figures, `method` (its name) among them.
    #[serde(flatten)]
    pub figures: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalSeconds {
    pub total: f64,
}

/// Why a line is not a record.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("not valid JSON ({0}); each line must be one JSON object")]
    Json(serde_json::Error),
    #[error("expected a JSON object, found {0}")]
    NotAnObject(&'static str),
    #[error("a {kind} record that does not read: {source}")]
    Record { kind: String, source: serde_json::Error },
}

impl Record {
    /// The record as one log line (no newline).
    pub fn line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads one line of a log; `None` for a record of another kind (or none), which readers
    /// skip.
    pub fn parse(line: &str) -> Result<Option<Record>, LineError> {
        let value: Value = serde_json::from_str(line).map_err(LineError::Json)?;
        Record::from_value(value)
    }

    /// [`Record::parse`] of a line already read as JSON.
    pub fn from_value(value: Value) -> Result<Option<Record>, LineError> {
        let kind = match &value {
            Value::Object(o) => {
                o.get("kind").and_then(Value::as_str).unwrap_or_default().to_string()
            }
            other => return Err(LineError::NotAnObject(crate::error::json_kind(other))),
        };
        match kind.as_str() {
            "step" | "eval" => serde_json::from_value(value)
                .map(Some)
                .map_err(|source| LineError::Record { kind, source }),
            _ => Ok(None),
        }
    }

    /// The record's step on a training-step axis: a step's own, an evaluation's `after_steps`.
    pub fn x(&self) -> u64 {
        match self {
            Record::Step(s) => s.step,
            Record::Eval(e) => e.after_steps,
        }
    }

    pub fn job_id(&self) -> &str {
        match self {
            Record::Step(s) => &s.job_id,
            Record::Eval(e) => &e.job_id,
        }
    }
}

impl StepLog {
    /// A step record around the method's figures (`figures`: its metrics as a JSON object);
    /// each entry of their `agents` list becomes an [`AgentStep`] with the same figures.
    pub fn new(job_id: &str, step: u64, figures: Value) -> StepLog {
        let mut figures = object(figures, STEP_FIELDS);
        let agents = match figures.remove("agents") {
            Some(Value::Array(list)) => Some(
                list.into_iter()
                    .map(|a| AgentStep { figures: object(a, AGENT_FIELDS), ..AgentStep::default() })
                    .collect(),
            ),
            Some(other) => {
                // Not a list: kept as the method gave it.
                figures.insert("agents".into(), other);
                None
            }
            None => None,
        };
        StepLog { job_id: job_id.to_string(), step, agents, figures, ..StepLog::default() }
    }

    /// The agents of the step (none when the method logs none per agent).
    pub fn agents(&self) -> &[AgentStep] {
        self.agents.as_deref().unwrap_or_default()
    }

    /// The step as a JSON value, in the shape the method's figures are read from.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(Record::Step(self.clone())).unwrap_or_default()
    }
}

/// The keys a step record's shared fields own: a method's figure of the same name gives way
/// (the record always said the machinery's value).
const STEP_FIELDS: &[&str] = &[
    "kind",
    "job_id",
    "step",
    "unix_time",
    "tokens_per_s",
    "seconds",
    "idle_seconds",
    "pooled_whitening",
];
const AGENT_FIELDS: &[&str] = &["weight_sync", "version", "train"];
const EVAL_FIELDS: &[&str] =
    &["kind", "job_id", "step", "after_steps", "temperature", "unix_time", "seconds", "greedy"];

/// `v`'s entries less the `owned` keys; nothing when `v` is not an object.
fn object(v: Value, owned: &[&str]) -> Map<String, Value> {
    match v {
        Value::Object(mut m) => {
            m.retain(|k, _| !owned.contains(&k.as_str()));
            m
        }
        _ => Map::new(),
    }
}

impl AgentStep {
    /// The agent's index (`agent` in its figures).
    pub fn agent(&self) -> Option<u64> {
        self.figures.get("agent").and_then(Value::as_u64)
    }

    /// A number of the agent's figures (`reward_mean`, ...).
    pub fn figure(&self, name: &str) -> Option<f64> {
        self.figures.get(name).and_then(Value::as_f64)
    }
}

impl EvalLog {
    /// An evaluation record around the method's figures of the sampled game, and of the greedy
    /// one when it was played.
    pub fn new(
        job_id: &str,
        after_steps: u64,
        temperature: f64,
        figures: Value,
        greedy: Option<Value>,
    ) -> EvalLog {
        EvalLog {
            job_id: job_id.to_string(),
            after_steps,
            step: after_steps,
            temperature,
            greedy: greedy.map(|g| object(g, &[])),
            figures: object(figures, EVAL_FIELDS),
            ..EvalLog::default()
        }
    }

    /// The evaluation as a JSON value, in the shape the method's figures are read from.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(Record::Eval(self.clone())).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A step record as the coordinator assembled it before the log was typed, with its keys.
    fn untyped_step() -> Value {
        json!({
            "kind": "step", "job_id": "j", "step": 3, "method": "grpo", "unix_time": 1700000000.25,
            "tokens_per_s": 812.5, "reward": {"mean": 0.25}, "generated_tokens": 4096,
            "idle_seconds": {"workers": 1.5, "learners": 0.0},
            "agents": [{"agent": 0, "reward_mean": 0.125, "version": 4,
                        "weight_sync": {"bytes": 1024, "learner_bytes": 512, "seconds": 0.5},
                        "train": {"loss": -0.01, "no_gradient": false, "masked_samples": 2, "return_moments": {"all": {"count": 3, "mean": 0.5, "m2": 0.25}}}}],
            "seconds": {"rollout": 10.0, "experience": 0.5, "train": 7.0, "broadcast": 1.0, "coordinator": 0.1, "total": 18.6}
        })
    }

    #[test]
    fn a_step_reads_typed_and_writes_back_the_same_fields() {
        let v = untyped_step();
        let Some(Record::Step(s)) = Record::from_value(v.clone()).unwrap() else {
            panic!("a step")
        };
        assert_eq!(
            (s.job_id.as_str(), s.step, s.seconds.unwrap().train, s.idle_seconds.unwrap().workers),
            ("j", 3, 7.0, 1.5)
        );
        let a = &s.agents()[0];
        assert_eq!(
            (a.agent(), a.figure("reward_mean"), a.version, a.weight_sync.learner_bytes),
            (Some(0), Some(0.125), 4, 512)
        );
        let train = a.train.as_ref().unwrap();
        assert_eq!(
            (train.masked_samples, train.no_gradient, train.return_moments["all"].count),
            (2, false, 3)
        );
        assert_eq!(s.figures["method"], "grpo");
        // Written back: every field of the original, the report's defaults filled in.
        let back: Value = serde_json::from_str(&Record::Step(s).line()).unwrap();
        let mut want = v;
        let full = serde_json::to_value(TrainReport {
            loss: -0.01,
            masked_samples: 2,
            return_moments: train_moments(),
            ..TrainReport::default()
        })
        .unwrap();
        want["agents"][0]["train"] = full;
        assert_eq!(back, want);
    }

    fn train_moments() -> BTreeMap<String, Moments> {
        BTreeMap::from([("all".to_string(), Moments { count: 3, mean: 0.5, m2: 0.25 })])
    }

    #[test]
    fn a_line_has_the_shared_fields_first() {
        let s = StepLog::new("j", 1, json!({"method": "grpo", "agents": [{"agent": 0}]}));
        let line = Record::Step(s).line();
        assert!(line.starts_with(r#"{"kind":"step","job_id":"j","step":1,"unix_time":0.0,"tokens_per_s":0.0,"agents":[{"weight_sync":"#), "{line}");
        assert!(line.ends_with(r#""train":null,"agent":0}],"method":"grpo"}"#), "{line}");
    }

    #[test]
    fn the_shared_fields_win_over_a_figure_of_the_same_name() {
        let mut s = StepLog::new(
            "j",
            2,
            json!({"step": 9, "seconds": 1, "x": 1, "agents": [{"agent": 0, "version": 7}]}),
        );
        s.seconds = Some(StepSeconds { total: 5.0, ..StepSeconds::default() });
        s.agents.as_mut().unwrap()[0].version = 3;
        let v: Value = serde_json::from_str(&Record::Step(s).line()).unwrap();
        assert_eq!(
            (v["step"].as_u64(), v["seconds"]["total"].as_f64(), v["x"].as_u64()),
            (Some(2), Some(5.0), Some(1))
        );
        assert_eq!(v["agents"][0]["version"], 3);
        let e = EvalLog::new(
            "j",
            4,
            0.0,
            json!({"after_steps": 1, "accuracy": 0.5}),
            Some(json!({"accuracy": 0.75})),
        );
        let v = e.to_value();
        assert_eq!(
            (v["after_steps"].as_u64(), v["step"].as_u64(), v["kind"].as_str()),
            (Some(4), Some(4), Some("eval"))
        );
        assert_eq!(v["greedy"]["accuracy"], 0.75);
    }

    #[test]
    fn an_eval_keeps_its_greedy_game_and_other_kinds_are_skipped() {
        let v = json!({"kind": "eval", "job_id": "j", "step": 4, "after_steps": 4, "temperature": 0.7, "unix_time": 1.0,
                       "seconds": {"total": 3.0}, "method": "grpo", "accuracy": 0.5, "greedy": {"method": "grpo", "accuracy": 0.75}});
        let Some(Record::Eval(e)) = Record::from_value(v.clone()).unwrap() else {
            panic!("an eval")
        };
        assert_eq!(
            (e.after_steps, e.temperature, e.greedy.as_ref().unwrap()["accuracy"].as_f64()),
            (4, 0.7, Some(0.75))
        );
        assert_eq!(e.to_value(), v);
        assert!(Record::parse(r#"{"kind":"note","text":"x"}"#).unwrap().is_none());
        assert!(Record::parse(r#"{"text":"x"}"#).unwrap().is_none());
        assert_eq!(
            Record::parse("[1]").unwrap_err().to_string(),
            "expected a JSON object, found an array"
        );
        let err = Record::parse(r#"{"kind":"step","job_id":"j"}"#).unwrap_err().to_string();
        assert!(err.starts_with("a step record that does not read: missing field `step`"), "{err}");
    }
}
