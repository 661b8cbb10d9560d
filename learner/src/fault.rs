//! A fault injected for tests, from `COMAS_LEARNER_FAULT`: `flip-advantage-sign` trains every
//! step against its advantages (the test that training makes rewarded behaviour more likely
//! must fail then).

/// Whether this learner negates every advantage it trains with.
pub(crate) fn flips_advantages() -> bool {
    static FLIP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FLIP.get_or_init(|| {
        std::env::var("COMAS_LEARNER_FAULT").is_ok_and(|v| v == "flip-advantage-sign")
    })
}
