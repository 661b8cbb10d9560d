//! One `partial_table` game as a state machine (spec §3.2): T rounds of public messages, one
//! seat at a time in the table's seat order, each seeing the transcript so far; then every
//! seat's private final turn, all at once. The record keeps each turn with its tags.
use crate::method::RecordFault;
use super::config::CosirConfig;
use super::prompts::{discussion_prompt, final_prompt};
use super::table::Table;
use super::tags::{parse, Tags};
use crate::error::WorkflowError;
use crate::program::{take_replies, Reply, Request};
use crate::seed::{derive_seed, tag};
use crate::turn::{ChatMessage, FinishReason, Role, Sampled, TurnOutput, TurnRequest};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CosirTurn {
    pub turn_index: u32,
    pub seat: u32,
    pub agent: u32,
    /// `Discussant` for a public message, `Voter` for the private final turn.
    pub role: Role,
    /// 0-based discussion round; `rounds` for the final turn.
    pub round: u32,
    #[serde(flatten)]
    pub sampled: Sampled,
    pub text: String,
    /// The text without a reasoning block: what the teammates read.
    pub message: String,
    pub tags: Tags,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CosirTrajectory {
    pub table: Table,
    pub instance: u32,
    /// Discussion turns in speaking order, then the final turns in seat order.
    pub turns: Vec<CosirTurn>,
}

impl CosirTrajectory {
    pub fn policy_turns(&self) -> Vec<crate::program::PolicyTurn> {
        self.turns
            .iter()
            .map(|t| crate::program::PolicyTurn { turn_index: t.turn_index, agent: t.agent, role: t.role, policy_version: t.sampled.policy_version })
            .collect()
    }

    pub fn completion_tokens(&self) -> u64 {
        self.turns.iter().map(|t| t.sampled.completion_ids.len() as u64).sum()
    }

    /// Checks what a worker could get wrong: the turn plan, the seats' agents, log-prob counts,
    /// and tags that are not what the text says.
    pub fn validate(&self, cfg: &CosirConfig) -> Result<(), RecordFault> {
        let n = cfg.agents as usize;
        if self.table.views.len() != n || self.table.order.len() != n {
            return Err(format!("the table has {} seats, the job {n}", self.table.views.len()).into());
        }
        self.table.check_shape(cfg)?;
        let plan = turn_plan(cfg, &self.table);
        if self.turns.len() != plan.len() {
            return Err(format!("{} turns, expected {}", self.turns.len(), plan.len()).into());
        }
        for (i, (t, (seat, round, role))) in self.turns.iter().zip(plan).enumerate() {
            let at = format!("turn {i} (index {})", t.turn_index);
            let here = |m: String| Err(RecordFault::at(&at, m));
            if (t.seat, t.round, t.role) != (seat, round, role) {
                return here(format!("is seat {} round {} {}, expected seat {seat} round {round} {role}", t.seat, t.round, t.role));
            }
            if t.agent != cfg.agent_of(seat) {
                return here(format!("played by agent {}, but seat {seat} is agent {}'s", t.agent, cfg.agent_of(seat)));
            }
            t.sampled.check().map_err(|f| RecordFault::turn(&at, f))?;
            if t.tags != read_tags(cfg, &self.table, t.role, &t.message, t.sampled.finish_reason) {
                return here("its tags are not what its message says".into());
            }
        }
        Ok(())
    }
}

/// (seat, round, role) of every turn: T rounds in seat order, then each seat's final turn.
pub fn turn_plan(cfg: &CosirConfig, table: &Table) -> Vec<(u32, u32, Role)> {
    let mut plan: Vec<(u32, u32, Role)> = (0..cfg.rounds).flat_map(|r| table.order.iter().map(move |&s| (s, r, Role::Discussant))).collect();
    plan.extend((0..cfg.agents).map(|s| (s, cfg.rounds, Role::Voter)));
    plan
}

fn read_tags(cfg: &CosirConfig, table: &Table, role: Role, message: &str, finish: FinishReason) -> Tags {
    parse(message, table, role == Role::Voter, finish == FinishReason::Length, cfg.max_shares_per_msg, cfg.max_requests_per_msg)
}

#[derive(Debug, Clone)]
pub struct Episode {
    config: CosirConfig,
    table: Table,
    instance: u32,
    seed: u64,
    plan: Vec<(u32, u32, Role)>,
    turns: Vec<CosirTurn>,
    pending: Vec<Request>,
}

impl Episode {
    pub fn new(config: &CosirConfig, table: &Table, instance: u32, seed: u64) -> Result<Self, WorkflowError> {
        config.validate().map_err(|(k, m)| WorkflowError::MalformedTrajectory(format!("cosir.{k}: {m}")))?;
        let n = config.agents as usize;
        table.check_shape(config).map_err(WorkflowError::MalformedTrajectory)?;
        if table.views.len() != n || table.order.len() != n {
            return Err(WorkflowError::MalformedTrajectory(format!("the table has {} seats, the job {n}", table.views.len())));
        }
        let mut e =
            Episode { config: config.clone(), plan: turn_plan(config, table), table: table.clone(), instance, seed, turns: Vec::new(), pending: Vec::new() };
        e.open();
        Ok(e)
    }

    pub fn pending(&self) -> &[Request] {
        &self.pending
    }

    pub fn is_done(&self) -> bool {
        self.turns.len() == self.plan.len()
    }

    /// The public messages so far, by seat.
    fn transcript(&self) -> Vec<(u32, String)> {
        self.turns.iter().filter(|t| t.role == Role::Discussant).map(|t| (t.seat, t.message.clone())).collect()
    }

    fn request(&self, i: usize) -> Request {
        let (seat, round, role) = self.plan[i];
        let cfg = &self.config;
        let prompt = match role {
            Role::Voter => final_prompt(&self.table, seat, &self.transcript()),
            _ => discussion_prompt(&self.table, seat, &self.transcript(), round + 1, cfg.rounds, cfg.max_shares_per_msg, cfg.max_requests_per_msg),
        };
        Request::Turn(TurnRequest {
            turn_index: i as u32,
            agent: cfg.agent_of(seat),
            role,
            round,
            slot: seat,
            judge_index: 0,
            about_solution: None,
            about_evaluation: None,
            messages: vec![ChatMessage::user(prompt)],
            sampling: cfg.sampling_for(role).clone(),
            seed: derive_seed(&[self.seed, tag::TURN_SAMPLING, i as u64]),
            blocks_cut: 0,
        })
    }

    /// The next group: one discussion turn, or every final turn at once.
    fn open(&mut self) {
        let next = self.turns.len();
        self.pending = match self.plan.get(next) {
            None => Vec::new(),
            Some((_, _, Role::Voter)) => (next..self.plan.len()).map(|i| self.request(i)).collect(),
            Some(_) => vec![self.request(next)],
        };
    }

    pub fn submit(&mut self, replies: Vec<Reply>) -> Result<(), WorkflowError> {
        let replies = take_replies(&self.pending, replies)?;
        for reply in replies {
            let Reply::Turn(out) = reply else {
                return Err(WorkflowError::MalformedTurn { turn_index: 0, message: "a CoSIR game runs no tools".into() });
            };
            self.record(out);
        }
        self.open();
        Ok(())
    }

    fn record(&mut self, out: TurnOutput) {
        let (seat, round, role) = self.plan[out.turn_index as usize];
        let message = crate::turn::without_thinking(&out.text);
        let tags = read_tags(&self.config, &self.table, role, &message, out.finish_reason);
        let turn_index = out.turn_index;
        let (sampled, text) = Sampled::split(out);
        self.turns.push(CosirTurn { turn_index, seat, agent: self.config.agent_of(seat), role, round, sampled, text, message, tags });
    }

    pub fn into_trajectory(self) -> Result<CosirTrajectory, WorkflowError> {
        if !self.is_done() {
            return Err(WorkflowError::MalformedTrajectory(format!("the game stopped after {} of {} turns", self.turns.len(), self.plan.len())));
        }
        Ok(CosirTrajectory { table: self.table, instance: self.instance, turns: self.turns })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cosir::table::tests::fixture;

    /// A scripted one-token reply (the CoSIR tests' only kind).
    pub(crate) fn reply(turn_index: u32, text: &str) -> Reply {
        Reply::Turn(TurnOutput {
            turn_index,
            text: text.into(),
            raw_text: text.into(),
            prompt_ids: vec![1, 2],
            completion_ids: vec![3],
            logprobs: vec![-0.5],
            finish_reason: FinishReason::Stop,
            policy_version: 0,
            constrained: Vec::new(),
        })
    }

    #[test]
    fn rounds_go_seat_by_seat_then_every_seat_decides_at_once() {
        let cfg = CosirConfig {
            options: 3,
            criteria: 3,
            agents: 2,
            max_score: 3,
            rounds: 2,
            seat_policy: crate::cosir::config::SeatPolicy::PerSeat,
            ..Default::default()
        };
        let mut table = fixture();
        table.order = vec![1, 0];
        let mut e = Episode::new(&cfg, &table, 0, 9).unwrap();
        let texts = ["<think>hmm</think>SHARE(A, c3, 3)", "SHARE(A, c2, 3)\nREQUEST(B, c3)", "ok", "FINAL(A)"];
        for (i, text) in texts.iter().enumerate() {
            let p = e.pending().to_vec();
            assert_eq!(p.len(), 1, "discussion turns go one at a time");
            let Request::Turn(t) = &p[0] else { panic!() };
            assert_eq!((t.turn_index, t.slot, t.role, t.agent), (i as u32, table.order[i % 2], Role::Discussant, table.order[i % 2]));
            // Each turn sees the messages before it, thinking stripped.
            if i == 1 {
                assert!(t.messages[0].content.contains("[agent_2] SHARE(A, c3, 3)\n\nRound 1 of 2."), "{}", t.messages[0].content);
            }
            e.submit(vec![reply(i as u32, text)]).unwrap();
        }
        let p = e.pending().to_vec();
        assert_eq!(p.len(), 2, "both final turns at once");
        e.submit(vec![reply(5, "FINAL(B)"), reply(4, "FINAL(A)")]).unwrap();
        assert!(e.is_done() && e.pending().is_empty());
        let t = e.into_trajectory().unwrap();
        t.validate(&cfg).unwrap();
        assert_eq!(t.turns[3].tags.violations, vec![crate::cosir::tags::Violation::FinalInDiscussion]);
        assert_eq!((t.turns[4].seat, t.turns[4].tags.final_choice, t.turns[5].tags.final_choice), (0, Some(0), Some(1)));
        let mut forged = t.clone();
        forged.turns[1].tags.shares.clear();
        assert!(forged.validate(&cfg).unwrap_err().to_string().contains("its tags are not what its message says"));
    }
}
