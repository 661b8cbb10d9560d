//! The summary record `comas eval` writes (`summary.json`) and `comas plot` reads back.
use super::Setup;
use crate::code::CodeGrading;
use serde::{Deserialize, Serialize};

/// Accuracy of one (benchmark tag, setup) cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalCell {
    pub tag: String,
    pub setup: Setup,
    pub graded: usize,
    pub passed: usize,
    pub accuracy: f64,
    /// Code only: passed under the other block mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed_other_mode: Option<usize>,
    pub mean_new_tokens: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    pub bench: String,
    pub models: Vec<String>,
    pub code_grading: CodeGrading,
    /// The training step of the checkpoint evaluated (`--job-dir`, or `--step`), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_step: Option<u64>,
    pub graded: usize,
    pub passed: usize,
    pub accuracy: f64,
    pub cells: Vec<EvalCell>,
}
