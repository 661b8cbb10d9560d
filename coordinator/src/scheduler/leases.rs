//! What becomes of a lease: its result accepted once (or its failure retried up to the job's
//! limit), its copies cancelled once it is decided, its worker's leases re-queued when the
//! worker is lost, and a lease past its timeout copied to another worker.
use super::*;

impl State {
    /// Forgets a worker; what it held goes back to the front of the queue, in lease order.
    pub(super) fn drop_worker(&mut self, id: &str, reason: &str) {
        if let Some(w) = self.workers.remove(id) {
            self.leased -= w.leased.len();
            self.sync_changed = true;
            if let Some(free) = w.ranked {
                self.open.remove(&(Reverse(free), id.to_string()));
            }
            self.ready -= usize::from(w.counted_ready);
            let mut back: Vec<Lease> = w
                .leased
                .into_values()
                .filter(|l| {
                    self.batches
                        .get(&l.batch)
                        .is_some_and(|b| b.outstanding.contains(&l.spec.episode_id))
                })
                .collect();
            back.sort_by_key(|l| l.since);
            if w.draining && back.is_empty() {
                tracing::info!(worker = %id, reason, "drained worker left");
            } else if back.is_empty() {
                // Nothing of a job was lost (an idle worker stopping at the end of a run): no alarm.
                tracing::info!(worker = %id, reason, "idle worker left");
            } else {
                tracing::warn!(worker = %id, reason, requeued = back.len(), "worker lost");
            }
            self.metrics.requeued_episodes.inc_by(back.len() as u64);
            for l in back.into_iter().rev() {
                self.queue.push_front(Lease { since: Instant::now(), copied: false, ..l });
            }
        }
    }

    /// Forgets `worker`'s lease of `episode` (its slot is free at once) and tells the worker to
    /// stop it; the CANCELLED result that comes back is ignored.
    pub(super) fn cancel_lease(&mut self, worker: &str, episode: &str) {
        let Some(w) = self.workers.get_mut(worker) else { return };
        if w.leased.remove(episode).is_none() {
            return;
        }
        self.leased -= 1;
        self.metrics.cancelled_leases.inc();
        // A connection that has ended is noticed by the next lease; nothing runs there then.
        let _ = w.tx.send(WorkerMsg::Cancel(vec![episode.to_string()]));
        self.rerank(worker);
    }

    /// Once an episode of `batch` is decided (accepted, or failed for good), the copies of it
    /// still running elsewhere are waste: they are cancelled. Only an episode marked copied can
    /// have any, so the workers are looked through for those alone.
    pub(super) fn cancel_copies(&mut self, batch: &BatchKey, episode: &str) {
        if !self.batches.get_mut(batch).is_some_and(|b| b.copied.remove(episode)) {
            return;
        }
        let holders: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| w.leased.contains_key(episode))
            .map(|(id, _)| id.clone())
            .collect();
        for worker in holders {
            self.cancel_lease(&worker, episode);
        }
    }

    pub(super) fn on_result(&mut self, id: String, conn: u64, r: pb::EpisodeResult) {
        let Some(w) = self.workers.get_mut(&id).filter(|w| w.conn == conn) else { return };
        if r.error_kind == pb::EpisodeErrorKind::Cancelled as i32
            && !w.leased.contains_key(&r.episode_id)
        {
            // The answer to our own cancel.
            return;
        }
        let Some(lease) = w.leased.remove(&r.episode_id) else {
            // Leased elsewhere after a timeout; the other copy decides.
            self.metrics.duplicate_results.inc();
            return;
        };
        self.leased -= 1;
        if r.error_kind == pb::EpisodeErrorKind::Draining as i32 {
            // Not the episode's fault: the worker is going away (its lease is re-queued below).
            w.draining = true;
            self.sync_changed = true;
        }
        self.rerank(&id);
        let Some(batch) = self.batches.get_mut(&lease.batch) else { return };
        if !batch.outstanding.contains(&r.episode_id) {
            self.metrics.duplicate_results.inc();
            return;
        }
        // A trajectory that does not parse, breaks the protocol or was sampled with the wrong
        // weights is this attempt failing: it is retried like any failed episode.
        let mut r = r;
        if r.error.is_empty() {
            match crate::experience::check_record(
                &batch.method,
                &r.trajectory_json,
                &r.episode_id,
                batch.versions.as_deref(),
            ) {
                Ok(record) => {
                    batch.outstanding.remove(&r.episode_id);
                    self.metrics.episodes_completed.inc();
                    let episode = r.episode_id.clone();
                    let _ = batch.results.send(Delivery::Done {
                        episode_id: r.episode_id,
                        record: Box::new(record),
                        trajectory_json: r.trajectory_json,
                        worker: id,
                    });
                    self.cancel_copies(&lease.batch, &episode);
                    return;
                }
                Err(e) => {
                    self.metrics.malformed_trajectories.inc();
                    r.error = format!("malformed trajectory: {e}");
                }
            }
        }
        if r.error_kind == pb::EpisodeErrorKind::Draining as i32 {
            self.metrics.requeued_episodes.inc();
            self.queue.push_front(Lease { since: Instant::now(), copied: false, ..lease });
            return;
        }
        if r.error_kind == pb::EpisodeErrorKind::Cancelled as i32 {
            // Stopped by an older cancel of the same id (a cancelled job's episode that had
            // ended there, leased again when the job resumed): not the episode's fault either.
            self.metrics.requeued_episodes.inc();
            self.queue.push_front(Lease { since: Instant::now(), copied: false, ..lease });
            return;
        }
        let attempts = lease.attempts + 1;
        tracing::warn!(worker = %id, episode = %r.episode_id, attempts, error = %r.error, "episode failed");
        if attempts >= batch.max_attempts {
            batch.outstanding.remove(&r.episode_id);
            let episode = r.episode_id.clone();
            let _ = batch.results.send(Delivery::Failed {
                episode_id: r.episode_id,
                error: format!("failed {attempts} times; last error on worker {id}: {}", r.error),
            });
            self.cancel_copies(&lease.batch, &episode);
        } else {
            self.metrics.requeued_episodes.inc();
            self.queue.push_back(Lease { attempts, since: Instant::now(), copied: false, ..lease });
        }
    }

    pub(super) fn tick(&mut self) {
        let now = Instant::now();
        let dead: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| now.duration_since(w.last_seen) > self.settings.heartbeat_timeout)
            .map(|(id, _)| id.clone())
            .collect();
        for id in dead {
            self.drop_worker(&id, "no heartbeat");
        }
        // A lease past its job's episode timeout is handed out once more, to another worker; it
        // keeps its slot where it runs, and whichever copy returns first counts.
        let mut again = Vec::new();
        let batches = &self.batches;
        for w in self.workers.values_mut() {
            for l in w.leased.values_mut() {
                let timeout = batches
                    .get(&l.batch)
                    .map_or(self.settings.episode_timeout, |b| b.episode_timeout);
                if !l.copied && now.duration_since(l.since) > timeout {
                    l.copied = true;
                    again.push(Lease { since: now, copied: false, ..l.clone() });
                }
            }
        }
        for l in again {
            if self
                .batches
                .get(&l.batch)
                .is_some_and(|b| b.outstanding.contains(&l.spec.episode_id))
            {
                tracing::warn!(episode = %l.spec.episode_id, "episode lease timed out; leasing a copy elsewhere");
                if let Some(b) = self.batches.get_mut(&l.batch) {
                    b.copied.insert(l.spec.episode_id.clone());
                }
                self.metrics.requeued_episodes.inc();
                self.queue.push_back(l);
            }
        }
        // Queued episodes with no ready worker: each job waits as long as its schedule says.
        let Some(idle) = self.idle_since.map(|t| now.duration_since(t)) else { return };
        let queued: HashSet<BatchKey> = self.queue.iter().map(|l| l.batch.clone()).collect();
        let stalled: Vec<(BatchKey, Duration)> = queued
            .into_iter()
            .filter_map(|j| self.batches.get(&j).map(|b| (j, b.worker_wait)))
            .filter(|(_, wait)| idle > *wait)
            .collect();
        if stalled.is_empty() {
            return;
        }
        let workers: Vec<String> = self
            .workers
            .iter()
            .map(|(id, w)| {
                format!(
                    "{id} at {}{}",
                    w.address,
                    if w.last_error.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", w.last_error)
                    }
                )
            })
            .collect();
        for (j, wait) in stalled {
            let n = self.queue.iter().filter(|l| l.batch == j).count();
            let reason = format!(
                "{n} episodes waited {wait:?} with no ready rollout worker (registered: {})",
                if workers.is_empty() { "none".to_string() } else { workers.join("; ") }
            );
            if let Some(b) = self.batches.remove(&j) {
                let _ = b.results.send(Delivery::Stalled { reason });
            }
            self.queue.retain(|l| l.batch != j);
        }
        if self.queue.is_empty() {
            self.idle_since = None;
        }
    }
}
