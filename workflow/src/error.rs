//! The error type of the protocol side. Messages say what went wrong and what was expected.
use crate::comas::config::ConfigError;
use crate::task::DatasetError;
use crate::turn::Role;
use thiserror::Error;

/// What kind of JSON value `v` is, in words, for messages such as "expected an object, found an
/// array".
pub fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[derive(Debug, Error)]
pub enum WorkflowError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// An assignment plan whose shape does not match the config it is used with.
    #[error("assignment plan does not fit the config: {0}")]
    PlanMismatch(String),
    #[error("batch too large: {0}")]
    BatchTooLarge(String),
    #[error("the episode is finished; it expects no more turn outputs")]
    EpisodeFinished,
    #[error(
        "the episode is not finished: {pending} {role} turn(s) of round {round} are still pending"
    )]
    EpisodeNotFinished { round: u32, role: Role, pending: usize },
    #[error("turn {turn_index} is not pending (the pending turns are {first}..{end})")]
    UnknownTurn { turn_index: u32, first: u32, end: u32 },
    #[error("turn {0} was submitted more than once")]
    DuplicateTurn(u32),
    #[error("outputs are missing for pending turns {0:?}; submit the whole group at once")]
    MissingTurns(Vec<u32>),
    #[error("turn {turn_index}: {logprobs} logprobs for {tokens} completion tokens (need one per token)")]
    LogprobCount { turn_index: u32, logprobs: usize, tokens: usize },
    #[error("turn {turn_index}: {message}")]
    MalformedTurn { turn_index: u32, message: String },
    #[error("malformed trajectory: {0}")]
    MalformedTrajectory(String),
}

/// A job that cannot run. `field` is the key path in the job file (`agents[1].train.lr`).
#[derive(Debug, Clone, PartialEq, Error)]
pub enum JobError {
    #[error("job file is not valid TOML or has a wrong key: {0}")]
    Syntax(String),
    #[error("`{field}`: {message}")]
    Invalid { field: String, message: String },
    /// A command-line override (`schedule.steps=abc`) that makes the job wrong; `arg` is the
    /// override as given.
    #[error("override `{arg}`: {message}")]
    Override { arg: String, message: String },
}

/// The error of a wrong key.
pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> JobError {
    JobError::Invalid { field: field.into(), message: message.into() }
}
