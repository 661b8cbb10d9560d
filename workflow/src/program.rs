//! What an episode program exchanges with a worker. A method's episode (`Program`) hands out
//! groups of `Request`s (generations for a policy or a frozen model, and tool runs), takes the
//! whole group's `Reply`s back, and ends with a `Record` that the coordinator turns into
//! rewards. The worker drives any program the same way; it never needs to know the method.
//! The programs, starts and records of every method are the registry's (`crate::registry`).
use crate::error::WorkflowError;
use crate::tool::{ToolRequest, ToolResult};
use crate::turn::{check_constrained, Role, TurnOutput, TurnRequest};
use serde::{Deserialize, Serialize};

pub use crate::registry::{MethodConfig, Program, ProgramStart, Record};

/// An effect a program needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// A generation by agent `agent` (a trained policy or a frozen model).
    Turn(TurnRequest),
    /// A program run in the sandbox.
    Tool(ToolRequest),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Turn(TurnOutput),
    Tool(ToolResult),
}

impl Request {
    /// The index a reply must carry: a turn index or a call index (each unique in its episode).
    fn key(&self) -> (bool, u32) {
        match self {
            Request::Turn(t) => (true, t.turn_index),
            Request::Tool(t) => (false, t.call_index),
        }
    }
}

impl Reply {
    fn key(&self) -> (bool, u32) {
        match self {
            Reply::Turn(t) => (true, t.turn_index),
            Reply::Tool(t) => (false, t.call_index),
        }
    }
}

/// The replies in the order of `pending`, if they answer every request exactly once and each
/// generation is well formed.
pub fn take_replies(pending: &[Request], replies: Vec<Reply>) -> Result<Vec<Reply>, WorkflowError> {
    let mut slots: Vec<Option<Reply>> = pending.iter().map(|_| None).collect();
    for reply in replies {
        let key = reply.key();
        let Some(i) = pending.iter().position(|r| r.key() == key) else {
            return Err(WorkflowError::MalformedTurn {
                turn_index: key.1,
                message: format!(
                    "no pending {} has this index",
                    if key.0 { "turn" } else { "tool call" }
                ),
            });
        };
        if slots[i].is_some() {
            return Err(WorkflowError::DuplicateTurn(key.1));
        }
        if let Reply::Turn(out) = &reply {
            if out.logprobs.len() != out.completion_ids.len() {
                return Err(WorkflowError::LogprobCount {
                    turn_index: out.turn_index,
                    logprobs: out.logprobs.len(),
                    tokens: out.completion_ids.len(),
                });
            }
            check_constrained(&out.constrained, &out.completion_ids).map_err(|fault| {
                WorkflowError::MalformedTurn {
                    turn_index: out.turn_index,
                    message: fault.to_string(),
                }
            })?;
        }
        slots[i] = Some(reply);
    }
    let missing: Vec<u32> =
        pending.iter().zip(&slots).filter(|(_, s)| s.is_none()).map(|(r, _)| r.key().1).collect();
    if !missing.is_empty() {
        return Err(WorkflowError::MissingTurns(missing));
    }
    Ok(slots.into_iter().flatten().collect())
}

/// A turn of a trained agent, as the version check sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyTurn {
    pub turn_index: u32,
    pub agent: u32,
    pub role: Role,
    pub policy_version: u64,
}
