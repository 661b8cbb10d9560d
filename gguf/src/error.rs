use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file is not a well-formed GGUF file; `offset` is where reading failed.
    #[error("{path}: not a valid GGUF file at byte {offset}: {message}")]
    Format { path: PathBuf, offset: u64, message: String },
    #[error(
        "tensor `{tensor}` has type {ty}, which comas cannot dequantise; supported: {supported}"
    )]
    UnsupportedType { tensor: String, ty: String, supported: &'static str },
    #[error("tensor `{tensor}`: {message}")]
    Tensor { tensor: String, message: String },
    /// A metadata key is missing or has the wrong type.
    #[error("metadata `{key}`: {message}")]
    Metadata { key: String, message: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("output folder {path}: {message}")]
    Output { path: PathBuf, message: String },
}

pub type Result<T> = std::result::Result<T, GgufError>;

impl GgufError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
    pub(crate) fn meta(key: &str, message: impl Into<String>) -> Self {
        Self::Metadata { key: key.to_string(), message: message.into() }
    }
}
