//! Decimal answers (SciBench; spec §8.3): the first value the reference parser reads from the
//! response, boxed answers first, as a float `a`; the ground truth, a leading `+` removed, read
//! the same way as `g`; correct iff |a − g| ≤ 0.05·max(|a|, |g|). Anything that does not read as
//! a float is wrong. Also the training-time science check, which reads the answer text instead.
use super::extract::{extract, extract_with, Extracted};
use super::value::{Const, Expr, Value};
use super::Failure;

/// Relative tolerance of both numeric rules.
pub const TOLERANCE: f64 = 0.05;

/// Python's `float()` of a parse result: a real number, ±∞ included.
fn float_of(parsed: &Extracted) -> Option<f64> {
    match &parsed.value {
        Some(Value::Expr(Expr::Const(Const::Inf))) => Some(f64::INFINITY),
        Some(Value::Expr(Expr::Const(Const::NegInf))) => Some(f64::NEG_INFINITY),
        Some(Value::Expr(e)) => e.value().filter(|c| c.im == 0.0).map(|c| c.re),
        Some(_) => None,
        // Without a value the reference's first result is the text itself.
        None => parsed.text.as_deref().and_then(python_float),
    }
}

/// Python's `float(str)`: optional sign, digits with `_` between them, a decimal point, an
/// exponent, `inf` / `nan`; surrounding whitespace allowed.
pub fn python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let b = t.as_bytes();
    let ok_underscores = b.iter().enumerate().all(|(i, &c)| {
        c != b'_'
            || (i > 0 && i + 1 < b.len() && b[i - 1].is_ascii_digit() && b[i + 1].is_ascii_digit())
    });
    if !ok_underscores {
        return None;
    }
    t.replace('_', "").parse::<f64>().ok()
}

pub fn grade(response: &str, gt: &str) -> Result<(), Failure> {
    let gt = gt.trim();
    let gt = gt.strip_prefix('+').unwrap_or(gt);
    let want = extract_with(gt, true);
    let Some(g) = float_of(&want) else { return Err(Failure::UnreadableReference(gt.to_string())) };
    let got = extract_with(response, true);
    if got.value.is_none() && got.text.is_none() {
        return Err(Failure::NoAnswer);
    }
    let Some(a) = float_of(&got) else {
        return Err(Failure::NotANumber(got.text.unwrap_or_default()));
    };
    // Written as in the reference, IEEE semantics included: an infinite answer passes.
    if (a - g).abs() <= TOLERANCE * a.abs().max(g.abs()) {
        Ok(())
    } else {
        Err(Failure::OutOfTolerance { got: a, want: g })
    }
}

/// Training-time science check (logging only): the answer text the reference parser extracts,
/// read with Python's `float`, within 5 % of the record's answer. `None` when the record's
/// answer is not a number.
pub fn science_is_correct(response: &str, answer: &str) -> Option<bool> {
    let g = python_float(answer)?;
    let got = extract(response);
    // The text is the reference's second parse result, which exists only next to a value.
    let a = got.value.as_ref().and(got.text.as_deref()).and_then(python_float);
    Some(a.is_some_and(|a| (a - g).abs() < TOLERANCE * g.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_five_percent_of_the_larger() {
        assert_eq!(grade("so \\boxed{1.04}", "1.0"), Ok(()));
        assert_eq!(grade("so \\boxed{1.05}", "1.0"), Ok(()));
        assert!(grade("so \\boxed{1.06}", "1.0").is_err());
        // Relative to the larger magnitude.
        assert_eq!(grade("\\boxed{0.96}", "1"), Ok(()));
        assert!(grade("\\boxed{0.94}", "1").is_err());
        assert_eq!(grade("\\boxed{105}", "100"), Ok(()));
        assert_eq!(grade("\\boxed{-2.5}", "-2.4"), Ok(()));
        assert!(grade("\\boxed{2.5}", "-2.5").is_err());
        assert_eq!(grade("the value is \\boxed{\\frac{1}{2}}", "0.5"), Ok(()));
        assert_eq!(grade("\\boxed{1.5 \\times 10^{3}}", "1500"), Ok(()));
    }

    #[test]
    fn boxed_first_and_plus_stripped() {
        // The box wins over a later number.
        assert_eq!(grade("The answer is \\boxed{3.2} J; about 10 in other units.", "3.2"), Ok(()));
        assert_eq!(grade("\\boxed{2.5}", "+2.5"), Ok(()));
        assert_eq!(grade("the result is 7.0", "7"), Ok(()));
    }

    #[test]
    fn unreadable_answers_are_wrong() {
        assert_eq!(grade("no idea", "3.0"), Err(Failure::NoAnswer));
        assert_eq!(grade("\\boxed{x}", "3.0"), Err(Failure::NotANumber("x".into())));
        assert_eq!(grade("\\boxed{1, 2}", "3.0"), Err(Failure::NotANumber("1, 2".into())));
        assert_eq!(grade("\\boxed{3}", "abc"), Err(Failure::UnreadableReference("abc".into())));
        assert_eq!(
            grade("\\boxed{4}", "3.0"),
            Err(Failure::OutOfTolerance { got: 4.0, want: 3.0 })
        );
    }

    #[test]
    fn training_science_check() {
        assert_eq!(science_is_correct("\\boxed{1.03e+24}", "1e+24"), Some(true));
        assert_eq!(science_is_correct("\\boxed{1.2e+24}", "1e+24"), Some(false));
        assert_eq!(science_is_correct("no number", "1e+24"), Some(false));
        // Strictly within 5 % of the reference value.
        assert_eq!(science_is_correct("\\boxed{1.05}", "1"), Some(false));
        assert_eq!(science_is_correct("\\boxed{1.04}", "1"), Some(true));
        assert_eq!(science_is_correct("\\boxed{1}", "n/a"), None);
    }

    #[test]
    fn python_float_forms() {
        assert_eq!(python_float(" 1.5e3 "), Some(1500.0));
        assert_eq!(python_float("1_000"), Some(1000.0));
        assert_eq!(python_float("1__0"), None);
        assert_eq!(python_float("+2"), Some(2.0));
        assert_eq!(python_float("\\frac{1}{2}"), None);
    }
}
