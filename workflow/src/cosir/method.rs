//! CoSIR on the method seam: its `[cosir]` table, games on tables drawn from the job seed (no
//! data set), every message and final turn one sample for its seat's agent with the turn reward
//! the evaluator's replay gives (spec cosir.md §4.4, §5), and its sharing figures.
use crate::method::RecordFault;
use super::config::SeatPolicy;
use super::metrics::CosirMetrics;
use super::reward::replay;
use super::{CosirConfig, CosirTrajectory, Episode, Table};
use crate::error::WorkflowError;
use crate::error::{invalid, JobError};
use crate::mean::Mean;
use crate::method::{Chart, Experience, JobView, Line, Made, Method, PromptFit, RoomNeeds, Row, Samples, ShareTally, Shares, StepContext, Summary, TaskSource, Unit};
use crate::program::{PolicyTurn, Reply, Request};
use crate::seed::{derive_seed, PlanSeed, EVAL_SHARD};
use crate::task::TaskRecord;
use crate::train_config::{KlEstimator, TrainDefaults};
use crate::turn::PromptMeter;

/// CoSIR's KL coefficient (in the loss, k3; spec cosir.md §5).
pub const COSIR_KL_COEF: f64 = 1e-3;

/// Seed stream of CoSIR tables.
const COSIR_TABLE_TAG: u64 = 0xC051_7AB1;

/// CoSIR (spec cosir.md).
pub struct Cosir;

/// A step's figures: the games, and each agent's share.
pub type CosirStep = Shares<CosirMetrics>;

impl crate::method::Episode for Episode {
    type Record = CosirTrajectory;

    fn pending(&self) -> Vec<Request> {
        Episode::pending(self).to_vec()
    }

    fn submit(&mut self, replies: Vec<Reply>, _: &dyn PromptMeter) -> Result<(), WorkflowError> {
        Episode::submit(self, replies)
    }

    fn is_done(&self) -> bool {
        Episode::is_done(self)
    }

    fn finish(self) -> Result<CosirTrajectory, WorkflowError> {
        self.into_trajectory()
    }
}

impl crate::method::Record for CosirTrajectory {
    fn turns(&self) -> u32 {
        self.turns.len() as u32
    }

    fn completion_tokens(&self) -> u64 {
        CosirTrajectory::completion_tokens(self)
    }

    fn policy_turns(&self) -> Vec<PolicyTurn> {
        CosirTrajectory::policy_turns(self)
    }

    fn shift_versions(&mut self, by: u64) {
        self.turns.iter_mut().for_each(|t| t.sampled.policy_version += by);
    }
}

/// Turns one trained agent speaks in a game: every seat's (shared policy) or its own seat's.
fn turns_per_agent(c: &CosirConfig) -> u64 {
    let seats = match c.seat_policy {
        SeatPolicy::Shared => u64::from(c.agents),
        SeatPolicy::PerSeat => 1,
    };
    seats * u64::from(c.turns_per_seat())
}

impl Method for Cosir {
    const NAME: &'static str = "cosir";
    const CHART_GROUPS: &'static [&'static str] = &["sharing"];

    type Config = CosirConfig;
    type Task = Table;
    type Plan = ();
    type Episode = Episode;
    type Record = CosirTrajectory;
    type Metrics = CosirStep;

    /// The settings, with as many [[agents]] as the seat policy trains; a table must be drawable.
    fn configure(table: toml::Table, job: &JobView<'_>) -> Result<CosirConfig, JobError> {
        let cfg: CosirConfig = crate::method::read_settings(toml::Value::Table(table), "cosir")?;
        cfg.validate().map_err(|(k, m)| invalid(format!("cosir.{k}"), m))?;
        let want = cfg.num_agents();
        if job.agents != want {
            return Err(invalid(
                "agents",
                match cfg.seat_policy {
                    SeatPolicy::Shared => format!("cosir.seat_policy = \"shared\" trains one policy for every seat; list 1 [[agents]], not {}", job.agents),
                    SeatPolicy::PerSeat => format!("cosir.seat_policy = \"per_seat\" trains one agent per seat; list {want} [[agents]] (cosir.agents), not {}", job.agents),
                },
            ));
        }
        Table::generate(&cfg, 0, "check").map_err(|e| invalid("cosir", e))?;
        Ok(cfg)
    }

    fn task_source(_: &CosirConfig) -> TaskSource {
        TaskSource::Generated
    }

    /// A k3 KL term in the loss, β = 1e-3, against drift in free text (spec §5).
    fn train_defaults(c: &CosirConfig) -> TrainDefaults {
        TrainDefaults {
            temperature: Some(crate::method::temperature_or_one(c.sampling.temperature)),
            kl_coef: Some(COSIR_KL_COEF),
            kl_in_loss: Some(true),
            kl_estimator: Some(KlEstimator::K3),
            ..TrainDefaults::default()
        }
    }

    fn samples(c: &CosirConfig, _agent: u32, episodes: u64) -> Samples {
        let least = episodes * turns_per_agent(c);
        Samples { least, most: least, why: format!("{episodes} games x {} turns", turns_per_agent(c)) }
    }

    fn room(c: &CosirConfig) -> RoomNeeds {
        let new = u64::from(c.sampling.max_new_tokens.max(c.final_sampling.as_ref().map_or(0, |s| s.max_new_tokens)));
        RoomNeeds::one_reply("cosir.sampling.max_new_tokens", "sampling.max_new_tokens", new)
    }

    fn for_evaluation(c: &CosirConfig, instances: u32, temperature: f64) -> CosirConfig {
        let mut c = c.clone();
        c.instances_per_question = instances;
        c.sampling.temperature = temperature;
        if let Some(f) = &mut c.final_sampling {
            f.temperature = temperature;
        }
        c
    }

    fn copies(c: &CosirConfig) -> u32 {
        c.instances_per_question
    }

    /// Table `index` of the stream of `seed.shard` (training tables, or the fixed held-out ones
    /// of the evaluation shard): the same index always gives the same table.
    fn task(c: &CosirConfig, index: usize, _: &[TaskRecord], seed: PlanSeed) -> Result<Table, WorkflowError> {
        let prefix = if seed.shard == EVAL_SHARD { "eval-table" } else { "table" };
        Table::generate(c, derive_seed(&[seed.global, COSIR_TABLE_TAG, seed.shard, index as u64]), &format!("{prefix}-{index}"))
            .map_err(|e| WorkflowError::PlanMismatch(format!("drawing CoSIR table {index}: {e}")))
    }

    fn plans(_: &CosirConfig, episodes: usize, _: PlanSeed) -> Result<Vec<()>, WorkflowError> {
        Ok(vec![(); episodes])
    }

    fn speakers(c: &CosirConfig, _: &()) -> Vec<u32> {
        (0..c.num_agents()).collect()
    }

    fn prompt_fit(c: &CosirConfig) -> PromptFit {
        PromptFit { max_len: c.prompt_max_len.map(|p| (p, "cosir.prompt_max_len".to_string())), ..Default::default() }
    }

    fn start(c: &CosirConfig, table: &Table, _: (), instance: u32, seed: u64, _: &dyn PromptMeter) -> Result<Episode, WorkflowError> {
        Episode::new(c, table, instance, seed)
    }

    fn check(c: &CosirConfig, t: &CosirTrajectory) -> Result<(), RecordFault> {
        t.validate(c)
    }

    /// The evidence of each game is replayed by the method's reward code, and every message
    /// and final turn becomes one sample for the seat's agent with its turn reward.
    fn experience(c: &CosirConfig, records: Vec<(String, CosirTrajectory)>, step: &StepContext<'_>) -> Result<Made<CosirStep>, WorkflowError> {
        let mut tally = ShareTally::new(step.agents, false);
        let mut replays = Vec::with_capacity(records.len());
        for (episode_id, t) in &records {
            let r = replay(c, t);
            for (turn, reward) in t.turns.iter().zip(&r.rewards) {
                // The group of `group_norm` (spec §5): G rollouts of a table, same seat and turn.
                let group = format!("{}/seat{}/turn{}", t.table.id, turn.seat, turn.turn_index);
                let e = Experience::sampled(&turn.sampled, reward.reward, group, episode_id, turn.turn_index, c.sampling_for(turn.role).temperature);
                tally.push(turn.agent, e, episode_id, &format!("turn {}", turn.turn_index))?;
            }
            replays.push((r, t.table.tries, t.completion_tokens()));
        }
        let games: Vec<_> = replays.iter().map(|(r, tries, tokens)| (r, *tries, *tokens)).collect();
        let (per_agent, agents) = tally.finish();
        Ok(Made { per_agent, metrics: Shares { figures: CosirMetrics::of(&games), agents }, pooled_whitening: false })
    }

    /// Team accuracy, valid shares per game, private cells disclosed, requests answered and
    /// format violations.
    fn watch(m: &CosirStep) -> Vec<String> {
        let c = &m.figures;
        let pct = |s: Mean| s.mean.map_or("-".into(), |v| format!("{:.0}%", v * 100.0));
        vec![
            format!("team right {}", pct(c.team_accuracy)),
            format!("valid shares/game {}", c.valid_shares_per_episode.mean.map_or("-".into(), |v| format!("{v:.1}"))),
            format!("disclosed {} answered {}", pct(c.disclosure_rate), pct(c.request_fulfilment_rate)),
            format!("format broken {}", pct(c.format_violation_rate)),
        ]
    }

    fn summary(m: &CosirStep) -> Summary {
        let c = &m.figures;
        let accuracy = c.team_accuracy.mean;
        let rows = vec![
            Row::new("team right", accuracy, Unit::Share),
            Row::new("seat right", c.individual_accuracy.mean, Unit::Share),
            Row::new("private cells disclosed", c.disclosure_rate.mean, Unit::Share),
            Row::new("requests answered", c.request_fulfilment_rate.mean, Unit::Share),
            Row::new("messages breaking the format", c.format_violation_rate.mean, Unit::Share),
        ];
        Summary { accuracy, graded: Some(c.team_accuracy.count), rows }
    }

    fn charts(steps: &[CosirStep]) -> Vec<Chart> {
        let rate = |name: &str, colour: usize, f: fn(&CosirMetrics) -> Mean| Line {
            name: name.into(),
            colour: Some(colour),
            values: steps.iter().map(|m| f(&m.figures).mean).collect(),
        };
        let rates = vec![
            rate("team accuracy", 0, |c| c.team_accuracy),
            rate("seat accuracy", 1, |c| c.individual_accuracy),
            rate("private cells disclosed", 2, |c| c.disclosure_rate),
            rate("requests answered", 3, |c| c.request_fulfilment_rate),
            rate("received info used", 4, |c| c.use_rate),
            rate("messages breaking the format", 5, |c| c.format_violation_rate),
        ];
        let mut names: Vec<&String> = steps.iter().flat_map(|m| m.figures.reward_terms.keys()).collect();
        names.sort();
        names.dedup();
        let terms = names
            .iter()
            .enumerate()
            .map(|(i, t)| Line { name: t.to_string(), colour: Some(i), values: steps.iter().map(|m| m.figures.reward_terms.get(*t).and_then(|s| s.mean)).collect() })
            .collect();
        vec![
            Chart {
                group: "sharing",
                key: "sharing.rates",
                title: "Team accuracy and information flow",
                needs: "team_accuracy, disclosure_rate, ... in the step records",
                share: true,
                lines: rates,
            },
            Chart {
                group: "sharing",
                key: "sharing.terms",
                title: "Reward terms (unweighted mean per turn)",
                needs: "reward_terms.<term>.mean in the step records",
                share: false,
                lines: terms,
            },
        ]
    }
}
