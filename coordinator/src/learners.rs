//! Links to the job's learners. Every call has a deadline; while a learner is unreachable (for
//! example restarting from its checkpoint) calls are retried with backoff until the deadline,
//! and the error names the agent and the address.
//!
//! Deadlines: a call that trains (`Train`) may take as long as the step takes, but not without
//! proof of life: the learner's `TrainProgress` must move (a new step, or one more micro-batch
//! through the model, in the log-prob pass before training as in training) at least once per
//! `patience`; a learner that answers but whose training is stuck fails the
//! call. Every other call answers within `patience` (at least `MIN_ANSWER`) or fails.
use crate::error::{CoordinatorError, Result};
use comas_proto::v1 as pb;
use comas_proto::v1::learner_client::LearnerClient;
use comas_service::agent::ForAgent;
use comas_service::limits::PEER_MESSAGE_BYTES;
use std::future::Future;
use std::time::{Duration, Instant};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// A learner client whose every call names the link's agent (a learner may train several).
pub type Client = LearnerClient<InterceptedService<Channel, ForAgent>>;

pub struct LearnerLink {
    pub agent: u32,
    pub address: String,
    client: Option<Client>,
    /// How long to keep retrying an unreachable learner.
    pub patience: Duration,
}

/// The shortest bound on one try of a call that does not train: a link with no patience (one
/// try) still waits this long for an answer.
const MIN_ANSWER: Duration = Duration::from_secs(10);

/// How often the coordinator asks learners how far their step has got.
pub(crate) const TRAIN_PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// How long a progress probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors worth retrying: the learner is down, restarting or its connection dropped.
/// (ABORTED is not one: the same call would fail again; see `CoordinatorError::LearnerMoved`.)
fn transient(s: &Status) -> bool {
    matches!(s.code(), Code::Unavailable | Code::Cancelled | Code::Unknown)
}

impl LearnerLink {
    pub fn new(agent: u32, address: &str, patience: Duration) -> Self {
        let address = comas_service::grpc_uri(address);
        Self { agent, address, client: None, patience }
    }

    fn err(&self, message: String) -> CoordinatorError {
        CoordinatorError::Learner { agent: self.agent, address: self.address.clone(), message }
    }

    async fn client(&mut self) -> Result<Client, Status> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let ch = comas_service::tls::channel(&self.address, |e| {
            e.connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(20))
        })
        .await
        .map_err(|e| match e {
            comas_service::tls::ConnectError::Address { .. } => {
                Status::invalid_argument(format!("bad address: {e}"))
            }
            e => Status::unavailable(format!("cannot connect: {e}")),
        })?;
        let c = LearnerClient::with_interceptor(ch, ForAgent(self.agent))
            .max_decoding_message_size(PEER_MESSAGE_BYTES)
            .max_encoding_message_size(PEER_MESSAGE_BYTES);
        self.client = Some(c.clone());
        Ok(c)
    }

    /// How far the learner's step in training has got: one try, `None` when it does not answer
    /// in time (progress is for display; the training call itself has its own deadlines).
    pub async fn train_progress(&mut self) -> Option<pb::TrainProgressReport> {
        let mut c = self.client().await.ok()?;
        match tokio::time::timeout(PROBE_TIMEOUT, c.train_progress(pb::TrainProgressRequest {}))
            .await
        {
            Ok(Ok(r)) => Some(r.into_inner()),
            _ => {
                self.client = None;
                None
            }
        }
    }

    /// Runs `f` until it succeeds, fails for good, or the learner stays unreachable too long;
    /// each try answers within `patience` (at least `MIN_ANSWER`).
    pub async fn call<T, F, Fut>(&mut self, what: &str, f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_with(what, Some(self.patience.max(MIN_ANSWER)), f).await
    }

    /// As `call`, each try bounded by `each` when given.
    async fn call_with<T, F, Fut>(
        &mut self,
        what: &str,
        each: Option<Duration>,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let started = Instant::now();
        let mut backoff = comas_service::backoff::Backoff::reconnect();
        loop {
            let outcome = match self.client().await {
                Ok(c) => match each {
                    Some(limit) => match tokio::time::timeout(limit, f(c)).await {
                        Ok(r) => r.map(tonic::Response::into_inner),
                        Err(_) => {
                            return Err(self.err(format!(
                            "{what}: no answer within {limit:?} (the job's learner_timeout_secs)"
                        )))
                        }
                    },
                    None => f(c).await.map(tonic::Response::into_inner),
                },
                Err(e) => Err(e),
            };
            match outcome {
                Ok(v) => return Ok(v),
                Err(s) if transient(&s) && started.elapsed() < self.patience => {
                    tracing::warn!(agent = self.agent, address = %self.address, error = %s.message(), "{what}: learner unreachable; retrying");
                    self.client = None;
                    tokio::time::sleep(backoff.next_wait()).await;
                }
                Err(s) if s.code() == Code::Aborted => {
                    return Err(CoordinatorError::LearnerMoved {
                        agent: self.agent,
                        address: self.address.clone(),
                        message: format!("{what}: {}", s.message()),
                    })
                }
                Err(s) => {
                    let hint = if transient(&s) {
                        format!(" (unreachable for {:?}; is the learner running?)", self.patience)
                    } else {
                        String::new()
                    };
                    return Err(self.err(format!("{what}: {}{hint}", s.message())));
                }
            }
        }
    }

    pub async fn info(&mut self) -> Result<pb::LearnerInfo> {
        self.call("Info", |mut c| async move { c.info(pb::InfoRequest {}).await }).await
    }

    /// Trains one step; `step_id` makes a retry after a dropped connection harmless. With
    /// `version`, the learner refuses the step unless every experience was sampled with it;
    /// with `at_step`, unless it is at that training step (`LearnerMoved` otherwise). Norm groups
    /// named in `pooled` are whitened with those moments instead of the learner's own.
    pub async fn train(
        &mut self,
        step_id: &str,
        experiences: &[pb::Experience],
        version: Option<u64>,
        at_step: Option<u64>,
        pooled: &[pb::GroupMoments],
    ) -> Result<pb::TrainReport> {
        let header = pb::TrainHeader {
            step_id: step_id.to_string(),
            num_experiences: experiences.len() as u32,
            expected_version: version,
            at_step,
            pooled_moments: pooled.to_vec(),
            ..Default::default()
        };
        self.send_train("Train", header, experiences).await
    }

    /// The moments of the step's returns per norm group, computed by the learner without
    /// training (which it then does on the Train call of the same `step_id`).
    pub async fn moments(
        &mut self,
        step_id: &str,
        experiences: &[pb::Experience],
        version: Option<u64>,
        at_step: Option<u64>,
    ) -> Result<Vec<pb::GroupMoments>> {
        let header = pb::TrainHeader {
            step_id: step_id.to_string(),
            num_experiences: experiences.len() as u32,
            expected_version: version,
            at_step,
            moments_only: true,
            ..Default::default()
        };
        Ok(self.send_train("Train (moments)", header, experiences).await?.return_moments)
    }

    async fn send_train(
        &mut self,
        what: &str,
        header: pb::TrainHeader,
        experiences: &[pb::Experience],
    ) -> Result<pb::TrainReport> {
        let header = pb::TrainRequest { item: Some(pb::train_request::Item::Header(header)) };
        let mut probe = LearnerLink::new(self.agent, &self.address, PROBE_TIMEOUT);
        let limit = self.patience;
        let (agent, address) = (self.agent, self.address.clone());
        let call = self.call_with(what, None, |mut c| {
            let items: Vec<pb::TrainRequest> = std::iter::once(header.clone())
                .chain(experiences.iter().map(|e| pb::TrainRequest {
                    item: Some(pb::train_request::Item::Experience(e.clone())),
                }))
                .collect();
            async move { c.train(tokio_stream::iter(items)).await }
        });
        tokio::select! {
            r = call => r,
            seen = probe.stalled_for(limit) => Err(CoordinatorError::Learner {
                agent,
                address,
                message: format!(
                    "{what}: no training progress for {limit:?} (the job's learner_timeout_secs; \
                     last seen: {seen}): the learner answers, but its step does not move"
                ),
            }),
        }
    }

    /// Returns once the learner's training progress has not moved for `limit`, with the last
    /// progress seen. Never returns while it moves.
    async fn stalled_for(&mut self, limit: Duration) -> String {
        let mut last: Option<(bool, u64, u32, u64, u64)> = None;
        let mut seen = "no answer".to_string();
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(TRAIN_PROGRESS_EVERY).await;
            if let Some(p) = self.train_progress().await {
                let now = Some((p.training, p.global_step, p.samples_done, p.tokens_done, p.beats));
                if now != last {
                    last = now;
                    since = Instant::now();
                    seen = format!(
                        "step {}, {} of {} samples{}",
                        p.global_step,
                        p.samples_done,
                        p.samples_total,
                        if p.training { ", training" } else { "" }
                    );
                }
            }
            if since.elapsed() >= limit {
                return seen;
            }
        }
    }

    /// The stored report of a step this learner trained before (say, before the coordinator
    /// restarted or the job failed); `None` when the learner keeps none (it restarted since).
    pub async fn report(&mut self, step_id: &str) -> Result<Option<pb::TrainReport>> {
        let header = pb::TrainRequest {
            item: Some(pb::train_request::Item::Header(pb::TrainHeader {
                step_id: step_id.to_string(),
                report_only: true,
                ..Default::default()
            })),
        };
        self.call("Train (report)", |mut c| {
            let header = header.clone();
            async move {
                match c.train(tokio_stream::iter([header])).await {
                    Ok(r) => Ok(r.map(Some)),
                    Err(s) if s.code() == Code::NotFound => Ok(tonic::Response::new(None)),
                    Err(s) => Err(s),
                }
            }
        })
        .await
    }

    /// Saves a checkpoint if the learner is at `expected_step` (`LearnerMoved` otherwise).
    pub async fn save(&mut self, expected_step: Option<u64>) -> Result<pb::CheckpointInfo> {
        self.call("SaveCheckpoint", |mut c| async move {
            c.save_checkpoint(pb::SaveCheckpointRequest { expected_step }).await
        })
        .await
    }

    /// Restores the learner's checkpoint of training step `step` (from its checkpoint root), and
    /// with it the weights of version `step`.
    pub async fn load_step(&mut self, step: u64) -> Result<pb::CheckpointInfo> {
        self.call("LoadCheckpoint", |mut c| async move {
            c.load_checkpoint(pb::LoadCheckpointRequest { path: String::new(), step: Some(step) })
                .await
        })
        .await
    }

    /// Publishes the weights if they are `expected_version` (`LearnerMoved` otherwise).
    pub async fn publish(&mut self, expected_version: Option<u64>) -> Result<pb::WeightsPublished> {
        self.call("PublishWeights", |mut c| async move {
            c.publish_weights(pb::PublishWeightsRequest { expected_version }).await
        })
        .await
    }

    pub async fn export(&mut self, dir: &str) -> Result<pb::CheckpointInfo> {
        let dir = dir.to_string();
        self.call("Export", |mut c| {
            let dir = dir.clone();
            async move { c.export(pb::ExportRequest { dir, merge_lora: false }).await }
        })
        .await
    }
}
