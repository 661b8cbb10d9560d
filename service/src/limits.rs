//! Every message-size limit of the gRPC servers and clients, in one place: both ends of a call
//! use the same number, so a message one side may send the other may take.

/// A job file (`SubmitJob`, `comas submit`): a few KiB; inline evaluation questions make more.
pub const JOB_FILE_BYTES: usize = 1 << 20;
/// Any message of the coordinator's client API (a `SubmitJob` carries one job file; a
/// `JobEpisodes` record one evaluation transcript).
pub const API_MESSAGE_BYTES: usize = 4 << 20;
/// Any message between services: episode specs and results on a worker's `RunEpisodes`
/// stream, experiences on a learner's `Train` stream, reports.
pub const PEER_MESSAGE_BYTES: usize = 64 << 20;
/// A message of a weight stream (`StreamWeights`, `RelayWeights`): a chunk of at most 2 MiB of
/// tensor bytes and its header.
pub const WEIGHT_MESSAGE_BYTES: usize = 8 << 20;

/// A token bucket per peer: `per_minute` calls, refilled evenly, at most `per_minute` at once.
/// Zero turns it off.
#[derive(Debug)]
pub struct RateLimit {
    per_minute: u32,
    buckets: std::sync::Mutex<std::collections::HashMap<String, (f64, std::time::Instant)>>,
}

impl RateLimit {
    pub fn per_minute(per_minute: u32) -> Self {
        Self { per_minute, buckets: Default::default() }
    }

    /// Takes one call for `peer`; when none is left, how long until one is.
    pub fn take(&self, peer: &str) -> Result<(), std::time::Duration> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let cap = f64::from(self.per_minute);
        let per_sec = cap / 60.0;
        let now = std::time::Instant::now();
        let mut b = self.buckets.lock().expect("rate lock");
        // Peers that went quiet are forgotten, so the map stays as small as the active set.
        if b.len() > 10_000 {
            b.retain(|_, (_, at)| now.duration_since(*at).as_secs_f64() * per_sec < cap);
        }
        let (left, at) = b.entry(peer.to_string()).or_insert((cap, now));
        *left = (*left + now.duration_since(*at).as_secs_f64() * per_sec).min(cap);
        *at = now;
        if *left >= 1.0 {
            *left -= 1.0;
            return Ok(());
        }
        Err(std::time::Duration::from_secs_f64((1.0 - *left) / per_sec))
    }
}

/// Calls one connection may have in flight at once, on every server.
pub const CALLS_PER_CONNECTION: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_burst_then_waits_and_others_are_not_held_up() {
        let r = RateLimit::per_minute(3);
        for _ in 0..3 {
            r.take("10.0.0.1").unwrap();
        }
        let wait = r.take("10.0.0.1").unwrap_err();
        assert!(wait.as_secs_f64() > 19.0 && wait.as_secs_f64() <= 20.0, "{wait:?}");
        r.take("10.0.0.2").unwrap();
        let off = RateLimit::per_minute(0);
        assert!((0..1000).all(|_| off.take("x").is_ok()));
    }
}

/// Deadline of a client's call to the coordinator's API: for a unary call its whole answer, for
/// a stream (WatchJob) its start; the stream itself runs as long as the job.
pub const API_CALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);
