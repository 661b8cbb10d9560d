use comas_workflow::job::JobError;

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error(transparent)]
    Job(#[from] JobError),
    #[error("job store: {0}")]
    Store(String),
    #[error("{0}")]
    Files(String),
    #[error("learner of agent {agent} ({address}): {message}")]
    Learner { agent: u32, address: String, message: String },
    /// The learner is at another training step than the call was planned for (it restarted
    /// from a checkpoint meanwhile); the step's training is planned again.
    #[error("learner of agent {agent} ({address}) moved: {message}")]
    LearnerMoved { agent: u32, address: String, message: String },
    /// The learner is at an older training step than the job (it restarted from an older
    /// checkpoint); the job rolls back to the step every learner can return to.
    #[error("learner of agent {agent} ({address}) is at training step {at}, behind the job's {step} completed steps (it restarted from an older checkpoint)")]
    LearnerBehind { agent: u32, address: String, at: u64, step: u64 },
    #[error("rollout: {0}")]
    Rollout(String),
    #[error("job {0} was cancelled")]
    Cancelled(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = CoordinatorError> = std::result::Result<T, E>;

impl From<CoordinatorError> for tonic::Status {
    fn from(e: CoordinatorError) -> Self {
        match &e {
            CoordinatorError::Job(_) | CoordinatorError::Files(_) => {
                tonic::Status::invalid_argument(e.to_string())
            }
            CoordinatorError::Store(_) => tonic::Status::internal(e.to_string()),
            _ => tonic::Status::failed_precondition(e.to_string()),
        }
    }
}
