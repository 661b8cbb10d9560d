//! Grading final answers as pure code (spec §8.3).
//!
//! - `math`: symbolic equivalence, a port of `math_verify` 0.8.0 `verify(parse(gt), parse(r))`,
//!   with a reference answer read as LaTeX (inside `$...$` when written without delimiters);
//!   checked against the reference on the corpora in tests/fixtures/grade/.
//! - `choice`: the last boxed letter A–D.
//! - `numeric`: SciBench decimals within 5 %.
//!
//! [`grade`] is the benchmark entry point; [`is_correct`] is the training-time check (logging
//! only, and the verifier control's reward). Code answers need a sandbox and are graded
//! elsewhere.
//!
//! Layout: `extract` finds the answer span in a text, `normalize` cleans its LaTeX, `latex` and
//! `pyexpr` parse it into a `value::Value`, and `equiv` compares two values.
pub mod choice;
mod equiv;
mod extract;
mod latex;
pub mod math;
mod normalize;
pub mod numeric;
mod pyexpr;
mod value;

use crate::task::TaskKind;
use thiserror::Error;

/// Which rule grades a benchmark answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnswerKind {
    /// GSM8K, MATH-500, AMC, AIME.
    Math,
    /// GPQA, MMLU, MedQA: a letter A–D.
    Choice,
    /// SciBench: a decimal within 5 %.
    Numeric,
}

/// Why an answer was graded wrong.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum Failure {
    #[error("no answer found")]
    NoAnswer,
    /// The ground truth itself reads as nothing; the reference grades every answer wrong then.
    #[error("the reference answer {0:?} reads as nothing")]
    UnreadableReference(String),
    #[error("{got:?} is not equal to {want:?}")]
    NotEqual { got: String, want: String },
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("{got} is not within 5% of {want}")]
    OutOfTolerance { got: f64, want: f64 },
}

/// The grade of one answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Passed,
    /// `reason` is the failure in words.
    Failed {
        failure: Failure,
        reason: String,
    },
}

impl Verdict {
    fn from_result(r: Result<(), Failure>) -> Verdict {
        match r {
            Ok(()) => Verdict::Passed,
            Err(failure) => {
                let reason = failure.to_string();
                Verdict::Failed { failure, reason }
            }
        }
    }
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Passed)
    }
    pub fn reason(&self) -> Option<&str> {
        match self {
            Verdict::Passed => None,
            Verdict::Failed { reason, .. } => Some(reason),
        }
    }
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Verdict::Passed => None,
            Verdict::Failed { failure, .. } => Some(failure),
        }
    }
}

/// Grades a benchmark response against its ground truth.
pub fn grade(kind: AnswerKind, response: &str, gt: &str) -> Verdict {
    Verdict::from_result(match kind {
        AnswerKind::Math => math::grade(response, gt),
        AnswerKind::Choice => choice::grade(response, gt),
        AnswerKind::Numeric => numeric::grade(response, gt),
    })
}

/// Content of the last `\boxed{...}`, with nested braces kept.
pub fn last_boxed(text: &str) -> Option<&str> {
    let start = text.rfind("\\boxed")? + "\\boxed".len();
    let rest = &text[start..];
    let open = rest.find('{')?;
    if !rest[..open].trim().is_empty() {
        return None;
    }
    let mut depth = 0usize;
    for (i, c) in rest[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&rest[open + 1..open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// What a math solution answers, as the reference parser reads it: the text of the span it
/// picks (normalised LaTeX, or a number as read); `None` when it finds nothing.
pub fn math_answer(text: &str) -> Option<String> {
    math::parse(text).text
}

/// Training-time correctness (spec §8.3, logging only): `Some(true/false)` when the solution can
/// be graded for this task, `None` otherwise (coding needs a sandbox; an empty or non-numeric
/// science answer cannot be checked).
pub fn is_correct(task: TaskKind, solution: &str, answer: &str) -> Option<bool> {
    if answer.trim().is_empty() {
        return None;
    }
    match task {
        TaskKind::Math => Some(math::is_equivalent(solution, answer)),
        TaskKind::Science => numeric::science_is_correct(solution, answer),
        TaskKind::Coding | TaskKind::DataScience => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_answers_are_found_and_compared() {
        assert_eq!(last_boxed("so \\boxed{1} then \\boxed{\\frac{1}{2}}."), Some("\\frac{1}{2}"));
        assert_eq!(last_boxed("no box"), None);
        assert_eq!(last_boxed("\\boxed{unclosed"), None);
        assert_eq!(
            is_correct(TaskKind::Math, "x = \\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
            Some(true)
        );
        assert_eq!(is_correct(TaskKind::Math, "\\boxed{1,000}", "1000"), Some(true));
        assert_eq!(is_correct(TaskKind::Math, "\\boxed{41}", "42"), Some(false));
        assert_eq!(is_correct(TaskKind::Math, "forty-two", "42"), Some(false));
        assert_eq!(math_answer("so 4 + 3 = 7 apples"), Some("7".into()));
        assert_eq!(math_answer("The answer is 12. Then 13 more"), Some("12".into()));
        assert_eq!(math_answer("She has 1,000 coins."), Some("1000".into()));
        assert_eq!(math_answer("no digits"), None);
        assert_eq!(is_correct(TaskKind::Math, "She has 1,000 coins.", "1000"), Some(true));
        assert_eq!(is_correct(TaskKind::Science, "\\boxed{1.03e+24}", "1e+24"), Some(true));
        assert_eq!(is_correct(TaskKind::Science, "\\boxed{1.2e+24}", "1e+24"), Some(false));
        assert_eq!(is_correct(TaskKind::Science, "no number", "1e+24"), Some(false));
        assert_eq!(is_correct(TaskKind::Coding, "```python\npass\n```", "assert True"), None);
    }

    #[test]
    fn one_entry_point_for_the_three_rules() {
        assert!(grade(AnswerKind::Math, "\\boxed{\\frac{1}{2}}", "0.5").passed());
        assert_eq!(grade(AnswerKind::Math, "I give up", "3").reason(), Some("no answer found"));
        assert_eq!(
            grade(AnswerKind::Math, "\\boxed{4}", "3").reason(),
            Some("\"4\" is not equal to \"3\"")
        );
        assert!(grade(AnswerKind::Choice, "It is \\boxed{d}.", "D").passed());
        assert_eq!(
            grade(AnswerKind::Choice, "It is \\boxed{A}.", "D").failure(),
            Some(&Failure::NotEqual { got: "A".into(), want: "D".into() })
        );
        assert!(grade(AnswerKind::Numeric, "\\boxed{9.8}", "9.81").passed());
        assert_eq!(
            grade(AnswerKind::Numeric, "\\boxed{12}", "9.81").failure(),
            Some(&Failure::OutOfTolerance { got: 12.0, want: 9.81 })
        );
    }
}
