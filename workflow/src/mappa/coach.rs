//! Reading a coach's reply (spec 4): the first `PROCESS_SCORE:` (clamped to 0–10), and an
//! outcome from `OUTCOME_SCORE:` (clamped to 0–1) or else `ANSWER_CORRECT: 0|1`.
use regex::Regex;
use std::sync::LazyLock;

static PROCESS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?i)PROCESS_SCORE:\s*([\d.]+)").expect("constant pattern compiles"));
static OUTCOME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?i)OUTCOME_SCORE:\s*([\d.]+)").expect("constant pattern compiles"));
static CORRECT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?i)ANSWER_CORRECT:\s*([01])").expect("constant pattern compiles"));
static LOOSE_FRACTION: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"([0-1]\.\d+)").expect("constant pattern compiles"));
static LOOSE_NUMBER: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(\d+\.?\d*)").expect("constant pattern compiles"));

/// The score used by the legacy fallback when not even a loose number is found.
pub const LEGACY_DEFAULT_SCORE: f64 = 5.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoachReading {
    pub process: Option<f64>,
    pub outcome: Option<f64>,
}

fn first(re: &Regex, text: &str) -> Option<f64> {
    re.captures(text).and_then(|c| c[1].parse::<f64>().ok()).filter(|v| v.is_finite())
}

pub fn parse_coach(text: &str) -> CoachReading {
    let process = first(&PROCESS, text).map(|v| v.clamp(0.0, 10.0));
    let outcome = first(&OUTCOME, text).map(|v| v.clamp(0.0, 1.0)).or_else(|| first(&CORRECT, text));
    CoachReading { process, outcome }
}

impl CoachReading {
    /// Whether the reply is complete: it has a process score, and an outcome when one was asked.
    pub fn complete(&self, wants_outcome: bool) -> bool {
        self.process.is_some() && (!wants_outcome || self.outcome.is_some())
    }
}

/// The reference's loose reading for parity: a decimal in [0, 1] with a fraction, else the
/// first number within 0–10, else the default.
pub fn legacy_score(text: &str) -> f64 {
    if let Some(v) = first(&LOOSE_FRACTION, text) {
        return v;
    }
    LOOSE_NUMBER.captures_iter(text).filter_map(|c| c[1].parse::<f64>().ok()).find(|v| (0.0..=10.0).contains(v)).unwrap_or(LEGACY_DEFAULT_SCORE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_read_clamped_and_case_insensitive() {
        assert_eq!(parse_coach("Good work.\nPROCESS_SCORE: 7\nANSWER_CORRECT: 1"), CoachReading { process: Some(7.0), outcome: Some(1.0) });
        assert_eq!(parse_coach("process_score: 12.5"), CoachReading { process: Some(10.0), outcome: None });
        assert_eq!(parse_coach("PROCESS_SCORE: 3\nOUTCOME_SCORE: 0.4\nANSWER_CORRECT: 1"), CoachReading { process: Some(3.0), outcome: Some(0.4) });
        assert_eq!(parse_coach("PROCESS_SCORE: 2 PROCESS_SCORE: 9").process, Some(2.0));
        assert_eq!(parse_coach("I would give it an eight."), CoachReading { process: None, outcome: None });
        assert!(!parse_coach("PROCESS_SCORE: 6").complete(true));
        assert!(parse_coach("PROCESS_SCORE: 6").complete(false));
    }

    #[test]
    fn the_legacy_reading_takes_any_number() {
        assert_eq!(legacy_score("about 0.75 of the way"), 0.75);
        assert_eq!(legacy_score("step 42 was fine, I give 8"), 8.0);
        assert_eq!(legacy_score("no numbers"), LEGACY_DEFAULT_SCORE);
    }
}
