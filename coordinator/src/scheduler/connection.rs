//! A worker's connection task: its `RunEpisodes` stream, and bringing it to the job's policies
//! and weight versions (loading, then pulling each new version from a relay peer or the
//! learner, patiently while a learner restarts).
use super::{Cmd, PolicyTarget, Pull, WorkerMsg};
use comas_proto::v1 as pb;
use comas_proto::v1::rollout_worker_client::RolloutWorkerClient;
use comas_service::limits::PEER_MESSAGE_BYTES;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

const LOAD_TIMEOUT: Duration = Duration::from_secs(1800);
const UPDATE_TIMEOUT: Duration = Duration::from_secs(900);
const CANCEL_TIMEOUT: Duration = Duration::from_secs(10);

async fn dial(address: &str) -> Result<RolloutWorkerClient<Channel>, String> {
    let ch = comas_service::tls::channel(address, |e| {
        e.connect_timeout(Duration::from_secs(10))
            .tcp_keepalive(Some(Duration::from_secs(10)))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20))
    })
    .await
    .map_err(|e| format!("cannot connect to worker {address}: {e}"))?;
    Ok(RolloutWorkerClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_BYTES)
        .max_encoding_message_size(PEER_MESSAGE_BYTES))
}

/// One worker's connection: its episode stream, and bringing it to the current policies.
pub(super) async fn connection(
    id: String,
    conn: u64,
    address: String,
    mut rx: mpsc::UnboundedReceiver<WorkerMsg>,
    sched: mpsc::UnboundedSender<Cmd>,
) {
    let lost = |reason: String| {
        let _ = sched.send(Cmd::Lost { id: id.clone(), conn, reason });
    };
    let mut client = match dial(&address).await {
        Ok(c) => c,
        Err(e) => return lost(e),
    };
    let (spec_tx, spec_rx) = mpsc::unbounded_channel::<pb::EpisodeSpec>();
    let mut results = match client
        .run_episodes(tokio_stream::wrappers::UnboundedReceiverStream::new(spec_rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(e) => return lost(format!("opening the episode stream: {e}")),
    };
    let reader = {
        let (sched, id) = (sched.clone(), id.clone());
        tokio::spawn(async move {
            loop {
                match results.next().await {
                    Some(Ok(result)) => {
                        if sched.send(Cmd::Result { id: id.clone(), conn, result }).is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        let _ = sched.send(Cmd::Lost {
                            id,
                            conn,
                            reason: format!("episode stream broke: {}", e.message()),
                        });
                        return;
                    }
                    None => {
                        let _ = sched.send(Cmd::Lost {
                            id,
                            conn,
                            reason: "episode stream ended".into(),
                        });
                        return;
                    }
                }
            }
        })
    };
    let mut loaded_job: Option<String> = None;
    while let Some(msg) = rx.recv().await {
        match msg {
            WorkerMsg::Lease(spec) => {
                if spec_tx.send(spec).is_err() {
                    // The stream is gone. The reader may not have said so yet, and it is
                    // stopped below: say it here, or this lease (and the others of this
                    // worker) would wait for the heartbeat timeout. A second report of the same
                    // connection is ignored.
                    lost("episode stream closed".into());
                    break;
                }
            }
            WorkerMsg::Cancel(episode_ids) => {
                // Off this loop: a cancel must not wait behind a long prepare, nor hold one up.
                let (mut client, sched, id) = (client.clone(), sched.clone(), id.clone());
                tokio::spawn(async move {
                    let mut req = tonic::Request::new(pb::CancelEpisodesRequest { episode_ids });
                    req.set_timeout(CANCEL_TIMEOUT);
                    match client.cancel_episodes(req).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            let (stopped, tokens) = (r.stopped, r.tokens_before);
                            let _ = sched.send(Cmd::Cancelled { stopped, tokens });
                        }
                        // The worker decodes on until the episode ends; its result is ignored.
                        Err(e) => {
                            tracing::warn!(worker = %id, error = %e.message(), "cancel not delivered")
                        }
                    }
                });
            }
            WorkerMsg::Prepare(target, peer) => {
                let result =
                    prepare_patiently(&mut client, &target, peer.as_deref(), &mut loaded_job).await;
                if sched
                    .send(Cmd::Prepared {
                        id: id.clone(),
                        conn,
                        generation: target.generation,
                        result,
                    })
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    reader.abort();
}

/// `prepare`, retried with backoff while it fails for a passing reason, for up to the target's
/// `source_patience`: a learner that restarts during the broadcast comes back with the version
/// it published, and the broadcast goes on instead of failing the job; a worker that registers
/// again after it was given up for silence (a stall, a partition) may still hold the episodes
/// of its old stream for a moment, and loads once they have stopped.
async fn prepare_patiently(
    client: &mut RolloutWorkerClient<Channel>,
    t: &PolicyTarget,
    peer: Option<&str>,
    loaded_job: &mut Option<String>,
) -> Result<Vec<Pull>, String> {
    let started = Instant::now();
    let mut backoff = comas_service::backoff::Backoff::reconnect();
    loop {
        match prepare(client, t, peer, loaded_job).await {
            Err(Failure { message, passing: true }) if started.elapsed() < t.source_patience => {
                tracing::warn!(error = %message, "worker not ready to take the policies; retrying");
                tokio::time::sleep(backoff.next_wait()).await;
            }
            other => return other.map_err(|f| f.message),
        }
    }
}

/// Why a prepare failed, and whether the reason passes: a weight source that cannot be reached,
/// or episodes still running on the worker (both answered UNAVAILABLE).
struct Failure {
    message: String,
    passing: bool,
}

impl Failure {
    fn of(what: String, e: tonic::Status) -> Self {
        Self {
            message: format!("{what}: {}", e.message()),
            passing: e.code() == tonic::Code::Unavailable,
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self { message, passing: false }
    }
}

/// Loads the job's policies if needed and pulls every version the worker lacks, from `peer`
/// (falling back to the learner) when one is given.
async fn prepare(
    client: &mut RolloutWorkerClient<Channel>,
    t: &PolicyTarget,
    peer: Option<&str>,
    loaded_job: &mut Option<String>,
) -> Result<Vec<Pull>, Failure> {
    if loaded_job.as_deref() != Some(t.job_id.as_str()) {
        let mut req = tonic::Request::new(t.load.clone());
        req.set_timeout(LOAD_TIMEOUT);
        client.load_policies(req).await.map_err(|e| Failure::of("LoadPolicies".into(), e))?;
        *loaded_job = Some(t.job_id.clone());
    }
    let info = client
        .info(pb::WorkerInfoRequest {})
        .await
        .map_err(|e| format!("Info: {}", e.message()))?
        .into_inner();
    let have: HashMap<u32, u64> = info.agents.iter().map(|a| (a.agent_id, a.version)).collect();
    let mut pulls = Vec::new();
    for (agent, version, source) in &t.versions {
        if have.get(agent) == Some(version) {
            continue;
        }
        let request = match peer {
            Some(p) => pb::UpdateWeightsRequest {
                agent_id: *agent,
                version: *version,
                source: p.to_string(),
                relay: true,
                fallback_source: source.clone(),
            },
            None => pb::UpdateWeightsRequest {
                agent_id: *agent,
                version: *version,
                source: source.clone(),
                ..Default::default()
            },
        };
        let mut req = tonic::Request::new(request);
        req.set_timeout(UPDATE_TIMEOUT);
        // The worker answers UNAVAILABLE when it cannot reach the learner it pulls from.
        let r = client
            .update_weights(req)
            .await
            .map_err(|e| {
                Failure::of(format!("UpdateWeights agent {agent} to version {version}"), e)
            })?
            .into_inner();
        pulls.push(Pull { agent: *agent, bytes: r.bytes, seconds: r.seconds, relayed: r.relayed });
    }
    Ok(pulls)
}
