//! Means as the metrics records carry them: the value and how many values it is over.
use serde::{Deserialize, Serialize};

/// A mean and how many values it is over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Mean {
    pub mean: Option<f64>,
    pub count: u64,
}

/// A running sum and count.
#[derive(Debug, Default)]
pub struct Sum(f64, u64);

impl Sum {
    pub fn push(&mut self, v: f64) {
        self.0 += v;
        self.1 += 1;
    }
    pub fn mean(&self) -> Mean {
        Mean { mean: (self.1 > 0).then(|| self.0 / self.1 as f64), count: self.1 }
    }
}
