//! What a method needs of its models' contexts. The coordinator checks it at submit against every
//! model folder (`RoomNeeds`); a rollout worker fits prompts with it (`PromptFit`).
use crate::turn::Role;

/// Whose context a reply must fit in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaker {
    /// Every trained agent.
    Agents,
    /// Frozen model `i` (`[[frozen]]` entry i).
    Frozen(usize),
}

/// A reply that must leave room for a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyRoom {
    pub speaker: Speaker,
    /// The job-file key of its length (`comas.sampling.solver.max_new_tokens`).
    pub key: String,
    /// How a sum with the prompt limit names it (`sampling.solver.max_new_tokens`).
    pub name: String,
    pub new_tokens: u64,
    /// Text every prompt of this reply carries besides the task, with what it is ("2 input
    /// messages of max_msg_tokens 64").
    pub beside: Option<(u64, String)>,
}

/// What a task's prompt shares the trained agents' contexts with.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRoom {
    pub tokens: u64,
    /// What they are, for messages ("sampling.solver.max_new_tokens 256").
    pub why: String,
}

/// A method's needs: its replies must fit, and a task must fit what is left.
#[derive(Debug, Clone, PartialEq)]
pub struct RoomNeeds {
    pub replies: Vec<ReplyRoom>,
    pub task: TaskRoom,
    /// The job's own limit on a prompt, with its key, when it sets one.
    pub prompt_max_len: Option<(u64, String)>,
}

impl RoomNeeds {
    /// One reply length for every trained agent (and no limit of the job's).
    pub fn one_reply(
        key: impl Into<String>,
        name: impl Into<String>,
        new_tokens: u64,
    ) -> RoomNeeds {
        let name = name.into();
        RoomNeeds {
            task: TaskRoom { tokens: new_tokens, why: format!("{name} {new_tokens}") },
            replies: vec![ReplyRoom {
                speaker: Speaker::Agents,
                key: key.into(),
                name,
                new_tokens,
                beside: None,
            }],
            prompt_max_len: None,
        }
    }
}

/// How a worker fits an episode's prompts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptFit {
    /// The job's limit on a prompt's tokens, and the key that sets it.
    pub max_len: Option<(u32, String)>,
    /// Roles whose prompts the episode shortens to fit (CoMAS cuts quoted discussion), with
    /// each role's new tokens; the room is the tightest over `agents`' models. Empty: prompts
    /// are not fitted (one too long fails at admission), messages may still be cut.
    pub fitted: Vec<(Role, u32)>,
    pub agents: Vec<u32>,
}
