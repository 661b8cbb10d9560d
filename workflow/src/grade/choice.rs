//! Multiple-choice answers (GPQA, MMLU, MedQA; spec §8.3): the letter of the last
//! `\boxed{A}`..`\boxed{D}`, any case, upper-cased, must equal the ground truth.
use super::Failure;
use regex::Regex;
use std::sync::LazyLock;

static BOXED_LETTER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\\boxed\{([A-D])\}").expect("valid regex"));

/// The letter of the last boxed choice, upper-cased.
pub fn choice(response: &str) -> Option<char> {
    let caps = BOXED_LETTER.captures_iter(response).last()?;
    caps.get(1)?.as_str().chars().next().map(|c| c.to_ascii_uppercase())
}

pub fn grade(response: &str, gt: &str) -> Result<(), Failure> {
    let Some(letter) = choice(response) else { return Err(Failure::NoAnswer) };
    let want = gt.trim();
    if want.len() == 1 && want.starts_with(letter) {
        Ok(())
    } else {
        Err(Failure::NotEqual { got: letter.to_string(), want: want.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_boxed_letter_counts() {
        assert_eq!(choice("I first thought \\boxed{A} but it is \\boxed{c}."), Some('C'));
        assert_eq!(choice("\\boxed{E} is not an option"), None);
        assert_eq!(choice("\\boxed{ B }"), None);
        assert_eq!(choice("The answer is B."), None);
        assert_eq!(grade("so \\boxed{b}", "B"), Ok(()));
        assert_eq!(
            grade("so \\boxed{B}", "C"),
            Err(Failure::NotEqual { got: "B".into(), want: "C".into() })
        );
        assert_eq!(grade("so B", "B"), Err(Failure::NoAnswer));
        // A lower-case reference letter is not upper-cased: the reference compares as is.
        assert!(grade("\\boxed{b}", "b").is_err());
    }
}
