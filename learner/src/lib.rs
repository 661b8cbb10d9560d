//! Learner service: per-agent REINFORCE++ training (filled by issue 3).
//!
//! This crate is part of the workspace layout of DESIGN.md; it holds no code yet.
