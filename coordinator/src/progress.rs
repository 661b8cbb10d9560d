//! How a running job reports: typed changes of its live status and events for watchers, sent
//! over a channel to the task that owns the job table (`Jobs::drive`), so the step loop and its
//! helpers need nothing of `Jobs`.
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use crate::store::Store;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// A job's progress within its current stage, as `GetJob` and `WatchJob` show it.
#[derive(Debug, Clone, Default)]
pub struct Live {
    pub stage: String,
    pub episodes_done: u32,
    pub episodes_total: u32,
    /// Completion tokens of the episodes done in this stage (rollout, eval), or tokens through
    /// the training passes so far (train).
    pub stage_tokens: u64,
    pub stage_started: Option<std::time::Instant>,
    pub train_samples_done: u32,
    pub train_samples_total: u32,
    /// Bytes the workers have received so far of the weight broadcast, of the total they pull.
    pub broadcast_bytes_done: u64,
    pub broadcast_bytes_total: u64,
    pub broadcast_workers: u32,
}

/// One change of a job's live status.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// A stage starts: its counters start from zero.
    Enter(&'static str),
    /// The stage's episodes: how many there are and how many are already done.
    EpisodesPlanned { done: u32, total: u32 },
    /// Episodes done so far, and the completion tokens of the one that just came in.
    EpisodeDone { done: u32, tokens: u64 },
    /// Experiences the learners train on in this step.
    TrainPlanned(u32),
    /// Experiences trained so far and the tokens through the training passes.
    Trained { done: u32, tokens: u64 },
    /// Bytes of the weight broadcast received so far, of the total, by that many workers.
    Broadcast { done: u64, total: u64, workers: u32 },
    /// The job has ended: no stage.
    Ended,
}

impl Live {
    pub fn apply(&mut self, u: &Update) {
        match *u {
            Update::Enter(stage) => {
                *self = Live {
                    stage: stage.to_string(),
                    stage_started: Some(std::time::Instant::now()),
                    ..Live::default()
                }
            }
            Update::EpisodesPlanned { done, total } => {
                (self.episodes_done, self.episodes_total) = (done, total)
            }
            Update::EpisodeDone { done, tokens } => {
                self.episodes_done = done;
                self.stage_tokens += tokens;
            }
            Update::TrainPlanned(total) => self.train_samples_total = total,
            Update::Trained { done, tokens } => {
                (self.train_samples_done, self.stage_tokens) = (done, tokens)
            }
            Update::Broadcast { done, total, workers } => {
                (self.broadcast_bytes_done, self.broadcast_bytes_total, self.broadcast_workers) =
                    (done, total, workers)
            }
            Update::Ended => self.stage = String::new(),
        }
    }
}

/// What a job sends to the job table.
#[derive(Debug)]
pub enum Report {
    Live(Update),
    /// An event for watchers, carrying the job's status once every earlier report is applied.
    Event {
        kind: &'static str,
        metrics_json: String,
        message: String,
    },
    /// Answered once every earlier report is applied.
    Flush(oneshot::Sender<()>),
}

/// One job's end of the reporting channel.
#[derive(Clone)]
pub struct Reporter {
    job: String,
    tx: mpsc::UnboundedSender<(String, Report)>,
}

impl Reporter {
    pub fn new(job: String, tx: mpsc::UnboundedSender<(String, Report)>) -> Self {
        Self { job, tx }
    }

    pub fn live(&self, u: Update) {
        let _ = self.tx.send((self.job.clone(), Report::Live(u)));
    }

    pub fn event(&self, kind: &'static str, metrics_json: String, message: String) {
        let _ = self.tx.send((self.job.clone(), Report::Event { kind, metrics_json, message }));
    }

    /// Waits until everything reported so far is applied (before the job's end is recorded, so
    /// a watcher sees its last step before it sees the end).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((self.job.clone(), Report::Flush(tx))).is_ok() {
            let _ = rx.await;
        }
    }
}

/// What a running job may use: the store, the scheduler, the metrics and its reporter.
#[derive(Clone)]
pub struct RunContext {
    pub store: Arc<Store>,
    pub scheduler: Scheduler,
    pub metrics: Arc<Metrics>,
    pub report: Reporter,
    /// Checked again when a job starts: a coordinator restarted with narrower roots refuses
    /// what it would no longer accept.
    pub roots: comas_service::AllowedRoots,
    /// The job's MLflow run, when its file names a tracking server.
    pub tracker: Option<Arc<crate::mlflow::Tracker>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entering_a_stage_resets_its_counters() {
        let mut l = Live::default();
        for u in [
            Update::Enter("rollout"),
            Update::EpisodesPlanned { done: 2, total: 8 },
            Update::EpisodeDone { done: 3, tokens: 40 },
            Update::EpisodeDone { done: 4, tokens: 2 },
        ] {
            l.apply(&u);
        }
        assert_eq!(
            (l.stage.as_str(), l.episodes_done, l.episodes_total, l.stage_tokens),
            ("rollout", 4, 8, 42)
        );
        l.apply(&Update::Enter("train"));
        l.apply(&Update::TrainPlanned(24));
        l.apply(&Update::Trained { done: 12, tokens: 900 });
        assert_eq!(
            (l.episodes_done, l.train_samples_done, l.train_samples_total, l.stage_tokens),
            (0, 12, 24, 900)
        );
        l.apply(&Update::Ended);
        assert_eq!(l.stage, "");
    }
}
