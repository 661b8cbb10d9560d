//! Tool calls: code an episode program asks a worker to execute, and what came back. The
//! program stays pure; the worker runs the code in the sandbox and answers with a `ToolResult`.
use serde::{Deserialize, Serialize};

/// A file of a run's folder: a plain name and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceFile {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// One program to run, in a fresh sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolRequest {
    /// Unique within the episode, starting at 0.
    pub call_index: u32,
    /// Python source.
    pub code: String,
    pub timeout_secs: f64,
    /// Files the program's folder starts with (a chain's shared workspace). Never serialised:
    /// requests stay inside the worker.
    #[serde(skip)]
    pub files: Vec<WorkspaceFile>,
    /// Name patterns (`*`, `?`) of the files to hand back after the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fetch: Vec<String>,
}

/// How a run ended. `failure` is a stable key for metrics (`timeout`, `exit_code`,
/// `memory_limit`, `denied_network`, `sandbox_error`, ...); `None` when the program exited 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_index: u32,
    pub failure: Option<String>,
    /// The failure in words (`wall-clock timeout`, `exit code 1`); empty when it ran.
    #[serde(default)]
    pub detail: String,
    pub stdout: String,
    pub stderr: String,
    /// The files the run left that match the request's `fetch` patterns.
    #[serde(skip)]
    pub files: Vec<WorkspaceFile>,
}

impl ToolResult {
    pub fn ran(&self) -> bool {
        self.failure.is_none()
    }

    /// The observation an agent and its coach read (MAPPA spec 6): the output of a clean run
    /// (stderr appended when there is any), else the failure line, then stdout and stderr,
    /// since the error text is what the coach needs to assign blame.
    pub fn observation(&self) -> String {
        if self.ran() {
            let mut s = self.stdout.clone();
            if !self.stderr.is_empty() {
                s.push_str("\n[stderr]: ");
                s.push_str(&self.stderr);
            }
            return s;
        }
        let mut s = format!("[Execution failed: {}]", self.detail);
        for part in [&self.stdout, &self.stderr] {
            if !part.is_empty() {
                s.push('\n');
                s.push_str(part);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(failure: Option<&str>, detail: &str, stdout: &str, stderr: &str) -> ToolResult {
        ToolResult {
            call_index: 0,
            failure: failure.map(str::to_string),
            detail: detail.into(),
            stdout: stdout.into(),
            stderr: stderr.into(),
            files: Vec::new(),
        }
    }

    #[test]
    fn observations_keep_output_and_errors() {
        assert_eq!(result(None, "", "4\n", "").observation(), "4\n");
        assert_eq!(result(None, "", "4\n", "warn").observation(), "4\n\n[stderr]: warn");
        assert_eq!(
            result(
                Some("exit_code"),
                "exit code 1",
                "partial",
                "ZeroDivisionError: division by zero"
            )
            .observation(),
            "[Execution failed: exit code 1]\npartial\nZeroDivisionError: division by zero"
        );
        assert_eq!(
            result(Some("timeout"), "wall-clock timeout", "", "").observation(),
            "[Execution failed: wall-clock timeout]"
        );
    }
}
