//! The `partial_table` environment's tables (spec §3.1): seeded scores with a unique winner,
//! cells split among the seats, and the hardness filters that keep only tables no seat can
//! solve alone but the team can solve together.
use super::config::CosirConfig;
use super::evaluator::{Cell, Evidence, Shape};
use crate::seed::derive_seed;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Criterion names, in snake_case; a table takes C of them.
const CRITERIA: [&str; 16] = [
    "price",
    "quality",
    "safety",
    "speed",
    "comfort",
    "durability",
    "support",
    "design",
    "range",
    "warranty",
    "noise",
    "weight",
    "efficiency",
    "capacity",
    "reliability",
    "location",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub id: String,
    /// Option labels: A, B, …
    pub options: Vec<String>,
    pub criteria: Vec<String>,
    /// Public weight of each criterion (1–3).
    pub weights: Vec<u32>,
    /// The prior the scores were drawn from (the evaluator's).
    pub prior: Vec<f64>,
    /// Score of option o on criterion c: `scores[o][c]`.
    pub scores: Vec<Vec<u32>>,
    /// The option with the highest weighted total.
    pub answer: usize,
    /// The cells each seat sees at the start (E_j^0), sorted.
    pub views: Vec<Vec<Cell>>,
    /// The cells every seat sees.
    pub shared: Vec<Cell>,
    /// The seats in speaking order.
    pub order: Vec<u32>,
    /// Tables drawn to get this one: its generator's acceptance rate is 1 / tries.
    pub tries: u32,
}

/// Why a drawn table was thrown away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No unique winner by the margin.
    Margin,
    /// Some seat's own view already points to the winner (filter a).
    SolvableAlone,
    /// The pooled views do not single out the winner (filter b).
    UnsolvableTogether,
    /// The shared cells alone point to the winner (filter c).
    NoDecoy,
}

impl Table {
    pub fn shape(&self) -> Shape {
        Shape { options: self.options.len(), weights: self.weights.clone(), prior: self.prior.clone() }
    }

    /// The true values of `cells`.
    pub fn evidence<'a>(&self, cells: impl IntoIterator<Item = &'a Cell>) -> Evidence {
        cells.into_iter().map(|&(o, c)| ((o, c), self.scores[o][c])).collect()
    }

    pub fn utility(&self, o: usize) -> u32 {
        self.scores[o].iter().zip(&self.weights).map(|(s, w)| s * w).sum()
    }

    pub fn option_index(&self, label: &str) -> Option<usize> {
        self.options.iter().position(|x| x == label)
    }

    pub fn criterion_index(&self, name: &str) -> Option<usize> {
        self.criteria.iter().position(|x| x == name)
    }

    /// The table fits `cfg` and is self-consistent (a record's table, read back from a worker):
    /// its sizes, scores within 0..=K, cells within the table and the answer its best option.
    pub fn check_shape(&self, cfg: &CosirConfig) -> Result<(), String> {
        let (m, c, k) = (cfg.options as usize, cfg.criteria as usize, cfg.max_score);
        if self.options.len() != m || self.criteria.len() != c || self.weights.len() != c || self.prior.len() != k as usize + 1 {
            return Err(format!("the table is not {m} options x {c} criteria with scores 0..={k}"));
        }
        if self.scores.len() != m || self.scores.iter().any(|r| r.len() != c || r.iter().any(|&v| v > k)) {
            return Err("the table's scores do not fit its sizes".into());
        }
        let inside = |x: &Cell| x.0 < m && x.1 < c;
        if !self.views.iter().flatten().chain(&self.shared).all(inside) {
            return Err("a seat's view names a cell outside the table".into());
        }
        if self.answer >= m || (0..m).any(|o| o != self.answer && self.utility(o) >= self.utility(self.answer)) {
            return Err("the table's answer is not its one best option".into());
        }
        Ok(())
    }

    /// Draws tables from `seed` until one passes every check; `Err` after `max_tries`.
    pub fn generate(cfg: &CosirConfig, seed: u64, id: &str) -> Result<Table, String> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(derive_seed(&[seed, 0xC051]));
        let mut counts = [0u32; 4];
        for tries in 1..=cfg.max_tries {
            let t = draw(cfg, &mut rng, id, tries);
            match t.rejection(cfg) {
                None => return Ok(t),
                Some(r) => counts[r as usize] += 1,
            }
        }
        Err(format!(
            "no table passed the checks in {} draws (margin {}, solvable alone {}, unsolvable together {}, no decoy {}); relax cosir.tau, pooled_min, p_shared or require_decoy",
            cfg.max_tries, counts[0], counts[1], counts[2], counts[3]
        ))
    }

    /// The first check this table fails, if any (spec §3.1: margin, then filters a, b, c).
    pub fn rejection(&self, cfg: &CosirConfig) -> Option<Rejection> {
        let mut u: Vec<u32> = (0..self.options.len()).map(|o| self.utility(o)).collect();
        let best = u[self.answer];
        u.sort_unstable();
        if u.len() > 1 && best < u[u.len() - 2] + cfg.margin.max(1) {
            return Some(Rejection::Margin);
        }
        let shape = self.shape();
        let leads = |p: &[f64]| p[self.answer] >= p.iter().cloned().fold(0.0, f64::max);
        for view in &self.views {
            let p = shape.posterior(&self.evidence(view));
            if leads(&p) && p[self.answer] >= cfg.tau {
                return Some(Rejection::SolvableAlone);
            }
        }
        let pooled: Vec<Cell> = self.views.iter().flatten().copied().collect();
        if shape.posterior(&self.evidence(&pooled))[self.answer] < cfg.pooled_min {
            return Some(Rejection::UnsolvableTogether);
        }
        if cfg.require_decoy && leads(&shape.posterior(&self.evidence(&self.shared))) {
            return Some(Rejection::NoDecoy);
        }
        None
    }
}

/// One table from the generator, unchecked.
fn draw(cfg: &CosirConfig, rng: &mut impl Rng, id: &str, tries: u32) -> Table {
    let (m, c, n) = (cfg.options as usize, cfg.criteria as usize, cfg.agents as usize);
    let prior = cfg.prior_pmf();
    let mut names: Vec<String> = cfg.criteria_names.clone().unwrap_or_else(|| CRITERIA.iter().map(|s| s.to_string()).collect());
    names.shuffle(rng);
    let criteria: Vec<String> = names[..c].to_vec();
    let weights: Vec<u32> = (0..c).map(|_| rng.gen_range(1..=3)).collect();
    let score = |rng: &mut dyn rand::RngCore| {
        let x: f64 = rng.gen();
        let mut acc = 0.0;
        for (v, p) in prior.iter().enumerate() {
            acc += p;
            if x < acc {
                return v as u32;
            }
        }
        (prior.len() - 1) as u32
    };
    let scores: Vec<Vec<u32>> = (0..m).map(|_| (0..c).map(|_| score(rng)).collect()).collect();
    let utility = |o: usize| -> u32 { scores[o].iter().zip(&weights).map(|(s, w)| s * w).sum() };
    let answer = (0..m).max_by_key(|&o| (utility(o), std::cmp::Reverse(o))).unwrap_or(0);
    // Who sees what: per cell, or per criterion in column mode.
    let mut views: Vec<Vec<Cell>> = vec![Vec::new(); n];
    let mut shared = Vec::new();
    let units: Vec<Vec<Cell>> = if cfg.column_mode {
        (0..c).map(|cc| (0..m).map(|o| (o, cc)).collect()).collect()
    } else {
        (0..m).flat_map(|o| (0..c).map(move |cc| vec![(o, cc)])).collect()
    };
    for unit in units {
        let r: f64 = rng.gen();
        if r < cfg.p_shared {
            shared.extend(unit.iter().copied());
            views.iter_mut().for_each(|v| v.extend(unit.iter().copied()));
        } else if r < cfg.p_shared + cfg.p_hidden {
            continue;
        } else {
            let j = rng.gen_range(0..n);
            views[j].extend(unit.iter().copied());
            if rng.gen_bool(cfg.overlap_p) {
                let other = (j + rng.gen_range(1..n)) % n;
                views[other].extend(unit.iter().copied());
            }
        }
    }
    views.iter_mut().for_each(|v| v.sort_unstable());
    shared.sort_unstable();
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.shuffle(rng);
    Table {
        id: id.to_string(),
        options: (0..m).map(|o| ((b'A' + o as u8) as char).to_string()).collect(),
        criteria,
        weights,
        prior,
        scores,
        answer,
        views,
        shared,
        order,
        tries,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The table of spec §4.5: c1 shared, c2 held by agent_1 (seat 0), c3 by agent_2 (seat 1).
    pub(crate) fn fixture() -> Table {
        Table {
            id: "fixture".into(),
            options: vec!["A".into(), "B".into(), "C".into()],
            criteria: vec!["c1".into(), "c2".into(), "c3".into()],
            weights: vec![2, 1, 1],
            prior: vec![0.25; 4],
            scores: vec![vec![1, 3, 3], vec![3, 0, 1], vec![2, 1, 2]],
            answer: 0,
            views: vec![vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)], vec![(0, 0), (0, 2), (1, 0), (1, 2), (2, 0), (2, 2)]],
            shared: vec![(0, 0), (1, 0), (2, 0)],
            order: vec![0, 1],
            tries: 1,
        }
    }

    #[test]
    fn the_spec_fixture_passes_every_filter() {
        let cfg = CosirConfig { options: 3, criteria: 3, agents: 2, max_score: 3, column_mode: true, ..Default::default() };
        assert_eq!(fixture().rejection(&cfg), None);
        fixture().check_shape(&cfg).unwrap();
        let mut wrong = fixture();
        wrong.answer = 1;
        assert_eq!(wrong.check_shape(&cfg).unwrap_err(), "the table's answer is not its one best option");
        wrong = fixture();
        wrong.scores[0][0] = 4;
        assert!(wrong.check_shape(&cfg).is_err());
        // A margin of 2 rejects it (8 against 7).
        assert_eq!(fixture().rejection(&CosirConfig { margin: 2, ..cfg.clone() }), Some(Rejection::Margin));
        // Seat 0 knowing c3 as well would know the answer.
        let mut easy = fixture();
        easy.views[0] = (0..3).flat_map(|o| (0..3).map(move |c| (o, c))).collect();
        assert_eq!(easy.rejection(&cfg), Some(Rejection::SolvableAlone));
    }

    #[test]
    fn generated_tables_are_seeded_and_pass_the_filters() {
        let cfg = CosirConfig::default();
        let a = Table::generate(&cfg, 7, "t7").unwrap();
        assert_eq!(a, Table::generate(&cfg, 7, "t7").unwrap(), "same seed, same table");
        assert_ne!(a.scores, Table::generate(&cfg, 8, "t8").unwrap().scores);
        for seed in 0..20 {
            let t = Table::generate(&cfg, seed, "t").unwrap();
            assert_eq!(t.rejection(&cfg), None);
            assert_eq!((t.options.len(), t.criteria.len(), t.views.len()), (3, 4, 3));
            // Every cell is seen by someone (p_hidden 0); the shared ones by everyone.
            for o in 0..3 {
                for c in 0..4 {
                    let seen = t.views.iter().filter(|v| v.contains(&(o, c))).count();
                    assert!(seen == 1 || (seen == 3 && t.shared.contains(&(o, c))), "cell ({o},{c}) seen by {seen}");
                }
            }
            let mut order = t.order.clone();
            order.sort_unstable();
            assert_eq!(order, vec![0, 1, 2]);
            assert!(t.tries >= 1);
        }
        let impossible = CosirConfig { margin: 1000, max_tries: 50, ..cfg };
        assert!(Table::generate(&impossible, 1, "t").unwrap_err().contains("no table passed the checks in 50 draws"));
    }
}
