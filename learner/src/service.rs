//! gRPC side of the learner: converts messages and forwards work to the training thread.
use crate::engine::{Command, LoadFailure, LoadWhich, Routed, Versions};
use crate::error::LearnerError;
use crate::experience::{Constrained, Experience, Finish};
use crate::metrics::AgentMetrics;
use crate::progress::Progress;
use crate::publish::DEFAULT_CHUNK_BYTES;
use crate::trainer::StepReport;
use comas_proto::v1 as pb;
use comas_proto::v1::learner_server::Learner;
use comas_workflow::moments::Moments;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Largest number of experiences one Train call may carry (a guard against runaway clients).
pub const MAX_EXPERIENCES: u32 = 1 << 20;

pub struct LearnerService {
    /// The agents this process trains.
    pub agents: BTreeMap<u32, AgentSide>,
    pub engine: mpsc::Sender<Routed>,
    pub load_failure: LoadFailure,
    pub roots: comas_service::AllowedRoots,
}

/// What the gRPC side holds of one agent: its published weights, metrics and step progress.
pub struct AgentSide {
    pub versions: Versions,
    pub metrics: AgentMetrics,
    pub progress: Arc<Progress>,
}

fn status(e: LearnerError) -> Status {
    match e {
        LearnerError::Batch(_) | LearnerError::Config(_) => Status::invalid_argument(e.to_string()),
        LearnerError::NonFinite { .. } => Status::failed_precondition(e.to_string()),
        LearnerError::Checkpoint(_) => Status::failed_precondition(e.to_string()),
        LearnerError::UnknownStep(_) => Status::not_found(e.to_string()),
        LearnerError::StepMismatch { .. } => Status::aborted(e.to_string()),
        LearnerError::PartlyUpdated(_) => Status::unavailable(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

impl LearnerService {
    /// The agent a call is for: the one its metadata names, or this learner's only agent.
    fn route(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(u32, &AgentSide), Status> {
        let served = || self.agents.keys().copied().collect::<Vec<_>>();
        match comas_service::agent::agent_of(metadata)? {
            Some(a) => self.agents.get(&a).map(|s| (a, s)).ok_or_else(|| {
                Status::failed_precondition(format!("this learner trains agents {:?}, not agent {a}: check that agent's learner address in the job", served()))
            }),
            None if self.agents.len() == 1 => Ok(self.agents.iter().next().map(|(&a, s)| (a, s)).expect("one agent")),
            None => Err(Status::invalid_argument(format!(
                "this learner trains agents {:?}: name one in the call's {} metadata",
                served(),
                comas_service::agent::AGENT_METADATA
            ))),
        }
    }

    async fn call<T>(
        &self,
        agent: u32,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.engine
            .send(Routed { agent, command: make(tx) })
            .map_err(|_| self.stopped("the training thread has stopped; restart the learner"))?;
        // The thread can also stop between taking the request and answering it: a model that
        // fails to load does so while the first calls wait in the queue.
        rx.await.map_err(|_| self.stopped("the training thread stopped before answering; restart the learner (its log says why)"))
    }

    /// A model that failed to load will not load by retrying: say why, as a permanent error,
    /// so the caller fails the job at once. Any other stop may be a crash worth retrying.
    fn stopped(&self, otherwise: &str) -> Status {
        match self.load_failure.get() {
            Some(why) => Status::failed_precondition(format!(
                "the learner could not load its model: {why}; fix it and restart the learner"
            )),
            None => Status::unavailable(otherwise),
        }
    }
}

fn experience_from(m: pb::Experience, i: usize) -> Result<Experience, Status> {
    let finish = match pb::FinishReason::try_from(m.finish_reason) {
        Ok(pb::FinishReason::Stop) => Finish::Stop,
        Ok(pb::FinishReason::Length) => Finish::Length,
        _ => {
            return Err(Status::invalid_argument(format!(
                "experience {i}: finish_reason must be STOP or LENGTH"
            )))
        }
    };
    Ok(Experience {
        prompt_ids: m.prompt_ids,
        completion_ids: m.completion_ids,
        reward: m.reward,
        token_rewards: (!m.token_rewards.is_empty()).then_some(m.token_rewards),
        finish_reason: finish,
        group: m.group,
        sampling_logprobs: (!m.sampling_logprobs.is_empty())
            .then(|| m.sampling_logprobs.iter().map(|&x| x as f64).collect()),
        episode_id: (!m.episode_id.is_empty()).then_some(m.episode_id),
        turn_id: Some(m.turn_id),
        policy_version: Some(m.policy_version),
        constrained: m
            .constrained
            .into_iter()
            .map(|c| Constrained { position: c.position as usize, allowed: c.allowed })
            .collect(),
        temperature: match m.temperature {
            Some(t) if !(t > 0.0 && t.is_finite()) => {
                return Err(Status::invalid_argument(format!(
                    "experience {i}: temperature must be positive and finite, got {t}"
                )))
            }
            t => t,
        },
        norm_group: m.norm_group,
    })
}

pub fn moments_to_pb(m: &BTreeMap<String, Moments>) -> Vec<pb::GroupMoments> {
    m.iter()
        .map(|(g, m)| pb::GroupMoments {
            norm_group: g.clone(),
            count: m.count,
            mean: m.mean,
            m2: m.m2,
        })
        .collect()
}

/// Pooled moments as sent by a caller: finite, non-negative, one entry per group.
fn moments_from_pb(m: &[pb::GroupMoments]) -> Result<BTreeMap<String, Moments>, Status> {
    let mut out = BTreeMap::new();
    for g in m {
        if !(g.mean.is_finite() && g.m2.is_finite() && g.m2 >= 0.0) {
            return Err(Status::invalid_argument(format!(
                "pooled moments of norm group {:?}: mean and m2 must be finite and m2 >= 0",
                g.norm_group
            )));
        }
        if out
            .insert(g.norm_group.clone(), Moments { count: g.count, mean: g.mean, m2: g.m2 })
            .is_some()
        {
            return Err(Status::invalid_argument(format!(
                "pooled moments name norm group {:?} twice",
                g.norm_group
            )));
        }
    }
    Ok(out)
}

pub fn report_to_pb(r: &StepReport) -> pb::TrainReport {
    pb::TrainReport {
        global_step: r.global_step,
        optimizer_steps: r.optimizer_steps,
        samples: r.samples as u32,
        tokens: r.tokens as u64,
        loss: r.loss,
        pg_loss: r.pg_loss,
        kl_loss: r.kl_loss,
        kl: r.kl,
        clip_frac: r.clip_frac,
        approx_kl: r.approx_kl,
        entropy: r.entropy,
        grad_norm: r.grad_norm,
        lr: r.lr,
        seconds: r.seconds,
        tokens_per_s: r.tokens_per_s,
        sampler_mismatch: r.sampler_mismatch,
        singleton_groups: r.singleton_groups as u32,
        truncated: r.truncated as u32,
        return_mean: r.return_mean,
        json: serde_json::to_string(r).unwrap_or_default(),
        return_moments: moments_to_pb(&r.return_moments),
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::WeightChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Learner for LearnerService {
    async fn train(
        &self,
        request: Request<Streaming<pb::TrainRequest>>,
    ) -> Result<Response<pb::TrainReport>, Status> {
        let (agent, side) = self.route(request.metadata())?;
        let mut stream = request.into_inner();
        let header = match stream.next().await {
            Some(Ok(pb::TrainRequest { item: Some(pb::train_request::Item::Header(h)) })) => h,
            Some(Err(e)) => return Err(e),
            _ => return Err(Status::invalid_argument("a Train stream must start with a header")),
        };
        if header.report_only {
            if header.num_experiences != 0 || stream.next().await.is_some() {
                return Err(Status::invalid_argument("a report_only Train carries no experiences"));
            }
            let r = self
                .call(agent, |reply| Command::Report { step_id: header.step_id, reply })
                .await?
                .map_err(status)?;
            return Ok(Response::new(report_to_pb(&r)));
        }
        // Zero is a step without samples: it advances the learner's step and trains nothing.
        if header.num_experiences > MAX_EXPERIENCES {
            return Err(Status::invalid_argument(format!(
                "num_experiences must be in 0..={MAX_EXPERIENCES}, got {}",
                header.num_experiences
            )));
        }
        let mut batch = Vec::with_capacity(header.num_experiences as usize);
        while let Some(msg) = stream.next().await {
            match msg?.item {
                Some(pb::train_request::Item::Experience(e)) => {
                    if batch.len() as u32 >= header.num_experiences {
                        return Err(Status::invalid_argument(format!(
                            "more experiences than the {} announced",
                            header.num_experiences
                        )));
                    }
                    let i = batch.len();
                    if let Some(v) = header.expected_version.filter(|&v| v != e.policy_version) {
                        return Err(Status::invalid_argument(format!(
                            "experience {i} (episode {}, turn {}) was sampled with policy version {}, but this step trains on version {v}; nothing was trained",
                            e.episode_id, e.turn_id, e.policy_version
                        )));
                    }
                    batch.push(experience_from(e, i)?);
                }
                _ => {
                    return Err(Status::invalid_argument("only experiences may follow the header"))
                }
            }
        }
        if batch.len() as u32 != header.num_experiences {
            return Err(Status::invalid_argument(format!(
                "stream ended after {} of {} experiences; nothing was trained",
                batch.len(),
                header.num_experiences
            )));
        }
        if header.moments_only {
            if !header.pooled_moments.is_empty() {
                return Err(Status::invalid_argument(
                    "a moments_only Train takes no pooled_moments",
                ));
            }
            let m = self
                .call(agent, |reply| Command::Moments {
                    step_id: header.step_id,
                    at_step: header.at_step,
                    batch,
                    reply,
                })
                .await?
                .map_err(status)?;
            return Ok(Response::new(pb::TrainReport {
                return_moments: moments_to_pb(&m),
                ..Default::default()
            }));
        }
        let pooled = (!header.pooled_moments.is_empty())
            .then(|| moments_from_pb(&header.pooled_moments))
            .transpose()?;
        let timer = side.metrics.step_seconds.start_timer();
        let result = self
            .call(agent, |reply| Command::Train {
                step_id: header.step_id,
                at_step: header.at_step,
                batch,
                pooled,
                reply,
            })
            .await?;
        match result {
            Ok(r) => {
                timer.observe_duration();
                side.metrics.steps.inc();
                side.metrics.tokens.inc_by(r.tokens as u64);
                side.metrics.loss.set(r.loss);
                side.metrics.grad_norm.set(r.grad_norm);
                side.metrics.lr.set(r.lr);
                Ok(Response::new(report_to_pb(&r)))
            }
            Err(e) => {
                timer.stop_and_discard();
                side.metrics.step_errors.inc();
                Err(status(e))
            }
        }
    }

    async fn publish_weights(
        &self,
        request: Request<pb::PublishWeightsRequest>,
    ) -> Result<Response<pb::WeightsPublished>, Status> {
        let (agent, side) = self.route(request.metadata())?;
        let expected = request.into_inner().expected_version;
        let p = self
            .call(agent, |reply| Command::Publish { expected, reply })
            .await?
            .map_err(status)?;
        side.metrics.version.set(p.version as i64);
        Ok(Response::new(pb::WeightsPublished {
            version: p.version,
            num_tensors: p.tensors.len() as u32,
            total_bytes: p.total_bytes(),
            lora: p.lora,
            dtype: p.dtype.clone(),
        }))
    }

    type StreamWeightsStream = ChunkStream;

    async fn stream_weights(
        &self,
        request: Request<pb::StreamWeightsRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let (_, side) = self.route(request.metadata())?;
        let req = request.into_inner();
        let found = side
            .versions
            .read()
            .expect("versions lock")
            .iter()
            .find(|v| v.version == req.version)
            .cloned();
        let Some(weights) = found else {
            let have: Vec<u64> =
                side.versions.read().expect("versions lock").iter().map(|v| v.version).collect();
            if have.is_empty() {
                // Nothing is published until the model has loaded: a learner that has just
                // (re)started is not ready yet, which a puller retries, unlike a missing version.
                return Err(self.stopped(&format!("the learner is still loading its model; weights version {} is not published yet", req.version)));
            }
            return Err(Status::not_found(format!(
                "weights version {} is not published here (have {have:?})",
                req.version
            )));
        };
        let max = if req.max_chunk_bytes == 0 {
            DEFAULT_CHUNK_BYTES
        } else {
            req.max_chunk_bytes as usize
        };
        let sent = side.metrics.weight_bytes_sent.clone();
        let stream = tokio_stream::iter(weights.chunks(max)).map(move |c| {
            sent.inc_by(c.data.len() as u64);
            Ok(c)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn save_checkpoint(
        &self,
        request: Request<pb::SaveCheckpointRequest>,
    ) -> Result<Response<pb::CheckpointInfo>, Status> {
        let (agent, _) = self.route(request.metadata())?;
        let expected = request.into_inner().expected_step;
        let s =
            self.call(agent, |reply| Command::Save { expected, reply }).await?.map_err(status)?;
        Ok(Response::new(pb::CheckpointInfo {
            path: s.path.display().to_string(),
            global_step: s.global_step,
            optimizer_steps: s.optimizer_steps,
        }))
    }

    async fn load_checkpoint(
        &self,
        request: Request<pb::LoadCheckpointRequest>,
    ) -> Result<Response<pb::CheckpointInfo>, Status> {
        let (agent, _) = self.route(request.metadata())?;
        let r = request.into_inner();
        let which = match (r.path.is_empty(), r.step) {
            (false, None) => LoadWhich::Path(r.path.into()),
            (true, None) => LoadWhich::Newest,
            (true, Some(step)) => LoadWhich::Step(step),
            (false, Some(_)) => {
                return Err(Status::invalid_argument(
                    "LoadCheckpoint takes a path or a step, not both",
                ))
            }
        };
        let s = self.call(agent, |reply| Command::Load { which, reply }).await?.map_err(status)?;
        Ok(Response::new(pb::CheckpointInfo {
            path: s.path.display().to_string(),
            global_step: s.global_step,
            optimizer_steps: s.optimizer_steps,
        }))
    }

    async fn export(
        &self,
        request: Request<pb::ExportRequest>,
    ) -> Result<Response<pb::CheckpointInfo>, Status> {
        let (agent, _) = self.route(request.metadata())?;
        let req = request.into_inner();
        if req.dir.is_empty() {
            return Err(Status::invalid_argument("Export needs a target folder (`dir`)"));
        }
        let dir = self
            .roots
            .check(std::path::Path::new(&req.dir))
            .map_err(|e| Status::permission_denied(format!("export folder: {e}")))?;
        let merge_lora = req.merge_lora;
        let s = self
            .call(agent, |reply| Command::Export { dir, merge_lora, reply })
            .await?
            .map_err(status)?;
        Ok(Response::new(pb::CheckpointInfo {
            path: s.path.display().to_string(),
            global_step: s.global_step,
            optimizer_steps: s.optimizer_steps,
        }))
    }

    async fn train_progress(
        &self,
        request: Request<pb::TrainProgressRequest>,
    ) -> Result<Response<pb::TrainProgressReport>, Status> {
        let (_, side) = self.route(request.metadata())?;
        Ok(Response::new(side.progress.report()))
    }

    async fn info(
        &self,
        request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::LearnerInfo>, Status> {
        let (agent, side) = self.route(request.metadata())?;
        let i = self.call(agent, |reply| Command::Info { reply }).await?;
        let latest =
            side.versions.read().expect("versions lock").back().map(|v| v.version).unwrap_or(0);
        Ok(Response::new(pb::LearnerInfo {
            agent_id: agent,
            model_type: i.model_type,
            num_parameters: i.num_parameters,
            trainable_parameters: i.trainable_parameters,
            lora: i.lora,
            dtype: i.dtype,
            device: i.device,
            global_step: i.global_step,
            optimizer_steps: i.optimizer_steps,
            latest_version: latest,
            config_json: i.config_json,
            memory_total_bytes: i.memory_total_bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service_of(
        agents: &[u32],
        failure: Option<&str>,
    ) -> (LearnerService, mpsc::Receiver<Routed>) {
        let (engine, rx) = mpsc::channel();
        let load_failure = LoadFailure::default();
        if let Some(why) = failure {
            load_failure.set(why.to_string()).unwrap();
        }
        let metrics = crate::metrics::Metrics::new();
        let sides = agents
            .iter()
            .map(|&a| {
                (
                    a,
                    AgentSide {
                        versions: Versions::default(),
                        metrics: metrics.agent(a),
                        progress: Progress::shared(),
                    },
                )
            })
            .collect();
        (LearnerService { agents: sides, engine, load_failure, roots: Default::default() }, rx)
    }

    fn service(failure: Option<&str>) -> (LearnerService, mpsc::Receiver<Routed>) {
        service_of(&[0], failure)
    }

    async fn pull(s: &LearnerService) -> Status {
        pull_for(s, None).await
    }

    async fn pull_for(s: &LearnerService, agent: Option<u32>) -> Status {
        let mut r = Request::new(pb::StreamWeightsRequest { version: 4, max_chunk_bytes: 0 });
        if let Some(a) = agent {
            r.metadata_mut().insert(comas_service::agent::AGENT_METADATA, a.into());
        }
        match s.stream_weights(r).await {
            Ok(_) => panic!("a learner with nothing published streamed weights"),
            Err(e) => e,
        }
    }

    #[tokio::test]
    async fn a_learner_of_several_agents_takes_calls_that_name_one_of_them() {
        let (s, _engine) = service_of(&[0, 2], None);
        let e = pull_for(&s, None).await;
        assert_eq!(
            (e.code(), e.message()),
            (
                tonic::Code::InvalidArgument,
                "this learner trains agents [0, 2]: name one in the call's comas-agent-id metadata"
            )
        );
        let e = pull_for(&s, Some(5)).await;
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().starts_with("this learner trains agents [0, 2], not agent 5"), "{e:?}");
        // Agent 2 is served: its weights are not published yet.
        assert_eq!(pull_for(&s, Some(2)).await.code(), tonic::Code::Unavailable);
        // A one-agent learner takes calls that name no agent, as before.
        let (one, _engine) = service(None);
        assert_eq!(pull_for(&one, None).await.code(), tonic::Code::Unavailable);
        assert_eq!(pull_for(&one, Some(1)).await.code(), tonic::Code::FailedPrecondition);
    }

    #[tokio::test]
    async fn weights_asked_of_a_learner_still_loading_are_worth_retrying() {
        let (s, _engine) = service(None);
        let e = pull(&s).await;
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert_eq!(
            e.message(),
            "the learner is still loading its model; weights version 4 is not published yet"
        );
    }

    #[tokio::test]
    async fn weights_asked_of_a_learner_that_failed_to_load_say_why() {
        let (s, _engine) = service(Some("config.json: missing field `hidden_size`"));
        let e = pull(&s).await;
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert_eq!(e.message(), "the learner could not load its model: config.json: missing field `hidden_size`; fix it and restart the learner");
    }
}
