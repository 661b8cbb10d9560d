//! The coordinator: job API and store, episode scheduling over the workers' streams, the
//! reward formulation, routing to the learners and the weight-version barrier.
pub mod broadcast;
pub mod cli;
pub mod cosir_experience;
pub mod episodes;
pub mod error;
pub mod experience;
pub mod files;
pub mod jobs;
pub mod learner_steps;
pub mod learners;
pub mod mappa_experience;
pub mod memory_check;
pub mod metrics;
pub mod neuromas_experience;
pub mod progress;
pub mod runner;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod store;
pub mod tensorboard;

pub use error::{CoordinatorError, Result};
