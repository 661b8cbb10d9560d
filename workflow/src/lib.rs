//! Methods as pure code: interaction protocols (episode state machines that ask for turns),
//! prompt templates, reward formulations and task data sets. Nothing here touches a model, a
//! thread pool or the network, so every rule can be unit-tested on plain data.
//!
//! Layout: the pieces shared by every method sit at the top (`task`, `turn`, `seed`, `error`);
//! each method gets its own folder (`comas/`, `mappa/`) behind the one seam in `program` with its config, prompts, protocol and rewards.
pub mod code;
pub mod comas;
pub mod cosir;
pub mod error;
pub mod eval;
pub mod grade;
pub mod job;
pub mod mappa;
pub mod mean;
pub mod memory;
pub mod moments;
pub mod neuromas;
pub mod program;
pub mod seed;
pub mod task;
pub mod tool;
pub mod train_config;
pub mod turn;

pub use error::WorkflowError;
pub use task::{DatasetError, TaskKind, TaskRecord};
pub use train_config::{TrainConfig, TrainConfigError};
pub use turn::{ChatMessage, ConstrainedToken, FinishReason, PromptMeter, Role, SamplingSpec, TurnOutput, TurnRequest, Unmetered, GUIDED_SCORE_SUFFIX};
