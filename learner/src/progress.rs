//! How far the step in training has got. The training thread writes it after every
//! micro-batch; the service reads it without waiting for the thread, so a coordinator can show
//! progress inside a step that takes minutes.
use comas_proto::v1 as pb;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Default)]
struct State {
    global_step: u64,
    started: Option<Instant>,
    samples_done: u32,
    samples_total: u32,
    tokens_done: u64,
    /// Micro-batches through the model, ever: moves in every phase of a step.
    beats: u64,
}

#[derive(Default)]
pub struct Progress(Mutex<State>);

impl Progress {
    pub fn shared() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A panic elsewhere cannot leave these counters half-written in a way that matters.
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s)
    }

    /// A step starts: `samples_total` forward+backward passes of samples are ahead.
    pub fn begin(&self, global_step: u64, samples_total: u32) -> Running<'_> {
        self.with(|s| {
            *s = State {
                global_step,
                started: Some(Instant::now()),
                samples_done: 0,
                samples_total,
                tokens_done: 0,
                beats: s.beats,
            }
        });
        Running(self)
    }

    pub fn advance(&self, samples: u32, tokens: u64) {
        self.with(|s| {
            s.samples_done = s.samples_done.saturating_add(samples).min(s.samples_total);
            s.tokens_done += tokens;
            s.beats += 1;
        });
    }

    /// A micro-batch went through the model outside training (log-probs before a step).
    pub fn beat(&self) {
        self.with(|s| s.beats += 1);
    }

    pub fn report(&self) -> pb::TrainProgressReport {
        self.with(|s| pb::TrainProgressReport {
            global_step: s.global_step,
            training: s.started.is_some(),
            samples_done: s.samples_done,
            samples_total: s.samples_total,
            tokens_done: s.tokens_done,
            seconds: s.started.map_or(0.0, |t| t.elapsed().as_secs_f64()),
            beats: s.beats,
        })
    }
}

/// Marks the step as over when dropped, however it ends.
pub struct Running<'a>(&'a Progress);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.with(|s| s.started = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_counts_up_and_ends_when_its_guard_goes() {
        let p = Progress::default();
        {
            let _run = p.begin(3, 10);
            p.advance(4, 400);
            p.advance(8, 100); // clamped to the total
            let r = p.report();
            assert_eq!(
                (r.global_step, r.training, r.samples_done, r.samples_total, r.tokens_done),
                (3, true, 10, 10, 500)
            );
        }
        let r = p.report();
        assert_eq!((r.global_step, r.training, r.samples_done), (3, false, 10));
    }

    #[test]
    fn beats_count_every_micro_batch_and_survive_a_new_step() {
        let p = Progress::default();
        p.beat();
        p.beat(); // two log-prob micro-batches before the step
        {
            let _run = p.begin(1, 4);
            p.advance(2, 10);
            p.advance(2, 10);
        }
        p.beat();
        let _run = p.begin(2, 4);
        assert_eq!(p.report().beats, 5);
    }
}
