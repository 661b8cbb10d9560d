//! A rollout worker: hosts the agents' policies, runs discussion episodes with continuous
//! batching, and swaps in new weights pulled from learners between decode steps.
pub mod cli;
pub mod engine;
pub mod fixed;
pub mod metrics;
pub mod models;
pub mod pulls;
pub mod register;
pub mod relay;
pub mod remote;
pub mod server;
pub mod service;
pub mod tools;
pub mod vllm;
