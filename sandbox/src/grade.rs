//! Code grading (spec 8.3): the response's Python blocks run against the checker in the sandbox.
use crate::error::SandboxError;
use crate::outcome::{Outcome, Reason};
use crate::sandbox::Sandbox;
use comas_workflow::code::{self, CodeGrading};
use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// The benchmark timeout of the spec (3.0 s).
pub const CODE_TIMEOUT: Duration = Duration::from_millis((code::EVAL_TIMEOUT_SECS * 1000.0) as u64);
/// The training-time `is_correct` timeout of the spec (1.0 s).
pub const TRAINING_CODE_TIMEOUT: Duration =
    Duration::from_millis((code::TRAINING_TIMEOUT_SECS * 1000.0) as u64);

/// Why a response was graded wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The response holds no ```` ```python ```` block.
    NoCodeBlock,
    /// Every block run failed; this is the last run's reason.
    Run(Reason),
}

/// The grade of one response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub correct: bool,
    pub mode: CodeGrading,
    /// Python blocks in the response (all of them, whatever the mode).
    pub blocks: usize,
    /// One outcome per block run, in order; `any_block` stops at the first that passes.
    pub runs: Vec<Outcome>,
    pub failure: Option<Failure>,
    /// The protections this machine lacks ([`Protections::gaps`](crate::Protections::gaps)),
    /// so that a grade made with a weaker sandbox says so.
    pub unprotected: Vec<String>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.failure, self.correct) {
            (_, true) => {
                // any_block runs blocks in order, last_block only the last one.
                let passing =
                    if self.mode == CodeGrading::LastBlock { self.blocks } else { self.runs.len() };
                write!(f, "correct ({}, block {passing} of {} passed)", self.mode, self.blocks)?
            }
            (Some(Failure::NoCodeBlock), _) => write!(f, "wrong: no ```python block")?,
            (Some(Failure::Run(r)), _) => {
                write!(f, "wrong ({}, {} block(s) run): {r}", self.mode, self.runs.len())?
            }
            (None, false) => write!(f, "wrong")?,
        }
        if !self.unprotected.is_empty() {
            write!(f, " [sandbox lacks: {}]", self.unprotected.join("; "))?;
        }
        Ok(())
    }
}

/// Grades `response` against `checker` (see `comas_workflow::code` for the checkers) with the
/// spec's 3.0 s timeout per program.
pub fn grade_code(
    sandbox: &Sandbox,
    response: &str,
    checker: &str,
    mode: CodeGrading,
) -> Result<Verdict, SandboxError> {
    grade_code_with_timeout(sandbox, response, checker, mode, CODE_TIMEOUT)
}

/// [`grade_code`] with another timeout (e.g. [`TRAINING_CODE_TIMEOUT`]).
pub fn grade_code_with_timeout(
    sandbox: &Sandbox,
    response: &str,
    checker: &str,
    mode: CodeGrading,
    timeout: Duration,
) -> Result<Verdict, SandboxError> {
    let blocks = code::python_blocks(response).len();
    let unprotected = sandbox.protections().gaps();
    let mut runs = Vec::new();
    for block in code::candidate_blocks(response, mode) {
        let outcome = sandbox.run_with_timeout(&code::program(block, checker), timeout)?;
        let passed = outcome.passed();
        runs.push(outcome);
        if passed {
            return Ok(Verdict { correct: true, mode, blocks, runs, failure: None, unprotected });
        }
    }
    let failure = match runs.last().and_then(Outcome::reason) {
        Some(reason) => Failure::Run(reason),
        None => Failure::NoCodeBlock,
    };
    Ok(Verdict { correct: false, mode, blocks, runs, failure: Some(failure), unprotected })
}
