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
    #[error("no report of training step `{0}` is kept here (the learner may have restarted since it trained it)")]
    UnknownStep(String),
    /// A full-model update failed after some of its optimizer steps were applied; there is no
    /// full-model snapshot to undo them, so this trainer refuses further steps.
    #[error("{0}; the weights were partly updated, so restart the learner: it resumes from its last checkpoint")]
    PartlyUpdated(String),
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
