//! The Bayesian evaluator of spec cosir.md §4: an ideal observer that knows the generator's
//! prior and some cells of the table, and gives the probability that each option has the
//! highest weighted total. Exact: each option's unknown part is a convolution of scaled prior
//! pmfs, and ties are split evenly through a generating polynomial. It ignores the conditioning
//! of the hardness filters and the uniqueness check (a documented approximation).
use std::collections::BTreeMap;

/// A cell of the table: (option, criterion).
pub type Cell = (usize, usize);

/// What the evaluator knows of a table besides its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub options: usize,
    /// Public weight of each criterion.
    pub weights: Vec<u32>,
    /// Prior pmf of a score over 0..=K (sums to 1).
    pub prior: Vec<f64>,
}

/// Known cells and their values.
pub type Evidence = BTreeMap<Cell, u32>;

/// Floor of a probability inside a logarithm (spec §4.2).
pub const PROB_FLOOR: f64 = 1e-6;

impl Shape {
    pub fn k(&self) -> u32 {
        self.prior.len() as u32 - 1
    }

    /// Pmf of option `o`'s weighted total given `known`: index u is P(U_o = u).
    pub fn total_pmf(&self, o: usize, known: &Evidence) -> Vec<f64> {
        let mut fixed = 0usize;
        let mut pmf = vec![1.0];
        for (c, &w) in self.weights.iter().enumerate() {
            let w = w as usize;
            match known.get(&(o, c)) {
                Some(&v) => fixed += w * v as usize,
                None => {
                    // Convolve with the pmf of w·S, S ~ prior.
                    let mut next = vec![0.0; pmf.len() + w * (self.prior.len() - 1)];
                    for (x, &px) in pmf.iter().enumerate() {
                        if px == 0.0 {
                            continue;
                        }
                        for (s, &ps) in self.prior.iter().enumerate() {
                            next[x + w * s] += px * ps;
                        }
                    }
                    pmf = next;
                }
            }
        }
        let mut out = vec![0.0; fixed];
        out.extend(pmf);
        out
    }

    /// P(o* = o | known) for every option (spec §4.1).
    pub fn posterior(&self, known: &Evidence) -> Vec<f64> {
        let pmfs: Vec<Vec<f64>> = (0..self.options).map(|o| self.total_pmf(o, known)).collect();
        let at = |p: &Vec<f64>, u: usize| p.get(u).copied().unwrap_or(0.0);
        // P(U < u) for each option, by prefix sums.
        let below: Vec<Vec<f64>> = pmfs
            .iter()
            .map(|p| {
                let mut acc = 0.0;
                let mut b = Vec::with_capacity(p.len() + 1);
                for &x in p {
                    b.push(acc);
                    acc += x;
                }
                b.push(acc);
                b
            })
            .collect();
        let less = |o: usize, u: usize| if u < below[o].len() { below[o][u] } else { 1.0 };
        (0..self.options)
            .map(|o| {
                let mut total = 0.0;
                for (u, &pu) in pmfs[o].iter().enumerate() {
                    if pu == 0.0 {
                        continue;
                    }
                    // Π_{o'≠o} (a + b z) = Σ q_k z^k: k others tie at u, the rest are below.
                    let mut q = vec![1.0];
                    for other in (0..self.options).filter(|&x| x != o) {
                        let (a, b) = (less(other, u), at(&pmfs[other], u));
                        let mut next = vec![0.0; q.len() + 1];
                        for (k, &qk) in q.iter().enumerate() {
                            next[k] += qk * a;
                            next[k + 1] += qk * b;
                        }
                        q = next;
                    }
                    total += pu * q.iter().enumerate().map(|(k, qk)| qk / (k as f64 + 1.0)).sum::<f64>();
                }
                total
            })
            .collect()
    }

    /// −ln max(P(o* | known), 1e-6).
    pub fn surprisal(&self, answer: usize, known: &Evidence) -> f64 {
        -self.posterior(known)[answer].max(PROB_FLOOR).ln()
    }

    /// Entropy (natural log) of the posterior.
    pub fn entropy(&self, known: &Evidence) -> f64 {
        entropy(&self.posterior(known))
    }

    /// Expected entropy drop from learning cell `x` (spec §4.2): unseen cells are independent,
    /// so the value's predictive is the prior. Zero for a cell already known.
    pub fn information_gain(&self, known: &Evidence, x: Cell) -> f64 {
        if known.contains_key(&x) {
            return 0.0;
        }
        let before = self.entropy(known);
        let after: f64 = self
            .prior
            .iter()
            .enumerate()
            .filter(|(_, &p)| p > 0.0)
            .map(|(v, &p)| {
                let mut with = known.clone();
                with.insert(x, v as u32);
                p * self.entropy(&with)
            })
            .sum();
        before - after
    }
}

pub fn entropy(p: &[f64]) -> f64 {
    -p.iter().filter(|&&x| x > 0.0).map(|x| x * x.ln()).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Spec §4.5: M = 3, w = (2, 1, 1), K = 3 uniform; A = (1,3,3), B = (3,0,1), C = (2,1,2).
    fn fixture() -> (Shape, [[u32; 3]; 3]) {
        (Shape { options: 3, weights: vec![2, 1, 1], prior: vec![0.25; 4] }, [[1, 3, 3], [3, 0, 1], [2, 1, 2]])
    }

    fn cells(table: &[[u32; 3]; 3], criteria: &[usize]) -> Evidence {
        let mut e = Evidence::new();
        for (o, row) in table.iter().enumerate() {
            for &c in criteria {
                e.insert((o, c), row[c]);
            }
        }
        e
    }

    fn close(got: &[f64], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn the_spec_fixture_to_the_digits_given() {
        let (shape, t) = fixture();
        close(&shape.posterior(&cells(&t, &[0])), &[35.0 / 1536.0, 151.0 / 192.0, 293.0 / 1536.0]);
        let agent_1 = cells(&t, &[0, 1]);
        let agent_2 = cells(&t, &[0, 2]);
        close(&shape.posterior(&agent_1), &[27.0 / 128.0, 37.0 / 64.0, 27.0 / 128.0]);
        close(&shape.posterior(&agent_2), &[7.0 / 96.0, 2.0 / 3.0, 25.0 / 96.0]);
        let mut a_c2 = agent_2.clone();
        a_c2.insert((0, 1), 3);
        close(&shape.posterior(&a_c2), &[23.0 / 96.0, 53.0 / 96.0, 5.0 / 24.0]);
        let mut b_c2 = agent_2.clone();
        b_c2.insert((1, 1), 0);
        close(&shape.posterior(&b_c2), &[5.0 / 24.0, 23.0 / 96.0, 53.0 / 96.0]);
        close(&shape.posterior(&cells(&t, &[0, 1, 2])), &[1.0, 0.0, 0.0]);
        let round = |x: f64| (x * 1e6).round() / 1e6;
        let s0 = shape.surprisal(0, &agent_1) + shape.surprisal(0, &agent_2);
        assert_eq!(round(s0), 4.174631);
        let s1 = shape.surprisal(0, &agent_1) + shape.surprisal(0, &a_c2);
        assert_eq!((round(s1), round(s0 - s1)), (2.985047, 1.189584));
        assert_eq!(round(s0 - (shape.surprisal(0, &agent_1) + shape.surprisal(0, &b_c2))), 1.049822);
        assert_eq!(round(shape.entropy(&agent_2)), 0.811621);
        let ig = |o: usize| round(shape.information_gain(&agent_2, (o, 1)));
        assert_eq!((ig(0), ig(1), ig(2)), (0.072354, 0.242428, 0.189163));
        assert_eq!(shape.information_gain(&agent_2, (0, 0)), 0.0);
    }

    /// Brute force: enumerate every completion of the unknown cells, split ties evenly.
    fn enumerate(shape: &Shape, known: &Evidence, criteria: usize) -> Vec<f64> {
        let unknown: Vec<Cell> = (0..shape.options).flat_map(|o| (0..criteria).map(move |c| (o, c))).filter(|x| !known.contains_key(x)).collect();
        let mut p = vec![0.0; shape.options];
        let k = shape.prior.len();
        let total = k.pow(unknown.len() as u32);
        for n in 0..total {
            let mut full = known.clone();
            let (mut rest, mut weight) = (n, 1.0);
            for &x in &unknown {
                let v = rest % k;
                rest /= k;
                weight *= shape.prior[v];
                full.insert(x, v as u32);
            }
            let u: Vec<u32> = (0..shape.options).map(|o| (0..criteria).map(|c| shape.weights[c] * full[&(o, c)]).sum()).collect();
            let best = *u.iter().max().unwrap();
            let winners: Vec<usize> = (0..shape.options).filter(|&o| u[o] == best).collect();
            for &o in &winners {
                p[o] += weight / winners.len() as f64;
            }
        }
        p
    }

    #[test]
    fn small_tables_agree_with_enumeration() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for case in 0..40 {
            let (m, c) = (rng.gen_range(2..=3), rng.gen_range(2..=3));
            let k = rng.gen_range(1..=3);
            let mut prior: Vec<f64> = (0..=k).map(|_| rng.gen_range(0.1..1.0)).collect();
            let sum: f64 = prior.iter().sum();
            prior.iter_mut().for_each(|x| *x /= sum);
            let shape = Shape { options: m, weights: (0..c).map(|_| rng.gen_range(1..=3)).collect(), prior };
            let mut known = Evidence::new();
            for o in 0..m {
                for cc in 0..c {
                    if rng.gen_bool(0.4) {
                        known.insert((o, cc), rng.gen_range(0..=k));
                    }
                }
            }
            let got = shape.posterior(&known);
            let want = enumerate(&shape, &known, c);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-12, "case {case}: {got:?} vs {want:?}");
            }
            assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
    }

    #[test]
    fn large_tables_agree_with_monte_carlo() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let shape = Shape { options: 5, weights: vec![1, 2, 3, 1, 2, 3, 1, 2], prior: vec![0.1; 10] };
        let mut known = Evidence::new();
        for o in 0..5 {
            for c in 0..8 {
                if rng.gen_bool(0.5) {
                    known.insert((o, c), rng.gen_range(0..10));
                }
            }
        }
        let exact = shape.posterior(&known);
        let draws = 10_000;
        let mut wins = vec![0.0; 5];
        for _ in 0..draws {
            let u: Vec<u32> =
                (0..5).map(|o| (0..8).map(|c| shape.weights[c] * known.get(&(o, c)).copied().unwrap_or_else(|| rng.gen_range(0..10))).sum()).collect();
            let best = *u.iter().max().unwrap();
            let winners: Vec<usize> = (0..5).filter(|&o| u[o] == best).collect();
            for &o in &winners {
                wins[o] += 1.0 / winners.len() as f64;
            }
        }
        for (e, w) in exact.iter().zip(&wins) {
            assert!((e - w / draws as f64).abs() < 0.02, "{exact:?} vs {wins:?}");
        }
    }
}
