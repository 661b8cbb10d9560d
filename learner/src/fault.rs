//! Faults injected for tests, from `COMAS_LEARNER_FAULT`:
//! - `flip-advantage-sign` trains every step against its advantages (the test that training
//!   makes rewarded behaviour more likely must fail then);
//! - `stall-train:N` stops the training thread for good when it starts step N, while the
//!   process goes on answering (a deadlocked thread or a hung device, as the coordinator sees
//!   it: alive, but its step never ends).

fn fault() -> Option<&'static str> {
    static FAULT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    FAULT.get_or_init(|| std::env::var("COMAS_LEARNER_FAULT").ok()).as_deref()
}

/// Whether this learner negates every advantage it trains with.
pub(crate) fn flips_advantages() -> bool {
    fault() == Some("flip-advantage-sign")
}

/// Blocks the calling (training) thread forever if the fault stalls `step`.
pub(crate) fn stall_at(step: u64) {
    let stalls = fault()
        .and_then(|f| f.strip_prefix("stall-train:"))
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n == step);
    if stalls {
        tracing::warn!(step, "training stalled on purpose (COMAS_LEARNER_FAULT)");
        loop {
            std::thread::park();
        }
    }
}
