//! gRPC side of the worker: parses specs, streams results back as episodes end, pulls weights.
use crate::engine::{Command, EngineError, EpisodeJob, EpisodeOutcome};
use crate::metrics::Metrics;
use crate::models::PolicySpec;
use crate::relay::{Relay, Transfer};
use crate::remote::RemotePolicy;
use comas_proto::v1 as pb;
use comas_proto::v1::learner_client::LearnerClient;
use comas_proto::v1::rollout_worker_client::RolloutWorkerClient;
use comas_proto::v1::rollout_worker_server::RolloutWorker;
use comas_proto::weights::{Assembler, ReceivedTensor};
use comas_service::openai::{Endpoint, DEFAULT_ATTEMPTS};
use comas_workflow::program::ProgramStart;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc as tmpsc, oneshot};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

pub struct WorkerService {
    pub engine: mpsc::Sender<Command>,
    pub metrics: Arc<Metrics>,
    pub next_stream: AtomicU64,
    /// Fires (with `true`) once LoadPolicies succeeded, so health can report SERVING.
    pub loaded: tokio::sync::watch::Sender<bool>,
    pub weight_timeout: Duration,
    /// Chunks of the newest pulled versions, served to the next workers of a relay chain.
    pub relay: Relay,
    /// Bytes of each agent's newest pull so far, for `Info`.
    pub pulls: crate::pulls::PullMeter,
    /// Turns true once a drain has finished: open episode streams end so the server can stop.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// Set, with the reason, once the engine thread has died: open streams end at once.
    pub engine_failed: tokio::sync::watch::Receiver<Option<String>>,
}

/// Resolves with the reason once the engine thread has died (never, if the sender is gone).
async fn engine_death(failed: &mut tokio::sync::watch::Receiver<Option<String>>) -> String {
    let why = failed.wait_for(Option::is_some).await.map(|why| why.clone().unwrap_or_default());
    match why {
        Ok(why) => why,
        Err(_) => std::future::pending().await,
    }
}

fn engine_gone() -> Status {
    Status::unavailable("the engine thread has stopped; restart the worker")
}

/// Why an episode spec from the coordinator cannot be run; sent back as the episode's error.
#[derive(Debug, thiserror::Error)]
enum SpecError {
    #[error("an episode spec needs an episode_id")]
    NoEpisodeId,
    #[error("episode {episode}: {why}")]
    Program { episode: String, why: String },
}

fn parse_job(spec: pb::EpisodeSpec) -> Result<EpisodeJob, SpecError> {
    if spec.episode_id.is_empty() {
        return Err(SpecError::NoEpisodeId);
    }
    let start = ProgramStart::parse(
        &spec.method,
        &spec.config_json,
        &spec.question_json,
        &spec.plan_json,
        spec.instance,
        spec.seed,
    )
    .map_err(|why| SpecError::Program { episode: spec.episode_id.clone(), why })?;
    Ok(EpisodeJob { start, episode_id: spec.episode_id })
}

fn result_of(o: EpisodeOutcome) -> pb::EpisodeResult {
    match o.result {
        Ok((json, turns, tokens)) => pb::EpisodeResult {
            episode_id: o.episode_id,
            trajectory_json: json,
            turns,
            generated_tokens: tokens,
            ..Default::default()
        },
        Err(e) => {
            let kind = match e {
                EngineError::Draining => pb::EpisodeErrorKind::Draining,
                EngineError::Cancelled => pb::EpisodeErrorKind::Cancelled,
                _ => pb::EpisodeErrorKind::Failed,
            };
            pb::EpisodeResult {
                episode_id: o.episode_id,
                error: e.to_string(),
                error_kind: kind as i32,
                ..Default::default()
            }
        }
    }
}

type ResultStream = Pin<Box<dyn Stream<Item = Result<pb::EpisodeResult, Status>> + Send>>;

/// Chunks queued per relay stream ahead of a slow reader.
const RELAY_QUEUE_CHUNKS: usize = 8;

impl WorkerService {
    /// Pulls one version from `source` (a learner, or with `relay` a peer worker), recording
    /// the chunks for the workers that relay from here. The tensors come back only when every
    /// one arrived whole and passed its checksum.
    async fn pull(
        &self,
        req: &pb::UpdateWeightsRequest,
        source: &str,
        relay: bool,
    ) -> Result<(Vec<ReceivedTensor>, u64), Status> {
        let source = comas_service::grpc_uri(source);
        let transfer = self.relay.begin(req.agent_id, req.version);
        self.pulls.begin(req.agent_id, req.version);
        let result = tokio::time::timeout(
            self.weight_timeout,
            receive(req, &source, relay, &transfer, &self.pulls),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!(
                "pulling version {} from {source} took longer than {:?}",
                req.version, self.weight_timeout
            )))
        });
        match &result {
            Ok(_) => transfer.complete(),
            Err(e) => transfer.fail(e.message()),
        }
        result
    }
}

async fn receive(
    req: &pb::UpdateWeightsRequest,
    source: &str,
    relay: bool,
    transfer: &Transfer,
    pulls: &crate::pulls::PullMeter,
) -> Result<(Vec<ReceivedTensor>, u64), Status> {
    let broken = |e: Status| source_status(source, e);
    let unreachable = |e: comas_service::tls::ConnectError| {
        Status::unavailable(format!("cannot reach weight source {source}: {e}"))
    };
    let channel = comas_service::weights_channel(source).await.map_err(unreachable)?;
    let mut stream = if relay {
        let mut client = RolloutWorkerClient::new(channel)
            .max_decoding_message_size(comas_service::limits::WEIGHT_MESSAGE_BYTES);
        client
            .relay_weights(pb::RelayWeightsRequest { agent_id: req.agent_id, version: req.version })
            .await
            .map_err(broken)?
            .into_inner()
    } else {
        let mut client =
            LearnerClient::with_interceptor(channel, comas_service::agent::ForAgent(req.agent_id))
                .max_decoding_message_size(comas_service::limits::WEIGHT_MESSAGE_BYTES);
        client
            .stream_weights(pb::StreamWeightsRequest { version: req.version, max_chunk_bytes: 0 })
            .await
            .map_err(broken)?
            .into_inner()
    };
    let mut asm = Assembler::default();
    let mut bytes = 0u64;
    while let Some(chunk) = stream.message().await.map_err(broken)? {
        if chunk.version != req.version {
            return Err(Status::data_loss(format!(
                "source sent version {} while {} was asked for",
                chunk.version, req.version
            )));
        }
        bytes += chunk.data.len() as u64;
        pulls.add(req.agent_id, req.version, chunk.data.len() as u64);
        asm.push(&chunk).map_err(Status::data_loss)?;
        transfer.push(chunk);
    }
    Ok((asm.finish().map_err(Status::data_loss)?, bytes))
}

/// A weight source's error as this worker reports it. A transfer cut off by the connection
/// (the learner restarting) is UNAVAILABLE, which the coordinator retries; the source's own
/// answers (a version it does not have, a model it could not load) keep their code.
fn source_status(source: &str, e: Status) -> Status {
    match e.code() {
        tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Unavailable => {
            Status::unavailable(format!("weight source {source} broke off: {}", e.message()))
        }
        _ => e,
    }
}

/// The endpoint of a frozen model served elsewhere, with its API key read from this worker's
/// environment; `None` for a model the worker loads.
fn remote_policy(a: &pb::AgentPolicy) -> Result<Option<RemotePolicy>, Status> {
    if a.endpoint.is_empty() {
        return Ok(None);
    }
    let bad = |m: String| Status::invalid_argument(format!("agent {}: {m}", a.agent_id));
    if !a.model_dir.is_empty() || !a.adapter_dir.is_empty() || a.full_weights {
        return Err(
            bad("an endpoint model has no model folder, adapter or weights to load".into()),
        );
    }
    let api_key = match a.api_key_env.as_str() {
        "" => None,
        var => Some(std::env::var(var).map_err(|_| {
            Status::failed_precondition(format!(
                "agent {}: the environment variable {var} (api_key_env) is not set on this worker; set it to the endpoint's API key",
                a.agent_id
            ))
        })?),
    };
    let endpoint = Endpoint::parse(&a.endpoint, api_key).map_err(|e| bad(e.to_string()))?;
    if a.endpoint_model.is_empty() {
        return Err(bad(
            "an endpoint model needs the name the endpoint serves it under (endpoint_model)".into(),
        ));
    }
    let max_attempts = if a.max_attempts == 0 { DEFAULT_ATTEMPTS } else { a.max_attempts };
    Ok(Some(RemotePolicy { endpoint, model: a.endpoint_model.clone(), max_attempts }))
}

#[tonic::async_trait]
impl RolloutWorker for WorkerService {
    async fn load_policies(
        &self,
        request: Request<pb::LoadPoliciesRequest>,
    ) -> Result<Response<pb::LoadPoliciesResponse>, Status> {
        let req = request.into_inner();
        if req.agents.is_empty() {
            return Err(Status::invalid_argument("LoadPolicies needs at least one agent"));
        }
        let engine = crate::engine::EngineKind::parse(&req.engine)
            .map_err(|e| Status::invalid_argument(format!("LoadPolicies `engine`: {e}")))?;
        let specs = req
            .agents
            .into_iter()
            .map(|a| {
                let lora = if a.lora_json.is_empty() {
                    None
                } else {
                    Some(serde_json::from_str(&a.lora_json).map_err(|e| {
                        Status::invalid_argument(format!(
                            "agent {}: `lora_json` is not valid: {e}",
                            a.agent_id
                        ))
                    })?)
                };
                Ok(PolicySpec {
                    agent: a.agent_id,
                    remote: remote_policy(&a)?,
                    model_dir: PathBuf::from(a.model_dir),
                    adapter_dir: (!a.adapter_dir.is_empty()).then(|| PathBuf::from(a.adapter_dir)),
                    full_weights: a.full_weights,
                    lora,
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let (tx, rx) = oneshot::channel();
        self.engine
            .send(Command::Load { specs, dtype: req.dtype, engine, reply: tx })
            .map_err(|_| engine_gone())?;
        let (agents, models) = rx.await.map_err(|_| engine_gone())?.map_err(Status::from)?;
        let _ = self.loaded.send(true);
        Ok(Response::new(pb::LoadPoliciesResponse {
            num_agents: agents as u32,
            num_models: models as u32,
        }))
    }

    type RunEpisodesStream = ResultStream;

    async fn run_episodes(
        &self,
        request: Request<Streaming<pb::EpisodeSpec>>,
    ) -> Result<Response<ResultStream>, Status> {
        let mut incoming = request.into_inner();
        let stream = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let engine = self.engine.clone();
        let mut stopping = self.stopping.clone();
        let mut failed = self.engine_failed.clone();
        let (out_tx, out_rx) = tmpsc::channel::<Result<pb::EpisodeResult, Status>>(64);
        let fault = crate::engine::fault_from_env();
        tokio::spawn(async move {
            let (res_tx, mut res_rx) = tmpsc::unbounded_channel::<EpisodeOutcome>();
            let mut outstanding = 0usize;
            let mut input_open = true;
            let cancel = |engine: &mpsc::Sender<Command>| {
                let _ = engine.send(Command::CancelStream { stream });
            };
            loop {
                if (!input_open || *stopping.borrow()) && outstanding == 0 {
                    break;
                }
                let stopped = *stopping.borrow();
                tokio::select! {
                    // Drained: end the stream so the client sees the worker go (nothing is lost,
                    // the coordinator re-queues whatever it still had leased here).
                    _ = stopping.changed(), if !stopped => {}
                    // The client is gone (its connection closed): nobody will read what these
                    // episodes make, and a worker that registers again must be free to load.
                    _ = out_tx.closed() => {
                        tracing::info!(stream, outstanding, "episode stream's reader is gone");
                        cancel(&engine);
                        return;
                    }
                    // No result can come any more: the client re-sends its episodes elsewhere.
                    why = engine_death(&mut failed) => {
                        let _ = out_tx.send(Err(Status::unavailable(format!("the engine thread died ({why}); the worker is stopping")))).await;
                        return;
                    }
                    msg = incoming.next(), if input_open => match msg {
                        Some(Ok(spec)) => match parse_job(spec.clone()) {
                            Ok(job) => {
                                if engine.send(Command::Episode { stream, job, results: res_tx.clone() }).is_err() {
                                    let _ = out_tx.send(Err(engine_gone())).await;
                                    return;
                                }
                                outstanding += 1;
                            }
                            Err(e) => {
                                let r = pb::EpisodeResult { episode_id: spec.episode_id, error: e.to_string(), ..Default::default() };
                                if out_tx.send(Ok(r)).await.is_err() {
                                    cancel(&engine);
                                    return;
                                }
                            }
                        },
                        // The client half-closed: finish what was sent, then end the stream.
                        None => input_open = false,
                        // A broken stream: drop this stream's episodes; the coordinator re-queues them.
                        Some(Err(e)) => {
                            tracing::warn!(stream, error = %e, "episode stream broke");
                            cancel(&engine);
                            return;
                        }
                    },
                    Some(outcome) = res_rx.recv() => {
                        outstanding -= 1;
                        if let Some(crate::engine::Fault::SlowResult(ms)) = fault {
                            // Sent later from its own task: the stream stays open until then.
                            let (out_tx, result) = (out_tx.clone(), result_of(outcome));
                            tokio::spawn(async move {
                                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                                let _ = out_tx.send(Ok(result)).await;
                            });
                            continue;
                        }
                        if out_tx.send(Ok(result_of(outcome))).await.is_err() {
                            cancel(&engine);
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out_rx))))
    }

    async fn cancel_episodes(
        &self,
        request: Request<pb::CancelEpisodesRequest>,
    ) -> Result<Response<pb::CancelEpisodesResponse>, Status> {
        let episode_ids = request.into_inner().episode_ids;
        let (reply, rx) = oneshot::channel();
        self.engine.send(Command::Cancel { episode_ids, reply }).map_err(|_| engine_gone())?;
        let r = rx.await.map_err(|_| engine_gone())?;
        Ok(Response::new(pb::CancelEpisodesResponse {
            stopped: r.stopped,
            unknown: r.unknown,
            tokens_before: r.tokens_before,
        }))
    }

    async fn update_weights(
        &self,
        request: Request<pb::UpdateWeightsRequest>,
    ) -> Result<Response<pb::UpdateWeightsResponse>, Status> {
        let req = request.into_inner();
        let started = Instant::now();
        let (tensors, bytes, served_by, relayed) = match self
            .pull(&req, &req.source, req.relay)
            .await
        {
            Ok((t, b)) => (t, b, req.source.clone(), req.relay),
            Err(e) if !req.fallback_source.is_empty() => {
                tracing::warn!(agent = req.agent_id, version = req.version, source = %req.source, error = %e.message(), "weight pull failed; pulling from the learner instead");
                let (t, b) = self.pull(&req, &req.fallback_source, false).await?;
                (t, b, req.fallback_source.clone(), false)
            }
            Err(e) => return Err(e),
        };
        self.metrics.weight_bytes_received.inc_by(bytes);
        if let Some(crate::engine::Fault::SlowSwap(secs)) = crate::engine::fault_from_env() {
            tokio::time::sleep(Duration::from_secs(secs)).await;
        }
        let (tx, rx) = oneshot::channel();
        self.engine
            .send(Command::Update { agent: req.agent_id, version: req.version, tensors, reply: tx })
            .map_err(|_| engine_gone())?;
        rx.await.map_err(|_| engine_gone())?.map_err(Status::from)?;
        self.relay.held(req.agent_id, req.version);
        self.pulls.finish(req.agent_id, req.version);
        Ok(Response::new(pb::UpdateWeightsResponse {
            version: req.version,
            bytes,
            seconds: started.elapsed().as_secs_f64(),
            served_by,
            relayed,
        }))
    }

    type RelayWeightsStream = Pin<Box<dyn Stream<Item = Result<pb::WeightChunk, Status>> + Send>>;

    async fn relay_weights(
        &self,
        request: Request<pb::RelayWeightsRequest>,
    ) -> Result<Response<Self::RelayWeightsStream>, Status> {
        let req = request.into_inner();
        let transfer = self.relay.find(req.agent_id, req.version).await?;
        let metrics = Arc::clone(&self.metrics);
        let (tx, rx) = tmpsc::channel(RELAY_QUEUE_CHUNKS);
        tokio::spawn(async move {
            let mut sent = 0;
            loop {
                match transfer.next_chunks(sent).await {
                    Ok(Some(chunks)) => {
                        for c in chunks {
                            sent += 1;
                            metrics.weight_bytes_relayed.inc_by(c.data.len() as u64);
                            if tx.send(Ok(c)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(None) => return,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn info(
        &self,
        _: Request<pb::WorkerInfoRequest>,
    ) -> Result<Response<pb::WorkerInfo>, Status> {
        let (tx, rx) = oneshot::channel();
        self.engine.send(Command::Info { reply: tx }).map_err(|_| engine_gone())?;
        let s = rx.await.map_err(|_| engine_gone())?;
        Ok(Response::new(pb::WorkerInfo {
            agents: s
                .versions
                .into_iter()
                .map(|(agent_id, version)| pb::AgentVersion { agent_id, version })
                .collect(),
            running_episodes: s.running_episodes as u32,
            running_sequences: s.running_sequences as u32,
            waiting_turns: s.waiting_turns as u32,
            draining: s.draining,
            pulls: self.pulls.report(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_cut_off_is_retried_and_the_sources_answers_are_kept() {
        let cut = source_status(
            "http://l:1",
            Status::unknown("h2 protocol error: error reading a body from connection"),
        );
        assert_eq!(
            (cut.code(), cut.message()),
            (tonic::Code::Unavailable, "weight source http://l:1 broke off: h2 protocol error: error reading a body from connection")
        );
        let missing = source_status(
            "http://l:1",
            Status::not_found("weights version 3 is not published here (have [4])"),
        );
        assert_eq!(
            (missing.code(), missing.message()),
            (tonic::Code::NotFound, "weights version 3 is not published here (have [4])")
        );
    }
}
