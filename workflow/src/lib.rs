//! Interaction protocols, prompt templates, reward formulations and tasks as pure code (filled by issue 4).
//!
//! This crate is part of the workspace layout of DESIGN.md; it holds no code yet.
