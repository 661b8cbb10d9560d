//! MAPPA: a fixed chain of agents solves a task, some with a Python tool; a frozen coach model
//! scores every action 0–10, and each (context, action, score) is one training sample for the
//! agent that acted (spec `mappa.md`).
//!
//! - `config`: settings and validation;
//! - `prompts`, `ds_prompts`: the agents' and the coach's prompts (MathChat, DSBench);
//! - `outcome`: the DSBench submission scored against the hidden answers (spec 7);
//! - `tools`: finding the tool calls in an action, and the observation turn;
//! - `coach`: reading the coach's scores;
//! - `episode`: the chain of one instance as a state machine;
//! - `trajectory`: the record of a finished episode;
//! - `reward`: coach verdicts → per-action rewards, and the step's metrics;
//! - `method`: MAPPA on the method seam.
pub mod coach;
pub mod config;
pub mod ds_prompts;
pub mod episode;
pub mod method;
pub mod outcome;
pub mod prompts;
pub mod reward;
pub mod tools;
pub mod trajectory;

pub use coach::{parse_coach, CoachReading};
pub use config::{CoachFallback, MappaConfig, NormScope, Pipeline};
pub use episode::Episode;
pub use method::{Mappa, MAPPA_KL_COEF};
pub use outcome::{DataKind, DsOutcome};
pub use reward::{action_rewards, ActionReward, MappaMetrics};
pub use trajectory::{Action, CoachVerdict, MappaTrajectory};
