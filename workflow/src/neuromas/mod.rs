//! NeuroMAS (spec neuromas.md): a multi-agent system as a layered graph of role-less nodes.
//! So far only the graph itself: its topology, edges, positions and growth steps. The node
//! prompts, the episode program, the many-adapter learner and `comas grow` are still to come.
pub mod topology;

pub use topology::{Graph, Init, Node, TopologySpec};
