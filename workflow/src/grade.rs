//! Training-time correctness of a solution, for logging only (never part of a reward). This is a
//! light grader: the last `\boxed{...}` of the answer compared with the record's answer after
//! normalisation (math), or as numbers within 5 % (science). Coding answers need a sandbox to
//! run tests and are not graded here (`None`).
use crate::task::TaskKind;

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

fn normalise(s: &str) -> String {
    let mut t = s.trim().trim_matches('$').to_string();
    for junk in ["\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "^\\circ", "^{\\circ}", "\\%", "%", "\\displaystyle"] {
        t = t.replace(junk, "");
    }
    t = t.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac");
    let t: String = t.chars().filter(|c| !c.is_whitespace()).collect();
    t.trim_end_matches('.').to_string()
}

fn number(s: &str) -> Option<f64> {
    let t = normalise(s).replace(",", "");
    let t = t.strip_prefix('+').unwrap_or(&t);
    t.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// `Some(true/false)` when the solution can be graded for this task, `None` otherwise.
pub fn is_correct(task: TaskKind, solution: &str, answer: &str) -> Option<bool> {
    if answer.trim().is_empty() {
        return None;
    }
    match task {
        TaskKind::Math => {
            let Some(got) = last_boxed(solution) else { return Some(false) };
            if normalise(got) == normalise(answer) {
                return Some(true);
            }
            Some(matches!((number(got), number(answer)), (Some(a), Some(b)) if (a - b).abs() <= 1e-9 * b.abs().max(1.0)))
        }
        TaskKind::Science => {
            let got = last_boxed(solution).and_then(number);
            let want = number(answer)?;
            Some(got.is_some_and(|a| (a - want).abs() <= 0.05 * a.abs().max(want.abs())))
        }
        TaskKind::Coding => None,
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
        assert_eq!(is_correct(TaskKind::Math, "x = \\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"), Some(true));
        assert_eq!(is_correct(TaskKind::Math, "\\boxed{42.}", "42"), Some(true));
        assert_eq!(is_correct(TaskKind::Math, "\\boxed{1,000}", "1000"), Some(true));
        assert_eq!(is_correct(TaskKind::Math, "\\boxed{41}", "42"), Some(false));
        assert_eq!(is_correct(TaskKind::Math, "forty-two", "42"), Some(false));
        assert_eq!(is_correct(TaskKind::Science, "\\boxed{1.03e+24}", "1e+24"), Some(true));
        assert_eq!(is_correct(TaskKind::Science, "\\boxed{1.2e+24}", "1e+24"), Some(false));
        assert_eq!(is_correct(TaskKind::Science, "no number", "1e+24"), Some(false));
        assert_eq!(is_correct(TaskKind::Coding, "```python\npass\n```", "assert True"), None);
    }
}
