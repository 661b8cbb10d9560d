//! One rollout of a NeuroMAS graph on a task (spec neuromas.md §5): layer-synchronous, every node
//! of a layer at once as soon as the layer below has spoken; the readout's answer is the
//! rollout's. The record keeps each node's full completion (what trains) and its message (what
//! the successors read).
use crate::method::RecordFault;
use super::config::NeuromasConfig;
use super::prompts::{node_prompt, Message};
use super::topology::{Graph, Node};
use crate::error::WorkflowError;
use crate::program::{take_replies, PolicyTurn, Reply, Request};
use crate::seed::{derive_seed, tag};
use crate::task::TaskRecord;
use crate::turn::{ChatMessage, PromptMeter, Role, Sampled, TurnOutput, TurnRequest};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeTurn {
    /// The node's place in position order (layer by layer): unique in the rollout.
    pub turn_index: u32,
    pub node: Node,
    pub agent: u32,
    #[serde(flatten)]
    pub sampled: Sampled,
    pub text: String,
    pub message: Message,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeuromasTrajectory {
    pub task: TaskRecord,
    /// Which of the task's G rollouts this is.
    pub instance: u32,
    pub graph: Graph,
    /// In position order.
    pub turns: Vec<NodeTurn>,
}

/// A node's role: the readout gives the answer, the others pass messages.
pub fn role_of(graph: &Graph, node: Node) -> Role {
    if node.layer == graph.depth() {
        Role::Readout
    } else {
        Role::Node
    }
}

impl NeuromasTrajectory {
    pub fn policy_turns(&self) -> Vec<PolicyTurn> {
        self.turns
            .iter()
            .map(|t| PolicyTurn { turn_index: t.turn_index, agent: t.agent, role: role_of(&self.graph, t.node), policy_version: t.sampled.policy_version })
            .collect()
    }

    pub fn completion_tokens(&self) -> u64 {
        self.turns.iter().map(|t| t.sampled.completion_ids.len() as u64).sum()
    }

    /// The readout's turn.
    pub fn readout(&self) -> Option<&NodeTurn> {
        self.turns.last().filter(|t| t.node.layer == self.graph.depth())
    }

    /// Checks what a worker could get wrong: one turn per node in position order, each by the
    /// node's adapter, log-probs for every token.
    pub fn validate(&self, cfg: &NeuromasConfig) -> Result<(), RecordFault> {
        // The job's graph, with its bridges either still in place or ended.
        let job = cfg.graph().map_err(|(k, m)| RecordFault::Shape(format!("neuromas.{k}: {m}")))?;
        let bridges_ok = self.graph.identity_layers.is_empty() || self.graph.identity_layers == job.identity_layers;
        if self.graph.spec != cfg.topology || self.graph.uids != job.uids || self.graph.next_uid != job.next_uid || !bridges_ok {
            return Err(RecordFault::Shape("the record's graph is not the job's topology".into()));
        }
        let nodes = self.graph.nodes();
        if self.turns.len() != nodes.len() {
            return Err(format!("{} node turns for a graph of {} nodes", self.turns.len(), nodes.len()).into());
        }
        for (i, (t, n)) in self.turns.iter().zip(&nodes).enumerate() {
            if (t.turn_index, t.node) != (i as u32, *n) {
                return Err(format!("turn {i} is node {} (index {}), expected {}", t.node.position(), t.turn_index, n.position()).into());
            }
            if t.agent != cfg.agent_of(*n) {
                return Err(format!("node {} was played by agent {}, its adapter is agent {}", n.position(), t.agent, cfg.agent_of(*n)).into());
            }
            t.sampled.check().map_err(|f| RecordFault::turn(format!("node {}", n.position()), f))?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Episode {
    config: NeuromasConfig,
    graph: Graph,
    nodes: Vec<Node>,
    task: TaskRecord,
    instance: u32,
    seed: u64,
    turns: Vec<NodeTurn>,
    pending: Vec<Request>,
}

impl Episode {
    pub fn new(config: &NeuromasConfig, graph: &Graph, task: &TaskRecord, instance: u32, seed: u64) -> Result<Self, WorkflowError> {
        config.validate().map_err(|(k, m)| WorkflowError::MalformedTrajectory(format!("neuromas.{k}: {m}")))?;
        let mut e = Episode {
            config: config.clone(),
            graph: graph.clone(),
            nodes: graph.nodes(),
            task: task.clone(),
            instance,
            seed,
            turns: Vec::new(),
            pending: Vec::new(),
        };
        e.open()?;
        Ok(e)
    }

    pub fn pending(&self) -> &[Request] {
        &self.pending
    }

    pub fn is_done(&self) -> bool {
        self.turns.len() == self.nodes.len()
    }

    fn request(&self, turn_index: usize) -> Result<Request, WorkflowError> {
        let node = self.nodes[turn_index];
        let said = |n: Node| self.turns.iter().find(|t| t.node == n).map(|t| t.message.clone());
        let prompt = node_prompt(&self.graph, node, &self.task.prompt, &said).map_err(WorkflowError::MalformedTrajectory)?;
        Ok(Request::Turn(TurnRequest {
            turn_index: turn_index as u32,
            agent: self.config.agent_of(node),
            role: role_of(&self.graph, node),
            round: node.layer - 1,
            slot: node.index - 1,
            judge_index: 0,
            about_solution: None,
            about_evaluation: None,
            messages: vec![ChatMessage::user(prompt)],
            sampling: self.config.sampling_of(&self.graph, node).clone(),
            seed: derive_seed(&[self.seed, tag::TURN_SAMPLING, turn_index as u64]),
            blocks_cut: 0,
        }))
    }

    /// The next layer's nodes, all at once.
    fn open(&mut self) -> Result<(), WorkflowError> {
        let next = self.turns.len();
        self.pending = match self.nodes.get(next) {
            None => Vec::new(),
            Some(first) => (next..self.nodes.len()).take_while(|&i| self.nodes[i].layer == first.layer).map(|i| self.request(i)).collect::<Result<_, _>>()?,
        };
        Ok(())
    }

    /// Takes a layer's replies; `meter` cuts each message to `max_msg_tokens`.
    pub fn submit(&mut self, replies: Vec<Reply>, meter: &dyn PromptMeter) -> Result<(), WorkflowError> {
        let replies = take_replies(&self.pending, replies)?;
        for reply in replies {
            let Reply::Turn(out) = reply else {
                return Err(WorkflowError::MalformedTurn { turn_index: 0, message: "a NeuroMAS graph runs no tools".into() });
            };
            self.record(out, meter);
        }
        self.open()
    }

    fn record(&mut self, out: TurnOutput, meter: &dyn PromptMeter) {
        let node = self.nodes[out.turn_index as usize];
        let agent = self.config.agent_of(node);
        let budget = self.config.max_msg_tokens;
        let message = Message::of(&out.text, |text| meter.cut(agent, text, budget));
        let turn_index = out.turn_index;
        let (sampled, text) = Sampled::split(out);
        self.turns.push(NodeTurn { turn_index, node, agent, sampled, text, message });
    }

    pub fn into_trajectory(self) -> Result<NeuromasTrajectory, WorkflowError> {
        if !self.is_done() {
            return Err(WorkflowError::MalformedTrajectory(format!("the rollout stopped after {} of {} nodes", self.turns.len(), self.nodes.len())));
        }
        Ok(NeuromasTrajectory { task: self.task, instance: self.instance, graph: self.graph, turns: self.turns })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neuromas::topology::TopologySpec;
    use crate::task::TaskKind;
    use crate::turn::FinishReason;

    /// Cuts by whitespace-separated words, standing in for a tokenizer.
    struct Words;

    impl PromptMeter for Words {
        fn fits(&self, _: Role, _: &str) -> bool {
            true
        }

        fn cut(&self, _: u32, text: &str, max_tokens: u32) -> Option<String> {
            let w: Vec<&str> = text.split_whitespace().collect();
            (w.len() > max_tokens as usize).then(|| w[..max_tokens as usize].join(" "))
        }
    }

    fn reply(r: &Request, text: &str) -> Reply {
        let Request::Turn(t) = r else { panic!("a tool request") };
        Reply::Turn(TurnOutput {
            turn_index: t.turn_index,
            text: text.into(),
            raw_text: text.into(),
            prompt_ids: vec![1, 2],
            completion_ids: vec![7; 3],
            logprobs: vec![-0.5; 3],
            finish_reason: FinishReason::Stop,
            policy_version: 4,
            constrained: Vec::new(),
        })
    }

    #[test]
    fn a_rollout_runs_layer_by_layer_and_passes_cut_messages_on() {
        let cfg =
            NeuromasConfig { topology: TopologySpec { layers: vec![3, 2, 1], ..TopologySpec::default() }, max_msg_tokens: 4, ..NeuromasConfig::default() };
        let graph = Graph::new(cfg.topology.clone()).unwrap();
        let task =
            TaskRecord { prompt: "What is 3 + 4?".into(), answer: "7".into(), task: TaskKind::Math, id: "q".into(), source: None, files: Default::default() };
        let mut e = Episode::new(&cfg, &graph, &task, 1, 9).unwrap();
        let mut calls_per_layer = Vec::new();
        while !e.is_done() {
            let pending = e.pending().to_vec();
            calls_per_layer.push(pending.len());
            let replies =
                pending.iter().map(|r| reply(r, &format!("<think>hidden</think>note from turn {} with extra words", turn_of(r).turn_index))).collect();
            e.submit(replies, &Words).unwrap();
        }
        assert_eq!(calls_per_layer, vec![3, 2, 1]);
        let t = e.into_trajectory().unwrap();
        t.validate(&cfg).unwrap();
        let mut other = cfg.clone();
        other.topology.layers = vec![3, 1];
        assert_eq!(t.validate(&other).unwrap_err(), RecordFault::Shape("the record's graph is not the job's topology".into()));
        assert_eq!(t.turns[0].message, Message { text: "note from turn 0".into(), truncated: true });
        // Training keeps the full completion; the message is only the view passed on.
        assert_eq!(t.turns[0].text, "<think>hidden</think>note from turn 0 with extra words");
        assert_eq!(t.policy_turns().iter().map(|p| (p.agent, p.role)).collect::<Vec<_>>()[4..], [(4, Role::Node), (5, Role::Readout)]);
        assert_eq!(t.completion_tokens(), 18);
    }

    fn turn_of(r: &Request) -> &TurnRequest {
        match r {
            Request::Turn(t) => t,
            Request::Tool(_) => panic!("a tool request"),
        }
    }

    #[test]
    fn the_readout_sees_the_messages_of_its_inputs_and_seeds_differ_per_node() {
        let readout_sampling =
            Some(crate::turn::SamplingSpec { max_new_tokens: 48, guided_suffix: Some("\\\\boxed\\{[0-9]+\\}".into()), ..Default::default() });
        let cfg = NeuromasConfig { topology: TopologySpec { layers: vec![2, 1], ..TopologySpec::default() }, readout_sampling, ..NeuromasConfig::default() };
        let graph = Graph::new(cfg.topology.clone()).unwrap();
        let task = TaskRecord { prompt: "2 + 2?".into(), answer: "4".into(), task: TaskKind::Math, id: "q".into(), source: None, files: Default::default() };
        let mut e = Episode::new(&cfg, &graph, &task, 0, 3).unwrap();
        let first = e.pending().to_vec();
        assert_ne!(turn_of(&first[0]).seed, turn_of(&first[1]).seed);
        e.submit(vec![reply(&first[1], "It is four."), reply(&first[0], "")], &Words).unwrap();
        let readout = turn_of(&e.pending()[0]).clone();
        let prompt = &readout.messages[0].content;
        assert!(prompt.contains("[L1N1]\n(no message)\n\n[L1N2]\nIt is four."), "{prompt}");
        assert_eq!((readout.role, readout.agent, readout.round), (Role::Readout, 2, 1));
        // The readout samples with its own settings, the other nodes with the common ones.
        assert_eq!((readout.sampling.max_new_tokens, turn_of(&first[0]).sampling.max_new_tokens), (48, 1024));
        let err = e.submit(vec![], &Words).unwrap_err();
        assert!(matches!(err, WorkflowError::MissingTurns(ref t) if t == &vec![2]), "{err:?}");
    }
}
