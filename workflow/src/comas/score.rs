//! Reading the verdicts out of generated text: the 1–3 score of a scorer (spec 4) and the
//! correct/incorrect judgment of the no-scoring ablation (spec 9). No retries, no defaults, no
//! guessing from stray digits: anything that does not follow the format is `None`, and the reward
//! turns `None` into a format penalty.
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

static SCORE_TAG: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?is)<score>(.*?)</score>").expect("constant score pattern compiles"));

static JUDGMENT_TAG: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?is)<judgment>(.*?)</judgment>").expect("constant judgment pattern compiles"));

/// The score inside the first `<score>…</score>` tag (tag name case-insensitive), if that text,
/// trimmed, is a base-10 integer in 1..=3. Later tags are never consulted.
pub fn extract_score(text: &str) -> Option<u8> {
    let inner = SCORE_TAG.captures(text)?.get(1)?.as_str().trim();
    // i64 parsing accepts an optional sign and ASCII digits only, like a plain integer literal;
    // overflow is just another invalid score.
    let value: i64 = inner.parse().ok()?;
    u8::try_from(value).ok().filter(|v| (1..=3).contains(v))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Judgment {
    Correct,
    Incorrect,
}

/// The verdict inside the first `<judgment>…</judgment>` tag: `correct` or `incorrect`, trimmed,
/// in any letter case. Anything else (or no tag) is `None`.
pub fn extract_judgment(text: &str) -> Option<Judgment> {
    let inner = JUDGMENT_TAG.captures(text)?.get(1)?.as_str().trim();
    if inner.eq_ignore_ascii_case("correct") {
        Some(Judgment::Correct)
    } else if inner.eq_ignore_ascii_case("incorrect") {
        Some(Judgment::Incorrect)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_test_vectors() {
        assert_eq!(extract_score("ok <score>3</score>"), Some(3));
        assert_eq!(extract_score("<SCORE> 2 </SCORE>"), Some(2));
        assert_eq!(extract_score("<score>4</score>"), None);
        assert_eq!(extract_score("<score>\" and \"</score><score>1</score>"), None);
        assert_eq!(extract_score("score: 3"), None);
        assert_eq!(extract_score("<score>2.0</score>"), None);
        assert_eq!(extract_score("<score>1</score> … <score>3</score>"), Some(1));
    }

    #[test]
    fn more_edges() {
        assert_eq!(extract_score("<score>0</score>"), None);
        assert_eq!(extract_score("<score>-1</score>"), None);
        assert_eq!(extract_score("<score>+2</score>"), Some(2));
        assert_eq!(extract_score("<score>02</score>"), Some(2));
        assert_eq!(extract_score("<score>\n3\n</score>"), Some(3));
        assert_eq!(extract_score("<Score>3</sCoRe>"), Some(3));
        assert_eq!(extract_score("<score></score>"), None);
        assert_eq!(extract_score("<score>3"), None);
        assert_eq!(extract_score("<score>99999999999999999999999</score>"), None);
        assert_eq!(extract_score("<score>three</score>"), None);
        assert_eq!(extract_score(""), None);
    }

    #[test]
    fn judgments() {
        assert_eq!(extract_judgment("fine. <judgment>correct</judgment>"), Some(Judgment::Correct));
        assert_eq!(extract_judgment("<JUDGMENT> Incorrect </judgment>"), Some(Judgment::Incorrect));
        assert_eq!(extract_judgment("<judgment>maybe</judgment><judgment>correct</judgment>"), None);
        assert_eq!(extract_judgment("<judgment>incorrect</judgment> <judgment>correct</judgment>"), Some(Judgment::Incorrect));
        assert_eq!(extract_judgment("correct"), None);
        assert_eq!(extract_judgment("<judgement>correct</judgement>"), None);
    }
}
