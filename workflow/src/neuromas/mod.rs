//! NeuroMAS (spec neuromas.md): a multi-agent system as a layered graph of role-less nodes.
//! Built so far, as pure code: the graph (topology, edges, positions, growth steps), the node
//! prompts and messages, one rollout as an episode, and its reward. Not yet wired into jobs:
//! the program seam entry, the many-adapter learner and `comas grow` are still to come.
pub mod config;
pub mod episode;
pub mod metrics;
pub mod prompts;
pub mod reward;
pub mod topology;

pub use config::{NeuromasConfig, ParamSharing};
pub use episode::{Episode, NeuromasTrajectory, NodeTurn};
pub use topology::{Graph, Init, Node, TopologySpec};
