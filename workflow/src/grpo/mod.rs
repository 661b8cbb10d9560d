//! GRPO (`method = "grpo"`): single-agent reinforcement learning with verifiable rewards, the
//! baseline every RL user runs first. Each agent answers each question G times; the task's
//! grader scores every answer (a math answer, a choice letter, a decimal, or code run with its
//! tests in the sandbox), optionally with a format bonus and an overlong penalty; the advantage
//! is the reward normalised over the G answers (`group_norm`) unless the agent's training
//! settings choose another estimator. Several agents each train on their own answers.
//!
//! - `config`: the `[grpo]` table;
//! - `episode`: one episode (every agent answers once; code answers are then tested);
//! - `reward`: an answer's reward;
//! - `metrics`: a step's figures;
//! - `method`: GRPO on the method seam.
pub mod config;
pub mod episode;
pub mod method;
pub mod metrics;
pub mod reward;

#[cfg(test)]
mod tests;

pub use config::{Grader, GrpoConfig, RewardSpec};
pub use episode::{Answer, Episode, GrpoRecord};
pub use method::{Grpo, GrpoStep};
pub use metrics::GrpoMetrics;
