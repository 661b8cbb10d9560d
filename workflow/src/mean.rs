//! Means as the metrics records carry them, and the one running accumulator every method's
//! figures are summed with.
use serde::{Deserialize, Serialize};

/// A mean and how many values it is over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Mean {
    pub mean: Option<f64>,
    pub count: u64,
}

/// Mean, (population) standard deviation and count of some values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Spread {
    pub mean: Option<f64>,
    pub std: Option<f64>,
    pub count: u64,
}

/// A running sum, sum of squares and count. Summed in the order pushed, so a figure is the
/// same bit for bit wherever it is computed.
#[derive(Debug, Clone, Default)]
pub struct Sum {
    sum: f64,
    squares: f64,
    count: u64,
}

impl Sum {
    /// The accumulator of `values`, pushed in order.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut s = Self::default();
        values.into_iter().for_each(|v| s.push(v));
        s
    }

    pub fn push(&mut self, v: f64) {
        self.sum += v;
        self.squares += v * v;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The mean, if any value was pushed.
    pub fn value(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }

    pub fn mean(&self) -> Mean {
        Mean { mean: self.value(), count: self.count }
    }

    /// Mean and standard deviation (E[x²] − E[x]², floored at 0 against rounding).
    pub fn spread(&self) -> Spread {
        let mean = self.value();
        let std = mean.map(|m| (self.squares / self.count as f64 - m * m).max(0.0).sqrt());
        Spread { mean, std, count: self.count }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_sum_has_no_mean_and_a_full_one_its_moments() {
        assert_eq!(Sum::default().spread(), Spread { mean: None, std: None, count: 0 });
        assert_eq!(Sum::default().mean(), Mean { mean: None, count: 0 });
        let s = Sum::of([1.0, 2.0, 3.0, 6.0]);
        assert_eq!(s.mean(), Mean { mean: Some(3.0), count: 4 });
        // Σx² = 50, E[x²] = 12.5, var = 12.5 − 9 = 3.5.
        assert_eq!(s.spread(), Spread { mean: Some(3.0), std: Some(3.5f64.sqrt()), count: 4 });
        // Equal values: rounding can make E[x²] − E[x]² negative; the floor keeps std 0.
        assert_eq!(Sum::of([0.1; 3]).spread().std, Some(0.0));
    }
}
