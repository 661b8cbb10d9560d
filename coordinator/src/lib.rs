//! Coordinator service: job API, scheduling and reward routing (filled by issue 5).
//!
//! This crate is part of the workspace layout of DESIGN.md; it holds no code yet.
