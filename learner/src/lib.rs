//! The learner of one agent: REINFORCE++ / GRPO training on the agent's own experiences,
//! checkpoints, and weight publishing to rollout workers over gRPC.
pub mod checkpoint;
pub mod cli;
/// The training settings, defined in the tch-free workflow crate so the coordinator shares them.
pub mod config {
    pub use comas_workflow::train_config::*;
}
pub mod engine;
pub mod error;
pub mod experience;
mod fault;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod packing;
pub mod progress;
pub mod publish;
pub mod rl;
pub mod server;
pub mod service;
mod step_probes;
pub mod trainer;

pub use config::TrainConfig;
pub use error::{LearnerError, Result};
pub use experience::{Experience, Finish};
pub use trainer::{StepReport, Trainer};
