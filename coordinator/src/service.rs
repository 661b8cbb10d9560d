//! gRPC side of the coordinator: the job API for clients and registration for workers.
use crate::jobs::Jobs;
use comas_proto::v1 as pb;
use comas_proto::v1::coordinator_server::Coordinator;
use comas_service::auth::{Scope, TokenFile};
use comas_service::limits::{RateLimit, JOB_FILE_BYTES};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct CoordinatorService {
    pub jobs: Arc<Jobs>,
    pub heartbeat_interval: Duration,
    /// Bearer tokens and their scopes; `None`: the API is open.
    pub tokens: Option<Arc<TokenFile>>,
    /// `SubmitJob` calls per peer address.
    pub submits: RateLimit,
}

impl CoordinatorService {
    fn allow<T>(&self, request: &Request<T>, need: Scope, what: &str) -> Result<(), Status> {
        comas_service::auth::check(self.tokens.as_deref(), request, need, what)
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::JobEvent, Status>> + Send>>;

fn terminal(s: &pb::JobStatus) -> bool {
    matches!(
        pb::JobState::try_from(s.state),
        Ok(pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Cancelled)
    )
}

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        self.allow(&request, Scope::Submit, "SubmitJob")?;
        let peer =
            request.remote_addr().map_or_else(|| "unknown".to_string(), |a| a.ip().to_string());
        if let Err(wait) = self.submits.take(&peer) {
            return Err(Status::resource_exhausted(format!(
                "too many SubmitJob calls from {peer}; retry in {:.0} s (the coordinator's --submit-per-minute)",
                wait.as_secs_f64().ceil()
            )));
        }
        let r = request.into_inner();
        if r.job_toml.len() > JOB_FILE_BYTES {
            return Err(Status::invalid_argument(format!(
                "job file is {} bytes; the limit is {JOB_FILE_BYTES}",
                r.job_toml.len()
            )));
        }
        Ok(Response::new(self.jobs.submit(r.job_toml, r.base_dir, r.reuse_name).await?))
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        self.allow(&request, Scope::Read, "GetJob")?;
        self.jobs
            .status_with_job_file(&request.into_inner().job_id)
            .map(Response::new)
            .map_err(|e| Status::not_found(e.to_string()))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        self.allow(&request, Scope::Read, "ListJobs")?;
        Ok(Response::new(pb::ListJobsResponse { jobs: self.jobs.list()? }))
    }

    type WatchJobStream = EventStream;

    async fn watch_job(
        &self,
        request: Request<pb::WatchJobRequest>,
    ) -> Result<Response<EventStream>, Status> {
        self.allow(&request, Scope::Read, "WatchJob")?;
        let id = request.into_inner().job_id;
        // Subscribe before reading the status, so no event falls between the two.
        let mut events = self.jobs.subscribe();
        let first = self.jobs.status(&id).map_err(|e| Status::not_found(e.to_string()))?;
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let jobs = Arc::clone(&self.jobs);
        tokio::spawn(async move {
            let done = terminal(&first);
            if tx
                .send(Ok(pb::JobEvent {
                    status: Some(first),
                    kind: "status".into(),
                    ..Default::default()
                }))
                .await
                .is_err()
                || done
            {
                return;
            }
            loop {
                match events.recv().await {
                    Ok((job, ev)) if job == id => {
                        let end = ev.kind == "finished";
                        if tx.send(Ok(ev)).await.is_err() || end {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Fell behind: resend the current status and go on.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if let Ok(s) = jobs.status(&id) {
                            let end = terminal(&s);
                            if tx
                                .send(Ok(pb::JobEvent {
                                    status: Some(s),
                                    kind: if end { "finished" } else { "status" }.into(),
                                    ..Default::default()
                                }))
                                .await
                                .is_err()
                                || end
                            {
                                return;
                            }
                        }
                    }
                    Err(_) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        self.allow(&request, Scope::Submit, "CancelJob")?;
        self.jobs
            .cancel(&request.into_inner().job_id)
            .map(Response::new)
            .map_err(|e| Status::not_found(e.to_string()))
    }

    async fn resume_job(
        &self,
        request: Request<pb::ResumeJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        self.allow(&request, Scope::Submit, "ResumeJob")?;
        self.jobs
            .resume(&request.into_inner().job_id)
            .map(Response::new)
            .map_err(|e| Status::failed_precondition(e.to_string()))
    }

    type JobEpisodesStream = Pin<Box<dyn Stream<Item = Result<pb::EpisodeRecord, Status>> + Send>>;

    async fn job_episodes(
        &self,
        request: Request<pb::JobEpisodesRequest>,
    ) -> Result<Response<Self::JobEpisodesStream>, Status> {
        self.allow(&request, Scope::Read, "JobEpisodes")?;
        let r = request.into_inner();
        self.jobs.status(&r.job_id).map_err(|e| Status::not_found(e.to_string()))?;
        let rows = self.jobs.store.step_episodes(&r.job_id, r.step)?;
        let records = rows
            .into_iter()
            .map(|(episode_id, record_json)| Ok(pb::EpisodeRecord { episode_id, record_json }));
        Ok(Response::new(Box::pin(tokio_stream::iter(records))))
    }

    async fn register_worker(
        &self,
        request: Request<pb::RegisterWorkerRequest>,
    ) -> Result<Response<pb::RegisterWorkerResponse>, Status> {
        self.allow(&request, Scope::Worker, "RegisterWorker")?;
        let r = request.into_inner();
        if r.worker_id.is_empty() || r.address.is_empty() {
            return Err(Status::invalid_argument(
                "RegisterWorker needs a worker_id and the address the coordinator can dial",
            ));
        }
        self.jobs.scheduler.register(r.worker_id, r.address, r.max_episodes.max(1), r.incarnation);
        Ok(Response::new(pb::RegisterWorkerResponse {
            heartbeat_interval_ms: self.heartbeat_interval.as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        self.allow(&request, Scope::Worker, "Heartbeat")?;
        let r = request.into_inner();
        let known = self.jobs.scheduler.heartbeat(r.worker_id, r.draining).await;
        Ok(Response::new(pb::HeartbeatResponse { known }))
    }

    async fn list_workers(
        &self,
        request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        self.allow(&request, Scope::Read, "ListWorkers")?;
        let s = self.jobs.scheduler.snapshot().await;
        let mut workers: Vec<pb::WorkerStatus> = s
            .workers
            .into_iter()
            .map(|w| pb::WorkerStatus {
                worker_id: w.id,
                address: w.address,
                max_episodes: w.capacity,
                leased: w.leased,
                ready: w.ready,
                draining: w.draining,
            })
            .collect();
        workers.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        Ok(Response::new(pb::ListWorkersResponse { workers }))
    }
}
