//! Grades one final output by its item's grader (spec §8.3): math, choice and numeric answers by
//! the pure graders of `comas_workflow::grade`, code by running it in the sandbox.
use anyhow::{Context, Result};
use comas_sandbox::{grade_code, Sandbox};
use comas_workflow::code::CodeGrading;
use comas_workflow::eval::{BenchItem, GraderKind};
use comas_workflow::grade::{self, AnswerKind};
use serde::{Deserialize, Serialize};

/// The grade of one output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub passed: bool,
    /// Why it failed, in words (no answer found, not equal, the program's error ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Code only: the verdict under the other block mode (any_block vs last_block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passed_other_mode: Option<bool>,
}

pub struct Grader {
    sandbox: Option<Sandbox>,
    mode: CodeGrading,
}

impl Grader {
    /// `code`: whether any item runs code (then the sandbox must start, or this is an error).
    pub fn new(code: bool, mode: CodeGrading) -> Result<Self> {
        let sandbox = if code {
            Some(Sandbox::with_defaults().context("code grading needs the sandbox")?)
        } else {
            None
        };
        if let Some(gaps) =
            sandbox.as_ref().map(|s| s.protections().gaps()).filter(|g| !g.is_empty())
        {
            tracing::warn!(missing = ?gaps, "the code sandbox runs without some protections on this machine");
        }
        Ok(Self { sandbox, mode })
    }

    pub fn grade(&self, item: &BenchItem, output: &str) -> Result<Verdict> {
        let kind = match &item.grader {
            GraderKind::Code { checker } => {
                let sandbox = self.sandbox.as_ref().context("a code item without the sandbox")?;
                let main = grade_code(sandbox, output, checker, self.mode)?;
                let other_mode = match self.mode {
                    CodeGrading::AnyBlock => CodeGrading::LastBlock,
                    CodeGrading::LastBlock => CodeGrading::AnyBlock,
                };
                let other = grade_code(sandbox, output, checker, other_mode)?;
                let reason = (!main.correct).then(|| main.to_string());
                return Ok(Verdict {
                    passed: main.correct,
                    reason,
                    passed_other_mode: Some(other.correct),
                });
            }
            GraderKind::Math => AnswerKind::Math,
            GraderKind::Choice => AnswerKind::Choice,
            GraderKind::Numeric => AnswerKind::Numeric,
        };
        let v = grade::grade(kind, output, &item.answer);
        Ok(Verdict {
            passed: v.passed(),
            reason: v.reason().map(str::to_string),
            passed_other_mode: None,
        })
    }
}
