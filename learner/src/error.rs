#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    #[error("config: {0}")]
    Config(String),
    #[error("config: {0}")]
    TrainConfig(#[from] comas_workflow::TrainConfigError),
    #[error("batch: {0}")]
    Batch(String),
    #[error("non-finite {what} in training step; weights left unchanged")]
    NonFinite { what: String },
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A request planned against another training step than the learner's (it restarted
    /// from a checkpoint, or trained the step already): the caller should look again.
    #[error(
        "{request} was planned for training step {expected}, but this learner is at step {at} (it may have restarted from a checkpoint); nothing was done"
    )]
    StepMismatch { request: &'static str, at: u64, expected: u64 },
    #[error("no report of training step `{0}` is kept here (the learner may have restarted since it trained it)")]
    UnknownStep(String),
    /// A full-model update failed after some of its optimizer steps were applied; there is no
    /// full-model snapshot to undo them, so this trainer refuses further steps.
    #[error("{0}; the weights were partly updated, so restart the learner: it resumes from its last checkpoint")]
    PartlyUpdated(String),
    /// libtorch failed inside a training step (tch panics where a call fails; allocation
    /// failures are the usual cause).
    #[error("libtorch failed during the training step: {0}; if memory is short, lower micro_batch_size or the prompt and completion lengths")]
    Panicked(String),
    #[error(transparent)]
    Model(#[from] comas_model::ModelError),
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("io error on {path}: {err}")]
    Io { path: std::path::PathBuf, err: std::io::Error },
}

pub type Result<T, E = LearnerError> = std::result::Result<T, E>;

impl LearnerError {
    pub fn io(path: impl Into<std::path::PathBuf>, err: std::io::Error) -> Self {
        LearnerError::Io { path: path.into(), err }
    }
}
