//! The one retry schedule of the workspace: the wait before each new try of something that keeps
//! failing doubles, from a first wait up to a cap. Callers decide what is worth retrying and for
//! how long (a patience, a number of tries); this only says how long to wait.
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits of `first`, then twice as long each time, never more than `cap`.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Backoff { first, cap, next: first }
    }

    /// Reaching a peer of the cluster again (a coordinator, a learner, a weight source that
    /// restarts): 200 ms, doubling to at most 5 s, so a restarted peer is found within seconds.
    pub const fn reconnect() -> Self {
        Backoff::new(Duration::from_millis(200), Duration::from_secs(5))
    }

    /// A remote model endpoint that keeps failing (spec mappa.md §4): 2 s before the second
    /// try, then min(2^attempt, 300) s before try `attempt + 1`.
    pub const fn endpoint() -> Self {
        Backoff::new(Duration::from_secs(2), Duration::from_secs(300))
    }

    /// The wait before the next try; the one after it is twice as long (up to the cap).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        wait
    }

    /// After a success: the next failure waits the first wait again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(mut b: Backoff, n: usize) -> Vec<Duration> {
        (0..n).map(|_| b.next_wait()).collect()
    }

    #[test]
    fn reconnect_waits_double_from_200_ms_to_5_s_and_reset_starts_over() {
        let ms = Duration::from_millis;
        assert_eq!(
            waits(Backoff::reconnect(), 7),
            [ms(200), ms(400), ms(800), ms(1600), ms(3200), ms(5000), ms(5000)]
        );
        let mut b = Backoff::reconnect();
        b.next_wait();
        b.next_wait();
        b.reset();
        assert_eq!(b.next_wait(), ms(200));
    }

    /// spec mappa.md §4: the wait before try k + 1 is min(2^k, 300) s.
    #[test]
    fn endpoint_waits_are_the_specs_schedule() {
        let got = waits(Backoff::endpoint(), 40);
        let want: Vec<Duration> =
            (1..=40u32).map(|k| Duration::from_secs(2u64.saturating_pow(k).min(300))).collect();
        assert_eq!(got, want);
    }
}
