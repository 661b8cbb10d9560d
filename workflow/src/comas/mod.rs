//! CoMAS: agents solve, critique each other's solutions and score the (solution, critique) pairs;
//! the scores reward the solvers and, inversely, the critics (spec `comas.md`).
//!
//! - `config`: settings and validation;
//! - `assignment`: who evaluates and who scores, planned per batch;
//! - `discussion`: which earlier pairs a round's solvers see;
//! - `prompts`: the templates;
//! - `score`: reading scores and verdicts out of text;
//! - `episode`: the protocol of one instance as a state machine;
//! - `batch`: all episodes of a step;
//! - `trajectory`: the record of a finished episode;
//! - `metrics`: a step's figures as typed records;
//! - `reward`: trajectory → per-turn rewards;
//! - `experience`: a step's records → experiences per agent and the step's figures;
//! - `method`: CoMAS on the method seam.
pub mod assignment;
pub mod batch;
pub mod config;
pub mod discussion;
pub mod episode;
pub mod experience;
pub mod method;
pub mod metrics;
pub mod prompts;
pub mod reward;
pub mod score;
pub mod trajectory;

pub use assignment::{plan_batch, BatchPlan, InstancePlan, PlanSeed, RoundAssignment};
pub use batch::{episode_seed, start_batch};
pub use config::{Assignment, CoMasConfig, ConfigError, DiscussionSource, JudgeReward, RewardSource, RoleSampling, Variant};
pub use episode::Episode;
pub use method::CoMas;
pub use reward::{comas_rewards, rewards, warm_up_judges, TurnReward, WarmUpWeights};
pub use score::{extract_judgment, extract_score, Judgment};
pub use trajectory::{Trajectory, TrajectoryTurn};
