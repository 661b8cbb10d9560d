//! The coordinator: job API and store, episode scheduling over the workers' streams, the
//! reward formulation, routing to the learners and the weight-version barrier.
pub mod broadcast;
pub mod cli;
pub mod episodes;
pub mod error;
pub mod experience;
pub mod files;
pub mod jobs;
pub mod learner_steps;
pub mod learners;
pub mod memory_check;
pub mod metrics;
mod metrics_log;
pub mod mlflow;
pub mod progress;
pub mod runner;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod store;
pub mod tensorboard;

pub use error::{CoordinatorError, Result};
