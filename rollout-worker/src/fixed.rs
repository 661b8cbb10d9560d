//! A lightweight worker for load tests of the coordinator: it registers, heartbeats and answers
//! the whole worker protocol (LoadPolicies, RunEpisodes, UpdateWeights, CancelEpisodes, Info) but
//! runs no model. Every turn is the same fixed completion, given after a fixed delay; everything
//! else is real: the episode programs run (so the records are what the coordinator checks), each
//! turn carries the version the coordinator last set for its agent, and cancels stop episodes.
//! Weight updates take the version without pulling bytes: what is measured is the coordinator.
//! Many of them run in one process (`FixedWorker::start` per worker).
use crate::register::{self, Registration};
use comas_proto::v1 as pb;
use comas_proto::v1::rollout_worker_server::{RolloutWorker, RolloutWorkerServer};
use comas_workflow::program::{Program, ProgramStart, Reply, Request};
use comas_workflow::tool::ToolResult;
use comas_workflow::{FinishReason, TurnOutput, Unmetered, WorkflowError};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request as Call, Response, Status, Streaming};

/// What every fixed worker of a fleet does.
#[derive(Debug, Clone)]
pub struct FixedSettings {
    pub coordinator: String,
    /// The address each worker listens on (a free port of its own).
    pub ip: IpAddr,
    pub max_episodes: u32,
    /// How long each group of turns takes, as if decoded.
    pub turn_delay: Duration,
    /// Every turn's prompt and completion: token ids within the agents' vocabulary, and the
    /// text the method's grader reads.
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub text: String,
}

/// Counts shared by a fleet.
#[derive(Debug, Default)]
pub struct FixedStats {
    pub episodes: AtomicU64,
    pub cancelled: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
enum FixedError {
    #[error("the episode spec: {0}")]
    Spec(String),
    #[error(transparent)]
    Protocol(#[from] WorkflowError),
    #[error("the record as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// One running worker; `kill` stops it as a killed process would look to the coordinator.
pub struct FixedWorker {
    pub id: String,
    pub address: String,
    stop: watch::Sender<bool>,
}

impl FixedWorker {
    /// Starts a worker: it listens, registers as `id` and waits for work.
    pub async fn start(
        id: String,
        settings: Arc<FixedSettings>,
        stats: Arc<FixedStats>,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind((settings.ip, 0)).await?;
        let address = listener.local_addr()?.to_string();
        let (stop, stopped) = watch::channel(false);
        let service = Fixed {
            settings: Arc::clone(&settings),
            stats,
            versions: Arc::default(),
            running: Arc::default(),
            cancelled_early: Arc::default(),
            stopped: stopped.clone(),
        };
        let registration = Registration {
            coordinator: settings.coordinator.clone(),
            worker_id: id.clone(),
            advertise: address.clone(),
            max_episodes: settings.max_episodes.max(1),
            bearer: comas_service::auth::Bearer::new(None).expect("no token"),
        };
        let (_draining_tx, draining) = watch::channel(false);
        tokio::spawn(register::run(registration, draining, stopped.clone()));
        let router =
            tonic::transport::Server::builder().add_service(RolloutWorkerServer::new(service));
        let mut until = stopped;
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = until.wait_for(|s| *s).await;
            };
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, shutdown).await {
                tracing::warn!(error = %e, "a fixed worker's server failed");
            }
        });
        Ok(Self { id, address, stop })
    }

    /// Its episode streams break, it answers nothing more and stops heartbeating (as when it
    /// is dropped).
    pub fn kill(self) {}
}

impl Drop for FixedWorker {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

#[derive(Clone)]
struct Fixed {
    settings: Arc<FixedSettings>,
    stats: Arc<FixedStats>,
    versions: Arc<Mutex<BTreeMap<u32, u64>>>,
    /// Running episodes by id: a cancel wakes the one it names.
    running: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    /// Cancels that came before their spec.
    cancelled_early: Arc<Mutex<HashSet<String>>>,
    stopped: watch::Receiver<bool>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fixed {
    fn reply(&self, request: Request) -> Reply {
        match request {
            Request::Turn(t) => {
                let s = &self.settings;
                let version = lock(&self.versions).get(&t.agent).copied().unwrap_or(0);
                Reply::Turn(TurnOutput {
                    turn_index: t.turn_index,
                    text: s.text.clone(),
                    raw_text: s.text.clone(),
                    prompt_ids: s.prompt_ids.clone(),
                    completion_ids: s.completion_ids.clone(),
                    logprobs: vec![-1.0; s.completion_ids.len()],
                    finish_reason: FinishReason::Stop,
                    policy_version: version,
                    constrained: Vec::new(),
                })
            }
            Request::Tool(t) => Reply::Tool(ToolResult {
                call_index: t.call_index,
                failure: None,
                detail: String::new(),
                stdout: String::new(),
                stderr: String::new(),
                files: Vec::new(),
            }),
        }
    }

    /// Runs one episode's program to its end, each group of turns after the turn delay.
    async fn play(&self, spec: &pb::EpisodeSpec) -> Result<(String, u32, u64), FixedError> {
        let start = ProgramStart::parse(
            &spec.method,
            &spec.config_json,
            &spec.question_json,
            &spec.plan_json,
            spec.instance,
            spec.seed,
        )
        .map_err(FixedError::Spec)?;
        let mut program = Program::start(&start, &Unmetered)?;
        while !program.is_done() {
            let requests = program.pending();
            tokio::time::sleep(self.settings.turn_delay).await;
            let replies = requests.into_iter().map(|r| self.reply(r)).collect();
            program.submit(replies, &Unmetered)?;
        }
        let record = program.finish()?;
        Ok((record.to_json()?, record.turns(), record.completion_tokens()))
    }

    async fn episode(&self, spec: pb::EpisodeSpec) -> pb::EpisodeResult {
        let id = spec.episode_id.clone();
        let cancelled = || pb::EpisodeResult {
            episode_id: id.clone(),
            error: "cancelled by the coordinator".into(),
            error_kind: pb::EpisodeErrorKind::Cancelled as i32,
            ..Default::default()
        };
        if lock(&self.cancelled_early).remove(&id) {
            return cancelled();
        }
        let wake = Arc::new(Notify::new());
        lock(&self.running).insert(id.clone(), Arc::clone(&wake));
        let outcome = tokio::select! {
            r = self.play(&spec) => Some(r),
            _ = wake.notified() => None,
        };
        lock(&self.running).remove(&id);
        match outcome {
            None => cancelled(),
            Some(Ok((trajectory_json, turns, generated_tokens))) => {
                self.stats.episodes.fetch_add(1, Ordering::Relaxed);
                pb::EpisodeResult {
                    episode_id: id,
                    trajectory_json,
                    turns,
                    generated_tokens,
                    ..Default::default()
                }
            }
            Some(Err(e)) => {
                pb::EpisodeResult { episode_id: id, error: e.to_string(), ..Default::default() }
            }
        }
    }
}

type ResultStream = Pin<Box<dyn Stream<Item = Result<pb::EpisodeResult, Status>> + Send>>;

#[tonic::async_trait]
impl RolloutWorker for Fixed {
    async fn load_policies(
        &self,
        request: Call<pb::LoadPoliciesRequest>,
    ) -> Result<Response<pb::LoadPoliciesResponse>, Status> {
        let agents = request.into_inner().agents;
        *lock(&self.versions) = agents.iter().map(|a| (a.agent_id, 0)).collect();
        Ok(Response::new(pb::LoadPoliciesResponse {
            num_agents: agents.len() as u32,
            num_models: 1,
        }))
    }

    type RunEpisodesStream = ResultStream;

    async fn run_episodes(
        &self,
        request: Call<Streaming<pb::EpisodeSpec>>,
    ) -> Result<Response<ResultStream>, Status> {
        let mut incoming = request.into_inner();
        let (out, results) = mpsc::channel::<Result<pb::EpisodeResult, Status>>(256);
        let me = self.clone();
        tokio::spawn(async move {
            let (done_tx, mut done) = mpsc::unbounded_channel::<pb::EpisodeResult>();
            let (mut open, mut outstanding) = (true, 0usize);
            let mut stopped = me.stopped.clone();
            while open || outstanding > 0 {
                tokio::select! {
                    _ = async { stopped.wait_for(|s| *s).await.map(|_| ()) } => {
                        let _ = out.send(Err(Status::unavailable("the worker stopped"))).await;
                        return;
                    }
                    msg = incoming.next(), if open => match msg {
                        Some(Ok(spec)) => {
                            outstanding += 1;
                            let (me, done_tx) = (me.clone(), done_tx.clone());
                            tokio::spawn(async move {
                                let _ = done_tx.send(me.episode(spec).await);
                            });
                        }
                        None => open = false,
                        Some(Err(_)) => return,
                    },
                    Some(result) = done.recv() => {
                        outstanding -= 1;
                        if out.send(Ok(result)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(results))))
    }

    async fn update_weights(
        &self,
        request: Call<pb::UpdateWeightsRequest>,
    ) -> Result<Response<pb::UpdateWeightsResponse>, Status> {
        let r = request.into_inner();
        lock(&self.versions).insert(r.agent_id, r.version);
        Ok(Response::new(pb::UpdateWeightsResponse {
            version: r.version,
            bytes: 0,
            seconds: 0.0,
            served_by: r.source,
            relayed: r.relay,
        }))
    }

    async fn info(
        &self,
        _: Call<pb::WorkerInfoRequest>,
    ) -> Result<Response<pb::WorkerInfo>, Status> {
        let agents = lock(&self.versions)
            .iter()
            .map(|(&agent_id, &version)| pb::AgentVersion { agent_id, version })
            .collect();
        let running = lock(&self.running).len() as u32;
        Ok(Response::new(pb::WorkerInfo {
            agents,
            running_episodes: running,
            ..Default::default()
        }))
    }

    type RelayWeightsStream = Pin<Box<dyn Stream<Item = Result<pb::WeightChunk, Status>> + Send>>;

    async fn relay_weights(
        &self,
        _: Call<pb::RelayWeightsRequest>,
    ) -> Result<Response<Self::RelayWeightsStream>, Status> {
        Err(Status::not_found("a fixed-token worker holds no weights to relay"))
    }

    async fn cancel_episodes(
        &self,
        request: Call<pb::CancelEpisodesRequest>,
    ) -> Result<Response<pb::CancelEpisodesResponse>, Status> {
        let (mut stopped, mut unknown) = (0, 0);
        for id in request.into_inner().episode_ids {
            match lock(&self.running).remove(&id) {
                Some(wake) => {
                    wake.notify_one();
                    stopped += 1;
                }
                None => {
                    lock(&self.cancelled_early).insert(id);
                    unknown += 1;
                }
            }
        }
        self.stats.cancelled.fetch_add(stopped as u64, Ordering::Relaxed);
        Ok(Response::new(pb::CancelEpisodesResponse { stopped, unknown, tokens_before: 0 }))
    }
}
