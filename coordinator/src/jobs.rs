//! Job lifecycle: submit (checked before anything is stored), queue, run one job at a time,
//! cancel, status and progress events. Jobs that were running when the coordinator stopped are
//! picked up again at start, from their last completed step.
use crate::error::{CoordinatorError, Result};
use crate::files::load_job;
use crate::metrics::Metrics;
use crate::progress::{Live, Report, Reporter, RunContext, Update};
use crate::runner;
use crate::scheduler::Scheduler;
use crate::store::{JobRow, JobState, Store};
use comas_proto::v1 as pb;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, mpsc, watch, Notify};

/// How long a job's end waits for its MLflow run to take the last metrics and the status.
const TRACKER_END_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// The same at shutdown, when the run stays open to be continued.
const TRACKER_SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

pub struct Jobs {
    pub store: Arc<Store>,
    pub scheduler: Scheduler,
    pub metrics: Arc<Metrics>,
    /// Where the paths of a job may lead (empty: anywhere).
    pub roots: comas_service::AllowedRoots,
    events: broadcast::Sender<(String, pb::JobEvent)>,
    live: Mutex<HashMap<String, Live>>,
    cancels: Mutex<HashMap<String, watch::Sender<bool>>>,
    wake: Notify,
}

pub fn state_pb(s: JobState) -> pb::JobState {
    match s {
        JobState::Queued => pb::JobState::Queued,
        JobState::Running => pb::JobState::Running,
        JobState::Succeeded => pb::JobState::Succeeded,
        JobState::Failed => pb::JobState::Failed,
        JobState::Cancelled => pb::JobState::Cancelled,
    }
}

impl Jobs {
    pub fn new(
        store: Arc<Store>,
        scheduler: Scheduler,
        metrics: Arc<Metrics>,
        roots: comas_service::AllowedRoots,
    ) -> Arc<Self> {
        let (events, _) = broadcast::channel(1024);
        Arc::new(Self {
            store,
            scheduler,
            metrics,
            roots,
            events,
            live: Mutex::new(HashMap::new()),
            cancels: Mutex::new(HashMap::new()),
            wake: Notify::new(),
        })
    }

    /// Checks the job file completely (TOML, keys, files, data, counts) and queues the job.
    pub async fn submit(
        &self,
        text: String,
        base_dir: String,
        reuse_name: bool,
    ) -> Result<pb::JobStatus> {
        let (t, b) = (text.clone(), base_dir.clone());
        let roots = self.roots.clone();
        let job = tokio::task::spawn_blocking(move || load_job(&t, &b, &roots))
            .await
            .map_err(|e| CoordinatorError::Other(e.to_string()))??
            .job;
        let rows = self.store.list_jobs()?;
        if let Some(old) = rows.iter().find(|r| r.name == job.spec.name).filter(|_| !reuse_name) {
            return Err(CoordinatorError::Files(format!(
                "`name`: job {} is already called `{}` ({}, {}/{} steps); learners keep checkpoints under a job's name, so this job would pick up that one's. Give this job another name, or continue that one with `comas resume {}`",
                old.id,
                old.name,
                old.state.as_str(),
                old.steps_done,
                old.total_steps,
                old.id
            )));
        }
        // Two live jobs writing one metrics.jsonl would interleave their steps.
        let out = &job.spec.output.dir;
        if let Some(other) = rows
            .iter()
            .filter(|r| !r.state.is_terminal())
            .find(|r| output_dir_of(r).as_ref() == Some(out))
        {
            return Err(CoordinatorError::Files(format!(
                "`output.dir`: {} is the output folder of job {} (`{}`, {}), which has not ended; give this job its own folder",
                out.display(),
                other.id,
                other.name,
                other.state.as_str()
            )));
        }
        for (k, a) in job.spec.agents.iter().enumerate() {
            if a.learner.as_deref().unwrap_or("").is_empty() {
                return Err(CoordinatorError::Files(format!(
                    "`agents[{k}].learner`: not set; give the address of agent {k}'s learner (e.g. http://learner-{k}.learner:50061); `comas local` fills it in"
                )));
            }
        }
        let notes = crate::memory_check::memory_notes(&job).await;
        let id = format!("job-{}", uuid::Uuid::new_v4().simple());
        self.store.insert_job(&id, &job.spec.name, &text, &base_dir, job.total_steps)?;
        tracing::info!(job = %id, name = %job.spec.name, steps = job.total_steps, "job queued");
        for n in &notes {
            match n.strip_prefix("warning: ") {
                Some(w) => tracing::warn!(job = %id, "{w}"),
                None => tracing::info!(job = %id, "{n}"),
            }
        }
        self.wake.notify_one();
        Ok(pb::JobStatus { notes, ..self.status(&id)? })
    }

    pub fn status(&self, id: &str) -> Result<pb::JobStatus> {
        Ok(self.status_of(&self.row(id)?))
    }

    /// The status with the job file the coordinator runs (GetJob's answer).
    pub fn status_with_job_file(&self, id: &str) -> Result<pb::JobStatus> {
        let row = self.row(id)?;
        Ok(pb::JobStatus { job_toml: row.spec.clone(), ..self.status_of(&row) })
    }

    fn row(&self, id: &str) -> Result<JobRow> {
        self.store
            .get_job(id)?
            .ok_or_else(|| CoordinatorError::Other(format!("no job with id `{id}`")))
    }

    pub fn status_of(&self, row: &JobRow) -> pb::JobStatus {
        let live = self.live.lock().expect("live lock").get(&row.id).cloned().unwrap_or_default();
        let versions = self.store.versions(&row.id).unwrap_or_default();
        let spec = comas_workflow::job::JobSpec::from_toml(&row.spec).ok();
        let metrics_path = spec.as_ref().map(|s| {
            let mut s = s.clone();
            if !row.base_dir.is_empty() {
                s.resolve_paths(std::path::Path::new(&row.base_dir));
            }
            s.output.dir.join("metrics.jsonl").display().to_string()
        });
        let agents = spec
            .map(|s| {
                s.agents
                    .iter()
                    .enumerate()
                    .map(|(k, a)| pb::AgentProgress {
                        agent_id: k as u32,
                        version: versions
                            .iter()
                            .find(|(x, _)| *x == k as u32)
                            .map_or(0, |(_, v)| *v),
                        learner: a.learner.clone().unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let rolling =
            row.state == JobState::Running && matches!(live.stage.as_str(), "rollout" | "eval");
        pb::JobStatus {
            job_id: row.id.clone(),
            name: row.name.clone(),
            state: state_pb(row.state) as i32,
            steps_done: row.steps_done,
            total_steps: row.total_steps,
            stage: if row.state == JobState::Running { live.stage } else { String::new() },
            episodes_done: live.episodes_done,
            episodes_total: live.episodes_total,
            stage_tokens: live.stage_tokens,
            stage_seconds: live.stage_started.map_or(0.0, |t| t.elapsed().as_secs_f64()),
            train_samples_done: live.train_samples_done,
            train_samples_total: live.train_samples_total,
            broadcast_bytes_done: live.broadcast_bytes_done,
            broadcast_bytes_total: live.broadcast_bytes_total,
            broadcast_workers: live.broadcast_workers,
            queued_episodes: if rolling {
                self.metrics.pending_episodes.get().max(0) as u32
            } else {
                0
            },
            leased_episodes: if rolling {
                self.metrics.leased_episodes.get().max(0) as u32
            } else {
                0
            },
            error: row.error.clone(),
            created_unix: row.created,
            updated_unix: row.updated,
            metrics_path: metrics_path.unwrap_or_default(),
            agents,
            notes: Vec::new(),
            job_toml: String::new(),
        }
    }

    pub fn list(&self) -> Result<Vec<pb::JobStatus>> {
        Ok(self.store.list_jobs()?.iter().map(|r| self.status_of(r)).collect())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<(String, pb::JobEvent)> {
        self.events.subscribe()
    }

    pub fn emit(&self, id: &str, kind: &str, metrics_json: String, message: String) {
        if let Ok(status) = self.status(id) {
            let _ = self.events.send((
                id.to_string(),
                pb::JobEvent { status: Some(status), kind: kind.into(), metrics_json, message },
            ));
        }
    }

    /// The MLflow tracker of a job whose file names a tracking server, with the records the
    /// store already holds (a resumed job's).
    fn start_tracker(&self, row: &JobRow) -> Option<Arc<crate::mlflow::Tracker>> {
        let mut spec = crate::mlflow::RunSpec::of(&row.id, &row.spec)?;
        spec.backlog = self.store.metrics_log(&row.id).unwrap_or_default();
        Some(Arc::new(crate::mlflow::Tracker::start(spec, self.metrics.tracking_dropped.clone())))
    }

    fn apply(&self, id: &str, u: &Update) {
        self.live.lock().expect("live lock").entry(id.to_string()).or_default().apply(u);
    }

    /// Applies a running job's reports in the order they were sent.
    async fn take_reports(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<(String, Report)>) {
        while let Some((id, report)) = rx.recv().await {
            match report {
                Report::Live(u) => self.apply(&id, &u),
                Report::Event { kind, metrics_json, message } => {
                    self.emit(&id, kind, metrics_json, message)
                }
                Report::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    pub fn cancel(&self, id: &str) -> Result<pb::JobStatus> {
        let row = self
            .store
            .get_job(id)?
            .ok_or_else(|| CoordinatorError::Other(format!("no job with id `{id}`")))?;
        match row.state {
            JobState::Queued => {
                self.store.set_state(id, JobState::Cancelled, "cancelled before it started")?;
                self.emit(id, "finished", String::new(), "cancelled".into());
            }
            JobState::Running => {
                if let Some(tx) = self.cancels.lock().expect("cancel lock").get(id) {
                    let _ = tx.send(true);
                }
            }
            _ => {}
        }
        self.status(id)
    }

    /// Queues a failed or cancelled job again; its committed steps and stored episodes are kept.
    pub fn resume(&self, id: &str) -> Result<pb::JobStatus> {
        let row = self
            .store
            .get_job(id)?
            .ok_or_else(|| CoordinatorError::Other(format!("no job with id `{id}`")))?;
        match row.state {
            JobState::Failed | JobState::Cancelled => {
                self.store.set_state(id, JobState::Queued, "")?;
                tracing::info!(job = %id, from_step = row.steps_done, "job queued again");
                self.wake.notify_one();
                self.status(id)
            }
            s => Err(CoordinatorError::Other(format!(
                "job `{id}` is {}; only failed or cancelled jobs can be resumed",
                s.as_str()
            ))),
        }
    }

    /// Runs jobs one after another until `shutdown` fires: first any job that was running when
    /// the coordinator last stopped, then queued jobs in submission order.
    pub async fn drive(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let (reports, rx) = mpsc::unbounded_channel();
        tokio::spawn(Arc::clone(&self).take_reports(rx));
        loop {
            if *shutdown.borrow() {
                return;
            }
            let next = match self.store.list_jobs() {
                Ok(rows) => rows
                    .iter()
                    .find(|r| r.state == JobState::Running)
                    .or_else(|| rows.iter().find(|r| r.state == JobState::Queued))
                    .cloned(),
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the job store");
                    None
                }
            };
            let Some(row) = next else {
                tokio::select! {
                    _ = self.wake.notified() => continue,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => continue,
                    _ = shutdown.changed() => return,
                }
            };
            let (cancel_tx, cancel_rx) = watch::channel(false);
            let mut cancelled = cancel_rx.clone();
            self.cancels.lock().expect("cancel lock").insert(row.id.clone(), cancel_tx);
            self.metrics.running_jobs.set(1);
            let id = row.id.clone();
            let tracker = self.start_tracker(&row);
            let ctx = RunContext {
                store: Arc::clone(&self.store),
                scheduler: self.scheduler.clone(),
                metrics: Arc::clone(&self.metrics),
                report: Reporter::new(id.clone(), reports.clone()),
                roots: self.roots.clone(),
                tracker: tracker.clone(),
            };
            let outcome = tokio::select! {
                r = runner::run_job(&ctx, row, cancel_rx) => Some(r),
                // Wherever the job is waiting (a learner, a worker, a step), a cancel ends it.
                _ = cancelled.wait_for(|c| *c) => Some(Err(CoordinatorError::Cancelled(id.clone()))),
                // Shutting down: the job stays `running` in the store and resumes on restart.
                _ = shutdown.changed() => None,
            };
            self.metrics.running_jobs.set(0);
            self.cancels.lock().expect("cancel lock").remove(&id);
            self.scheduler.cancel_job(id.clone());
            // The job's last reports (its last step's record) reach watchers before its end.
            ctx.report.flush().await;
            let Some(outcome) = outcome else {
                if let Some(t) = &tracker {
                    t.end(None, Vec::new(), TRACKER_SHUTDOWN_WAIT).await;
                }
                return;
            };
            let (state, error) = match outcome {
                Ok(()) => (JobState::Succeeded, String::new()),
                Err(CoordinatorError::Cancelled(_)) => (JobState::Cancelled, String::new()),
                Err(e) => (JobState::Failed, e.to_string()),
            };
            if state == JobState::Failed {
                tracing::error!(job = %id, error = %error, "job failed");
            } else {
                tracing::info!(job = %id, state = state.as_str(), "job ended");
            }
            if let Err(e) = self.store.set_state(&id, state, &error) {
                tracing::error!(job = %id, error = %e, "cannot record the job's end");
            }
            if let Some(t) = &tracker {
                let log = self.store.metrics_log(&id).unwrap_or_default();
                t.end(Some(state), log, TRACKER_END_WAIT).await;
            }
            self.apply(&id, &Update::Ended);
            self.emit(
                &id,
                "finished",
                String::new(),
                if error.is_empty() { state.as_str().to_string() } else { error },
            );
        }
    }
}

/// A stored job's output folder, with relative paths resolved as at its submission.
fn output_dir_of(row: &JobRow) -> Option<std::path::PathBuf> {
    let mut spec = comas_workflow::job::JobSpec::from_toml(&row.spec).ok()?;
    if !row.base_dir.is_empty() {
        spec.resolve_paths(std::path::Path::new(&row.base_dir));
    }
    Some(spec.output.dir)
}
