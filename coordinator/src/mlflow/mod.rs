//! A job's MLflow run (`[tracking] mlflow = "http://host:5000"`): the job file as parameters and
//! as an artifact, every committed step's and evaluation's numbers as metrics (the same names
//! and values as the TensorBoard scalars of `metrics.jsonl`), the metrics log and its figure
//! (`plot.png`, what `comas plot metrics.jsonl` draws) as artifacts and the run's status at the
//! end.
//!
//! Invariants:
//! - The job never waits on the server. One task owns the connection and a queue; the job's
//!   side only `try_send`s. While the server is away the task retries with backoff and keeps
//!   at most `MAX_PENDING` metrics; past that the oldest are dropped, counted and warned of.
//!   Only the job's end waits, for at most the caller's bound, so the final status gets out.
//! - A job has one run. The run carries the job id as a tag; a restarted coordinator finds it
//!   and continues it (status back to RUNNING), sending again the stored records from the
//!   highest step the run already has. A metric sent twice is stored once: its timestamp is the
//!   record's own time, and MLflow keeps one copy of an identical metric.
//! - A call the server refuses for good (a 4xx that is not 408 or 429) is not retried: that
//!   batch is dropped, or, when the run cannot be opened at all, tracking stops for this job.
pub mod client;
pub mod params;

use crate::store::JobState;
use crate::tensorboard::scalars_of;
use client::{Client, KeyValue, Metric, RunInfo, RunStatus, JOB_TAG, MAX_METRICS_PER_BATCH};
use comas_service::backoff::Backoff;
use comas_service::openai::CallError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Metrics held while the server cannot take them (about 100 bytes each).
pub const MAX_PENDING: usize = 200_000;
/// Messages in flight from the job to the tracker task.
const QUEUE: usize = 1024;

/// What the tracker needs of a job.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub url: String,
    pub experiment: String,
    pub run_name: String,
    pub job_id: String,
    /// The effective job file.
    pub job_file: String,
    /// The records the store already holds (a resumed job's), oldest first.
    pub backlog: Vec<String>,
}

impl RunSpec {
    /// The tracking set-up of a job file, if it names a server (no backlog yet).
    pub fn of(job_id: &str, job_file: &str) -> Option<RunSpec> {
        let spec = comas_workflow::job::JobSpec::from_toml(job_file).ok()?;
        let t = spec.tracking;
        Some(RunSpec {
            url: t.mlflow?,
            experiment: t.experiment.unwrap_or_else(|| spec.name.clone()),
            run_name: t.run_name.unwrap_or_else(|| format!("{} ({job_id})", spec.name)),
            job_id: job_id.to_string(),
            job_file: job_file.to_string(),
            backlog: Vec::new(),
        })
    }
}

enum Msg {
    Record(String),
    /// The job ended (`Some`) or the coordinator shuts down (`None`: the run stays RUNNING and
    /// is continued on restart); the metrics log to attach; acknowledged once done.
    End(End),
}

struct End {
    status: Option<RunStatus>,
    log: Vec<String>,
    /// `plot.png`, drawn once the first time the end is tried (`Some(None)`: nothing to draw).
    figure: Option<Option<Vec<u8>>>,
    /// The task gives up what it still holds at this time.
    deadline: Instant,
    ack: oneshot::Sender<()>,
}

/// The job's side of the tracker.
pub struct Tracker {
    tx: mpsc::Sender<Msg>,
    losses: Arc<Losses>,
    job_id: String,
}

/// Metrics that never reached the server, counted once whichever side dropped them.
struct Losses {
    counter: prometheus::IntCounter,
    total: AtomicU64,
    job_id: String,
}

impl Losses {
    /// Counts `metrics` dropped; warns at the first and each time the total doubles.
    fn lose(&self, metrics: u64, why: &str) {
        if metrics == 0 {
            return;
        }
        self.counter.inc_by(metrics);
        let before = self.total.fetch_add(metrics, Ordering::Relaxed);
        if before == 0 || (before + metrics).ilog2() > before.max(1).ilog2() {
            tracing::warn!(job = %self.job_id, dropped = before + metrics, "MLflow metrics dropped: {why}");
        }
    }
}

impl Tracker {
    /// Starts the tracker task of `spec`; `dropped` counts metrics that never reached the server.
    pub fn start(spec: RunSpec, dropped: prometheus::IntCounter) -> Tracker {
        let (tx, rx) = mpsc::channel(QUEUE);
        let job_id = spec.job_id.clone();
        let losses =
            Arc::new(Losses { counter: dropped, total: AtomicU64::new(0), job_id: job_id.clone() });
        let task = Task::new(spec, Arc::clone(&losses));
        tokio::spawn(task.run(rx));
        Tracker { tx, losses, job_id }
    }

    /// Queues one committed record; never waits.
    pub fn record(&self, line: &str) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(Msg::Record(line.into()))
        {
            self.losses.lose(metrics_of(line).len() as u64, "the tracker's queue is full");
        }
    }

    /// Sends the end (`state`, or `None` at shutdown) with the metrics log, and waits at most
    /// `within` for the tracker to deliver what it holds.
    pub async fn end(&self, state: Option<JobState>, log: Vec<String>, within: Duration) {
        let status = state.map(|s| match s {
            JobState::Succeeded => RunStatus::Finished,
            JobState::Cancelled => RunStatus::Killed,
            _ => RunStatus::Failed,
        });
        let (ack, done) = oneshot::channel();
        let end = End { status, log, figure: None, deadline: Instant::now() + within, ack };
        if self.tx.send(Msg::End(end)).await.is_err() {
            return;
        }
        if tokio::time::timeout(within, done).await.is_err() {
            tracing::warn!(job = %self.job_id, "the MLflow server did not take the job's last metrics and status within {within:?}; the run may not show the job's end");
        }
    }
}

/// What the task does next.
enum Next {
    Open,
    Send,
    End,
    Idle,
}

struct Task {
    spec: RunSpec,
    client: Option<Client>,
    run: Option<RunInfo>,
    pending: VecDeque<Metric>,
    end: Option<End>,
    /// Tracking gave up for this job (the server refused the run for good).
    off: bool,
    losses: Arc<Losses>,
    failures: u32,
}

impl Task {
    fn new(spec: RunSpec, losses: Arc<Losses>) -> Task {
        let client = match Client::new(&spec.url) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(job = %spec.job_id, error = %e, "MLflow tracking is off for this job");
                None
            }
        };
        let off = client.is_none();
        Task {
            spec,
            client,
            run: None,
            pending: VecDeque::new(),
            end: None,
            off,
            losses,
            failures: 0,
        }
    }

    fn next(&self) -> Next {
        if self.off {
            return if self.end.is_some() { Next::End } else { Next::Idle };
        }
        match (&self.run, self.pending.is_empty(), &self.end) {
            (None, _, _) => Next::Open,
            (Some(_), false, _) => Next::Send,
            (Some(_), true, Some(_)) => Next::End,
            (Some(_), true, None) => Next::Idle,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        let mut next_try = Instant::now();
        loop {
            let busy = !matches!(self.next(), Next::Idle);
            let deadline = self.end.as_ref().map(|e| e.deadline);
            tokio::select! {
                msg = rx.recv(), if self.end.is_none() => match msg {
                    Some(Msg::Record(line)) => self.take(&line),
                    Some(Msg::End(end)) => self.end = Some(end),
                    // The job's side is gone without an end: nothing more will come.
                    None => return,
                },
                _ = tokio::time::sleep_until(deadline.unwrap_or(next_try)), if deadline.is_some() => {
                    let n = self.pending.len() as u64;
                    if n > 0 {
                        self.lose(n, "the job ended and the server did not take them in time");
                    }
                    return;
                }
                _ = tokio::time::sleep_until(next_try), if busy => {
                    let step = self.next();
                    match self.advance(step).await {
                        Ok(true) => return,
                        Ok(false) => {
                            backoff.reset();
                            self.failures = 0;
                            next_try = Instant::now();
                        }
                        Err(e) => {
                            self.failures += 1;
                            if self.failures.is_power_of_two() {
                                tracing::warn!(job = %self.spec.job_id, error = %e, tries = self.failures, pending = self.pending.len(), "the MLflow server did not answer; retrying");
                            }
                            next_try = Instant::now() + backoff.next_wait();
                        }
                    }
                }
            }
        }
    }

    /// One record's metrics into the queue, the oldest dropped past `MAX_PENDING`.
    fn take(&mut self, line: &str) {
        if self.off {
            return;
        }
        self.pending.extend(metrics_of(line));
        let over = self.pending.len().saturating_sub(MAX_PENDING);
        if over > 0 {
            self.pending.drain(..over);
            self.lose(over as u64, "the MLflow server has been away too long");
        }
    }

    fn lose(&self, metrics: u64, why: &str) {
        self.losses.lose(metrics, why);
    }

    /// One stage; `Ok(true)` once the task is done. A retryable failure is returned to be
    /// tried again; one the server refuses for good drops what it was about.
    async fn advance(&mut self, step: Next) -> Result<bool, CallError> {
        let result = match step {
            Next::Open => self.open().await,
            Next::Send => self.send().await,
            Next::End => return self.finish().await,
            Next::Idle => Ok(()),
        };
        match result {
            Err(e) if !e.retryable() => {
                match step {
                    Next::Open => {
                        tracing::warn!(job = %self.spec.job_id, error = %e, "the MLflow server refused the job's run; tracking is off for this job");
                        self.off = true;
                        let n = self.pending.len() as u64;
                        self.pending.clear();
                        if n > 0 {
                            self.lose(n, "tracking is off");
                        }
                    }
                    _ => {
                        let n = self.pending.len().min(MAX_METRICS_PER_BATCH);
                        self.pending.drain(..n);
                        self.lose(n as u64, &format!("the server refused them: {e}"));
                    }
                }
                Ok(false)
            }
            r => r.map(|()| false),
        }
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("a client while tracking is on")
    }

    /// Finds or makes the job's run, marks it running, logs the parameters and the job file,
    /// and queues the stored records it does not have yet. Safe to repeat.
    async fn open(&mut self) -> Result<(), CallError> {
        let spec = &self.spec;
        if !spec.job_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(CallError::Malformed(format!("job id {:?}", spec.job_id)));
        }
        let client = self.client();
        let experiment = client.experiment(&spec.experiment).await?;
        let (run, from_step) = match client.find_run(&experiment, &spec.job_id).await? {
            Some((run, latest)) => {
                client.set_status(&run.run_id, RunStatus::Running, None).await?;
                (run, latest)
            }
            None => {
                let tags = [
                    KeyValue { key: JOB_TAG.into(), value: spec.job_id.clone() },
                    KeyValue { key: "mlflow.source.name".into(), value: "comas".into() },
                    KeyValue { key: "mlflow.source.type".into(), value: "JOB".into() },
                ];
                let start = (crate::store::now() * 1000.0) as i64;
                (client.create_run(&experiment, &spec.run_name, start, &tags).await?, 0)
            }
        };
        for chunk in params::params_of(&spec.job_file).chunks(client::MAX_PARAMS_PER_BATCH) {
            client.log_batch(&run.run_id, &[], chunk).await?;
        }
        if let Err(e) = client.upload(&run, "job.toml", spec.job_file.clone().into_bytes()).await {
            tracing::warn!(job = %spec.job_id, error = %e, "cannot attach the job file to the MLflow run");
        }
        tracing::info!(job = %spec.job_id, run = %run.run_id, experiment = %experiment, from_step, "MLflow run open");
        // Stored records from the run's highest step on, before those that came meanwhile.
        let backlog: Vec<Metric> = std::mem::take(&mut self.spec.backlog)
            .iter()
            .flat_map(|l| metrics_of(l))
            .filter(|m| m.step >= from_step)
            .collect();
        for m in backlog.into_iter().rev() {
            self.pending.push_front(m);
        }
        self.run = Some(run);
        Ok(())
    }

    async fn send(&mut self) -> Result<(), CallError> {
        let n = self.pending.len().min(MAX_METRICS_PER_BATCH);
        let batch: Vec<Metric> = self.pending.range(..n).cloned().collect();
        let run = self.run.as_ref().expect("an open run").run_id.clone();
        self.client().log_batch(&run, &batch, &[]).await?;
        self.pending.drain(..n);
        Ok(())
    }

    /// Attaches the metrics log and its figure, sets the run's end status, acknowledges the end.
    async fn finish(&mut self) -> Result<bool, CallError> {
        let end = self.end.as_mut().expect("an end");
        if let (Some(status), Some(run), false) = (end.status, &self.run, self.off) {
            let client = self.client.as_ref().expect("a client while tracking is on");
            let mut text = end.log.join("\n");
            text.push('\n');
            if end.figure.is_none() {
                end.figure = Some(draw_figure(&self.spec.job_id, text.clone()).await);
            }
            let mut artifacts = vec![("metrics.jsonl", text.into_bytes())];
            if let Some(Some(png)) = &end.figure {
                artifacts.push(("plot.png", png.clone()));
            }
            for (name, bytes) in artifacts {
                if let Err(e) = client.upload(run, name, bytes).await {
                    if e.retryable() {
                        return Err(e);
                    }
                    tracing::warn!(job = %self.spec.job_id, error = %e, "cannot attach {name} to the MLflow run");
                }
            }
            let end_ms = (crate::store::now() * 1000.0) as i64;
            client.set_status(&run.run_id, status, Some(end_ms)).await?;
        }
        if let Some(end) = self.end.take() {
            let _ = end.ack.send(());
        }
        Ok(true)
    }
}

/// The figure `comas plot metrics.jsonl -o plot.png` draws of the log `text`, drawn off the
/// async threads; `None`, with a warning, when the log has nothing to draw.
async fn draw_figure(job_id: &str, text: String) -> Option<Vec<u8>> {
    let drawn = tokio::task::spawn_blocking(move || {
        let name = "metrics.jsonl";
        comas_plot::default_png(&comas_plot::read::parse_log(&text, name)?, name)
    })
    .await;
    match drawn {
        Ok(Ok(png)) => Some(png),
        Ok(Err(e)) => {
            tracing::warn!(job = %job_id, error = format!("{e:#}"), "no figure for the MLflow run");
            None
        }
        Err(e) => {
            tracing::warn!(job = %job_id, error = %e, "drawing the MLflow run's figure failed");
            None
        }
    }
}

/// The MLflow metrics of one metrics record: its TensorBoard scalars, at the record's step and
/// time.
pub fn metrics_of(line: &str) -> Vec<Metric> {
    let Some(s) = serde_json::from_str(line).ok().as_ref().and_then(scalars_of) else {
        return Vec::new();
    };
    let timestamp = (s.wall_time * 1000.0).round() as i64;
    s.values
        .into_iter()
        .map(|(key, value)| Metric { key: metric_name(&key), value, timestamp, step: s.step })
        .collect()
}

/// A scalar's path as a name MLflow accepts: letters, digits and `_ - . / : space`, no empty,
/// `.` or `..` segment (MLflow treats names as file paths); anything else becomes `_`. Paths
/// with an empty key (`return_moments//count`, the pooled moments) read `return_moments/_/count`.
pub fn metric_name(path: &str) -> String {
    path.split('/')
        .map(|seg| {
            let seg: String = seg
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || "_-. :".contains(c) { c } else { '_' })
                .collect();
            if seg.is_empty() || seg == "." || seg == ".." {
                "_".to_string()
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_paths_become_names_mlflow_accepts() {
        assert_eq!(
            metric_name("agent0/train/return_moments//count"),
            "agent0/train/return_moments/_/count"
        );
        assert_eq!(
            metric_name("eval/greedy/accuracy/last_round"),
            "eval/greedy/accuracy/last_round"
        );
        assert_eq!(metric_name("score_hist/é/../x"), "score_hist/_/_/x");
    }

    #[test]
    fn a_record_gives_its_numbers_at_its_step_and_time_in_milliseconds() {
        let line = r#"{"kind":"eval","job_id":"j","after_steps":4,"unix_time":12.3456,"accuracy":{"last_round":0.5},"episodes":8}"#;
        let mut got = metrics_of(line);
        got.sort_by(|a, b| a.key.cmp(&b.key));
        let at = |key: &str, value| Metric { key: key.into(), value, timestamp: 12346, step: 4 };
        assert_eq!(got, [at("eval/accuracy/last_round", 0.5), at("eval/episodes", 8.0)]);
        assert!(metrics_of(r#"{"kind":"hello"}"#).is_empty());
    }
}
