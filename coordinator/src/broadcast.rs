//! Live progress of a weight broadcast: while the workers pull the new versions, the
//! coordinator asks each of them about once a second how many bytes have arrived, so a watcher
//! sees the transfer move instead of a silent stage.
use crate::progress::{Reporter, Update};
use crate::scheduler::Scheduler;
use comas_proto::v1 as pb;
use comas_proto::v1::rollout_worker_client::RolloutWorkerClient;
use std::collections::HashMap;
use std::time::Duration;
use tonic::transport::Channel;

/// How often the workers are asked.
const POLL_EVERY: Duration = Duration::from_millis(500);
/// A worker that does not answer within this is left out of this round.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// One agent's new version: what every worker pulls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub agent: u32,
    pub version: u64,
    /// Bytes of one copy, as the learner published it.
    pub bytes: u64,
}

/// Bytes received so far by one worker towards `targets`: a finished pull counts whole, one
/// under way by what has arrived (capped at the copy's size), other versions not at all.
pub fn received(pulls: &[pb::WeightPull], targets: &[Target]) -> u64 {
    targets
        .iter()
        .filter_map(|t| {
            let p = pulls.iter().find(|p| p.agent_id == t.agent && p.version == t.version)?;
            Some(if p.done { t.bytes } else { p.bytes_received.min(t.bytes) })
        })
        .sum()
}

async fn connect(address: &str) -> Option<RolloutWorkerClient<Channel>> {
    let ch = comas_service::tls::channel(address, |e| e.connect_timeout(ASK_TIMEOUT)).await.ok()?;
    Some(RolloutWorkerClient::new(ch))
}

/// Polls every non-draining worker until aborted, writing the sums into the job's live
/// status (`broadcast_bytes_done` of `broadcast_bytes_total`, over `broadcast_workers`).
pub async fn follow(scheduler: Scheduler, report: Reporter, targets: Vec<Target>) {
    let per_worker: u64 = targets.iter().map(|t| t.bytes).sum();
    let mut clients: HashMap<String, RolloutWorkerClient<Channel>> = HashMap::new();
    let mut last = (0, 0);
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        let workers: Vec<String> = scheduler
            .snapshot()
            .await
            .workers
            .into_iter()
            .filter(|w| !w.draining)
            .map(|w| w.address)
            .collect();
        let mut done = 0;
        for address in &workers {
            if !clients.contains_key(address) {
                match connect(address).await {
                    Some(c) => clients.insert(address.clone(), c),
                    None => continue,
                };
            }
            let Some(c) = clients.get_mut(address) else { continue };
            match tokio::time::timeout(ASK_TIMEOUT, c.info(pb::WorkerInfoRequest {})).await {
                Ok(Ok(info)) => done += received(&info.into_inner().pulls, &targets),
                _ => {
                    clients.remove(address);
                }
            }
        }
        let now = (done, workers.len());
        if now != last {
            last = now;
            report.live(Update::Broadcast {
                done,
                total: per_worker * workers.len() as u64,
                workers: workers.len() as u32,
            });
            report.event("broadcast", String::new(), String::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(agent_id: u32, version: u64, bytes_received: u64, done: bool) -> pb::WeightPull {
        pb::WeightPull { agent_id, version, bytes_received, done }
    }

    #[test]
    fn a_worker_counts_its_pulls_of_the_target_versions_only() {
        let targets = [
            Target { agent: 0, version: 4, bytes: 1000 },
            Target { agent: 1, version: 4, bytes: 600 },
        ];
        assert_eq!(received(&[], &targets), 0);
        // Agent 0 half in, agent 1 still at the old version.
        assert_eq!(received(&[pull(0, 4, 500, false), pull(1, 3, 600, true)], &targets), 500);
        // Agent 1 done; a finished pull counts its whole copy.
        assert_eq!(received(&[pull(0, 4, 900, false), pull(1, 4, 600, true)], &targets), 1500);
        // More bytes than one copy (never expected) do not overshoot the total.
        assert_eq!(received(&[pull(0, 4, 5000, false), pull(1, 4, 0, true)], &targets), 1600);
    }
}
