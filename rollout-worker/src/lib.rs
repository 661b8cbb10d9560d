//! Rollout worker service: continuous batching inference and discussion episodes (filled by issue 4).
//!
//! This crate is part of the workspace layout of DESIGN.md; it holds no code yet.
