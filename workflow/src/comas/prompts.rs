//! Prompt templates of CoMAS (spec 3.4, 3.5) and of its two ablations (spec 9). The wording is
//! ours; the slots and the rules each template states are fixed by the spec.
//!
//! Templates are filled in one pass: text put into a slot is never scanned for slots again, so a
//! problem that happens to contain `{solution}` is quoted as it is.
use crate::task::TaskKind;

/// What the solvers of round 0 see in place of a discussion.
pub const EMPTY_DISCUSSION: &str = "(Empty discussion)";

/// One quoted entry of a discussion: a solution and, except in the no-evaluation ablation, the
/// evaluation written about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscussionEntry<'a> {
    pub solution: &'a str,
    pub evaluation: Option<&'a str>,
}

/// Renders the discussion block: one `=== Discussion {i} ===` block per entry, in the given order,
/// separated by blank lines. Quoted texts and the whole block are stripped. No entries gives the
/// empty-discussion marker.
pub fn render_discussion(entries: &[DiscussionEntry<'_>]) -> String {
    if entries.is_empty() {
        return EMPTY_DISCUSSION.to_string();
    }
    let blocks: Vec<String> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut block = format!("=== Discussion {} ===\nSolution: {}", i + 1, e.solution.trim());
            if let Some(evaluation) = e.evaluation {
                block.push_str("\nEvaluation: ");
                block.push_str(evaluation.trim());
            }
            block
        })
        .collect();
    blocks.join("\n\n").trim().to_string()
}

/// Replaces `{name}` for the given slots in one left-to-right pass, then strips the result.
/// Braces that do not name a slot (such as `\boxed{}`) are kept as they are.
fn fill(template: &str, slots: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + slots.iter().map(|(_, v)| v.len()).sum::<usize>());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let hit = slots.iter().find(|(name, _)| after.starts_with(name) && after[name.len()..].starts_with('}'));
        match hit {
            Some((name, value)) => {
                out.push_str(value);
                rest = &after[name.len() + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

// ---- solver -------------------------------------------------------------------------------

const SOLVER: &str = "\
Problem:
{problem}

Discussion so far (use it only as a reference; it may contain mistakes):
{discussion}

{instruction}";

const SOLVE_MATH: &str = "\
Solve the problem step by step. Write your final answer inside \\boxed{}, for example \\boxed{n}.";

const SOLVE_CODING: &str = "\
First analyse what the problem requires and lay out a step-by-step plan. Then give your Python code \
in a single fenced code block, like this:
```python
def solve():
    pass
```
Apart from the analysis, your answer must contain only this one code snippet.";

const SOLVE_SCIENCE: &str = "\
Solve the problem step by step. Your final answer must be a decimal number written inside \\boxed{}, \
for example \\boxed{1}, \\boxed{0.1} or \\boxed{0.01}. Keep the unit outside the box.";

/// The prompt every solver of a round receives. `discussion` is a rendered discussion block.
pub fn solver_prompt(task: TaskKind, problem: &str, discussion: &str) -> String {
    let instruction = match task {
        TaskKind::Math => SOLVE_MATH,
        TaskKind::Coding | TaskKind::DataScience => SOLVE_CODING,
        TaskKind::Science => SOLVE_SCIENCE,
    };
    fill(SOLVER, &[("problem", problem.trim()), ("discussion", discussion.trim()), ("instruction", instruction)])
}

// ---- evaluator ----------------------------------------------------------------------------

const EVALUATOR: &str = "\
Problem:
{problem}

Solution to check:
{solution}

{instruction}";

const EVALUATOR_WITH_DISCUSSION: &str = "\
Problem:
{problem}

Discussion so far (use it only as a reference; it may contain mistakes):
{discussion}

Solution to check:
{solution}

{instruction}";

const EVALUATE_GENERAL: &str = "\
Examine the solution above and point out every error or weakness you can find. Report each one as \
a mistake, saying what is wrong and why. Be concise and do not retell the solution's reasoning.";

const EVALUATE_CODING: &str = "\
Examine the code above. Rather than general remarks, list the test cases on which it would fail, \
and for each one explain why it fails. Be concise and do not retell the code.";

fn evaluate_instruction(task: TaskKind) -> &'static str {
    match task {
        TaskKind::Coding | TaskKind::DataScience => EVALUATE_CODING,
        TaskKind::Math | TaskKind::Science => EVALUATE_GENERAL,
    }
}

fn evaluator_like(problem: &str, solution: &str, discussion: Option<&str>, instruction: &str) -> String {
    match discussion {
        None => fill(EVALUATOR, &[("problem", problem.trim()), ("solution", solution.trim()), ("instruction", instruction)]),
        Some(d) => fill(
            EVALUATOR_WITH_DISCUSSION,
            &[("problem", problem.trim()), ("discussion", d.trim()), ("solution", solution.trim()), ("instruction", instruction)],
        ),
    }
}

/// The evaluator prompt. `discussion` is `Some` only when `evaluator_sees_discussion` is set; the
/// block then goes between the problem and the solution.
pub fn evaluator_prompt(task: TaskKind, problem: &str, solution: &str, discussion: Option<&str>) -> String {
    evaluator_like(problem, solution, discussion, evaluate_instruction(task))
}

// ---- scorer -------------------------------------------------------------------------------

const SCORER: &str = "\
Problem:
{problem}

Solution:
{solution}

Evaluation of the solution:
{evaluation}

Decide whether the evaluation is sound, then score the solution with an integer from 1 to 3:
3: the solution is fully correct and none of the mistakes raised in the evaluation holds;
2: some minor mistakes raised in the evaluation are real, but they do not change the overall correctness;
1: at least one mistake raised in the evaluation is fatal and leads to a wrong answer.
Give a brief, concise justification first, then the score in the form <score>N</score>.
Example: {example}";

const SCORE_EXAMPLE_GENERAL: &str = "The evaluation rightly points out a calculation error in the second step, so the final answer is wrong. <score>1</score>";

const SCORE_EXAMPLE_CODING: &str =
    "The evaluation rightly points out that the code indexes past the end of the list on the empty-input test case. <score>1</score>";

/// The scorer prompt: judges the evaluation and scores the solution 1–3.
pub fn scorer_prompt(task: TaskKind, problem: &str, solution: &str, evaluation: &str) -> String {
    let example = match task {
        TaskKind::Coding | TaskKind::DataScience => SCORE_EXAMPLE_CODING,
        TaskKind::Math | TaskKind::Science => SCORE_EXAMPLE_GENERAL,
    };
    fill(SCORER, &[("problem", problem.trim()), ("solution", solution.trim()), ("evaluation", evaluation.trim()), ("example", example)])
}

// ---- ablation: no evaluation (a judge scores the bare solution) -----------------------------

const JUDGE: &str = "\
Problem:
{problem}

Solution:
{solution}

Decide whether the solution is correct and score it with an integer from 1 to 3:
3: the solution is fully correct;
2: it has minor mistakes that do not change the overall correctness;
1: it has at least one fatal mistake that leads to a wrong answer.
Give a brief, concise justification first, then the score in the form <score>N</score>.
Example: {example}";

const JUDGE_EXAMPLE_GENERAL: &str = "The solution makes a calculation error in the second step, so the final answer is wrong. <score>1</score>";

const JUDGE_EXAMPLE_CODING: &str = "The code indexes past the end of the list on the empty-input test case. <score>1</score>";

/// The judge prompt of the `no_evaluation` ablation.
pub fn judge_prompt(task: TaskKind, problem: &str, solution: &str) -> String {
    let example = match task {
        TaskKind::Coding | TaskKind::DataScience => JUDGE_EXAMPLE_CODING,
        TaskKind::Math | TaskKind::Science => JUDGE_EXAMPLE_GENERAL,
    };
    fill(JUDGE, &[("problem", problem.trim()), ("solution", solution.trim()), ("example", example)])
}

// ---- ablation: no scoring (evaluations end in a verdict) ------------------------------------

const VERDICT_GENERAL: &str = "\
Examine the solution above and point out every error or weakness you can find. Report each one as \
a mistake, saying what is wrong and why. Be concise and do not retell the solution's reasoning.
Finish with your verdict on the whole solution, either <judgment>correct</judgment> or <judgment>incorrect</judgment>.
Example: The second step contains a calculation error, so the final answer is wrong. <judgment>incorrect</judgment>";

const VERDICT_CODING: &str = "\
Examine the code above. Rather than general remarks, list the test cases on which it would fail, \
and for each one explain why it fails. Be concise and do not retell the code.
Finish with your verdict on the whole solution, either <judgment>correct</judgment> or <judgment>incorrect</judgment>.
Example: The code indexes past the end of the list on the empty-input test case. <judgment>incorrect</judgment>";

/// The evaluator prompt of the `no_scoring` ablation: an evaluation that ends in a verdict.
pub fn verdict_prompt(task: TaskKind, problem: &str, solution: &str, discussion: Option<&str>) -> String {
    let instruction = match task {
        TaskKind::Coding | TaskKind::DataScience => VERDICT_CODING,
        TaskKind::Math | TaskKind::Science => VERDICT_GENERAL,
    };
    evaluator_like(problem, solution, discussion, instruction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_discussion_marker() {
        assert_eq!(render_discussion(&[]), "(Empty discussion)");
    }

    #[test]
    fn discussion_blocks_are_numbered_stripped_and_separated() {
        let entries = [
            DiscussionEntry { solution: "  x = 2 \n", evaluation: Some("\nNo mistakes.  ") },
            DiscussionEntry { solution: "x = 3", evaluation: Some("Step 2 adds wrongly.\n") },
        ];
        assert_eq!(
            render_discussion(&entries),
            "=== Discussion 1 ===\nSolution: x = 2\nEvaluation: No mistakes.\n\n\
             === Discussion 2 ===\nSolution: x = 3\nEvaluation: Step 2 adds wrongly."
        );
        // A trailing empty evaluation leaves "Evaluation:" with a space that the final strip removes.
        let entries = [DiscussionEntry { solution: "s", evaluation: Some("  ") }];
        assert_eq!(render_discussion(&entries), "=== Discussion 1 ===\nSolution: s\nEvaluation:");
        let entries = [DiscussionEntry { solution: " only ", evaluation: None }];
        assert_eq!(render_discussion(&entries), "=== Discussion 1 ===\nSolution: only");
    }

    #[test]
    fn fill_is_single_pass() {
        assert_eq!(fill(" a {x} \\boxed{} {y} {z ", &[("x", "{y}"), ("y", "Y")]), "a {y} \\boxed{} Y {z");
    }

    #[test]
    fn solver_math_exact() {
        let p = solver_prompt(TaskKind::Math, "  What is 1+1? \n", EMPTY_DISCUSSION);
        assert_eq!(
            p,
            "Problem:\nWhat is 1+1?\n\n\
             Discussion so far (use it only as a reference; it may contain mistakes):\n(Empty discussion)\n\n\
             Solve the problem step by step. Write your final answer inside \\boxed{}, for example \\boxed{n}."
        );
    }

    #[test]
    fn solver_coding_and_science_rules() {
        let p = solver_prompt(TaskKind::Coding, "Write f.", EMPTY_DISCUSSION);
        assert!(
            p.ends_with("like this:\n```python\ndef solve():\n    pass\n```\nApart from the analysis, your answer must contain only this one code snippet.")
        );
        assert_eq!(p.matches("```python").count(), 1);
        let p = solver_prompt(TaskKind::Science, "How far?", EMPTY_DISCUSSION);
        assert!(p.contains("decimal number written inside \\boxed{}"));
        assert!(p.contains("\\boxed{1}, \\boxed{0.1} or \\boxed{0.01}"));
        assert!(p.ends_with("Keep the unit outside the box."));
    }

    #[test]
    fn evaluator_exact_and_with_discussion() {
        let p = evaluator_prompt(TaskKind::Math, "P", " S ", None);
        assert_eq!(
            p,
            "Problem:\nP\n\nSolution to check:\nS\n\n\
             Examine the solution above and point out every error or weakness you can find. Report each one as \
             a mistake, saying what is wrong and why. Be concise and do not retell the solution's reasoning."
        );
        let p = evaluator_prompt(TaskKind::Coding, "P", "S", Some("D"));
        assert!(p.starts_with("Problem:\nP\n\nDiscussion so far (use it only as a reference; it may contain mistakes):\nD\n\nSolution to check:\nS\n\n"));
        assert!(p.contains("list the test cases on which it would fail"));
        assert!(p.ends_with("do not retell the code."));
    }

    #[test]
    fn scorer_ends_with_one_line_example() {
        let p = scorer_prompt(TaskKind::Science, "P", "S", "E");
        assert!(p.starts_with("Problem:\nP\n\nSolution:\nS\n\nEvaluation of the solution:\nE\n\n"));
        assert!(p.contains("score the solution with an integer from 1 to 3:\n3: "));
        assert!(p.contains("in the form <score>N</score>."));
        let last = p.lines().last().unwrap();
        assert_eq!(last, "Example: The evaluation rightly points out a calculation error in the second step, so the final answer is wrong. <score>1</score>");
        let p = scorer_prompt(TaskKind::Coding, "P", "S", "E");
        assert!(p.ends_with("past the end of the list on the empty-input test case. <score>1</score>"));
    }

    #[test]
    fn ablation_prompts() {
        let p = judge_prompt(TaskKind::Math, "P", "S");
        assert!(p.starts_with("Problem:\nP\n\nSolution:\nS\n\nDecide whether the solution is correct"));
        assert!(!p.contains("Evaluation"));
        assert!(p.ends_with("so the final answer is wrong. <score>1</score>"));
        let p = verdict_prompt(TaskKind::Math, "P", "S", None);
        assert!(p.starts_with("Problem:\nP\n\nSolution to check:\nS\n\n"));
        assert!(p.contains("either <judgment>correct</judgment> or <judgment>incorrect</judgment>."));
        assert!(p.ends_with("<judgment>incorrect</judgment>"));
        let p = verdict_prompt(TaskKind::Coding, "P", "S", None);
        assert!(p.contains("list the test cases on which it would fail"));
    }

    #[test]
    fn slot_lookalikes_in_inputs_are_quoted_verbatim() {
        let p = scorer_prompt(TaskKind::Math, "Is {solution} a slot?", "{evaluation}", "{problem}");
        assert!(p.starts_with("Problem:\nIs {solution} a slot?\n\nSolution:\n{evaluation}\n\nEvaluation of the solution:\n{problem}\n\n"));
    }
}
