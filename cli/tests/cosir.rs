//! CoSIR end to end: the information game rewarded turn by turn as the spec says.
mod harness;

use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use harness::*;
use serde_json::Value;
use std::path::Path;

/// CoSIR's e2e job: two seats, each its own tiny agent; guided tails end every message with a
/// tag line (shares true and false, requests, a malformed line, names that do not exist) and
/// every final turn with a FINAL (sometimes two, sometimes none).
fn write_cosir_job(dir: &Path, learner_ports: &[u16]) {
    for (name, seed) in [("model-0", 3), ("model-1", 4)] {
        write_model(&dir.join(name), &TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) })
            .unwrap();
    }
    let agent = |k: usize| {
        format!("[[agents]]\nmodel = \"model-{k}\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-4\ntrain_batch_size = 6\nmicro_batch_size = 6\nmask_truncated = false\n", learner_ports[k])
    };
    let job = format!(
        "name = \"cosir-e2e\"\nseed = 5\nmethod = \"cosir\"\n[schedule]\nquestions_per_step = 2\nsteps = {COSIR_STEPS}\nlearner_timeout_secs = 120\n[output]\ndir = \"out\"\nsave_episodes = true\n\
         [cosir]\noptions = 3\ncriteria = 3\ncriteria_names = [\"cost\", \"speed\", \"safety\"]\nagents = 2\nmax_score = 2\nrounds = 2\nseat_policy = \"per_seat\"\ninstances_per_question = 2\n\
         [cosir.sampling]\ntemperature = 1.0\nmax_new_tokens = 96\nmin_new_tokens = 0\n\
         guided_suffix = '''\\n(SHARE\\((A|B|C), (cost|speed|safety), [0-2]\\)|SHARE\\(A, cost, 7\\)|REQUEST\\((A|B|C), (cost|speed|safety)\\)|REQUEST\\(agent_9, A, cost\\)|FINAL: A)'''\n\
         [cosir.final_sampling]\ntemperature = 1.0\nmax_new_tokens = 24\nmin_new_tokens = 0\nguided_suffix = '''\\n(FINAL\\((A|B|C)\\)|FINAL\\(A\\)\\nFINAL\\(B\\)|I choose A)'''\n{}{}",
        agent(0),
        agent(1)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

const COSIR_STEPS: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cosir_game_is_rewarded_as_the_spec_says_turn_by_turn() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_cosir_job(tmp.path(), &ports);
    let c = Cluster::launch(tmp.path(), ports, 1, &[], COSIR_STEPS, &["--max-episodes", "4"]);
    let id = c.submit().await;
    c.finished(&id).await;
    let log = c.metrics_log();
    assert_eq!(log.len() as u64, COSIR_STEPS);
    let (mut valid, mut lies, mut violations, mut tag_count) = (0u32, 0u32, 0u64, 0u64);
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        // 2 tables x 2 games, each 2 rounds x 2 seats + 2 finals.
        assert_eq!((m["method"].as_str(), m["episodes"].as_u64()), (Some("cosir"), Some(4)), "{m}");
        let text =
            std::fs::read_to_string(tmp.path().join(format!("out/episodes/step-{step:05}.jsonl")))
                .unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["record"].clone())
            .collect();
        assert_eq!(records.len(), 4);
        let mut by_seat: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let (mut step_valid, mut team_right, mut requests) = (0u32, 0u32, 0u32);
        let mut lie_rates = Vec::new();
        for r in &records {
            let turns = r["turns"].as_array().unwrap();
            assert_eq!(turns.len(), 6);
            let seat_of: std::collections::BTreeMap<u64, usize> = turns
                .iter()
                .map(|t| (t["turn_index"].as_u64().unwrap(), t["seat"].as_u64().unwrap() as usize))
                .collect();
            let g = cosir_reference::game(r);
            for (turn, reward) in g.rewards {
                by_seat[seat_of[&turn]].push(reward);
            }
            step_valid += g.valid_shares;
            lies += g.false_claims;
            requests += g.requests;
            if g.share_tags > 0 {
                lie_rates.push(f64::from(g.false_claims) / f64::from(g.share_tags));
            }
            team_right += u32::from(g.team_right);
            for t in turns {
                // Every message ends with its guided tag line; the tags are what the text says.
                let tags = &t["tags"];
                let lines = |p: &str| {
                    t["message"].as_str().unwrap().lines().filter(|l| l.starts_with(p)).count()
                };
                let counted = tags["shares"].as_array().unwrap().len()
                    + tags["requests"].as_array().unwrap().len()
                    + usize::from(tags["final_choice"].is_u64());
                assert!(counted <= lines("SHARE(") + lines("REQUEST(") + lines("FINAL("), "{t}");
                violations += tags["violations"].as_array().unwrap().len() as u64;
                tag_count += tags_of(t);
            }
        }
        valid += step_valid;
        assert_eq!(
            m["valid_shares_per_episode"]["mean"].as_f64(),
            Some(f64::from(step_valid) / 4.0),
            "{m}"
        );
        assert_eq!(m["team_accuracy"]["mean"].as_f64(), Some(f64::from(team_right) / 4.0), "{m}");
        assert_eq!(
            m["requests_per_episode"]["mean"].as_f64(),
            Some(f64::from(requests) / 4.0),
            "{m}"
        );
        let lie_rate =
            (!lie_rates.is_empty()).then(|| lie_rates.iter().sum::<f64>() / lie_rates.len() as f64);
        assert_eq!(
            (m["false_claim_rate"]["mean"].as_f64(), m["false_claim_rate"]["count"].as_u64()),
            (lie_rate, Some(lie_rates.len() as u64)),
            "{m}"
        );
        for k in 0..2 {
            let a = &m["agents"][k];
            // Each seat's agent trains on exactly its 3 turns of each of the 4 games.
            assert_eq!(
                (a["samples"].as_u64(), a["train"]["samples"].as_u64()),
                (Some(12), Some(12)),
                "step {step} agent {k}"
            );
            let want = by_seat[k].iter().sum::<f64>() / by_seat[k].len() as f64;
            let got = a["reward_mean"].as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-9,
                "step {step} agent {k}: reward mean {got}, the reference says {want}"
            );
        }
    }
    eprintln!(
        "tags {tag_count}, valid shares {valid}, false claims {lies}, violations {violations}"
    );
    assert!(
        tag_count > 0 && violations > 0 && lies > 0 && valid > 0,
        "the guided tails produced true and false shares, and violations"
    );
}

/// Tags a turn's record holds.
fn tags_of(t: &Value) -> u64 {
    let tags = &t["tags"];
    (tags["shares"].as_array().unwrap().len()
        + tags["requests"].as_array().unwrap().len()
        + usize::from(tags["final_choice"].is_u64())) as u64
}

/// The spec's rewards, written again from spec cosir.md §3.5 and §4 for this test: posteriors by
/// enumerating every completion of the unknown cells (not by convolution), default weights.
mod cosir_reference {
    use serde_json::Value;
    use std::collections::{BTreeMap, BTreeSet};

    type Cell = (usize, usize);

    pub struct Table {
        weights: Vec<u32>,
        prior: Vec<f64>,
        scores: Vec<Vec<u32>>,
        pub answer: usize,
        pub views: Vec<BTreeSet<Cell>>,
    }

    fn cell(v: &Value) -> Cell {
        (v[0].as_u64().unwrap() as usize, v[1].as_u64().unwrap() as usize)
    }

    impl Table {
        pub fn from_json(t: &Value) -> Self {
            let nums = |v: &Value| {
                v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>()
            };
            Table {
                weights: nums(&t["weights"]),
                prior: t["prior"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect(),
                scores: t["scores"].as_array().unwrap().iter().map(nums).collect(),
                answer: t["answer"].as_u64().unwrap() as usize,
                views: t["views"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_array().unwrap().iter().map(cell).collect())
                    .collect(),
            }
        }

        fn posterior(&self, known: &BTreeSet<Cell>) -> Vec<f64> {
            let (m, c) = (self.scores.len(), self.weights.len());
            let unknown: Vec<Cell> = (0..m)
                .flat_map(|o| (0..c).map(move |x| (o, x)))
                .filter(|x| !known.contains(x))
                .collect();
            let k = self.prior.len();
            let mut p = vec![0.0; m];
            let mut values = vec![0usize; unknown.len()];
            loop {
                let mut s = self.scores.clone();
                let mut w = 1.0;
                for (x, &v) in unknown.iter().zip(&values) {
                    s[x.0][x.1] = v as u32;
                    w *= self.prior[v];
                }
                let u: Vec<u32> = s
                    .iter()
                    .map(|row| row.iter().zip(&self.weights).map(|(a, b)| a * b).sum())
                    .collect();
                let best = *u.iter().max().unwrap();
                let n = u.iter().filter(|&&x| x == best).count() as f64;
                for o in 0..m {
                    if u[o] == best {
                        p[o] += w / n;
                    }
                }
                // Next completion, like an odometer.
                let mut i = 0;
                while i < values.len() && values[i] + 1 == k {
                    values[i] = 0;
                    i += 1;
                }
                if i == values.len() {
                    return p;
                }
                values[i] += 1;
            }
        }

        fn sigma(&self, known: &BTreeSet<Cell>) -> f64 {
            -self.posterior(known)[self.answer].max(1e-6).ln()
        }

        fn entropy(&self, known: &BTreeSet<Cell>) -> f64 {
            -self.posterior(known).iter().filter(|&&x| x > 0.0).map(|x| x * x.ln()).sum::<f64>()
        }

        /// H(E) − Σ_v p(v) H(E ∪ {x = v}): with the cell's true value fixed in `scores`, so it is
        /// tried at every value by a copy.
        fn gain(&self, known: &BTreeSet<Cell>, x: Cell) -> f64 {
            let mut with = known.clone();
            with.insert(x);
            let after: f64 = (0..self.prior.len())
                .map(|v| {
                    let mut t = Table {
                        weights: self.weights.clone(),
                        prior: self.prior.clone(),
                        scores: self.scores.clone(),
                        answer: self.answer,
                        views: Vec::new(),
                    };
                    t.scores[x.0][x.1] = v as u32;
                    self.prior[v] * t.entropy(&with)
                })
                .sum();
            self.entropy(known) - after
        }
    }

    /// One game as the reference sees it.
    pub struct Game {
        /// (turn index, reward) of every turn.
        pub rewards: Vec<(u64, f64)>,
        pub valid_shares: u32,
        pub false_claims: u32,
        pub share_tags: u32,
        pub requests: u32,
        pub team_right: bool,
    }

    /// Each turn's reward from the record's turns (their tags as recorded).
    pub fn game(record: &Value) -> Game {
        let t = Table::from_json(&record["table"]);
        let turns = record["turns"].as_array().unwrap();
        let n = t.views.len();
        let mut e: Vec<BTreeSet<Cell>> = t.views.clone();
        let team = |e: &Vec<BTreeSet<Cell>>| e.iter().map(|x| t.sigma(x)).sum::<f64>();
        let mut out = Vec::new();
        let (mut valid_shares, mut false_claims, mut share_tags, mut requests) = (0, 0, 0, 0);
        for turn in turns.iter().filter(|x| x["role"] == "discussant") {
            let seat = turn["seat"].as_u64().unwrap() as usize;
            let before = team(&e);
            let (mut valid, mut lies) = (Vec::new(), 0.0);
            for s in turn["tags"]["shares"].as_array().unwrap() {
                let x = cell(&s["cell"]);
                if s["value"].as_u64().unwrap() as u32 != t.scores[x.0][x.1] {
                    lies += 1.0;
                } else if e[seat].contains(&x) {
                    valid.push(x);
                }
            }
            let mut req = 0.0;
            for r in turn["tags"]["requests"].as_array().unwrap() {
                let x = cell(&r["cell"]);
                if !e[seat].contains(&x) && (0..n).any(|j| j != seat && e[j].contains(&x)) {
                    req += t.gain(&e[seat], x);
                }
            }
            for (j, ej) in e.iter_mut().enumerate() {
                if j != seat {
                    ej.extend(valid.iter().copied());
                }
            }
            valid_shares += valid.len() as u32;
            false_claims += lies as u32;
            share_tags += turn["tags"]["shares"].as_array().unwrap().len() as u32;
            requests += turn["tags"]["requests"].as_array().unwrap().len() as u32;
            let share = (before - team(&e)).max(0.0);
            let fmt =
                if turn["tags"]["violations"].as_array().unwrap().is_empty() { 0.0 } else { 1.0 };
            out.push((
                turn["turn_index"].as_u64().unwrap(),
                share + 0.5 * req - 0.5 * fmt - 0.5 * lies,
            ));
        }
        let finals: Vec<&Value> = turns.iter().filter(|x| x["role"] == "voter").collect();
        let mut votes: BTreeMap<u64, u32> = BTreeMap::new();
        for f in &finals {
            if let Some(o) = f["tags"]["final_choice"].as_u64() {
                *votes.entry(o).or_default() += 1;
            }
        }
        let top = votes.values().copied().max().unwrap_or(0);
        let leaders: Vec<u64> = votes.iter().filter(|(_, &v)| v == top).map(|(&o, _)| o).collect();
        let team_right = top > 0 && leaders == [t.answer as u64];
        for f in finals {
            let seat = f["seat"].as_u64().unwrap() as usize;
            let p = t.posterior(&e[seat]);
            let best = p.iter().cloned().fold(0.0, f64::max);
            let used =
                f["tags"]["final_choice"].as_u64().is_some_and(|o| p[o as usize] >= best - 1e-12);
            let fmt =
                if f["tags"]["violations"].as_array().unwrap().is_empty() { 0.0 } else { 1.0 };
            out.push((
                f["turn_index"].as_u64().unwrap(),
                f64::from(u8::from(used)) + f64::from(u8::from(team_right)) - 0.5 * fmt,
            ));
        }
        Game { rewards: out, valid_shares, false_claims, share_tags, requests, team_right }
    }
}
