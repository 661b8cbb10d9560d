//! What a node is told and what it passes on (spec neuromas.md §3), in our own words. A node
//! learns only where it sits: its layer and index, which nodes feed it and which read it. No
//! role name and no hint of a specialisation; what the messages say is left to training.
use super::topology::{Graph, Node};

/// Sent in place of a message that is empty once thinking is removed.
pub const NO_MESSAGE: &str = "(no message)";
/// Default of `max_msg_tokens`.
pub const DEFAULT_MAX_MSG_TOKENS: u32 = 512;

/// What a node passes downstream: its completion without thinking, cut to the message budget.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub text: String,
    /// Cut to `max_msg_tokens`.
    pub truncated: bool,
}

impl Message {
    /// The message of a completion. `cut` gives the text's first `max_tokens` tokens when it
    /// has more (the worker's tokenizer; `None`: it fits).
    pub fn of(completion: &str, cut: impl FnOnce(&str) -> Option<String>) -> Message {
        let text = crate::turn::without_thinking(completion);
        let (text, truncated) = match cut(&text) {
            Some(short) => (short.trim_end().to_string(), true),
            None => (text, false),
        };
        Message { text, truncated }
    }

    /// As the successors read it.
    pub fn shown(&self) -> &str {
        if self.text.trim().is_empty() {
            NO_MESSAGE
        } else {
            &self.text
        }
    }
}

fn ids(nodes: &[Node]) -> String {
    nodes.iter().map(Node::position).collect::<Vec<_>>().join(", ")
}

/// The position block: where the node is, who feeds it, who reads it.
pub fn position_block(graph: &Graph, node: Node) -> String {
    let width = graph.uids[node.layer as usize - 1].len();
    let inputs = graph.inputs(node.layer, node.index);
    let from = if inputs.is_empty() { "the task only".to_string() } else { ids(&inputs) };
    let to = if node.layer == graph.depth() { "final readout".to_string() } else { ids(&graph.successors(node.layer, node.index)) };
    format!(
        "You are node {pos} of a network of language-model nodes: layer {l} of {depth}, node {k} of {width}.\nYour inputs come from: {from}.\nYour output goes to: {to}.",
        pos = node.position(),
        l = node.layer,
        depth = graph.depth(),
        k = node.index,
    )
}

/// The user message of `node`: position, the task if this layer sees it, its inputs in a fixed
/// order (by layer, then index), and the instruction. `messages` maps an input node to what it
/// sent; every input must be there.
pub fn node_prompt(graph: &Graph, node: Node, task: &str, messages: &dyn Fn(Node) -> Option<Message>) -> Result<String, String> {
    let mut out = position_block(graph, node);
    if graph.sees_task(node.layer) {
        out.push_str(&format!("\n\nTask:\n{task}"));
    }
    let mut inputs = graph.inputs(node.layer, node.index);
    inputs.sort_by_key(|n| (n.layer, n.index));
    if !inputs.is_empty() {
        out.push_str("\n\nMessages from your inputs:");
        for n in inputs {
            let m = messages(n).ok_or_else(|| format!("node {} reads {}, which has not spoken", node.position(), n.position()))?;
            out.push_str(&format!("\n\n[{}]\n{}", n.position(), m.shown()));
        }
    }
    out.push_str("\n\n");
    if node.layer == graph.depth() {
        out.push_str("You give the final answer. Put it in \\boxed{} at the end of your reply.");
    } else {
        out.push_str("Write the message that will best help the nodes after you reach a correct final answer. What it contains is up to you.");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neuromas::topology::{Connectivity, TaskVisible, TopologySpec};

    fn graph(layers: &[u32], f: impl FnOnce(&mut TopologySpec)) -> Graph {
        let mut spec = TopologySpec { layers: layers.to_vec(), ..TopologySpec::default() };
        f(&mut spec);
        Graph::new(spec).unwrap()
    }

    #[test]
    fn a_node_is_told_its_position_its_inputs_in_order_and_nothing_of_a_role() {
        let g = graph(&[2, 2, 1], |_| {});
        let said = |n: Node| Some(Message { text: format!("from {}", n.position()), truncated: false });
        let p = node_prompt(&g, g.node(2, 2), "What is 3 + 4?", &said).unwrap();
        assert_eq!(
            p,
            "You are node L2N2 of a network of language-model nodes: layer 2 of 3, node 2 of 2.\nYour inputs come from: L1N1, L1N2.\nYour output goes to: L3N1.\
             \n\nTask:\nWhat is 3 + 4?\n\nMessages from your inputs:\n\n[L1N1]\nfrom L1N1\n\n[L1N2]\nfrom L1N2\n\n\
             Write the message that will best help the nodes after you reach a correct final answer. What it contains is up to you."
        );
        for role in ["planner", "critic", "solver", "verifier"] {
            assert!(!p.to_lowercase().contains(role));
        }
        let first = node_prompt(&g, g.node(1, 1), "T", &said).unwrap();
        assert!(first.contains("Your inputs come from: the task only.") && !first.contains("Messages from"), "{first}");
        let readout = node_prompt(&g, g.node(3, 1), "T", &said).unwrap();
        assert!(readout.contains("Your output goes to: final readout.") && readout.ends_with("at the end of your reply."), "{readout}");
    }

    #[test]
    fn hidden_tasks_sparse_inputs_and_missing_or_empty_messages() {
        let g = graph(&[3, 3, 1], |s| {
            s.task_visible = TaskVisible::FirstOnly;
            s.connectivity = Connectivity::Sparse;
            s.sparse_k = 2;
        });
        let said = |n: Node| Some(Message { text: if n.index == 3 { "  ".into() } else { "x".into() }, truncated: false });
        let p = node_prompt(&g, g.node(2, 2), "secret task", &said).unwrap();
        assert!(!p.contains("secret task"), "{p}");
        // Ring wiring: node 2 reads nodes 2 and 3 below; node 3's blank message is shown as such.
        assert!(p.contains("Your inputs come from: L1N2, L1N3.") && p.contains("[L1N3]\n(no message)"), "{p}");
        let err = node_prompt(&g, g.node(3, 1), "t", &|n: Node| (n.index != 2).then(|| Message { text: "x".into(), truncated: false })).unwrap_err();
        assert_eq!(err, "node L3N1 reads L2N2, which has not spoken");
    }

    #[test]
    fn a_message_drops_thinking_and_is_cut_to_its_budget() {
        let m = Message::of("<think>long reasoning</think> The sum is 7.", |_| None);
        assert_eq!(m, Message { text: "The sum is 7.".into(), truncated: false });
        let words = |t: &str| {
            let w: Vec<&str> = t.split_whitespace().collect();
            (w.len() > 2).then(|| w[..2].join(" ") + " ")
        };
        assert_eq!(Message::of("one two three", words), Message { text: "one two".into(), truncated: true });
        assert_eq!(Message::of("<think>only thinking</think>", |_| None).shown(), NO_MESSAGE);
    }
}
