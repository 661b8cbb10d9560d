//! CoSIR (spec cosir.md): an information-sharing game on a partly hidden score table, where a
//! Bayesian evaluator that knows the whole table rewards each message by how much it lowers the
//! team's surprisal about the best option. The parts marked OUR DESIGN in the spec are ours.
pub mod config;
pub mod episode;
pub mod evaluator;
pub mod method;
pub mod prompts;
pub mod table;
pub mod tags;

pub use config::CosirConfig;
pub use episode::{CosirTrajectory, CosirTurn, Episode};
pub use method::{Cosir, COSIR_KL_COEF};
pub use table::Table;
pub mod metrics;
pub mod reward;
