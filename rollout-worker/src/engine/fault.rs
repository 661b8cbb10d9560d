//! Faults injected for tests of the failure paths.
/// A fault injected for tests of the failure paths, from `COMAS_WORKER_FAULT`:
/// `step-panic:N` panics inside decode step N (caught: that batch fails), `engine-panic:N`
/// panics in the engine loop after step N (the thread dies and the worker with it),
/// `stale-version:N` reports the N-th finished episode's turns with a wrong policy version,
/// `slow-load:S` takes S seconds longer to load policies (a big model on a slow disk),
/// `slow-swap:S` waits S seconds between receiving a weight version and swapping it in,
/// `stale-weights:1` takes every new version's number but keeps decoding with the weights it
/// loaded (a broadcast that never reaches the models, for the test that training changes what
/// the workers sample), `slow-result:MS` reports each finished episode MS milliseconds late (a
/// slow machine, whatever the hardware: the tests of lease timeouts and of kills mid-job),
/// `slow-decode:MS` sleeps MS milliseconds before each decode step (a straggler that is still
/// decoding when its lease times out: the test of cancelled copies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    StepPanic(u64),
    EnginePanic(u64),
    StaleVersion(u64),
    SlowLoad(u64),
    SlowSwap(u64),
    StaleWeights,
    SlowResult(u64),
    SlowDecode(u64),
}

pub(crate) fn fault_from_env() -> Option<Fault> {
    let v = std::env::var("COMAS_WORKER_FAULT").ok()?;
    let (kind, n) = v.split_once(':')?;
    let n = n.parse().ok()?;
    match kind {
        "step-panic" => Some(Fault::StepPanic(n)),
        "engine-panic" => Some(Fault::EnginePanic(n)),
        "stale-version" => Some(Fault::StaleVersion(n)),
        "slow-load" => Some(Fault::SlowLoad(n)),
        "slow-swap" => Some(Fault::SlowSwap(n)),
        "stale-weights" => Some(Fault::StaleWeights),
        "slow-result" => Some(Fault::SlowResult(n)),
        "slow-decode" => Some(Fault::SlowDecode(n)),
        _ => None,
    }
}
