//! What an answer earns (pure): the grader's verdict, the format bonus and the overlong
//! shaping of `RewardSpec`.
use super::config::{Grader, RewardSpec};
use super::episode::Answer;
use crate::grade::{choice, last_boxed, math, numeric};
use crate::turn::without_thinking;

/// An answer graded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Graded {
    pub correct: bool,
    /// It gives an answer the grader can read (a box, a choice letter, a code block).
    pub readable: bool,
    /// The overlong penalty taken off, in [0, overlong_penalty].
    pub overlong: f64,
    pub reward: f64,
}

/// Grades `answer` to a question whose reference is `reference`; a code answer's verdict is
/// its test run's. Reasoning inside `<think>` does not count.
pub fn grade(grader: Grader, spec: &RewardSpec, max_new_tokens: u32, answer: &Answer, reference: &str) -> Graded {
    let text = without_thinking(&answer.text);
    // An empty box is no answer: a model paid for "\boxed{}" learns to print it empty.
    let boxed = last_boxed(&text).filter(|b| !b.trim().is_empty());
    // What the grader reads: the whole reply, or with `answer_in_box` the box alone.
    let graded = match (spec.answer_in_box, boxed) {
        (false, _) => Some(text.clone()),
        (true, Some(b)) => Some(format!("\\boxed{{{b}}}")),
        (true, None) => None,
    };
    let right = |grade: &dyn Fn(&str) -> bool| graded.as_deref().is_some_and(grade);
    let (correct, readable) = match grader {
        Grader::Math | Grader::Auto => (right(&|t| math::is_equivalent(t, reference)), boxed.is_some()),
        Grader::Choice => (right(&|t| choice::grade(t, reference).is_ok()), choice::choice(&text).is_some()),
        Grader::Numeric => (right(&|t| numeric::grade(t, reference).is_ok()), boxed.is_some()),
        Grader::Code => (answer.passed == Some(true), answer.passed.is_some()),
    };
    let overlong = overlong(spec, answer.sampled.completion_ids.len() as u32, max_new_tokens);
    let base = if correct { spec.correct } else { spec.wrong };
    let format = if readable { spec.format } else { 0.0 };
    Graded { correct, readable, overlong, reward: base + format - overlong }
}

/// DAPO's soft overlong punishment: 0 up to `max_new_tokens − buffer` tokens, then linear to
/// the full penalty at `max_new_tokens`.
pub fn overlong(spec: &RewardSpec, tokens: u32, max_new_tokens: u32) -> f64 {
    if spec.overlong_buffer == 0 || spec.overlong_penalty == 0.0 {
        return 0.0;
    }
    let free = max_new_tokens.saturating_sub(spec.overlong_buffer);
    let past = tokens.saturating_sub(free).min(spec.overlong_buffer);
    spec.overlong_penalty * f64::from(past) / f64::from(spec.overlong_buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::{FinishReason, Sampled};

    fn answer(text: &str, tokens: usize, passed: Option<bool>) -> Answer {
        Answer {
            turn_index: 0,
            agent: 0,
            sampled: Sampled {
                prompt_ids: vec![1],
                completion_ids: vec![2; tokens],
                logprobs: vec![-1.0; tokens],
                constrained: Vec::new(),
                finish_reason: FinishReason::Stop,
                policy_version: 0,
            },
            text: text.into(),
            passed,
            test_failure: None,
        }
    }

    #[test]
    fn answers_earn_their_grade_the_format_bonus_and_the_overlong_shaping() {
        let spec = RewardSpec { correct: 1.0, wrong: 0.0, format: 0.25, overlong_buffer: 10, overlong_penalty: 0.5, ..RewardSpec::default() };
        let g = |text: &str, tokens: usize| grade(Grader::Math, &spec, 100, &answer(text, tokens, None), "\\frac{1}{2}");
        assert_eq!(g("so \\boxed{0.5}", 20), Graded { correct: true, readable: true, overlong: 0.0, reward: 1.25 });
        assert_eq!(g("so \\boxed{2}", 20), Graded { correct: false, readable: true, overlong: 0.0, reward: 0.25 });
        // Unboxed but right: math_verify reads the last number too; no format bonus.
        assert_eq!(g("the answer is 1/2", 20).reward, 1.0);
        // 95 of 100 tokens: 5 past the free 90 of a 10-token buffer, half the penalty.
        assert_eq!(g("\\boxed{1/2}", 95).overlong, 0.25);
        assert_eq!(g("\\boxed{1/2}", 100).reward, 0.75);
        assert_eq!(g("<think>\\boxed{1/2}</think> no idea", 5).correct, false);
        let code = |passed| grade(Grader::Code, &spec, 100, &answer("```python\nx=1\n```", 5, passed), "assert x == 1");
        assert_eq!((code(Some(true)).reward, code(Some(false)).reward, code(None).reward), (1.25, 0.25, 0.0));
        assert_eq!(grade(Grader::Choice, &spec, 100, &answer("It is \\boxed{b}.", 5, None), "B").reward, 1.25);
        assert_eq!(grade(Grader::Numeric, &spec, 100, &answer("\\boxed{2.04}", 5, None), "2.0").correct, true);
    }

    /// The answers SmolLM2 learned under the format bonus in the learning study: the expression,
    /// then the instruction's "\boxed{}" copied empty. An empty box earns no bonus; with
    /// `answer_in_box` only the box is graded, so the expression before it earns nothing either.
    #[test]
    fn an_empty_box_is_no_answer_and_answer_in_box_grades_the_box_alone() {
        let lenient = RewardSpec { format: 0.25, ..RewardSpec::default() };
        let strict = RewardSpec { answer_in_box: true, ..lenient.clone() };
        let g = |spec: &RewardSpec, grader, text: &str, gt: &str| grade(grader, spec, 100, &answer(text, 5, None), gt);
        let empty = "Ben has 45 - 5 = \\boxed{}.\nBen has \\boxed{ }.";
        assert_eq!(g(&lenient, Grader::Math, empty, "40"), Graded { correct: true, readable: false, overlong: 0.0, reward: 1.0 });
        assert_eq!(g(&strict, Grader::Math, empty, "40"), Graded { correct: false, readable: false, overlong: 0.0, reward: 0.0 });
        assert_eq!(g(&strict, Grader::Math, "45 - 5 = \\boxed{40}", "40").reward, 1.25);
        // The box is graded as math_verify grades a box: an expression in it is evaluated.
        assert_eq!(g(&strict, Grader::Math, "so \\boxed{45 - 5}", "40").correct, true);
        assert_eq!(g(&strict, Grader::Math, "it is 40, \\boxed{41}", "40").correct, false);
        assert_eq!(g(&strict, Grader::Math, "it is 40", "40"), Graded { correct: false, readable: false, overlong: 0.0, reward: 0.0 });
        assert_eq!(g(&strict, Grader::Numeric, "about 2.04 \\boxed{}", "2.0").correct, false);
        assert_eq!(g(&strict, Grader::Numeric, "\\boxed{2.04}", "2.0").correct, true);
        assert_eq!(g(&strict, Grader::Choice, "It is B. \\boxed{}", "B").correct, false);
        assert_eq!(g(&strict, Grader::Choice, "\\boxed{B}", "B").correct, true);
    }
}
