//! Rewards of a finished game (spec §3.5 and §4.3–4.4): the evidence of every seat is replayed
//! turn by turn (valid SHAREs delivered to the others at once), and each turn's reward is the
//! weighted sum of its terms. Pure: the coordinator runs it on the worker's record.
use super::config::{CosirConfig, OutcomeReward, RequestReward, UseReward};
use super::episode::CosirTrajectory;
use super::evaluator::{Cell, PROB_FLOOR};
use super::tags::Violation;
use crate::turn::Role;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The terms of one turn's reward, before weighting (spec §4.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Terms {
    /// Team surprisal drop of the message's valid SHAREs (floored).
    pub share: f64,
    /// Sum over the message's REQUESTs.
    pub request: f64,
    #[serde(rename = "use")]
    pub use_: f64,
    pub outcome: f64,
    /// 1 when the message commits any format violation.
    pub format: f64,
    pub false_claims: u32,
    pub wasted_requests: u32,
    pub share_tags: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnReward {
    pub turn_index: u32,
    pub seat: u32,
    pub agent: u32,
    pub role: Role,
    pub reward: f64,
    pub terms: Terms,
    /// The cells this message's valid SHAREs delivered to every other seat (§3.5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivered: Vec<Cell>,
    /// True SHAREs of cells the sender did not hold (no credit, no penalty).
    #[serde(default)]
    pub unsupported: u32,
}

/// Everything the replay found in one game.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Replay {
    /// One per turn, in the record's order.
    pub rewards: Vec<TurnReward>,
    /// The plurality of the seats' FINAL choices; `None` on a tie or without votes.
    pub team_choice: Option<usize>,
    pub team_correct: bool,
    /// Seats whose own FINAL is the best option.
    pub correct_seats: u32,
    /// Team surprisal at the start and after each round.
    pub surprisal_by_round: Vec<f64>,
    pub valid_shares: u32,
    pub false_claims: u32,
    pub unsupported_shares: u32,
    pub share_tags: u32,
    pub requests: u32,
    pub wasted_requests: u32,
    /// Requests whose cell reached the requester by a valid SHARE within the next round.
    pub fulfilled_requests: u32,
    /// Cells some seat held at the start and not every seat, and how many of them were shared.
    pub private_cells: u32,
    pub disclosed_private_cells: u32,
    /// Final turns of seats that received at least one cell, and how many of those chose an
    /// option their final evidence makes most likely.
    pub finals_with_received: u32,
    pub used_received: u32,
    pub messages: u32,
    pub messages_with_violation: u32,
    pub violations: BTreeMap<String, u32>,
}

/// Σ_j −ln max(P(o* | E_j), 1e-6).
fn team_surprisal(t: &CosirTrajectory, evidence: &[BTreeSet<Cell>]) -> f64 {
    let shape = t.table.shape();
    evidence.iter().map(|e| shape.surprisal(t.table.answer, &t.table.evidence(e))).sum()
}

/// Replays the game's evidence and computes every turn's reward.
pub fn replay(cfg: &CosirConfig, t: &CosirTrajectory) -> Replay {
    let table = &t.table;
    let shape = table.shape();
    let n = table.views.len();
    let mut evidence: Vec<BTreeSet<Cell>> = table.views.iter().map(|v| v.iter().copied().collect()).collect();
    let initial = evidence.clone();
    let mut out = Replay { surprisal_by_round: vec![team_surprisal(t, &evidence)], ..Default::default() };
    let mut terms: Vec<Terms> = vec![Terms::default(); t.turns.len()];
    let mut delivered: Vec<Vec<Cell>> = vec![Vec::new(); t.turns.len()];
    let mut unsupported = vec![0u32; t.turns.len()];
    // Requests still open: (turn position, requester, cell, requester's surprisal then).
    let mut open: Vec<(usize, usize, Cell, f64)> = Vec::new();
    let mut disclosed: BTreeSet<Cell> = BTreeSet::new();
    let discussion: Vec<usize> = (0..t.turns.len()).filter(|&i| t.turns[i].role == Role::Discussant).collect();
    for (d, &i) in discussion.iter().enumerate() {
        let turn = &t.turns[i];
        let seat = turn.seat as usize;
        let before = team_surprisal(t, &evidence);
        let mut valid: Vec<Cell> = Vec::new();
        for s in &turn.tags.shares {
            out.share_tags += 1;
            if s.value != table.scores[s.cell.0][s.cell.1] {
                terms[i].false_claims += 1;
            } else if evidence[seat].contains(&s.cell) {
                valid.push(s.cell);
            } else {
                unsupported[i] += 1;
            }
        }
        terms[i].share_tags = turn.tags.shares.len() as u32;
        for ask in &turn.tags.requests {
            out.requests += 1;
            let lacks = !evidence[seat].contains(&ask.cell);
            let held = (0..n).any(|j| j != seat && evidence[j].contains(&ask.cell));
            if lacks && held {
                if cfg.request_reward == RequestReward::InformationGain {
                    terms[i].request += shape.information_gain(&table.evidence(&evidence[seat]), ask.cell);
                }
                let sigma = shape.surprisal(table.answer, &table.evidence(&evidence[seat]));
                open.push((d, seat, ask.cell, sigma));
            } else {
                terms[i].wasted_requests += 1;
            }
        }
        for (j, e) in evidence.iter_mut().enumerate() {
            if j != seat {
                e.extend(valid.iter().copied());
            }
        }
        out.valid_shares += valid.len() as u32;
        out.unsupported_shares += unsupported[i];
        delivered[i] = valid.clone();
        disclosed.extend(valid.iter().copied());
        let after = team_surprisal(t, &evidence);
        terms[i].share = match cfg.share_reward_floor {
            Some(floor) => (before - after).max(floor),
            None => before - after,
        };
        // Open requests this message answers, within a full round of their asking.
        let mut still = Vec::new();
        for (asked_at, requester, cell, sigma) in open.drain(..) {
            if asked_at < d && requester != seat && valid.contains(&cell) && d <= asked_at + n {
                out.fulfilled_requests += 1;
                if cfg.request_reward == RequestReward::Realized {
                    let now = shape.surprisal(table.answer, &table.evidence(&evidence[requester]));
                    terms[discussion[asked_at]].request += sigma - now;
                }
            } else if d < asked_at + n {
                still.push((asked_at, requester, cell, sigma));
            }
        }
        open = still;
        if (d + 1) % n == 0 {
            out.surprisal_by_round.push(after);
        }
    }
    // Final turns: the seats' choices against their final evidence and the answer.
    let finals: Vec<usize> = (0..t.turns.len()).filter(|&i| t.turns[i].role == Role::Voter).collect();
    let mut votes = vec![0u32; table.options.len()];
    for &i in &finals {
        if let Some(o) = t.turns[i].tags.final_choice {
            votes[o] += 1;
        }
    }
    let top = votes.iter().copied().max().unwrap_or(0);
    out.team_choice = if top > 0 && votes.iter().filter(|&&v| v == top).count() == 1 { votes.iter().position(|&v| v == top) } else { None };
    out.team_correct = out.team_choice == Some(table.answer);
    let outcome_of = |choice: Option<usize>| {
        let team = f64::from(u8::from(out.team_correct));
        let own = f64::from(u8::from(choice == Some(table.answer)));
        match cfg.outcome {
            OutcomeReward::Team => team,
            OutcomeReward::Individual => own,
            OutcomeReward::Both => (team + own) / 2.0,
        }
    };
    let mut seat_outcome = vec![0.0; n];
    for &i in &finals {
        let turn = &t.turns[i];
        let seat = turn.seat as usize;
        let choice = turn.tags.final_choice;
        let p = shape.posterior(&table.evidence(&evidence[seat]));
        let best = p.iter().cloned().fold(0.0, f64::max);
        let in_argmax = choice.is_some_and(|o| p[o] >= best - 1e-12);
        terms[i].use_ = match cfg.use_reward {
            UseReward::Argmax => f64::from(u8::from(in_argmax)),
            UseReward::LogPosterior => choice.map_or(PROB_FLOOR, |o| p[o].max(PROB_FLOOR)).ln(),
        };
        terms[i].outcome = outcome_of(choice);
        seat_outcome[seat] = terms[i].outcome;
        out.correct_seats += u32::from(choice == Some(table.answer));
        if evidence[seat].len() > initial[seat].len() {
            out.finals_with_received += 1;
            out.used_received += u32::from(in_argmax);
        }
    }
    let private: BTreeSet<Cell> = initial.iter().flatten().copied().filter(|c| !initial.iter().all(|e| e.contains(c))).collect();
    out.private_cells = private.len() as u32;
    out.disclosed_private_cells = private.intersection(&disclosed).count() as u32;
    for (i, turn) in t.turns.iter().enumerate() {
        let v = &turn.tags.violations;
        out.messages += 1;
        if !v.is_empty() {
            out.messages_with_violation += 1;
            terms[i].format = 1.0;
        }
        for kind in v {
            *out.violations.entry(Violation::as_str(*kind).to_string()).or_default() += 1;
        }
        out.false_claims += terms[i].false_claims;
        out.wasted_requests += terms[i].wasted_requests;
        let x = &terms[i];
        let reward = match turn.role {
            Role::Voter => cfg.w_use * x.use_ + cfg.w_out * x.outcome - cfg.w_fmt * x.format,
            _ => {
                let outcome = if cfg.outcome_to_all_turns { cfg.w_out * seat_outcome[turn.seat as usize] } else { 0.0 };
                cfg.w_share * x.share - cfg.share_tag_cost * f64::from(x.share_tags) + cfg.w_req * x.request
                    - cfg.w_waste * f64::from(x.wasted_requests)
                    - cfg.w_fmt * x.format
                    - cfg.w_false * f64::from(x.false_claims)
                    + outcome
            }
        };
        out.rewards.push(TurnReward {
            turn_index: turn.turn_index,
            seat: turn.seat,
            agent: turn.agent,
            role: turn.role,
            reward,
            terms: terms[i].clone(),
            delivered: std::mem::take(&mut delivered[i]),
            unsupported: unsupported[i],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosir::config::SeatPolicy;
    use crate::cosir::episode::tests::reply;
    use crate::cosir::episode::Episode;
    use crate::cosir::table::tests::fixture;

    fn play(cfg: &CosirConfig, texts: &[&str]) -> CosirTrajectory {
        let mut e = Episode::new(cfg, &fixture(), 0, 1).unwrap();
        let mut k = 0;
        while !e.is_done() {
            let n = e.pending().len();
            let replies = (k..k + n).map(|i| reply(i as u32, texts[i])).collect();
            e.submit(replies).unwrap();
            k += n;
        }
        e.into_trajectory().unwrap()
    }

    fn cfg() -> CosirConfig {
        CosirConfig { options: 3, criteria: 3, agents: 2, max_score: 3, rounds: 1, seat_policy: SeatPolicy::PerSeat, ..Default::default() }
    }

    /// The §4.5 fixture played out: agent_1 shares A.c2 and asks for A.c3, agent_2 shares A.c3
    /// and lies about B.c1, then they split their votes.
    #[test]
    fn the_fixture_game_worked_by_hand() {
        let t = play(&cfg(), &["SHARE(A, c2, 3)\nREQUEST(A, c3)", "SHARE(A, c3, 3)\nSHARE(B, c1, 2)\nREQUEST(A, c1)", "FINAL(A)", "FINAL(B)"]);
        let r = replay(&cfg(), &t);
        let round = |x: f64| (x * 1e6).round() / 1e6;
        let shape = t.table.shape();
        // Turn 0: the spec's 1.189584, plus half the information gain of A.c3 for agent_1.
        let ig = shape.information_gain(&t.table.evidence(&t.table.views[0]), (0, 2));
        assert!(ig > 0.0);
        assert_eq!(round(r.rewards[0].terms.share), 1.189584);
        assert_eq!(r.rewards[0].terms.request, ig);
        assert_eq!(r.rewards[0].reward, r.rewards[0].terms.share + 0.5 * ig);
        // Turn 1: A.c3 completes agent_1's view of A (σ drops to −ln P(A | c1, c2, A.c3));
        // B.c1 = 2 is false (it is 3); asking for A.c1, which it holds, is wasted.
        let full_a: crate::cosir::evaluator::Evidence = t.table.evidence(&[(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (0, 2)]);
        let agent_2_now = t.table.evidence(&[(0, 0), (0, 2), (1, 0), (1, 2), (2, 0), (2, 2), (0, 1)]);
        let want_share = (shape.surprisal(0, &t.table.evidence(&t.table.views[0])) + shape.surprisal(0, &agent_2_now))
            - (shape.surprisal(0, &full_a) + shape.surprisal(0, &agent_2_now));
        assert!((r.rewards[1].terms.share - want_share).abs() < 1e-12);
        assert_eq!((r.rewards[1].terms.false_claims, r.rewards[1].terms.wasted_requests, r.rewards[1].terms.request), (1, 1, 0.0));
        assert_eq!(r.rewards[1].reward, want_share - 0.5);
        // A split vote is no team answer: no outcome reward. agent_2's B is the argmax of
        // (23/96, 53/96, 5/24); agent_1's A is the argmax of its evidence only if A leads.
        assert_eq!((r.team_choice, r.team_correct, r.correct_seats), (None, false, 1));
        let p0 = shape.posterior(&full_a);
        let a_leads = p0[0] >= p0[1].max(p0[2]);
        assert_eq!(r.rewards[2].reward, f64::from(u8::from(a_leads)));
        assert_eq!(r.rewards[3].reward, 1.0);
        assert_eq!((r.valid_shares, r.false_claims, r.unsupported_shares, r.share_tags), (2, 1, 0, 3));
        assert_eq!((r.rewards[0].delivered.clone(), r.rewards[1].delivered.clone()), (vec![(0, 1)], vec![(0, 2)]));
        assert_eq!((r.requests, r.wasted_requests, r.fulfilled_requests), (2, 1, 1));
        // Private cells: c2 of agent_1 and c3 of agent_2 (6), of which A.c2 and A.c3 were shared.
        assert_eq!((r.private_cells, r.disclosed_private_cells), (6, 2));
        assert_eq!((r.finals_with_received, r.used_received), (2, 1 + u32::from(a_leads)));
        assert_eq!((r.messages, r.messages_with_violation), (4, 0));
        assert_eq!(r.surprisal_by_round.len(), 2);
        assert_eq!(round(r.surprisal_by_round[0]), 4.174631);
    }

    #[test]
    fn options_change_the_terms_they_name() {
        let texts = ["REQUEST(A, c3)", "SHARE(A, c3, 3)", "FINAL(A)", "FINAL(A)"];
        let base = replay(&cfg(), &play(&cfg(), &texts));
        // Both vote A, the answer: the team outcome reaches both final turns.
        assert_eq!((base.team_choice, base.rewards[2].terms.outcome, base.rewards[3].terms.outcome), (Some(0), 1.0, 1.0));
        // Realized: the request earns agent_1's surprisal drop once A.c3 arrives.
        let realized = CosirConfig { request_reward: RequestReward::Realized, ..cfg() };
        let t = play(&realized, &texts);
        let r = replay(&realized, &t);
        let shape = t.table.shape();
        let before = shape.surprisal(0, &t.table.evidence(&t.table.views[0]));
        let mut after_cells = t.table.views[0].clone();
        after_cells.push((0, 2));
        let after = shape.surprisal(0, &t.table.evidence(&after_cells));
        assert!((r.rewards[0].terms.request - (before - after)).abs() < 1e-12 && before > after);
        // The outcome on every turn, and a log-posterior use term.
        let all = CosirConfig { outcome_to_all_turns: true, use_reward: UseReward::LogPosterior, ..cfg() };
        let r = replay(&all, &play(&all, &texts));
        assert_eq!(r.rewards[1].reward, r.rewards[1].terms.share + 1.0);
        assert!(r.rewards[2].terms.use_ <= 0.0);
        // A true score the sender does not hold is unsupported: not delivered, not credited.
        let r = replay(&cfg(), &play(&cfg(), &["ok", "SHARE(A, c2, 3)", "FINAL(A)", "FINAL(A)"]));
        assert_eq!((r.unsupported_shares, r.rewards[1].unsupported, r.valid_shares, r.rewards[1].terms.share), (1, 1, 0, 0.0));
        assert!(r.rewards[1].delivered.is_empty());
        // Without the floor a share that raises the team's surprisal costs; with it, it earns 0.
        let floorless = CosirConfig { share_reward_floor: None, ..cfg() };
        let mut raws = Vec::new();
        for (first, second) in [("SHARE(C, c2, 1)", "ok"), ("ok", "SHARE(C, c3, 2)"), ("ok", "SHARE(B, c3, 1)")] {
            let at = usize::from(first == "ok");
            let raw = replay(&floorless, &play(&floorless, &[first, second, "FINAL(A)", "FINAL(A)"])).rewards[at].terms.share;
            let floored = replay(&cfg(), &play(&cfg(), &[first, second, "FINAL(A)", "FINAL(A)"])).rewards[at].terms.share;
            assert_eq!(floored, raw.max(0.0));
            raws.push(raw);
        }
        assert!(raws.iter().any(|&r| r < 0.0) && raws.iter().any(|&r| r > 0.0), "{raws:?}");
    }
}
