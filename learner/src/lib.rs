//! The learner of one agent: REINFORCE++ / GRPO training on the agent's own experiences,
//! checkpoints, and (with the service) weight publishing to rollout workers.
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod experience;
pub mod loss;
pub mod optim;
pub mod rl;
pub mod trainer;

pub use config::TrainConfig;
pub use error::{LearnerError, Result};
pub use experience::{Experience, Finish};
pub use trainer::{StepReport, Trainer};
