//! What a step of CoSIR games did (spec §5's metrics and the evaluation measures), as a
//! typed record shared by the coordinator, `comas plot` and the tests.
use super::reward::Replay;
use crate::mean::{Mean, Sum};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Read back leniently: a field a record lacks takes its default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CosirMetrics {
    pub episodes: u64,
    /// Share of games whose plurality choice is the best option.
    pub team_accuracy: Mean,
    /// Share of seats whose own FINAL is the best option.
    pub individual_accuracy: Mean,
    /// Team surprisal (nats) at the start of a game and after its last round.
    pub surprisal_start: Mean,
    pub surprisal_final: Mean,
    /// Mean change of the team surprisal over each round (negative: the team learned).
    pub surprisal_change_by_round: Vec<Mean>,
    pub valid_shares_per_episode: Mean,
    /// False SHAREs over all SHARE tags, and true ones the sender did not hold.
    pub false_claim_rate: Mean,
    pub unsupported_rate: Mean,
    pub requests_per_episode: Mean,
    pub wasted_request_rate: Mean,
    /// Requests answered by a valid SHARE of the cell within a round.
    pub request_fulfilment_rate: Mean,
    /// Private cells (held by some seats, not all) that were shared.
    pub disclosure_rate: Mean,
    /// Seats that received information and chose an option their final evidence makes most
    /// likely.
    pub use_rate: Mean,
    /// Messages with any format violation, and violations by kind.
    pub format_violation_rate: Mean,
    pub violations: BTreeMap<String, u64>,
    /// Mean reward of each term (unweighted) and of the turns by role.
    pub reward_terms: BTreeMap<String, Mean>,
    pub reward: BTreeMap<String, Mean>,
    /// Tables drawn per table accepted (the generator's hardness filters).
    pub table_acceptance_rate: Option<f64>,
    pub generated_tokens: u64,
}

fn rate(num: u32, den: u32) -> Option<f64> {
    (den > 0).then(|| f64::from(num) / f64::from(den))
}

impl CosirMetrics {
    /// `games`: each game's replay, its table's draw count and its generated tokens.
    pub fn of(games: &[(&Replay, u32, u64)]) -> Self {
        let mut m = CosirMetrics { episodes: games.len() as u64, ..Default::default() };
        let mut sums: BTreeMap<&str, Sum> = BTreeMap::new();
        let mut push = |k: &'static str, v: Option<f64>| {
            if let Some(v) = v {
                sums.entry(k).or_default().push(v);
            }
        };
        let mut terms: BTreeMap<String, Sum> = BTreeMap::new();
        let mut by_role: BTreeMap<String, Sum> = BTreeMap::new();
        let mut rounds: Vec<Sum> = Vec::new();
        let (mut tables, mut tries) = (0u64, 0u64);
        for (r, table_tries, tokens) in games {
            push("team", Some(f64::from(u8::from(r.team_correct))));
            let seats = r.rewards.iter().filter(|x| x.role == crate::turn::Role::Voter).count() as u32;
            push("individual", rate(r.correct_seats, seats));
            push("s_start", r.surprisal_by_round.first().copied());
            push("s_final", r.surprisal_by_round.last().copied());
            for (i, w) in r.surprisal_by_round.windows(2).enumerate() {
                if rounds.len() <= i {
                    rounds.push(Sum::default());
                }
                rounds[i].push(w[1] - w[0]);
            }
            push("shares", Some(f64::from(r.valid_shares)));
            push("false", rate(r.false_claims, r.share_tags));
            push("unsupported", rate(r.unsupported_shares, r.share_tags));
            push("requests", Some(f64::from(r.requests)));
            push("wasted", rate(r.wasted_requests, r.requests));
            push("fulfilled", rate(r.fulfilled_requests, r.requests - r.wasted_requests));
            push("disclosed", rate(r.disclosed_private_cells, r.private_cells));
            push("used", rate(r.used_received, r.finals_with_received));
            push("violating", rate(r.messages_with_violation, r.messages));
            for (k, v) in &r.violations {
                *m.violations.entry(k.clone()).or_default() += u64::from(*v);
            }
            for x in &r.rewards {
                by_role.entry(x.role.as_str().to_string()).or_default().push(x.reward);
                let t = &x.terms;
                let mut term = |k: &str, v: f64| terms.entry(k.to_string()).or_default().push(v);
                match x.role {
                    crate::turn::Role::Voter => {
                        term("use", t.use_);
                        term("outcome", t.outcome);
                    }
                    _ => {
                        term("share", t.share);
                        term("request", t.request);
                        term("false_claims", f64::from(t.false_claims));
                    }
                }
                term("format", t.format);
            }
            tables += 1;
            tries += u64::from(*table_tries);
            m.generated_tokens += tokens;
        }
        let mean = |k: &str| sums.get(k).map(Sum::mean).unwrap_or_default();
        m.team_accuracy = mean("team");
        m.individual_accuracy = mean("individual");
        m.surprisal_start = mean("s_start");
        m.surprisal_final = mean("s_final");
        m.surprisal_change_by_round = rounds.iter().map(Sum::mean).collect();
        m.valid_shares_per_episode = mean("shares");
        m.false_claim_rate = mean("false");
        m.unsupported_rate = mean("unsupported");
        m.requests_per_episode = mean("requests");
        m.wasted_request_rate = mean("wasted");
        m.request_fulfilment_rate = mean("fulfilled");
        m.disclosure_rate = mean("disclosed");
        m.use_rate = mean("used");
        m.format_violation_rate = mean("violating");
        m.reward_terms = terms.iter().map(|(k, s)| (k.clone(), s.mean())).collect();
        m.reward = by_role.iter().map(|(k, s)| (k.clone(), s.mean())).collect();
        m.table_acceptance_rate = (tries > 0).then(|| tables as f64 / tries as f64);
        m
    }
}
