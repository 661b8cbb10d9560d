//! What can go wrong on the engine thread: loading policies, swapping in weights, running an
//! episode. The messages are what the coordinator and the user read, so they say what to fix.
use comas_model::ModelError;
use comas_workflow::{Role, WorkflowError};
use std::sync::Arc;
use tonic::Status;

// Underlying errors go into the message rather than `source()` (as in `ModelError`), so
// printing the error chain does not repeat them.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// LoadPolicies failed; the policies loaded before stay.
    #[error(transparent)]
    Load(ModelError),
    #[error("{running} episodes are running; finish or cancel them before loading policies")]
    EpisodesRunning { running: usize },
    #[error(
        "agent {agent} is a frozen model behind an endpoint; it has no weights here to update"
    )]
    RemoteAgent { agent: u32 },
    #[error("agent {agent} is not loaded on this worker")]
    AgentNotLoaded { agent: u32 },
    /// An episode names an agent this worker has not loaded.
    #[error("agent {agent} is not loaded on this worker (LoadPolicies first)")]
    EpisodeAgentNotLoaded { agent: u32 },
    /// `Models::apply_update` for an agent it does not hold.
    #[error("agent {agent} is not loaded here")]
    NoPolicy { agent: u32 },
    #[error("agent {agent} shares its base model with other agents; load it with full_weights to update it")]
    SharedBase { agent: u32 },
    #[error("update for agent {agent} has {got} tensors, the policy has {want}")]
    TensorCount { agent: u32, got: usize, want: usize },
    #[error("update for agent {agent} lacks tensor `{name}`")]
    MissingTensor { agent: u32, name: String },
    #[error("tensor `{name}`: update has shape {update:?}, policy has {policy:?}")]
    ShapeMismatch { name: String, update: Vec<i64>, policy: Vec<i64> },
    #[error("tensor `{name}`: {err}")]
    BadDtype { name: String, err: ModelError },
    #[error("tensor `{name}`: {err}")]
    BadTensor { name: String, err: tch::TchError },
    /// The copy into the policy's tensors failed (libtorch's error; everything was checked).
    #[error("update for agent {agent}: {err}")]
    CopyFailed { agent: u32, err: tch::TchError },
    #[error("worker is draining; send this episode elsewhere")]
    Draining,
    #[error("cancelled by the coordinator")]
    Cancelled,
    #[error("invalid episode: {0}")]
    InvalidEpisode(WorkflowError),
    #[error("turn {turn} could not start: {err}")]
    TurnNotStarted { turn: u32, err: ModelError },
    /// The turn's prompt does not fit: `why` says which limit it passes.
    #[error("turn {turn} ({role}, round {round}, agent {agent}): {why}")]
    NoRoom { turn: u32, role: Role, round: u32, agent: u32, why: String },
    #[error("protocol rejected the turns: {0}")]
    ProtocolRejected(WorkflowError),
    /// The finished program would not give its record.
    #[error(transparent)]
    Finish(WorkflowError),
    #[error(transparent)]
    RecordJson(serde_json::Error),
    /// A failed decode step fails every episode of its batch, so they share the error.
    #[error("decode failed: {0}")]
    DecodeFailed(Arc<ModelError>),
    /// The vLLM server behind this worker failed a turn, a swap or its start.
    #[error(transparent)]
    Vllm(#[from] crate::vllm::VllmError),
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        EngineError::Load(e)
    }
}

impl EngineError {
    /// Not the episode's fault: the worker is going away, so it is sent elsewhere.
    pub fn is_draining(&self) -> bool {
        matches!(self, EngineError::Draining)
    }
}

/// How LoadPolicies and UpdateWeights report an engine error. Episodes still running pass
/// (they finish, or stop once their stream is seen gone), so that one says UNAVAILABLE: the
/// coordinator asks again.
impl From<EngineError> for Status {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::EpisodesRunning { .. } => Status::unavailable(e.to_string()),
            e => Status::failed_precondition(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The coordinator and the tests read these messages: they are the ones the worker sent as
    // plain strings before it had this type.
    #[test]
    fn messages_are_the_workers_words() {
        let cases = [
            (EngineError::AgentNotLoaded { agent: 2 }, "agent 2 is not loaded on this worker"),
            (
                EngineError::ShapeMismatch {
                    name: "w".into(),
                    update: vec![2, 3],
                    policy: vec![3],
                },
                "tensor `w`: update has shape [2, 3], policy has [3]",
            ),
            (
                EngineError::TensorCount { agent: 1, got: 3, want: 4 },
                "update for agent 1 has 3 tensors, the policy has 4",
            ),
            (
                EngineError::NoRoom {
                    turn: 4,
                    role: Role::Solver,
                    round: 1,
                    agent: 0,
                    why: "too long".into(),
                },
                "turn 4 (solver, round 1, agent 0): too long",
            ),
            (
                EngineError::DecodeFailed(Arc::new(ModelError::Input("x".into()))),
                "decode failed: invalid input: x",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.to_string(), want);
        }
        assert!(EngineError::Draining.is_draining());
        let status = Status::from(EngineError::SharedBase { agent: 1 });
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        // Passing: the coordinator asks again.
        let status = Status::from(EngineError::EpisodesRunning { running: 3 });
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }
}
