//! Tool runs for episode programs: a small pool of threads runs each program in the sandbox and
//! sends the result back on a channel the engine polls, so the engine thread never waits on one.
use crate::engine::Stats;
use comas_sandbox::{Denied, Outcome, Reason, RunFile, RunFiles, Sandbox, SandboxError};
use comas_workflow::program::Reply;
use comas_workflow::tool::{ToolRequest, ToolResult, WorkspaceFile};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

/// Runs at once on one worker (spec 6: 16 tool workers).
pub const TOOL_THREADS: usize = 16;

struct Job {
    episode: u64,
    request: ToolRequest,
}

/// What one episode asked for off the engine thread (a tool run, an endpoint's turn), done.
pub struct SideDone {
    pub episode: u64,
    pub reply: Reply,
}

pub struct ToolPool {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Sender<SideDone>,
    stats: Arc<Stats>,
}

/// One sandbox for the worker's life: probing the machine's protections takes a moment.
fn sandbox() -> &'static Result<Sandbox, SandboxError> {
    static SANDBOX: OnceLock<Result<Sandbox, SandboxError>> = OnceLock::new();
    SANDBOX.get_or_init(Sandbox::with_defaults)
}

/// The stable metrics key of a failure.
fn failure_key(r: Reason) -> String {
    match r {
        Reason::Timeout => "timeout".into(),
        Reason::CpuLimit => "cpu_limit".into(),
        Reason::MemoryLimit => "memory_limit".into(),
        Reason::ProcessLimit => "process_limit".into(),
        Reason::FileSizeLimit => "file_size_limit".into(),
        Reason::Denied(Denied::Network) => "denied_network".into(),
        Reason::Denied(Denied::Filesystem) => "denied_filesystem".into(),
        Reason::Denied(Denied::Operation) => "denied_operation".into(),
        Reason::Signal(_) => "signal".into(),
        Reason::ExitCode(_) => "exit_code".into(),
    }
}

/// A run's result; `Err` is the sandbox failing to run it at all.
fn result_of(call_index: u32, outcome: Result<Outcome, &dyn std::fmt::Display>) -> ToolResult {
    match outcome {
        Ok(o) => ToolResult {
            call_index,
            failure: o.reason().map(failure_key),
            detail: o.reason().map(|r| r.to_string()).unwrap_or_default(),
            stdout: o.stdout,
            stderr: o.stderr,
            files: Vec::new(),
        },
        Err(e) => ToolResult {
            call_index,
            failure: Some("sandbox_error".into()),
            detail: format!("the sandbox could not run the program: {e}"),
            stdout: String::new(),
            stderr: String::new(),
            files: Vec::new(),
        },
    }
}

fn run(request: &ToolRequest) -> ToolResult {
    let timeout = Duration::from_secs_f64(request.timeout_secs);
    let s = match sandbox() {
        Ok(s) => s,
        Err(e) => return result_of(request.call_index, Err(e)),
    };
    if request.files.is_empty() && request.fetch.is_empty() {
        return match s.run_with_timeout(&request.code, timeout) {
            Ok(outcome) => result_of(request.call_index, Ok(outcome)),
            Err(e) => result_of(request.call_index, Err(&e)),
        };
    }
    let files = RunFiles {
        inputs: request
            .files
            .iter()
            .map(|f| RunFile { name: f.name.clone(), bytes: f.bytes.clone() })
            .collect(),
        fetch: request.fetch.clone(),
    };
    match s.run_with_files(&request.code, timeout, &files) {
        Ok((outcome, out, note)) => {
            let mut r = result_of(request.call_index, Ok(outcome));
            r.files =
                out.into_iter().map(|f| WorkspaceFile { name: f.name, bytes: f.bytes }).collect();
            if let Some(note) = note {
                // The agent and its coach should know a saved file did not reach the workspace.
                r.stderr.push_str(&format!("\n[workspace] {note}"));
            }
            r
        }
        Err(e) => result_of(request.call_index, Err(&e)),
    }
}

impl ToolPool {
    /// The pool (its threads start with the first run), sending its results on `done`.
    pub fn new(done: mpsc::Sender<SideDone>, stats: Arc<Stats>) -> Self {
        Self { jobs: None, done, stats }
    }

    /// Queues a run; its result arrives on the pool's channel, tagged with `episode`.
    pub fn submit(&mut self, episode: u64, request: ToolRequest) {
        let jobs = self.jobs.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..TOOL_THREADS {
                let (rx, done, stats) =
                    (Arc::clone(&rx), self.done.clone(), Arc::clone(&self.stats));
                let spawned =
                    std::thread::Builder::new().name(format!("worker-tool-{i}")).spawn(move || {
                        loop {
                            let job = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                                Ok(j) => j,
                                Err(_) => return,
                            };
                            let _span = tracing::debug_span!(
                                "tool_run",
                                episode = job.episode,
                                call = job.request.call_index
                            )
                            .entered();
                            let result = run(&job.request);
                            stats.tool_runs.fetch_add(1, Ordering::Relaxed);
                            if !result.ran() {
                                stats.tool_failures.fetch_add(1, Ordering::Relaxed);
                            }
                            if done
                                .send(SideDone { episode: job.episode, reply: Reply::Tool(result) })
                                .is_err()
                            {
                                return;
                            }
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot start a tool thread");
                }
            }
            tx
        });
        if let Err(mpsc::SendError(job)) = jobs.send(Job { episode, request }) {
            let result = result_of(job.request.call_index, Err(&"no tool thread is running"));
            let _ = self.done.send(SideDone { episode, reply: Reply::Tool(result) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_keep_their_reason() {
        let r = result_of(3, Err(&"no python3"));
        assert_eq!((r.call_index, r.failure.as_deref()), (3, Some("sandbox_error")));
        assert_eq!(failure_key(Reason::Timeout), "timeout");
        assert_eq!(failure_key(Reason::ExitCode(1)), "exit_code");
    }
}
