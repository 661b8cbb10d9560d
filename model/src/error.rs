use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model. Messages say what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    // The underlying error goes into the message rather than `source()`, so printing the
    // error chain does not repeat it.
    #[error("cannot access {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: invalid JSON: {err}")]
    Json { path: PathBuf, err: serde_json::Error },
    #[error("config: {0}")]
    Config(String),
    #[error("model folder {folder}: {what}")]
    Folder { folder: PathBuf, what: String },
    #[error(
        "weights: tensor `{name}` is missing from the checkpoint (expected shape {expected:?})"
    )]
    MissingTensor { name: String, expected: Vec<i64> },
    #[error("weights: tensor `{name}` has shape {found:?} in the checkpoint but the config implies {expected:?}")]
    ShapeMismatch { name: String, expected: Vec<i64>, found: Vec<i64> },
    #[error("weights: {0}")]
    Weights(String),
    #[error("safetensors file {path}: {message}")]
    SafeTensors { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("lora adapter: {0}")]
    Lora(String),
    /// Sampling met logits that are NaN or infinite: the model computes garbage. `token` counts
    /// the sequence's new tokens from 1.
    #[error(
        "the model's logits are not finite (NaN or inf) at token {token} of sequence {sequence}: its weights or config.json are broken (NaN weights, e.g. from a training step that diverged, or a bad config value such as rms_norm_eps)"
    )]
    NonFiniteLogits { sequence: u64, token: usize },
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io { path: path.into(), err: source }
    }
}

/// Reads and parses a JSON file with errors that name the file.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|err| ModelError::Json { path: path.to_path_buf(), err })
}
