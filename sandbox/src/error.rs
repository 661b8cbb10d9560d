use std::path::PathBuf;
use thiserror::Error;

/// The sandbox itself could not work. A program that fails, crashes or breaks a limit is not an
/// error: it gets an [`Outcome`](crate::Outcome) with a failed status.
#[derive(Debug, Error)]
pub enum SandboxError {
    #[error(
        "no Python interpreter at {python:?} ({source}): install Python 3 (e.g. `apt-get install python3`) \
         or point COMAS_PYTHON (or the sandbox config's `python`) at one"
    )]
    PythonMissing { python: PathBuf, source: std::io::Error },
    #[error("Python interpreter {python:?} does not work: {detail}")]
    PythonBroken { python: PathBuf, detail: String },
    #[error("sandbox setup failed: {what}: {source}")]
    Setup { what: &'static str, source: std::io::Error },
    #[error("cannot start the sandboxed process: {0}")]
    Spawn(std::io::Error),
    #[error("sandbox protection setup failed: {0}")]
    Protection(String),
    #[error("{0:?} cannot be a file of a sandbox run: give a plain name, not hidden, not main.py, with no folder")]
    BadFileName(String),
}

/// The HumanEval data could not be read.
#[derive(Debug, Error)]
pub enum DataError {
    #[error("HumanEval data not found at {path:?}: run `bash scripts/fetch-humaneval.sh` (or set COMAS_HUMANEVAL to the file)")]
    Missing { path: PathBuf },
    #[error("cannot read {path:?}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path:?} line {line}: {source}")]
    Json { path: PathBuf, line: usize, source: serde_json::Error },
}
