//! Training-time correctness of a solution, for logging (and for the verifier control's reward,
//! never CoMAS's). This is a light grader: the last `\boxed{...}` of the answer compared with the
//! record's answer after normalisation (math), or as numbers within 5 % (science). A math answer
//! without a box is read as the reference grader `math_verify` reads one: the number after the
//! last "answer is" / "answer:", else the last number of the text (checked against `math_verify`
//! on a corpus, `workflow/tests/grade_parity.rs`). Coding answers need a sandbox to run tests and
//! are not graded here (`None`).
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

/// The last number written in `text` (digits, `,` thousands groups, a decimal part; a `-` right
/// before the digits when it is not a binary minus), as written.
fn last_number(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let mut end = b.len();
    while end > 0 && !b[end - 1].is_ascii_digit() {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    let mut start = end;
    while start > 0 {
        let c = b[start - 1];
        let grouped = |sep: u8| c == sep && start >= 2 && b[start - 2].is_ascii_digit();
        if c.is_ascii_digit() || grouped(b',') || grouped(b'.') {
            start -= 1;
        } else {
            break;
        }
    }
    if start > 0 && b[start - 1] == b'-' && (start < 2 || !b[start - 2].is_ascii_alphanumeric()) {
        start -= 1;
    }
    Some(&text[start..end])
}

/// The first number of `text`, as written.
fn first_number(text: &str) -> Option<&str> {
    let at = text.find(|c: char| c.is_ascii_digit())?;
    let len = text[at..].find(|c: char| !(c.is_ascii_digit() || c == ',' || c == '.')).unwrap_or(text.len() - at);
    Some(text[at..at + len].trim_end_matches(['.', ',']))
}

/// What a math solution answers: its last `\boxed{...}`; without one, the number after the last
/// "answer is" / "answer:" (any case), else its last number.
pub fn math_answer(text: &str) -> Option<&str> {
    if let Some(b) = last_boxed(text) {
        return Some(b);
    }
    let lower = text.to_ascii_lowercase();
    let phrase = ["answer is", "answer:"].iter().filter_map(|p| lower.rfind(p).map(|i| i + p.len())).max();
    if let Some(after) = phrase.and_then(|i| first_number(&text[i..])) {
        return Some(after);
    }
    last_number(text)
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
            let Some(got) = math_answer(solution) else { return Some(false) };
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
        // Unboxed: the phrase first, else the last number.
        assert_eq!(math_answer("so 4 + 3 = 7 apples"), Some("7"));
        assert_eq!(math_answer("The answer is 12. Then 13 more"), Some("12"));
        assert_eq!(math_answer("She has 1,000 coins."), Some("1,000"));
        assert_eq!(math_answer("It is 2.5."), Some("2.5"));
        assert_eq!(math_answer("it drops to -3 degrees"), Some("-3"));
        assert_eq!(math_answer("11 - 4"), Some("4"));
        assert_eq!(math_answer("11-4"), Some("4"));
        assert_eq!(math_answer("no digits"), None);
        assert_eq!(is_correct(TaskKind::Math, "She has 1,000 coins.", "1000"), Some(true));
        assert_eq!(is_correct(TaskKind::Science, "\\boxed{1.03e+24}", "1e+24"), Some(true));
        assert_eq!(is_correct(TaskKind::Science, "\\boxed{1.2e+24}", "1e+24"), Some(false));
        assert_eq!(is_correct(TaskKind::Science, "no number", "1e+24"), Some(false));
        assert_eq!(is_correct(TaskKind::Coding, "```python\npass\n```", "assert True"), None);
    }
}
