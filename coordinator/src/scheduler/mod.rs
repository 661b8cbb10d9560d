//! Episode scheduling. One task owns the worker registry and the episode queue; everything
//! else talks to it over a channel. Each registered worker gets a connection task that holds
//! its `RunEpisodes` stream and brings it to the job's policies and weight versions before it is
//! leased anything. A lost worker's leases go back to the front of the queue; a result is
//! delivered once per episode id, so a retried episode is never counted twice.
//!
//! Invariants (checked after every command in the tests):
//! - `leased` is the number of leases held over all workers, kept as they are made and ended,
//!   so a result or a heartbeat costs the same with 10 workers or 1,000;
//! - `ready` is the number of ready workers, and `open` holds exactly the workers a lease may go
//!   to now (ready, not draining, a free slot), each under the free slots recorded in its
//!   `ranked`: every change to a worker's slots, readiness or draining re-ranks it (`rerank`),
//!   so a lease costs O(log workers) and no command counts the workers again;
//! - the waiters for a generation are looked at again only after a command that can change
//!   their answer (`sync_changed`): a heartbeat or a result during a broadcast costs the same
//!   with 10 workers or 1,000;
//! - an episode held by more than one worker is in its batch's `copied` set (a lease copied after
//!   its timeout, or a batch submitted again under the same key), so deciding an episode looks
//!   for other holders only then.
use crate::metrics::Metrics;
use comas_proto::v1 as pb;
use comas_workflow::program::MethodConfig;
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

mod connection;
mod leases;
#[cfg(test)]
mod tests;
mod types;

pub use types::{
    AgentSync, BatchLimits, BatchSpec, Delivery, PolicyTarget, Pull, SchedulerSettings, Snapshot,
    SyncError, SyncStats, WorkerView, DEFAULT_RELAY_FANOUT,
};

/// What starts a registered worker's connection task: the real one dials the worker and holds
/// its stream (`connection::connection`); the actor's tests keep its messages instead.
type Connect = Arc<
    dyn Fn(String, u64, String, mpsc::UnboundedReceiver<WorkerMsg>, mpsc::UnboundedSender<Cmd>)
        + Send
        + Sync,
>;

enum Cmd {
    Register {
        id: String,
        address: String,
        capacity: u32,
        incarnation: u64,
    },
    Heartbeat {
        id: String,
        draining: bool,
        reply: oneshot::Sender<bool>,
    },
    SetTarget {
        target: Arc<PolicyTarget>,
    },
    WaitPrepared {
        generation: u64,
        reply: oneshot::Sender<Result<SyncStats, SyncError>>,
    },
    Submit {
        job_id: String,
        batch: BatchSpec,
        results: mpsc::UnboundedSender<Delivery>,
    },
    CancelJob {
        job_id: String,
    },
    Prepared {
        id: String,
        conn: u64,
        generation: u64,
        result: Result<Vec<Pull>, String>,
    },
    Result {
        id: String,
        conn: u64,
        result: pb::EpisodeResult,
    },
    Lost {
        id: String,
        conn: u64,
        reason: String,
    },
    /// A worker's answer to a cancel: episodes stopped there, and the tokens they had made.
    Cancelled {
        stopped: u32,
        tokens: u64,
    },
    Tick,
    Snapshot {
        reply: oneshot::Sender<Snapshot>,
    },
}

enum WorkerMsg {
    /// Take the target's versions; with a peer, pull them from that worker's address (a relay
    /// hop) and from the learners only if that fails.
    Prepare(Arc<PolicyTarget>, Option<String>),
    Lease(pb::EpisodeSpec),
    /// Stop these episodes (their leases here are already forgotten).
    Cancel(Vec<String>),
}

/// A batch is known by its job and its tag, so one job may have several batches queued (an
/// async job's next steps, an evaluation beside them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BatchKey {
    job_id: String,
    tag: String,
}

#[derive(Clone)]
struct Lease {
    batch: BatchKey,
    spec: pb::EpisodeSpec,
    attempts: u32,
    since: Instant,
    /// A copy of this lease was queued after it timed out; it still runs (and counts) here.
    copied: bool,
}

struct Worker {
    address: String,
    incarnation: u64,
    /// Registered while a target was already set: until it is first ready it is a late
    /// joiner, which a broadcast does not wait for when other workers are ready.
    joined_late: bool,
    capacity: u32,
    conn: u64,
    tx: mpsc::UnboundedSender<WorkerMsg>,
    leased: HashMap<String, Lease>,
    ready_gen: Option<u64>,
    preparing: Option<u64>,
    last_seen: Instant,
    draining: bool,
    last_error: String,
    /// The free slots it is in `State::open` under, if it is there.
    ranked: Option<u32>,
    /// Whether it is counted in `State::ready`.
    counted_ready: bool,
}

impl Worker {
    fn free(&self) -> u32 {
        self.capacity.saturating_sub(self.leased.len() as u32)
    }
}

/// A place in `State::open`: most free slots first, ties to the smallest id.
type Rank = (Reverse<u32>, String);

struct Batch {
    results: mpsc::UnboundedSender<Delivery>,
    outstanding: HashSet<String>,
    max_attempts: u32,
    episode_timeout: Duration,
    worker_wait: Duration,
    method: MethodConfig,
    versions: Option<Vec<u64>>,
    /// Episodes that may be held by more than one worker: only these have copies to cancel.
    copied: HashSet<String>,
}

/// Handle to the scheduler task.
#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Cmd>,
}

impl Scheduler {
    pub fn spawn(settings: SchedulerSettings, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let connect: Connect = Arc::new(|id, conn, address, rx, me| {
            tokio::spawn(connection::connection(id, conn, address, rx, me));
        });
        let state = State::new(settings, metrics, tx.clone(), connect);
        tokio::spawn(state.run(rx));
        let ticker = tx.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(500));
            loop {
                every.tick().await;
                if ticker.send(Cmd::Tick).is_err() {
                    break;
                }
            }
        });
        Self { tx }
    }

    pub fn register(&self, id: String, address: String, capacity: u32, incarnation: u64) {
        let _ = self.tx.send(Cmd::Register { id, address, capacity, incarnation });
    }

    pub async fn heartbeat(&self, id: String, draining: bool) -> bool {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Cmd::Heartbeat { id, draining, reply });
        rx.await.unwrap_or(false)
    }

    /// Workers start loading the job's policies and pulling these versions.
    pub fn set_target(&self, target: PolicyTarget) {
        let _ = self.tx.send(Cmd::SetTarget { target: Arc::new(target) });
    }

    /// Resolves when every live worker has reached `generation` (at once when there are none).
    pub async fn wait_prepared(&self, generation: u64) -> Result<SyncStats, SyncError> {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Cmd::WaitPrepared { generation, reply });
        rx.await.map_err(|_| SyncError::SchedulerStopped)?
    }

    pub fn submit(
        &self,
        job_id: String,
        batch: BatchSpec,
        results: mpsc::UnboundedSender<Delivery>,
    ) {
        let _ = self.tx.send(Cmd::Submit { job_id, batch, results });
    }

    pub fn cancel_job(&self, job_id: String) {
        let _ = self.tx.send(Cmd::CancelJob { job_id });
    }

    pub async fn snapshot(&self) -> Snapshot {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Cmd::Snapshot { reply });
        rx.await.unwrap_or_default()
    }
}

struct State {
    settings: SchedulerSettings,
    metrics: Arc<Metrics>,
    me: mpsc::UnboundedSender<Cmd>,
    connect: Connect,
    workers: HashMap<String, Worker>,
    next_conn: u64,
    queue: VecDeque<Lease>,
    batches: HashMap<BatchKey, Batch>,
    target: Option<Arc<PolicyTarget>>,
    waiters: Vec<(u64, oneshot::Sender<Result<SyncStats, SyncError>>)>,
    /// What each generation's weight pulls moved, until its waiter takes it.
    sync: HashMap<u64, SyncStats>,
    /// Since when episodes have been queued with no ready worker to take them.
    idle_since: Option<Instant>,
    /// Leases held over all workers.
    leased: usize,
    /// Ready workers.
    ready: usize,
    /// A command may have changed a waiter's answer since the waiters were last looked at: a
    /// worker's readiness, preparing or error, a worker come or gone, a waiter added.
    sync_changed: bool,
    /// The workers a lease may go to now, best first (see the module's invariants).
    open: BTreeSet<Rank>,
}

impl State {
    fn new(
        settings: SchedulerSettings,
        metrics: Arc<Metrics>,
        me: mpsc::UnboundedSender<Cmd>,
        connect: Connect,
    ) -> State {
        State {
            settings,
            metrics,
            me,
            connect,
            workers: HashMap::new(),
            next_conn: 0,
            queue: VecDeque::new(),
            batches: HashMap::new(),
            target: None,
            waiters: Vec::new(),
            idle_since: None,
            sync: HashMap::new(),
            leased: 0,
            ready: 0,
            sync_changed: false,
            open: BTreeSet::new(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        while let Some(cmd) = rx.recv().await {
            self.apply(cmd);
        }
    }

    /// One command, and what follows from it: leases, settled waiters, gauges.
    fn apply(&mut self, cmd: Cmd) {
        let started = Instant::now();
        self.handle(cmd);
        self.dispatch();
        self.settle_waiters();
        self.publish_gauges();
        self.metrics.scheduler_seconds.inc_by(started.elapsed().as_secs_f64());
        #[cfg(test)]
        self.check_counts();
    }

    /// The kept counts against a count of everything (the module's invariants).
    #[cfg(test)]
    fn check_counts(&self) {
        let leased: usize = self.workers.values().map(|w| w.leased.len()).sum();
        assert_eq!(self.leased, leased, "leases held over all workers");
        let ready = self.workers.values().filter(|w| self.is_ready(w)).count();
        assert_eq!(self.ready, ready, "ready workers");
        let mut holders: HashMap<&str, usize> = HashMap::new();
        for w in self.workers.values() {
            for id in w.leased.keys() {
                *holders.entry(id).or_default() += 1;
            }
        }
        for (id, n) in holders.into_iter().filter(|(_, n)| *n > 1) {
            assert!(
                self.batches.values().any(|b| b.copied.contains(id)),
                "episode {id} is held by {n} workers but is not marked copied"
            );
        }
        let open: BTreeSet<Rank> = self
            .workers
            .iter()
            .filter_map(|(id, w)| self.open_with(w).map(|free| (Reverse(free), id.clone())))
            .collect();
        assert_eq!(self.open, open, "the workers a lease may go to");
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Register { id, address, capacity, incarnation } => {
                self.register(id, address, capacity, incarnation)
            }
            Cmd::Heartbeat { id, draining, reply } => {
                let known = match self.workers.get_mut(&id) {
                    Some(w) => {
                        w.last_seen = Instant::now();
                        if draining && !w.draining {
                            tracing::info!(worker = %id, "worker is draining; it gets no new episodes");
                            self.sync_changed = true;
                        }
                        w.draining |= draining;
                        true
                    }
                    None => false,
                };
                self.rerank(&id);
                let _ = reply.send(known);
            }
            Cmd::SetTarget { target } => {
                self.sync_changed = true;
                let keep = target.generation.saturating_sub(1);
                self.sync.retain(|g, _| *g >= keep);
                let mut ids: Vec<String> = self
                    .workers
                    .iter()
                    .filter(|(_, w)| w.ready_gen != Some(target.generation))
                    .map(|(id, _)| id.clone())
                    .collect();
                ids.sort();
                let addresses: Vec<String> =
                    ids.iter().map(|id| self.workers[id].address.clone()).collect();
                let peers = relay_peers(&addresses, self.settings.relay_fanout);
                for (id, peer) in ids.iter().zip(peers) {
                    let w = self.workers.get_mut(id).expect("listed worker");
                    w.preparing = Some(target.generation);
                    let _ = w.tx.send(WorkerMsg::Prepare(Arc::clone(&target), peer));
                }
                self.target = Some(target);
                self.rerank_all();
            }
            Cmd::WaitPrepared { generation, reply } => {
                self.waiters.push((generation, reply));
                self.sync_changed = true;
            }
            Cmd::Submit {
                job_id,
                batch: BatchSpec { tag, first, specs, method, limits, versions },
                results,
            } => {
                let outstanding: HashSet<String> =
                    specs.iter().map(|s| s.episode_id.clone()).collect();
                let key = BatchKey { job_id, tag };
                // Submitted again under the same key: its episodes may still run somewhere.
                let copied = if self.batches.contains_key(&key) {
                    outstanding.clone()
                } else {
                    HashSet::new()
                };
                let batch = Batch {
                    results,
                    outstanding,
                    max_attempts: limits.max_attempts,
                    episode_timeout: limits
                        .episode_timeout
                        .unwrap_or(self.settings.episode_timeout),
                    worker_wait: limits.worker_wait.unwrap_or(self.settings.worker_wait),
                    method,
                    versions,
                    copied,
                };
                self.queue.retain(|l| l.batch != key);
                self.batches.insert(key.clone(), batch);
                let now = Instant::now();
                let leases = specs.into_iter().map(|spec| Lease {
                    batch: key.clone(),
                    spec,
                    attempts: 0,
                    since: now,
                    copied: false,
                });
                if first {
                    for l in leases.rev() {
                        self.queue.push_front(l);
                    }
                } else {
                    self.queue.extend(leases);
                }
            }
            Cmd::CancelJob { job_id } => {
                self.batches.retain(|k, _| k.job_id != job_id);
                self.queue.retain(|l| l.batch.job_id != job_id);
                // Its running episodes stop decoding on their workers.
                let ids: Vec<(String, String)> = self
                    .workers
                    .iter()
                    .flat_map(|(w, wk)| {
                        wk.leased
                            .values()
                            .filter(|l| l.batch.job_id == job_id)
                            .map(move |l| (w.clone(), l.spec.episode_id.clone()))
                    })
                    .collect();
                for (worker, episode) in ids {
                    self.cancel_lease(&worker, &episode);
                }
                // A worker that joins later must not load an ended job's policies.
                if self.target.as_ref().is_some_and(|t| t.job_id == job_id) {
                    self.target = None;
                    self.sync_changed = true;
                    self.rerank_all();
                }
            }
            Cmd::Prepared { id, conn, generation, result } => {
                self.sync_changed = true;
                if let Some(w) = self.workers.get_mut(&id).filter(|w| w.conn == conn) {
                    if w.preparing == Some(generation) {
                        w.preparing = None;
                    }
                    match result {
                        Ok(pulls) => {
                            self.sync.entry(generation).or_default().add(&pulls);
                            w.ready_gen =
                                Some(w.ready_gen.map_or(generation, |g| g.max(generation)));
                            w.last_error.clear();
                        }
                        Err(e) => {
                            tracing::warn!(worker = %id, error = %e, "worker could not take the job's policies");
                            w.last_error = e;
                        }
                    }
                }
                self.rerank(&id);
            }
            Cmd::Result { id, conn, result } => self.on_result(id, conn, result),
            Cmd::Lost { id, conn, reason } => {
                if self.workers.get(&id).is_some_and(|w| w.conn == conn) {
                    self.drop_worker(&id, &reason);
                }
            }
            Cmd::Cancelled { stopped, tokens } => {
                self.metrics.cancels_stopped.inc_by(u64::from(stopped));
                self.metrics.cancelled_tokens.inc_by(tokens);
            }
            Cmd::Tick => self.tick(),
            Cmd::Snapshot { reply } => {
                let workers = self
                    .workers
                    .iter()
                    .map(|(id, w)| WorkerView {
                        id: id.clone(),
                        address: w.address.clone(),
                        capacity: w.capacity,
                        leased: w.leased.len() as u32,
                        ready: self.is_ready(w),
                        draining: w.draining,
                        last_error: w.last_error.clone(),
                    })
                    .collect();
                let _ = reply.send(Snapshot {
                    workers,
                    pending: self.queue.len(),
                    leased: self.leased,
                });
            }
        }
    }

    fn is_ready(&self, w: &Worker) -> bool {
        !w.draining && self.target.as_ref().is_some_and(|t| w.ready_gen == Some(t.generation))
    }

    /// The free slots `w` belongs in `open` under, if a lease may go to it now.
    fn open_with(&self, w: &Worker) -> Option<u32> {
        (self.is_ready(w) && w.free() > 0).then(|| w.free())
    }

    /// Counts worker `id` as ready or not and puts it where it belongs in `open` now: called
    /// after anything that changes its free slots, its readiness or its draining (a worker no
    /// longer known is already out of both).
    fn rerank(&mut self, id: &str) {
        let Some(w) = self.workers.get(id) else { return };
        let (ready, now) = (self.is_ready(w), self.open_with(w));
        if (ready, now) == (w.counted_ready, w.ranked) {
            return;
        }
        if ready != w.counted_ready {
            if ready {
                self.ready += 1;
            } else {
                self.ready -= 1;
            }
        }
        if now != w.ranked {
            if let Some(was) = w.ranked {
                self.open.remove(&(Reverse(was), id.to_string()));
            }
            if let Some(free) = now {
                self.open.insert((Reverse(free), id.to_string()));
            }
        }
        let w = self.workers.get_mut(id).expect("looked up above");
        (w.counted_ready, w.ranked) = (ready, now);
    }

    /// Every worker re-ranked: the target changed, and with it every worker's readiness.
    fn rerank_all(&mut self) {
        let ids: Vec<String> = self.workers.keys().cloned().collect();
        for id in ids {
            self.rerank(&id);
        }
    }

    fn register(&mut self, id: String, address: String, capacity: u32, incarnation: u64) {
        if let Some(w) = self.workers.get_mut(&id) {
            if w.address == address && w.incarnation == incarnation {
                w.last_seen = Instant::now();
                w.capacity = capacity.max(1);
                return self.rerank(&id);
            }
            // A restarted process lost its policies and its episodes, whatever its address.
            let why = if w.address == address {
                "restarted (a new incarnation)"
            } else {
                "re-registered with a new address"
            };
            self.drop_worker(&id, why);
        }
        self.next_conn += 1;
        let conn = self.next_conn;
        let (tx, rx) = mpsc::unbounded_channel();
        (self.connect)(id.clone(), conn, address.clone(), rx, self.me.clone());
        tracing::info!(worker = %id, %address, capacity, "worker registered");
        let mut w = Worker {
            address,
            incarnation,
            joined_late: self.target.is_some(),
            capacity: capacity.max(1),
            conn,
            tx,
            leased: HashMap::new(),
            ready_gen: None,
            preparing: None,
            last_seen: Instant::now(),
            draining: false,
            last_error: String::new(),
            ranked: None,
            counted_ready: false,
        };
        if let Some(t) = &self.target {
            w.preparing = Some(t.generation);
            // A late joiner pulls from the learners: the others may be busy with episodes.
            let _ = w.tx.send(WorkerMsg::Prepare(Arc::clone(t), None));
        }
        self.workers.insert(id, w);
        self.sync_changed = true;
    }

    /// Leases queued episodes to open workers, the one with the most free slots first (ties to
    /// the smallest id), never to a worker already running the same episode. The open workers
    /// are kept ranked as they change (`open`), so a lease costs O(log workers), not a look at
    /// every worker (1,000 workers: see the fleet bench).
    fn dispatch(&mut self) {
        if self.queue.is_empty() {
            return self.note_idle();
        }
        let mut i = 0;
        while i < self.queue.len() && !self.open.is_empty() {
            let l = &self.queue[i];
            if !self
                .batches
                .get(&l.batch)
                .is_some_and(|b| b.outstanding.contains(&l.spec.episode_id))
            {
                self.queue.remove(i);
                continue;
            }
            // The best worker that does not hold this episode already (a copy goes elsewhere).
            let episode = &l.spec.episode_id;
            let chosen = self
                .open
                .iter()
                .map(|(_, id)| id)
                .find(|id| !self.workers[*id].leased.contains_key(episode))
                .cloned();
            let Some(id) = chosen else {
                i += 1;
                continue;
            };
            let lease = self.queue.remove(i).expect("index in range");
            let w = self.workers.get_mut(&id).expect("open workers exist");
            if w.tx.send(WorkerMsg::Lease(lease.spec.clone())).is_err() {
                self.queue.push_front(lease);
                self.drop_worker(&id, "connection task ended");
                // Its leases went back to the front of the queue: look at them again.
                i = 0;
                continue;
            }
            w.leased
                .insert(lease.spec.episode_id.clone(), Lease { since: Instant::now(), ..lease });
            self.leased += 1;
            self.rerank(&id);
        }
        self.note_idle();
    }

    /// When episodes started waiting with no ready worker to take them (for the stall check).
    fn note_idle(&mut self) {
        let waiting = !self.queue.is_empty() && !self.workers.values().any(|w| self.is_ready(w));
        self.idle_since = match (waiting, self.idle_since) {
            (true, Some(t)) => Some(t),
            (true, None) => Some(Instant::now()),
            (false, _) => None,
        };
    }

    /// Answers the waiters whose generation the workers have reached (or cannot reach). Only
    /// after a command that can change the answer; then one pass over the workers, whatever the
    /// number of waiters' outcomes it decides.
    fn settle_waiters(&mut self) {
        if !std::mem::take(&mut self.sync_changed) || self.waiters.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.waiters);
        for (generation, reply) in pending {
            match self.sync_outcome(generation) {
                None => self.waiters.push((generation, reply)),
                Some(Ok(())) => {
                    let stats = self.sync.get(&generation).cloned().unwrap_or_default();
                    let _ = reply.send(Ok(stats));
                }
                Some(Err(e)) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
    }

    /// Whether the workers are done with `generation`: every live worker has it (or those that
    /// failed to take it, when some have it), or every one failed; `None` while some still
    /// prepare. A worker that joined mid-job and has never been ready may load for a long time:
    /// once some worker is ready it is not waited for (it gets episodes once it has caught up).
    fn sync_outcome(&self, generation: u64) -> Option<Result<(), SyncError>> {
        // Counts over the live (not draining) workers, late joiners apart from the rest.
        #[derive(Default)]
        struct Tally {
            live: usize,
            behind: usize,
            preparing: usize,
            failed: usize,
        }
        let (mut rest, mut late) = (Tally::default(), Tally::default());
        for w in self.workers.values().filter(|w| !w.draining) {
            let t = if w.joined_late && w.ready_gen.is_none() { &mut late } else { &mut rest };
            t.live += 1;
            if w.ready_gen.is_none_or(|g| g < generation) {
                t.behind += 1;
                t.preparing += usize::from(w.preparing.is_some());
                t.failed += usize::from(w.preparing.is_none() && !w.last_error.is_empty());
            }
        }
        let some_ready = rest.behind + late.behind < rest.live + late.live;
        let counted = if some_ready {
            rest
        } else {
            Tally {
                live: rest.live + late.live,
                behind: rest.behind + late.behind,
                preparing: rest.preparing + late.preparing,
                failed: rest.failed + late.failed,
            }
        };
        if counted.behind == 0 {
            return Some(Ok(()));
        }
        if counted.preparing > 0 {
            return None;
        }
        if counted.behind < counted.live {
            // Some workers failed to update: they get nothing until the next target.
            return Some(Ok(()));
        }
        if counted.failed == counted.behind {
            let failures = self
                .workers
                .values()
                .filter(|w| !w.draining && w.ready_gen.is_none_or(|g| g < generation))
                .map(|w| (w.address.clone(), w.last_error.clone()))
                .collect();
            return Some(Err(SyncError::NoWorkerUpdated { failures }));
        }
        None
    }

    fn publish_gauges(&mut self) {
        self.metrics.pending_episodes.set(self.queue.len() as i64);
        self.metrics.leased_episodes.set(self.leased as i64);
        self.metrics.workers.set(self.workers.len() as i64);
        self.metrics.ready_workers.set(self.ready as i64);
    }
}

/// The relay peer of each worker (in `addresses`' order): the first pulls from the learners
/// (`None`), worker i > 0 from worker (i - 1) / fanout. Fanout 0: every worker from the learners.
fn relay_peers(addresses: &[String], fanout: usize) -> Vec<Option<String>> {
    (0..addresses.len())
        .map(|i| (fanout > 0 && i > 0).then(|| addresses[(i - 1) / fanout].clone()))
        .collect()
}
