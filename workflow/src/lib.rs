//! Methods as pure code: interaction protocols (episode state machines that ask for turns),
//! prompt templates, reward formulations and task data sets. Nothing here touches a model, a
//! thread pool or the network, so every rule can be unit-tested on plain data.
//!
//! Layout: the pieces shared by every method sit at the top (`task`, `turn`, `seed`, `error`,
//! `job`, `program`); the seam every method implements is `method`; each method is a folder,
//! listed once in `methods!` below, which generates `registry`.
pub mod code;
pub mod dataset;
pub mod error;
pub mod grade;
pub mod job;
pub mod mean;
pub mod memory;
pub mod method;
pub mod moments;
pub mod program;
pub mod seed;
pub mod step_log;
pub mod task;
pub mod tool;
pub mod train_config;
pub mod turn;

// The methods: a folder and its type each.
method::registry::methods! {
    comas::CoMas,
    mappa::Mappa,
    cosir::Cosir,
    neuromas::Neuromas,
    eval::Evaluation,
    grpo::Grpo,
}

/// Metrics records written before every record named its method are CoMAS's.
pub const UNNAMED_RECORDS: &str = "comas";

pub use error::WorkflowError;
pub use task::{DatasetError, TaskKind, TaskRecord};
pub use train_config::{TrainConfig, TrainConfigError};
pub use turn::{
    ChatMessage, ConstrainedToken, FinishReason, PromptMeter, Role, SamplingSpec, TurnOutput,
    TurnRequest, Unmetered, GUIDED_SCORE_SUFFIX,
};
