//! The four setups of spec §8.2 as one state machine per question.
use super::prompts;
use crate::turn::ChatMessage;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The AutoGen stop word: a reply that contains it ends the conversation (substring test).
pub const TERMINATOR: &str = "TERMINATE";
const CONSISTENCY_SAMPLES: usize = 5;
const DEBATE_AGENTS: usize = 3;
const AUTOGEN_ASSISTANT_TURNS: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Setup {
    /// One call on the query.
    Vanilla,
    /// Five samples and a call that aggregates them.
    Consistency,
    /// Three agents, two rounds, then an aggregation.
    Debate,
    /// An assistant and a mirrored user proxy, at most three assistant turns.
    Autogen,
}

impl Setup {
    pub const ALL: [Setup; 4] = [Setup::Vanilla, Setup::Consistency, Setup::Debate, Setup::Autogen];

    pub fn as_str(self) -> &'static str {
        match self {
            Setup::Vanilla => "vanilla",
            Setup::Consistency => "consistency",
            Setup::Debate => "debate",
            Setup::Autogen => "autogen",
        }
    }
}

impl fmt::Display for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown setup `{0}`: use vanilla, consistency, debate or autogen")]
pub struct UnknownSetup(pub String);

impl FromStr for Setup {
    type Err = UnknownSetup;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Setup::ALL.into_iter().find(|x| x.as_str() == s.to_ascii_lowercase()).ok_or_else(|| UnknownSetup(s.to_string()))
    }
}

/// One chat call a dialogue asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// Position of the call within its dialogue, from 0.
    pub id: u32,
    /// Team member that answers: with several models, member m is played by model m mod count.
    pub member: usize,
    /// What the call is, e.g. `sample 2`, `agent 1 round 0`, `aggregate`, `proxy 1`.
    pub label: String,
    pub messages: Vec<ChatMessage>,
}

/// Where an AutoGen conversation stands.
#[derive(Debug, Clone)]
struct AutogenState {
    assistant: Vec<ChatMessage>,
    proxy: Vec<ChatMessage>,
    assistant_turns: u32,
    last_answer: String,
}

/// One question under one setup.
#[derive(Debug, Clone)]
pub struct Dialogue {
    setup: Setup,
    query: String,
    calls: Vec<Call>,
    replies: Vec<Option<String>>,
    autogen: Option<AutogenState>,
    output: Option<String>,
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage { role: role.to_string(), content: content.to_string() }
}

impl Dialogue {
    pub fn new(setup: Setup, query: impl Into<String>) -> Self {
        Self { setup, query: query.into(), calls: Vec::new(), replies: Vec::new(), autogen: None, output: None }
    }

    pub fn setup(&self) -> Setup {
        self.setup
    }

    /// The graded output, once the dialogue has ended.
    pub fn output(&self) -> Option<&str> {
        self.output.as_deref()
    }

    /// Every call asked for so far, with its reply when it has one.
    pub fn transcript(&self) -> impl Iterator<Item = (&Call, Option<&str>)> {
        self.calls.iter().zip(self.replies.iter().map(Option::as_deref))
    }

    /// The first calls. Call it once.
    pub fn start(&mut self) -> Vec<Call> {
        let q = self.query.clone();
        match self.setup {
            Setup::Vanilla => vec![self.ask(0, "answer", vec![msg("user", &q)])],
            Setup::Consistency => (0..CONSISTENCY_SAMPLES).map(|i| self.ask(i, &format!("sample {}", i + 1), vec![msg("user", &q)])).collect(),
            Setup::Debate => {
                let opening = prompts::debate_opening(&q);
                (0..DEBATE_AGENTS).map(|i| self.ask(i, &format!("agent {} round 0", i + 1), vec![msg("user", &opening)])).collect()
            }
            Setup::Autogen => {
                let assistant = vec![msg("system", &prompts::autogen_assistant(TERMINATOR)), msg("user", &q)];
                // The proxy is the same model with an empty system message, its roles mirrored:
                // the query is its own (assistant) turn and the assistant's replies reach it as user turns.
                let proxy = vec![msg("system", ""), msg("assistant", &q)];
                self.autogen = Some(AutogenState { assistant: assistant.clone(), proxy, assistant_turns: 1, last_answer: String::new() });
                vec![self.ask(0, "assistant 1", assistant)]
            }
        }
    }

    fn ask(&mut self, member: usize, label: &str, messages: Vec<ChatMessage>) -> Call {
        let call = Call { id: self.calls.len() as u32, member, label: label.to_string(), messages };
        self.calls.push(call.clone());
        self.replies.push(None);
        call
    }

    fn reply(&self, id: usize) -> &str {
        self.replies[id].as_deref().unwrap_or_default()
    }

    fn all_replied(&self, ids: std::ops::Range<usize>) -> bool {
        ids.clone().all(|i| self.replies.get(i).is_some_and(Option::is_some))
    }

    /// Takes the reply to call `id` and returns the calls it unlocks (none once the dialogue has
    /// ended). A reply to an unknown call, or a second reply, is an error.
    pub fn deliver(&mut self, id: u32, reply: impl Into<String>) -> Result<Vec<Call>, DialogueError> {
        let slot = self.replies.get_mut(id as usize).ok_or(DialogueError::UnknownCall(id))?;
        if slot.is_some() {
            return Err(DialogueError::Answered(id));
        }
        *slot = Some(reply.into());
        let q = self.query.clone();
        let id = id as usize;
        Ok(match self.setup {
            Setup::Vanilla => {
                self.output = Some(self.reply(0).to_string());
                Vec::new()
            }
            Setup::Consistency => {
                let n = CONSISTENCY_SAMPLES;
                if id < n && self.all_replied(0..n) {
                    let samples: Vec<&str> = (0..n).map(|i| self.reply(i)).collect();
                    let text = prompts::consistency_aggregate(&q, &samples);
                    vec![self.ask(0, "aggregate", vec![msg("user", &text)])]
                } else {
                    if id == n {
                        self.output = Some(self.reply(n).to_string());
                    }
                    Vec::new()
                }
            }
            Setup::Debate => {
                let n = DEBATE_AGENTS;
                if id < n && self.all_replied(0..n) {
                    let opening = prompts::debate_opening(&q);
                    let firsts: Vec<String> = (0..n).map(|i| self.reply(i).to_string()).collect();
                    (0..n)
                        .map(|i| {
                            let others: Vec<&str> = (0..n).filter(|&j| j != i).map(|j| firsts[j].as_str()).collect();
                            let history = vec![msg("user", &opening), msg("assistant", &firsts[i]), msg("user", &prompts::debate_rebuttal(&q, &others))];
                            self.ask(i, &format!("agent {} round 1", i + 1), history)
                        })
                        .collect()
                } else if (n..2 * n).contains(&id) && self.all_replied(n..2 * n) {
                    let finals: Vec<&str> = (n..2 * n).map(|i| self.reply(i)).collect();
                    let text = prompts::debate_aggregate(&q, &finals);
                    vec![self.ask(0, "aggregate", vec![msg("user", &text)])]
                } else {
                    if id == 2 * n {
                        self.output = Some(self.reply(id).to_string());
                    }
                    Vec::new()
                }
            }
            Setup::Autogen => self.autogen_step(id),
        })
    }

    fn autogen_step(&mut self, id: usize) -> Vec<Call> {
        let reply = self.reply(id).to_string();
        let mut st = self.autogen.take().expect("an AutoGen dialogue has its state from start");
        let is_assistant = self.calls[id].member == 0;
        let next = if is_assistant {
            st.assistant.push(msg("assistant", &reply));
            st.last_answer = reply.clone();
            if reply.contains(TERMINATOR) || st.assistant_turns >= AUTOGEN_ASSISTANT_TURNS {
                self.output = Some(reply);
                Vec::new()
            } else {
                st.proxy.push(msg("user", &reply));
                let label = format!("proxy {}", st.assistant_turns);
                vec![self.ask(1, &label, st.proxy.clone())]
            }
        } else {
            st.proxy.push(msg("assistant", &reply));
            if reply.contains(TERMINATOR) {
                self.output = Some(st.last_answer.clone());
                Vec::new()
            } else {
                st.assistant.push(msg("user", &reply));
                st.assistant_turns += 1;
                let label = format!("assistant {}", st.assistant_turns);
                vec![self.ask(0, &label, st.assistant.clone())]
            }
        };
        self.autogen = Some(st);
        next
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DialogueError {
    #[error("the dialogue asked for no call {0}")]
    UnknownCall(u32),
    #[error("call {0} already has its reply")]
    Answered(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a dialogue to its end, answering each call with `answer(call)`; returns the calls made.
    fn run(setup: Setup, answer: impl Fn(&Call) -> String) -> (Dialogue, Vec<Call>) {
        let mut d = Dialogue::new(setup, "What is 2 + 3?");
        let mut pending = d.start();
        let mut all = Vec::new();
        while let Some(call) = pending.pop() {
            let more = d.deliver(call.id, answer(&call)).unwrap();
            all.push(call);
            pending.extend(more);
        }
        all.sort_by_key(|c| c.id);
        (d, all)
    }

    #[test]
    fn vanilla_is_one_call_on_the_query() {
        let (d, calls) = run(Setup::Vanilla, |_| "\\boxed{5}".into());
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].messages, vec![msg("user", "What is 2 + 3?")]);
        assert_eq!(d.output(), Some("\\boxed{5}"));
    }

    #[test]
    fn consistency_aggregates_five_samples_in_order() {
        let (d, calls) = run(Setup::Consistency, |c| if c.label == "aggregate" { "final".into() } else { format!("r{}", c.id + 1) });
        assert_eq!(calls.len(), 6);
        assert!(calls[..5].iter().all(|c| c.messages == vec![msg("user", "What is 2 + 3?")]));
        let agg = &calls[5].messages[0].content;
        assert!(agg.starts_with("[Task]:\nWhat is 2 + 3?\n\n[Solution 1]:\nr1\n\n[Solution 2]:\nr2\n\n"), "{agg}");
        assert!(agg.contains("[Solution 5]:\nr5\n\n"));
        assert_eq!(calls.iter().map(|c| c.member).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 0]);
        assert_eq!(d.output(), Some("final"));
    }

    #[test]
    fn debate_gives_each_agent_its_own_history_and_the_others_answers() {
        let (d, calls) = run(Setup::Debate, |c| format!("{} says", c.label));
        assert_eq!(calls.len(), 7);
        let second = &calls[4]; // agent 2, round 1
        assert_eq!(second.label, "agent 2 round 1");
        assert_eq!(second.messages.len(), 3);
        assert_eq!(second.messages[1], msg("assistant", "agent 2 round 0 says"));
        let rebuttal = &second.messages[2].content;
        assert!(rebuttal.contains("```\nagent 1 round 0 says\n```") && rebuttal.contains("```\nagent 3 round 0 says\n```"));
        assert!(!rebuttal.contains("agent 2 round 0"), "an agent is not shown its own answer");
        assert!(rebuttal.ends_with("What is 2 + 3?"), "the problem is repeated");
        let agg = &calls[6].messages[0].content;
        assert!(agg.starts_with("Task:\nWhat is 2 + 3?\n\nSolution 1:\nagent 1 round 1 says\n\n"), "{agg}");
        assert_eq!(d.output(), Some("aggregate says"));
    }

    #[test]
    fn autogen_stops_at_the_terminator_or_after_three_assistant_turns() {
        // Nobody terminates: assistant, proxy, assistant, proxy, assistant.
        let (d, calls) = run(Setup::Autogen, |c| format!("{} reply", c.label));
        let labels: Vec<&str> = calls.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, vec!["assistant 1", "proxy 1", "assistant 2", "proxy 2", "assistant 3"]);
        assert_eq!(d.output(), Some("assistant 3 reply"));
        // The proxy's history: empty system message, the query as its own turn, replies as user turns.
        let proxy2 = &calls[3].messages;
        assert_eq!(proxy2[0], msg("system", ""));
        assert_eq!(proxy2[1], msg("assistant", "What is 2 + 3?"));
        assert_eq!(proxy2[2], msg("user", "assistant 1 reply"));
        assert_eq!(proxy2[3], msg("assistant", "proxy 1 reply"));
        assert_eq!(proxy2[4], msg("user", "assistant 2 reply"));
        let assistant3 = &calls[4].messages;
        assert_eq!(assistant3.len(), 6, "system, query, a1, u1, a2, u2");
        assert_eq!(assistant3[5], msg("user", "proxy 2 reply"));

        // The assistant terminates at once.
        let (d, calls) = run(Setup::Autogen, |_| "\\boxed{5} TERMINATE".into());
        assert_eq!(calls.len(), 1);
        assert_eq!(d.output(), Some("\\boxed{5} TERMINATE"));
        // The proxy terminates: the previous answer is the output.
        let (d, calls) = run(Setup::Autogen, |c| if c.member == 1 { "TERMINATE".into() } else { format!("{} answer", c.label) });
        assert_eq!(calls.len(), 2);
        assert_eq!(d.output(), Some("assistant 1 answer"));
    }

    #[test]
    fn a_reply_to_an_unknown_or_answered_call_is_refused() {
        let mut d = Dialogue::new(Setup::Consistency, "q");
        d.start();
        assert_eq!(d.deliver(9, "x").unwrap_err(), DialogueError::UnknownCall(9));
        assert!(d.deliver(0, "x").unwrap().is_empty());
        assert_eq!(d.deliver(0, "y").unwrap_err(), DialogueError::Answered(0));
        assert_eq!("Debate".parse::<Setup>().unwrap(), Setup::Debate);
        assert!("chain".parse::<Setup>().is_err());
    }
}
