//! `[neuromas]` of a job (spec neuromas.md §2–§5): the graph, how nodes map to adapters, the
//! message budget, rollouts per task and the reward's format penalty.
use super::prompts::DEFAULT_MAX_MSG_TOKENS;
use super::topology::{Graph, Node, TopologySpec};
use crate::turn::SamplingSpec;
use serde::{Deserialize, Serialize};

/// Which nodes share an adapter (§4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParamSharing {
    /// One adapter per node, keyed by its uid.
    #[default]
    PerNode,
    /// One per layer.
    PerLayer,
    /// One for the whole graph: nodes differ only by position and inputs.
    Shared,
}

/// Reward of a readout with no `\boxed{}` answer when `format_penalty` is on (§5).
pub const NO_BOX_REWARD: f64 = -0.5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NeuromasConfig {
    pub topology: TopologySpec,
    pub param_sharing: ParamSharing,
    /// Tokens of a node's message passed downstream (thinking removed first).
    pub max_msg_tokens: u32,
    /// G: rollouts of each task, the group of `group_norm` (a training job needs 2 or more).
    pub rollouts_per_task: u32,
    /// A readout without `\boxed{}` gets `NO_BOX_REWARD` instead of 0.
    pub format_penalty: bool,
    /// Every node's sampling (§5: temperature 1, top_p 1).
    pub sampling: SamplingSpec,
    /// The readout's, when it differs (a guided `\boxed{}` tail for a small model); default:
    /// `sampling`.
    pub readout_sampling: Option<SamplingSpec>,
    /// Steps during which `topology.bridge_layers` read through identity wiring (§6); from this
    /// step on they read through `connectivity`.
    pub bridge_steps: u64,
}

impl Default for NeuromasConfig {
    fn default() -> Self {
        Self {
            topology: TopologySpec::default(),
            param_sharing: ParamSharing::PerNode,
            max_msg_tokens: DEFAULT_MAX_MSG_TOKENS,
            rollouts_per_task: 8,
            format_penalty: true,
            sampling: SamplingSpec { max_new_tokens: 1024, min_new_tokens: 1, ..SamplingSpec::default() },
            readout_sampling: None,
            bridge_steps: 0,
        }
    }
}

impl NeuromasConfig {
    /// Checks the settings; the error names the key under `neuromas.` and what is wrong.
    pub fn validate(&self) -> Result<(), (String, String)> {
        self.topology.validate().map_err(|(k, m)| (format!("topology.{k}"), m))?;
        if self.max_msg_tokens == 0 {
            return Err(("max_msg_tokens".into(), "a node needs room for a message: give at least 1".into()));
        }
        if self.rollouts_per_task == 0 {
            return Err(("rollouts_per_task".into(), "must be at least 1".into()));
        }
        if self.sampling.max_new_tokens == 0 {
            return Err(("sampling.max_new_tokens".into(), "must be at least 1".into()));
        }
        self.sampling.check().map_err(|m| ("sampling".to_string(), m))?;
        if let Some(r) = &self.readout_sampling {
            if r.max_new_tokens == 0 {
                return Err(("readout_sampling.max_new_tokens".into(), "must be at least 1".into()));
            }
            r.check().map_err(|m| ("readout_sampling".to_string(), m))?;
        }
        Ok(())
    }

    /// The graph as declared, bridges in place.
    pub fn graph(&self) -> Result<Graph, (String, String)> {
        Graph::new(self.topology.clone()).map_err(|(k, m)| (format!("topology.{k}"), m))
    }

    /// The graph that step `step` plays: bridged layers read through identity wiring only
    /// before `bridge_steps`.
    pub fn graph_at(&self, step: u64) -> Result<Graph, (String, String)> {
        let mut g = self.graph()?;
        if step >= self.bridge_steps {
            g.end_bridge();
        }
        Ok(g)
    }

    /// The sampling of `node` in `graph`.
    pub fn sampling_of(&self, graph: &Graph, node: Node) -> &SamplingSpec {
        match &self.readout_sampling {
            Some(r) if node.layer == graph.depth() => r,
            _ => &self.sampling,
        }
    }

    /// The largest reply any node may write.
    pub fn max_new_tokens(&self) -> u32 {
        self.readout_sampling.as_ref().map_or(0, |r| r.max_new_tokens).max(self.sampling.max_new_tokens)
    }

    /// The adapter (the job's agent) that plays `node`.
    pub fn agent_of(&self, node: Node) -> u32 {
        match self.param_sharing {
            ParamSharing::Shared => 0,
            ParamSharing::PerLayer => node.layer - 1,
            // Uids are handed out from 0 and never reused, so they index the adapters.
            ParamSharing::PerNode => node.uid as u32,
        }
    }

    /// Adapters `graph` needs.
    pub fn agents(&self, graph: &Graph) -> u32 {
        match self.param_sharing {
            ParamSharing::Shared => 1,
            ParamSharing::PerLayer => graph.depth(),
            ParamSharing::PerNode => graph.next_uid as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_map_to_adapters_by_sharing_and_bad_settings_name_their_key() {
        let mut cfg = NeuromasConfig::default();
        let g = Graph::new(cfg.topology.clone()).unwrap();
        let agents = |c: &NeuromasConfig| g.nodes().iter().map(|&n| c.agent_of(n)).collect::<Vec<_>>();
        assert_eq!((agents(&cfg), cfg.agents(&g)), (vec![0, 1, 2, 3, 4, 5, 6], 7));
        cfg.param_sharing = ParamSharing::PerLayer;
        assert_eq!((agents(&cfg), cfg.agents(&g)), (vec![0, 0, 0, 1, 1, 1, 2], 3));
        cfg.param_sharing = ParamSharing::Shared;
        assert_eq!((agents(&cfg), cfg.agents(&g)), (vec![0; 7], 1));
        cfg.rollouts_per_task = 0;
        assert_eq!(cfg.validate().unwrap_err().0, "rollouts_per_task");
        // A bridged layer reads one node until bridge_steps, then its full input layer.
        let mut bridged = NeuromasConfig { bridge_steps: 2, ..NeuromasConfig::default() };
        bridged.topology.bridge_layers = vec![2];
        assert_eq!(bridged.graph_at(1).unwrap().inputs(2, 3).len(), 1);
        assert_eq!(bridged.graph_at(2).unwrap().inputs(2, 3).len(), 3);
        cfg.rollouts_per_task = 8;
        cfg.topology.layers = vec![2, 2];
        let (key, why) = cfg.validate().unwrap_err();
        assert_eq!(key, "topology.layers");
        assert!(why.contains("readout"), "{why}");
        let parsed: NeuromasConfig = toml::from_str("param_sharing = \"per_layer\"\n[topology]\nlayers = [2, 1]\n").unwrap();
        assert_eq!((parsed.param_sharing, parsed.topology.layers, parsed.max_msg_tokens), (ParamSharing::PerLayer, vec![2, 1], 512));
        assert!(toml::from_str::<NeuromasConfig>("max_msg = 3\n").is_err());
    }
}
