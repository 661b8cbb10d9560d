//! What the scheduler's callers hand it and get back: the policy target, deliveries, weight
//! pulls and their statistics, views of the workers, batches and settings.
use comas_proto::v1 as pb;
use comas_workflow::program::MethodConfig;
use std::time::Duration;

/// What every worker must host before it gets episodes: the job's policies at these versions.
#[derive(Debug, Clone)]
pub struct PolicyTarget {
    pub job_id: String,
    /// Bumped whenever the versions change; a worker is ready for the generation it reached.
    pub generation: u64,
    pub load: pb::LoadPoliciesRequest,
    /// (agent, version, address of the learner that serves it)
    pub versions: Vec<(u32, u64, String)>,
    /// How long a pull waits for a learner that cannot be reached (restarting from its
    /// checkpoint, say) before the worker reports the failure: the job's learner timeout.
    pub source_patience: Duration,
}

/// Why the workers could not be brought to a policy target.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SyncError {
    #[error("the scheduler stopped")]
    SchedulerStopped,
    /// Every live worker failed to take the target: (address, last error) of each.
    #[error("no worker could take the new weights: {}", listed(.failures))]
    NoWorkerUpdated { failures: Vec<(String, String)> },
}

fn listed(failures: &[(String, String)]) -> String {
    failures
        .iter()
        .map(|(address, error)| format!("{address}: {error}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// An episode's outcome, sent to the job that submitted it.
#[derive(Debug)]
pub enum Delivery {
    /// A record that parsed, passed its method's checks and carries the versions the batch
    /// expects; `trajectory_json` is what the worker sent, for the store.
    Done {
        episode_id: String,
        record: Box<comas_workflow::program::Record>,
        trajectory_json: String,
        worker: String,
    },
    Failed {
        episode_id: String,
        error: String,
    },
    /// The batch cannot make progress (no ready worker for too long).
    Stalled {
        reason: String,
    },
}

/// One worker's pull of one agent's new version.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pull {
    pub agent: u32,
    pub bytes: u64,
    pub seconds: f64,
    /// Served by another worker (a relay hop), not by the learner.
    pub relayed: bool,
}

/// Weight pulls of one broadcast for one agent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AgentSync {
    /// Bytes received, summed over the workers.
    pub bytes: u64,
    /// Of those, the bytes the learner sent (the rest came over relay hops).
    pub learner_bytes: u64,
    /// The slowest worker's seconds.
    pub seconds: f64,
}

/// Weight pulls of one broadcast, per agent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncStats {
    pub per_agent: std::collections::BTreeMap<u32, AgentSync>,
}

impl SyncStats {
    pub(super) fn add(&mut self, pulls: &[Pull]) {
        for p in pulls {
            let e = self.per_agent.entry(p.agent).or_default();
            e.bytes += p.bytes;
            if !p.relayed {
                e.learner_bytes += p.bytes;
            }
            e.seconds = e.seconds.max(p.seconds);
        }
    }
}

#[derive(Debug, Clone)]
pub struct WorkerView {
    pub id: String,
    pub address: String,
    pub capacity: u32,
    pub leased: u32,
    pub ready: bool,
    pub draining: bool,
    pub last_error: String,
}

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub workers: Vec<WorkerView>,
    pub pending: usize,
    pub leased: usize,
}

/// What a job's schedule says about its episodes; unset times fall back to the coordinator's.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_attempts: u32,
    pub episode_timeout: Option<Duration>,
    pub worker_wait: Option<Duration>,
}

/// A batch's episodes, how to read their records, and the policy version each agent's turns
/// must carry (synchronous mode).
pub struct BatchSpec {
    /// Names the batch within its job ("step-3", "eval-0"); a batch submitted with the tag
    /// of one still queued replaces it.
    pub tag: String,
    /// Queued before every episode already waiting (an evaluation the job waits for).
    pub first: bool,
    pub specs: Vec<pb::EpisodeSpec>,
    pub method: MethodConfig,
    pub limits: BatchLimits,
    pub versions: Option<Vec<u64>>,
}

impl BatchLimits {
    pub fn of(s: &comas_workflow::job::ScheduleSpec) -> Self {
        Self {
            max_attempts: s.max_episode_attempts,
            episode_timeout: s.episode_timeout_secs.map(Duration::from_secs),
            worker_wait: s.worker_wait_secs.map(Duration::from_secs),
        }
    }
}

/// Weight broadcast by relay chain unless told otherwise: the learner sends each byte once.
pub const DEFAULT_RELAY_FANOUT: usize = 1;

#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    pub heartbeat_timeout: Duration,
    pub episode_timeout: Duration,
    /// How long queued episodes may wait with no ready worker before the batch is stalled.
    pub worker_wait: Duration,
    /// Weight broadcast: 0 = every worker pulls from the learners; k >= 1 = the workers form a
    /// tree in which each passes the weights on to k others (1: a chain).
    pub relay_fanout: usize,
}
