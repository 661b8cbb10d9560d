//! NeuroMAS (spec neuromas.md): a multi-agent system as a layered graph of role-less nodes.
//! As pure code: the graph (topology, edges, positions, growth steps), the node prompts and
//! messages, one rollout as an episode, its reward, and the method on the seam (`method`).
pub mod config;
pub mod episode;
pub mod method;
pub mod metrics;
pub mod prompts;
pub mod reward;
pub mod topology;

pub use config::{NeuromasConfig, ParamSharing};
pub use episode::{Episode, NeuromasTrajectory, NodeTurn};
pub use method::{Neuromas, NEUROMAS_KL_COEF};
pub use topology::{Graph, Init, Node, TopologySpec};
