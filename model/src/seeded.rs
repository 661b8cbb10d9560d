//! Seeded draws from torch's generator. libtorch has one default generator per process, so two
//! threads that each seed it and then draw (two tests writing tiny models, two learners of
//! `comas local` initialising LoRA adapters) interleave their draws and get weights that depend
//! on timing. Every seeded draw goes through [`with_torch_seed`], which holds the generator for
//! the whole seed-and-draw sequence.
use std::sync::Mutex;

static TORCH_GENERATOR: Mutex<()> = Mutex::new(());

/// Seeds torch's default generator with `seed` and runs `draw` while no other caller of this
/// function can touch the generator.
pub fn with_torch_seed<T>(seed: i64, draw: impl FnOnce() -> T) -> T {
    // A panic in another draw leaves nothing half-done that matters: the next caller reseeds.
    let _held = TORCH_GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    tch::manual_seed(seed);
    draw()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};

    fn draws(seed: i64) -> Vec<f32> {
        with_torch_seed(seed, || {
            (0..200)
                .flat_map(|_| {
                    Vec::<f32>::try_from(Tensor::randn([16], (Kind::Float, Device::Cpu))).unwrap()
                })
                .collect()
        })
    }

    #[test]
    fn concurrent_seeded_draws_match_the_sequential_ones() {
        let alone = [draws(1), draws(2)];
        let threads: Vec<_> = (0..4)
            .map(|i| {
                std::thread::spawn(move || (0..5).map(|_| draws(1 + i % 2)).collect::<Vec<_>>())
            })
            .collect();
        for (i, t) in threads.into_iter().enumerate() {
            for got in t.join().unwrap() {
                assert!(
                    got == alone[i % 2],
                    "thread {i}'s draws with seed {} differ from the same seed's draws alone",
                    1 + i % 2
                );
            }
        }
    }
}
