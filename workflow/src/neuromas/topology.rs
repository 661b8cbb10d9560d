//! NeuroMAS graphs (spec neuromas.md §2): layers of role-less nodes, the edges that carry their
//! messages, and the growth steps of §6. Nodes keep a stable uid (which keys their adapters and
//! optimizer state) while their positions `L{l}N{k}` are recomputed whenever the graph changes.
use crate::seed::derive_seed;
use rand::seq::index::sample;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

/// How a node reads the layer below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Connectivity {
    #[default]
    Full,
    Sparse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SparsePattern {
    #[default]
    Ring,
    /// `sparse_k` distinct predecessors drawn with the seed (graph_seed, layer, index).
    Random,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Skip {
    #[default]
    None,
    /// Also read every node of layer l − 2.
    Prev2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskVisible {
    #[default]
    All,
    FirstOnly,
}

/// `[neuromas.topology]` of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TopologySpec {
    /// Widths W_1..W_L; the last is the readout and must be 1.
    pub layers: Vec<u32>,
    pub connectivity: Connectivity,
    pub sparse_k: u32,
    pub sparse_pattern: SparsePattern,
    pub skip: Skip,
    pub task_visible: TaskVisible,
    /// Seed of `random` sparse wiring.
    pub graph_seed: u64,
    /// Each node's uid, layer by layer (default: 0, 1, … in position order). A grown graph
    /// names them, since uids key the adapters and stay with their nodes when positions move.
    pub uids: Option<Vec<Vec<u64>>>,
    /// Layers (1-based) inserted by depth growth that still read through identity wiring (node
    /// k reads only node k below) until `neuromas.bridge_steps` (§6).
    pub bridge_layers: Vec<u32>,
}

impl Default for TopologySpec {
    fn default() -> Self {
        Self {
            layers: vec![3, 3, 1],
            connectivity: Connectivity::Full,
            sparse_k: 2,
            sparse_pattern: SparsePattern::Ring,
            skip: Skip::None,
            task_visible: TaskVisible::All,
            graph_seed: 0,
            uids: None,
            bridge_layers: Vec::new(),
        }
    }
}

/// Most nodes a graph may have (each is an LLM call per task and an adapter).
pub const MAX_NODES: u32 = 256;

impl TopologySpec {
    /// Checks the shape; the error names the key (under `neuromas.topology.`) and what is wrong.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: String| Err((k.to_string(), m));
        match self.layers.as_slice() {
            [] => return bad("layers", "list at least one layer width, ending with the readout's 1".into()),
            [.., last] if *last != 1 => return bad("layers", format!("the last layer is the readout and must have width 1, got {last}")),
            _ => {}
        }
        if let Some(l) = self.layers.iter().position(|&w| w == 0) {
            return bad("layers", format!("layer {} has width 0; every layer needs a node", l + 1));
        }
        let nodes: u32 = self.layers.iter().sum();
        if nodes > MAX_NODES {
            return bad("layers", format!("{nodes} nodes, over the {MAX_NODES} a graph may have"));
        }
        if self.connectivity == Connectivity::Sparse && self.sparse_k == 0 {
            return bad("sparse_k", "sparse connectivity needs at least one input per node".into());
        }
        if let Some(uids) = &self.uids {
            let widths: Vec<u32> = uids.iter().map(|l| l.len() as u32).collect();
            if widths != self.layers {
                return bad("uids", format!("give one uid per node: the layers are {:?} wide, the uids {widths:?}", self.layers));
            }
            // Uids index the adapters (`per_node`), so they must be 0..n without gaps or repeats.
            let mut all: Vec<u64> = uids.iter().flatten().copied().collect();
            all.sort_unstable();
            if all.iter().enumerate().any(|(i, &u)| u != i as u64) {
                return bad("uids", format!("the uids must be 0 to {} each once, got {all:?}", nodes - 1));
            }
        }
        let depth = self.layers.len() as u32;
        if let Some(&l) = self.bridge_layers.iter().find(|&&l| l < 2 || l >= depth) {
            return bad(
                "bridge_layers",
                format!("layer {l} cannot bridge: only layers 2 to {} (below the readout) read one node each", depth.saturating_sub(1)),
            );
        }
        Ok(())
    }
}

/// A node of a graph: its stable uid and its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Node {
    pub uid: u64,
    /// 1-based layer and index within the layer.
    pub layer: u32,
    pub index: u32,
}

impl Node {
    /// `L{l}N{k}`.
    pub fn position(&self) -> String {
        format!("L{}N{}", self.layer, self.index)
    }
}

/// A graph as it stands: the spec, the node uids per layer (in position order), and, for a layer
/// inserted by depth growth that is still bridging, identity wiring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Graph {
    pub spec: TopologySpec,
    /// `uids[l][k]` is node (l + 1, k + 1).
    pub uids: Vec<Vec<u64>>,
    /// Layers (1-based) that read only the node with their own index below them (§6 bridge).
    #[serde(default)]
    pub identity_layers: Vec<u32>,
    /// The next uid to hand out.
    pub next_uid: u64,
}

/// Where a new node's adapter comes from when the graph grows (§6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Init {
    /// A copy of this node's adapter and optimizer moments.
    Copy(u64),
    /// The backbone (B = 0).
    Zero,
}

/// A growth step: the new graph and where each new node starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct Grown {
    pub graph: Graph,
    pub inits: Vec<(u64, Init)>,
}

impl Graph {
    /// The graph of `spec`, its bridges still in place; uids are the spec's or, when it names
    /// none, handed out in position order from 0.
    pub fn new(spec: TopologySpec) -> Result<Graph, (String, String)> {
        spec.validate()?;
        let mut next = 0u64;
        let uids = match &spec.uids {
            Some(u) => u.clone(),
            None => spec
                .layers
                .iter()
                .map(|&w| {
                    (0..w)
                        .map(|_| {
                            next += 1;
                            next - 1
                        })
                        .collect()
                })
                .collect(),
        };
        let next_uid = uids.iter().flatten().map(|&u| u + 1).max().unwrap_or(0);
        Ok(Graph { identity_layers: spec.bridge_layers.clone(), spec, uids, next_uid })
    }

    pub fn depth(&self) -> u32 {
        self.uids.len() as u32
    }

    /// Every node, layer by layer.
    pub fn nodes(&self) -> Vec<Node> {
        self.uids
            .iter()
            .enumerate()
            .flat_map(|(l, layer)| layer.iter().enumerate().map(move |(k, &uid)| Node { uid, layer: l as u32 + 1, index: k as u32 + 1 }))
            .collect()
    }

    pub fn node(&self, layer: u32, index: u32) -> Node {
        Node { uid: self.uids[layer as usize - 1][index as usize - 1], layer, index }
    }

    /// The nodes that node (layer, index) reads, ordered by (layer, index); none for layer 1.
    pub fn inputs(&self, layer: u32, index: u32) -> Vec<Node> {
        if layer <= 1 {
            return Vec::new();
        }
        let below = self.uids[layer as usize - 2].len() as u32;
        let mut from: Vec<(u32, u32)> = if self.identity_layers.contains(&layer) {
            vec![(layer - 1, index.min(below))]
        } else {
            match self.spec.connectivity {
                Connectivity::Full => (1..=below).map(|k| (layer - 1, k)).collect(),
                Connectivity::Sparse => {
                    let ks = self.spec.sparse_k.min(below);
                    match self.spec.sparse_pattern {
                        SparsePattern::Ring => (0..ks).map(|j| (layer - 1, (index - 1 + j) % below + 1)).collect(),
                        SparsePattern::Random => {
                            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(derive_seed(&[self.spec.graph_seed, u64::from(layer), u64::from(index)]));
                            sample(&mut rng, below as usize, ks as usize).into_iter().map(|k| (layer - 1, k as u32 + 1)).collect()
                        }
                    }
                }
            }
        };
        if self.spec.skip == Skip::Prev2 && layer >= 3 {
            from.extend((1..=self.uids[layer as usize - 3].len() as u32).map(|k| (layer - 2, k)));
        }
        from.sort_unstable();
        from.dedup();
        from.into_iter().map(|(l, k)| self.node(l, k)).collect()
    }

    /// The nodes that read node (layer, index); empty for the readout.
    pub fn successors(&self, layer: u32, index: u32) -> Vec<Node> {
        self.nodes().into_iter().filter(|n| n.layer > layer && self.inputs(n.layer, n.index).iter().any(|i| i.layer == layer && i.index == index)).collect()
    }

    /// Whether node (layer, ·) is shown the task.
    pub fn sees_task(&self, layer: u32) -> bool {
        layer == 1 || self.spec.task_visible == TaskVisible::All
    }

    /// Width growth of `layer` to `width` nodes (§6): new node j copies node ((j − 1) mod W) + 1
    /// of the same layer (`copy_sibling`) or starts from the backbone.
    pub fn widen(&self, layer: u32, width: u32, copy_sibling: bool) -> Result<Grown, String> {
        let l = layer as usize;
        if l == 0 || l > self.uids.len() {
            return Err(format!("layer {layer} does not exist (the graph has {})", self.uids.len()));
        }
        if l == self.uids.len() {
            return Err("the readout keeps width 1".into());
        }
        let old = self.uids[l - 1].clone();
        if width <= old.len() as u32 {
            return Err(format!("layer {layer} has {} nodes already; growth only adds", old.len()));
        }
        let mut g = self.clone();
        let mut inits = Vec::new();
        for j in old.len() as u32 + 1..=width {
            let uid = g.next_uid;
            g.next_uid += 1;
            g.uids[l - 1].push(uid);
            let source = old[((j - 1) as usize) % old.len()];
            inits.push((uid, if copy_sibling { Init::Copy(source) } else { Init::Zero }));
        }
        g.spec.layers[l - 1] = width;
        g.sync_spec();
        g.spec.validate().map_err(|(k, m)| format!("{k}: {m}"))?;
        Ok(Grown { graph: g, inits })
    }

    /// Depth growth (§6): a new layer just before the readout, as wide as the layer below it; new
    /// node k copies node k below (`copy_prev`) or starts from the backbone, and the new layer
    /// reads through identity wiring until `end_bridge`.
    pub fn deepen(&self, copy_prev: bool) -> Result<Grown, String> {
        let below =
            self.uids.len().checked_sub(1).filter(|&b| b > 0).map(|b| self.uids[b - 1].clone()).ok_or("a graph of only the readout has no layer to copy")?;
        let mut g = self.clone();
        let at = g.uids.len() - 1;
        let mut layer = Vec::new();
        let mut inits = Vec::new();
        for &src in &below {
            let uid = g.next_uid;
            g.next_uid += 1;
            layer.push(uid);
            inits.push((uid, if copy_prev { Init::Copy(src) } else { Init::Zero }));
        }
        g.uids.insert(at, layer);
        g.spec.layers.insert(at, below.len() as u32);
        // Layers above the insertion move up by one.
        g.identity_layers = g.identity_layers.iter().map(|&l| if l as usize > at { l + 1 } else { l }).collect();
        g.identity_layers.push(at as u32 + 1);
        g.sync_spec();
        g.spec.validate().map_err(|(k, m)| format!("{k}: {m}"))?;
        Ok(Grown { graph: g, inits })
    }

    /// Grows the graph to the widths `target` (§6, as `comas grow` does): first each existing
    /// layer below the readout widens to its target, then new layers go in before the readout
    /// one at a time, each as wide as the layer below, and then widen. Every new node's init
    /// names an old node (a copy of a copy is a copy of the original) or the backbone.
    pub fn grow_to(&self, target: &[u32], copy_sibling: bool, copy_prev: bool) -> Result<Grown, String> {
        let depth = self.uids.len();
        if target.len() < depth || target.last() != Some(&1) {
            return Err(format!("a graph of {:?} grows to more or wider layers ending with the readout's 1, not to {target:?}", self.spec.layers));
        }
        if let Some(l) = (0..depth - 1).find(|&l| target[l] < self.uids[l].len() as u32) {
            return Err(format!("layer {} has {} nodes and growth only adds, but the target gives it {}", l + 1, self.uids[l].len(), target[l]));
        }
        let mut g = Grown { graph: self.clone(), inits: Vec::new() };
        let step = |g: Grown, next: Result<Grown, String>| -> Result<Grown, String> {
            let next = next?;
            let mut inits = g.inits;
            for (uid, init) in next.inits {
                // A copy of a node that is itself new starts where that node starts.
                let resolved = match init {
                    Init::Copy(src) => inits.iter().find(|(u, _)| *u == src).map_or(init, |&(_, i)| i),
                    Init::Zero => Init::Zero,
                };
                inits.push((uid, resolved));
            }
            Ok(Grown { graph: next.graph, inits })
        };
        for (l, &want) in target.iter().enumerate().take(depth - 1) {
            if want > g.graph.uids[l].len() as u32 {
                let next = g.graph.widen(l as u32 + 1, want, copy_sibling);
                g = step(g, next)?;
            }
        }
        for _ in depth..target.len() {
            let next = g.graph.deepen(copy_prev);
            g = step(g, next)?;
        }
        for (l, &want) in target.iter().enumerate().take(target.len() - 1).skip(depth - 1) {
            if want > g.graph.uids[l].len() as u32 {
                let next = g.graph.widen(l as u32 + 1, want, copy_sibling);
                g = step(g, next)?;
            } else if want < g.graph.uids[l].len() as u32 {
                return Err(format!("a new layer {} starts as wide as the layer below it ({}); the target gives it {want}", l + 1, g.graph.uids[l].len()));
            }
        }
        Ok(g)
    }

    /// Ends every bridge: the inserted layers read through the configured connectivity. The
    /// spec keeps naming them, as the job that declared them does.
    pub fn end_bridge(&mut self) {
        self.identity_layers.clear();
    }

    /// A grown graph's spec names what it now is: its uids and the layers still bridging.
    fn sync_spec(&mut self) {
        self.spec.uids = Some(self.uids.clone());
        self.spec.bridge_layers = self.identity_layers.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(layers: &[u32], f: impl FnOnce(&mut TopologySpec)) -> Graph {
        let mut spec = TopologySpec { layers: layers.to_vec(), ..Default::default() };
        f(&mut spec);
        Graph::new(spec).unwrap()
    }

    fn positions(nodes: &[Node]) -> Vec<String> {
        nodes.iter().map(Node::position).collect()
    }

    #[test]
    fn edges_follow_the_connectivity() {
        let full = graph(&[3, 3, 1], |_| {});
        assert_eq!(full.nodes().len(), 7);
        assert!(full.inputs(1, 2).is_empty());
        assert_eq!(positions(&full.inputs(2, 1)), ["L1N1", "L1N2", "L1N3"]);
        assert_eq!(positions(&full.inputs(3, 1)), ["L2N1", "L2N2", "L2N3"]);
        assert_eq!(positions(&full.successors(1, 2)), ["L2N1", "L2N2", "L2N3"]);
        assert!(full.successors(3, 1).is_empty());
        // Ring: node k reads ((k − 1 + j) mod W) + 1 for j < min(sparse_k, W).
        let ring = graph(&[4, 4, 1], |s| s.connectivity = Connectivity::Sparse);
        assert_eq!(positions(&ring.inputs(2, 1)), ["L1N1", "L1N2"]);
        assert_eq!(positions(&ring.inputs(2, 4)), ["L1N1", "L1N4"]);
        assert_eq!(positions(&ring.inputs(3, 1)), ["L2N1", "L2N2"]);
        // Random: seeded, distinct, k of them.
        let random = graph(&[5, 5, 1], |s| {
            s.connectivity = Connectivity::Sparse;
            s.sparse_pattern = SparsePattern::Random;
            s.sparse_k = 3;
            s.graph_seed = 9;
        });
        let picked = random.inputs(2, 2);
        assert_eq!(picked.len(), 3);
        assert_eq!(picked, random.inputs(2, 2));
        assert!(picked.windows(2).all(|w| w[0].index < w[1].index));
        // prev2 adds the layer two below.
        let skip = graph(&[2, 2, 1], |s| s.skip = Skip::Prev2);
        assert_eq!(positions(&skip.inputs(3, 1)), ["L1N1", "L1N2", "L2N1", "L2N2"]);
        let first_only = graph(&[2, 1], |s| s.task_visible = TaskVisible::FirstOnly);
        assert!(first_only.sees_task(1) && !first_only.sees_task(2));
    }

    #[test]
    fn malformed_graphs_name_the_problem() {
        let err = |layers: &[u32]| TopologySpec { layers: layers.to_vec(), ..Default::default() }.validate().unwrap_err().1;
        assert!(err(&[3, 2]).contains("readout and must have width 1, got 2"));
        assert!(err(&[]).contains("at least one layer"));
        assert!(err(&[2, 0, 1]).contains("layer 2 has width 0"));
        assert!(err(&[200, 100, 1]).contains("301 nodes"));
        let sparse = TopologySpec { connectivity: Connectivity::Sparse, sparse_k: 0, ..Default::default() };
        assert_eq!(sparse.validate().unwrap_err().0, "sparse_k");
    }

    #[test]
    fn growth_keeps_uids_and_says_where_new_nodes_start() {
        // [2, 1] → [3, 1]: the new node copies node ((3 − 1) mod 2) + 1 = node 1.
        let g = graph(&[2, 1], |_| {});
        assert_eq!(g.uids, vec![vec![0, 1], vec![2]]);
        let wide = g.widen(1, 3, true).unwrap();
        assert_eq!(wide.graph.uids, vec![vec![0, 1, 3], vec![2]]);
        assert_eq!(wide.inits, vec![(3, Init::Copy(0))]);
        assert_eq!(positions(&wide.graph.inputs(2, 1)), ["L1N1", "L1N2", "L1N3"]);
        // [3, 1] → [3, 3, 1]: a layer before the readout, node k copying node k below, read
        // through identity wiring until the bridge ends; the readout's uid stays, its position moves.
        let deep = wide.graph.deepen(true).unwrap();
        assert_eq!(deep.graph.spec.layers, vec![3, 3, 1]);
        assert_eq!(deep.graph.uids, vec![vec![0, 1, 3], vec![4, 5, 6], vec![2]]);
        assert_eq!(deep.inits, vec![(4, Init::Copy(0)), (5, Init::Copy(1)), (6, Init::Copy(3))]);
        assert_eq!(deep.graph.node(3, 1).uid, 2);
        assert_eq!(positions(&deep.graph.inputs(2, 2)), ["L1N2"]);
        let mut bridged = deep.graph.clone();
        bridged.end_bridge();
        assert_eq!(positions(&bridged.inputs(2, 2)), ["L1N1", "L1N2", "L1N3"]);
        assert_eq!(g.widen(1, 2, true).unwrap_err(), "layer 1 has 2 nodes already; growth only adds");
        assert_eq!(g.widen(2, 2, true).unwrap_err(), "the readout keeps width 1");
        assert_eq!(g.widen(1, 4, false).unwrap().inits, vec![(3, Init::Zero), (4, Init::Zero)]);
        // A grown graph's spec alone rebuilds it: the uids and the bridge go with it.
        assert_eq!(deep.graph.spec.uids, Some(deep.graph.uids.clone()));
        assert_eq!(deep.graph.spec.bridge_layers, vec![2]);
        assert_eq!(Graph::new(deep.graph.spec.clone()).unwrap(), deep.graph);
    }

    #[test]
    fn growing_to_a_target_widens_then_deepens() {
        let g = graph(&[2, 1], |_| {});
        // [2, 1] → [3, 1] → [3, 3, 1], the spec's schedule in one call.
        let grown = g.grow_to(&[3, 3, 1], true, true).unwrap();
        assert_eq!(grown.graph.uids, vec![vec![0, 1, 3], vec![4, 5, 6], vec![2]]);
        // Node 6 copies node 3, itself a copy of node 0.
        assert_eq!(grown.inits, vec![(3, Init::Copy(0)), (4, Init::Copy(0)), (5, Init::Copy(1)), (6, Init::Copy(0))]);
        assert_eq!(grown.graph.identity_layers, vec![2]);
        // Two new layers, the second then widened: copies of copies resolve to old nodes.
        let two = g.grow_to(&[2, 2, 3, 1], true, true).unwrap();
        assert_eq!(two.graph.spec.layers, vec![2, 2, 3, 1]);
        assert_eq!(two.graph.identity_layers, vec![2, 3]);
        assert!(two.inits.iter().all(|(_, i)| matches!(i, Init::Copy(0) | Init::Copy(1))), "{:?}", two.inits);
        assert_eq!(g.grow_to(&[2, 1], true, true).unwrap().graph, g);
        assert!(g.grow_to(&[1, 1], true, true).unwrap_err().contains("growth only adds"));
        assert!(g.grow_to(&[3], true, true).unwrap_err().contains("ending with the readout's 1"));
        assert!(g.grow_to(&[2, 1, 1], true, true).unwrap_err().contains("as wide as the layer below it (2)"));
        assert_eq!(g.grow_to(&[2, 2, 1], true, false).unwrap().inits, vec![(3, Init::Zero), (4, Init::Zero)]);
    }

    #[test]
    fn named_uids_must_cover_every_node_once() {
        let spec =
            |uids: Vec<Vec<u64>>, bridge: Vec<u32>| TopologySpec { layers: vec![2, 2, 1], uids: Some(uids), bridge_layers: bridge, ..Default::default() };
        let g = Graph::new(spec(vec![vec![0, 1], vec![3, 4], vec![2]], vec![2])).unwrap();
        assert_eq!((g.next_uid, g.node(3, 1).uid, g.identity_layers.clone()), (5, 2, vec![2]));
        let err = |s: TopologySpec| s.validate().unwrap_err();
        assert_eq!(err(spec(vec![vec![0, 1], vec![2]], vec![])).0, "uids");
        assert!(err(spec(vec![vec![0, 1], vec![3, 3], vec![2]], vec![])).1.contains("0 to 4 each once"));
        assert!(err(spec(vec![vec![0, 1], vec![5, 4], vec![2]], vec![])).1.contains("0 to 4 each once"));
        assert!(err(spec(vec![vec![0, 1], vec![3, 4], vec![2]], vec![3])).1.contains("layer 3 cannot bridge"));
        assert!(err(spec(vec![vec![0, 1], vec![3, 4], vec![2]], vec![1])).1.contains("layer 1 cannot bridge"));
    }
}
