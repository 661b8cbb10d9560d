//! CoSIR settings (`[cosir]` in a job file): the table sizes and visibility of spec §3.1, the
//! episode of §3.2, the tag limits of §3.4 and the reward terms and weights of §4.3–4.4.
use crate::turn::{Role, SamplingSpec};
use serde::{Deserialize, Serialize};

/// Who plays the seats (spec §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SeatPolicy {
    /// One shared policy (agent 0) plays every seat.
    #[default]
    Shared,
    /// Seat j is played by agent j, each with its own learner.
    PerSeat,
}

/// How a REQUEST is rewarded (spec §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RequestReward {
    /// The expected entropy drop of the requested cell for the requester.
    #[default]
    InformationGain,
    /// The requester's surprisal drop, if a valid SHARE of the cell reaches it within the next
    /// full round.
    Realized,
}

/// How using received information in the final choice is rewarded (spec §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UseReward {
    /// 1 if the choice is an argmax of the posterior given the seat's final evidence.
    #[default]
    Argmax,
    /// ln max(P(choice | final evidence), 1e-6).
    LogPosterior,
}

/// Which outcome a final turn is rewarded for (spec §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeReward {
    /// 1 if the team's plurality choice is the best option.
    #[default]
    Team,
    /// 1 if this seat's own choice is.
    Individual,
    /// The mean of the two.
    Both,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CosirConfig {
    /// M, options A, B, … (3–5).
    pub options: u32,
    /// C, criteria (3–8).
    pub criteria: u32,
    /// N, seats (2–4).
    pub agents: u32,
    /// K: scores are 0..=K.
    pub max_score: u32,
    /// Names to draw the criteria from (snake_case; at least C); default: a built-in list.
    pub criteria_names: Option<Vec<String>>,
    /// Prior pmf of a score over 0..=K (default uniform); the evaluator uses it too.
    pub prior: Option<Vec<f64>>,
    /// Least margin of the best option over the second (δ).
    pub margin: u32,
    pub p_shared: f64,
    pub overlap_p: f64,
    pub p_hidden: f64,
    /// Whole criteria (columns) are shared or given to one seat, instead of single cells.
    pub column_mode: bool,
    /// Filter a: no seat's own view may give the best option this probability as its argmax.
    pub tau: f64,
    /// Filter b: the pooled views must give the best option at least this probability.
    pub pooled_min: f64,
    /// Filter c: the shared cells alone must point elsewhere.
    pub require_decoy: bool,
    /// Tables drawn before generation gives up (a setting no table can pass).
    pub max_tries: u32,
    /// T discussion rounds.
    pub rounds: u32,
    pub max_shares_per_msg: u32,
    pub max_requests_per_msg: u32,
    /// Episodes per table (G rollouts of the same table).
    pub instances_per_question: u32,
    pub seat_policy: SeatPolicy,
    /// Discussion turns (max_new_tokens is the spec's `max_msg_tokens`), and final turns
    /// unless `final_sampling` is given.
    pub sampling: SamplingSpec,
    pub final_sampling: Option<SamplingSpec>,
    pub w_share: f64,
    pub w_req: f64,
    pub w_use: f64,
    pub w_out: f64,
    pub w_fmt: f64,
    pub w_false: f64,
    /// Penalty per wasted request.
    pub w_waste: f64,
    /// Cost per SHARE tag.
    pub share_tag_cost: f64,
    /// Floor of the sharing reward; `None` lets it go negative.
    pub share_reward_floor: Option<f64>,
    pub request_reward: RequestReward,
    pub use_reward: UseReward,
    pub outcome: OutcomeReward,
    /// Also add w_out · r_out to every discussion turn of the episode.
    pub outcome_to_all_turns: bool,
    /// Longest prompt in tokens (unset: the model's context less max_new_tokens).
    pub prompt_max_len: Option<u32>,
}

impl Default for CosirConfig {
    fn default() -> Self {
        Self {
            options: 3,
            criteria: 4,
            agents: 3,
            max_score: 9,
            criteria_names: None,
            prior: None,
            margin: 1,
            p_shared: 0.25,
            overlap_p: 0.0,
            p_hidden: 0.0,
            column_mode: false,
            tau: 0.5,
            pooled_min: 0.95,
            require_decoy: true,
            max_tries: 100_000,
            rounds: 3,
            max_shares_per_msg: 4,
            max_requests_per_msg: 2,
            instances_per_question: 1,
            seat_policy: SeatPolicy::Shared,
            sampling: SamplingSpec { temperature: 1.0, top_p: 1.0, top_k: 0, max_new_tokens: 256, min_new_tokens: 0, ..Default::default() },
            final_sampling: None,
            w_share: 1.0,
            w_req: 0.5,
            w_use: 1.0,
            w_out: 1.0,
            w_fmt: 0.5,
            w_false: 0.5,
            w_waste: 0.0,
            share_tag_cost: 0.0,
            share_reward_floor: Some(0.0),
            request_reward: RequestReward::InformationGain,
            use_reward: UseReward::Argmax,
            outcome: OutcomeReward::Team,
            outcome_to_all_turns: false,
            prompt_max_len: None,
        }
    }
}

impl CosirConfig {
    /// The prior pmf over 0..=K.
    pub fn prior_pmf(&self) -> Vec<f64> {
        self.prior.clone().unwrap_or_else(|| vec![1.0 / f64::from(self.max_score + 1); self.max_score as usize + 1])
    }

    /// The agent that plays `seat`.
    pub fn agent_of(&self, seat: u32) -> u32 {
        match self.seat_policy {
            SeatPolicy::Shared => 0,
            SeatPolicy::PerSeat => seat,
        }
    }

    /// Trained agents the job needs.
    pub fn num_agents(&self) -> u32 {
        match self.seat_policy {
            SeatPolicy::Shared => 1,
            SeatPolicy::PerSeat => self.agents,
        }
    }

    /// Turns each seat speaks in an episode: a message per round, then its final turn.
    pub fn turns_per_seat(&self) -> u32 {
        self.rounds + 1
    }

    pub fn sampling_for(&self, role: Role) -> &SamplingSpec {
        match (role, &self.final_sampling) {
            (Role::Voter, Some(s)) => s,
            _ => &self.sampling,
        }
    }

    /// Checks the settings; the error names the key (under `cosir.`) and says what is wrong.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: String| Err((k.to_string(), m));
        let range = |k: &str, v: u32, lo: u32, hi: u32| if v < lo || v > hi { bad(k, format!("must be in {lo}..={hi}, got {v}")) } else { Ok(()) };
        range("options", self.options, 2, 26)?;
        range("criteria", self.criteria, 1, 16)?;
        range("agents", self.agents, 2, 8)?;
        range("max_score", self.max_score, 1, 99)?;
        range("rounds", self.rounds, 1, 16)?;
        range("instances_per_question", self.instances_per_question, 1, 1024)?;
        if let Some(names) = &self.criteria_names {
            let snake = |n: &String| {
                n.chars().next().is_some_and(|c| c.is_ascii_lowercase()) && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            };
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            if unique.len() != names.len() || names.len() < self.criteria as usize || !names.iter().all(snake) {
                return bad("criteria_names", format!("must be at least {} distinct snake_case names (a-z, 0-9, _), the grammar's", self.criteria));
            }
        }
        if let Some(p) = &self.prior {
            if p.len() != self.max_score as usize + 1 || p.iter().any(|x| !(x.is_finite() && *x >= 0.0)) || (p.iter().sum::<f64>() - 1.0).abs() > 1e-9 {
                return bad("prior", format!("must be {} non-negative probabilities (scores 0..={}) summing to 1", self.max_score + 1, self.max_score));
            }
        }
        for (k, v) in
            [("p_shared", self.p_shared), ("overlap_p", self.overlap_p), ("p_hidden", self.p_hidden), ("tau", self.tau), ("pooled_min", self.pooled_min)]
        {
            if !(0.0..=1.0).contains(&v) {
                return bad(k, format!("must be a probability in [0, 1], got {v}"));
            }
        }
        if self.p_shared + self.p_hidden > 1.0 {
            return bad("p_hidden", format!("p_shared + p_hidden is {}, over 1", self.p_shared + self.p_hidden));
        }
        if self.max_tries == 0 {
            return bad("max_tries", "must be at least 1".into());
        }
        if self.sampling.max_new_tokens == 0 || self.final_sampling.as_ref().is_some_and(|s| s.max_new_tokens == 0) {
            return bad("sampling.max_new_tokens", "must be at least 1 (also in final_sampling)".into());
        }
        for (k, v) in [
            ("w_share", self.w_share),
            ("w_req", self.w_req),
            ("w_use", self.w_use),
            ("w_out", self.w_out),
            ("w_fmt", self.w_fmt),
            ("w_false", self.w_false),
            ("w_waste", self.w_waste),
            ("share_tag_cost", self.share_tag_cost),
        ] {
            if !v.is_finite() {
                return bad(k, format!("must be finite, got {v}"));
            }
        }
        Ok(())
    }
}
