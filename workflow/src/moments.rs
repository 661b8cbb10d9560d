//! Count, mean and summed squared deviation of a set of returns: what whitening needs, in a
//! form that parts computed on different learners pool exactly (Chan et al.'s parallel
//! variance), so advantages can be whitened over all agents' samples (MAPPA's `global` scope)
//! while each learner holds only its own.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Moments {
    pub count: u64,
    pub mean: f64,
    /// Σ (x − mean)².
    pub m2: f64,
}

impl Moments {
    /// Moments of `values`, summed in the order given.
    pub fn of<'a>(values: impl Iterator<Item = &'a f64> + Clone) -> Self {
        let (sum, count) = values.clone().fold((0.0, 0u64), |(s, n), x| (s + x, n + 1));
        if count == 0 {
            return Self::default();
        }
        let mean = sum / count as f64;
        Self { count, mean, m2: values.map(|x| (x - mean).powi(2)).sum() }
    }

    /// Population variance (0 without values).
    pub fn variance(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.m2 / self.count as f64
        }
    }

    /// The moments of the union of two disjoint sets.
    pub fn merge(self, other: Self) -> Self {
        if other.count == 0 {
            return self;
        }
        if self.count == 0 {
            return other;
        }
        let n = self.count + other.count;
        let delta = other.mean - self.mean;
        let mean = self.mean + delta * other.count as f64 / n as f64;
        let m2 = self.m2
            + other.m2
            + delta * delta * (self.count as f64 * other.count as f64) / n as f64;
        Self { count: n, mean, m2 }
    }

    /// The moments of the union of disjoint parts.
    pub fn pool(parts: impl IntoIterator<Item = Self>) -> Self {
        parts.into_iter().fold(Self::default(), Self::merge)
    }
}

#[cfg(test)]
mod tests {
    use super::Moments;

    #[test]
    fn pooled_parts_equal_the_moments_of_the_union() {
        let a = [0.699, 0.701, 0.397, 0.397];
        let b = [0.2, 0.2];
        let c: [f64; 0] = [];
        let all: Vec<f64> = a.iter().chain(&b).copied().collect();
        let pooled =
            Moments::pool([Moments::of(a.iter()), Moments::of(c.iter()), Moments::of(b.iter())]);
        let whole = Moments::of(all.iter());
        assert_eq!(pooled.count, 6);
        assert!((pooled.mean - whole.mean).abs() < 1e-15, "{pooled:?} {whole:?}");
        assert!((pooled.variance() - whole.variance()).abs() < 1e-15, "{pooled:?} {whole:?}");
        // By hand: mean 2.594 / 6 = 0.432333…, variance 0.253747 / 6 = 0.0422912 (population).
        assert!((whole.mean - 0.4323333333).abs() < 1e-9);
        assert!((whole.variance() - 0.0422912).abs() < 1e-6, "{}", whole.variance());
        assert_eq!(Moments::pool([]), Moments::default());
        assert_eq!(Moments::of(c.iter()).variance(), 0.0);
    }
}
