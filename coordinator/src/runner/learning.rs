//! A step's part on the learners: each trains on its agent's experiences (with moments pooled
//! over agents where the method whitens globally), each publishes, and the new versions go out
//! to the workers by relay.
use super::*;

impl JobRun {
    /// Stage `train`: every learner in parallel on its own agent's experiences; each checkpoints
    /// if due and publishes version `step + 1`.
    pub(super) async fn train(
        &mut self,
        step: u64,
        batch: &StepBatch,
        at: &[u64],
        times: &mut StepTimes,
    ) -> Result<Trained> {
        let (ctx, id, l) = (self.ctx.clone(), self.id.clone(), self.agents());
        let started = Instant::now();
        let samples: Vec<u32> = batch.per_agent.iter().map(|e| e.len() as u32).collect();
        ctx.report.live(Update::Enter("train"));
        ctx.report.live(Update::TrainPlanned(samples.iter().sum()));
        ctx.report.event("stage", String::new(), format!("step {step}: training {l} agents"));
        let checkpoint = (step + 1) % self.job.spec.schedule.checkpoint_every == 0
            || step + 1 == self.job.total_steps;
        let step_id = format!("{id}/{step}");
        let tally = Arc::new(std::sync::Mutex::new(vec![TrainTally::default(); l]));
        // A JoinSet aborts the poller when dropped, so it also stops when the stage fails or the
        // job is cancelled, not only when training finishes.
        let mut follower = tokio::task::JoinSet::new();
        follower.spawn(follow_training(
            ctx.report.clone(),
            self.links.iter().map(|k| (k.agent, k.address.clone())).collect(),
            step + 1,
            samples.clone(),
            Arc::clone(&tally),
        ));
        let pooled = Arc::new(if batch.pooled_whitening {
            self.pooled_moments(step, &step_id, batch, at).await?
        } else {
            Vec::new()
        });
        let job = Arc::clone(&self.job);
        let done = |k: usize, out: &(Option<pb::TrainReport>, pb::WeightsPublished)| {
            let (done, tokens) =
                TrainTally::finish(&tally, k, samples[k], out.0.as_ref().map_or(0, |r| r.tokens));
            ctx.report.live(Update::Trained { done, tokens });
            ctx.report.event(
                "trained",
                String::new(),
                format!("agent {k} trained on {} experiences", samples[k]),
            );
        };
        let outs = self
            .on_every_learner(
                batch,
                |k, mut link, exps| {
                    let (step_id, at_k, job, pooled) =
                        (step_id.clone(), at[k], Arc::clone(&job), Arc::clone(&pooled));
                    async move {
                        let out = train_learner(
                            &mut link, &job, &step_id, &exps, step, checkpoint, at_k, &pooled,
                        )
                        .await;
                        (link, out)
                    }
                },
                done,
            )
            .await;
        drop(follower);
        let mut trained = Trained {
            reports: vec![None; l],
            versions: vec![0; l],
            bytes: vec![0; l],
            pooled: pooled.to_vec(),
        };
        for (k, (report, published)) in outs?.into_iter().enumerate() {
            trained.reports[k] = report;
            trained.versions[k] = published.version;
            trained.bytes[k] = published.total_bytes;
        }
        for (k, v) in trained.versions.iter().enumerate() {
            if *v != step + 1 {
                return Err(CoordinatorError::Learner {
                    agent: k as u32,
                    address: self.links[k].address.clone(),
                    message: format!(
                        "published version {v} after step {step}; expected {}",
                        step + 1
                    ),
                });
            }
        }
        times.train = started.elapsed().as_secs_f64();
        Ok(trained)
    }

    /// Every learner's return moments for `step`, pooled per norm group: the first half of a
    /// step whose advantages are whitened over all agents (each learner keeps what it computed
    /// for the Train call that follows).
    pub(super) async fn pooled_moments(
        &mut self,
        step: u64,
        step_id: &str,
        batch: &StepBatch,
        at: &[u64],
    ) -> Result<Vec<pb::GroupMoments>> {
        let job = Arc::clone(&self.job);
        let parts = self
            .on_every_learner(
                batch,
                |k, mut link, exps| {
                    let (step_id, at_k, job) = (step_id.to_string(), at[k], Arc::clone(&job));
                    async move {
                        let out =
                            learner_moments(&mut link, &job, &step_id, &exps, step, at_k).await;
                        (link, out)
                    }
                },
                |_, _| {},
            )
            .await?;
        Ok(pool_moments(&parts))
    }

    /// Runs `task` on every learner at once, each with its link and its agent's experiences,
    /// hands each result to `done` as it arrives, and puts the links back. The first error
    /// fails the stage once every task has ended; a cancel ends it at once.
    pub(super) async fn on_every_learner<T, Fut>(
        &mut self,
        batch: &StepBatch,
        task: impl Fn(usize, LearnerLink, Vec<pb::Experience>) -> Fut,
        mut done: impl FnMut(usize, &T),
    ) -> Result<Vec<T>>
    where
        T: Send + 'static,
        Fut: std::future::Future<Output = (LearnerLink, Result<T>)> + Send + 'static,
    {
        let l = self.agents();
        let mut tasks = tokio::task::JoinSet::new();
        for (k, (link, exps)) in
            self.links.drain(..).zip(batch.per_agent.iter().cloned()).enumerate()
        {
            let fut = task(k, link, exps);
            tasks.spawn(async move { (k, fut.await) });
        }
        let mut slots: Vec<Option<LearnerLink>> = (0..l).map(|_| None).collect();
        let mut outs: Vec<Option<T>> = (0..l).map(|_| None).collect();
        let mut first_err = None;
        let joined = async {
            while let Some(r) = tasks.join_next().await {
                let (k, (link, out)) =
                    r.map_err(|e| CoordinatorError::Other(format!("learner task: {e}")))?;
                slots[k] = Some(link);
                match out {
                    Ok(t) => {
                        done(k, &t);
                        outs[k] = Some(t);
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            Ok::<_, CoordinatorError>(())
        };
        tokio::select! {
            r = joined => r?,
            _ = self.cancel.changed() => return Err(CoordinatorError::Cancelled(self.id.clone())),
        }
        self.links = slots.into_iter().map(|s| s.expect("every task returned its link")).collect();
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(outs.into_iter().map(|o| o.expect("every task succeeded")).collect())
    }

    /// Stage `broadcast`: every worker pulls the new versions before the next rollout (none
    /// after the last step).
    pub(super) async fn broadcast(
        &mut self,
        step: u64,
        trained: &Trained,
        times: &mut StepTimes,
    ) -> Result<crate::scheduler::SyncStats> {
        let started = Instant::now();
        let mut sync = crate::scheduler::SyncStats::default();
        self.ctx.report.live(Update::Enter("broadcast"));
        if step + 1 < self.job.total_steps {
            let generation =
                retarget(&self.ctx, &self.job, &self.id, &self.load, &trained.versions);
            self.target_versions = Some(trained.versions.clone());
            let targets = (0..self.agents())
                .map(|k| broadcast::Target {
                    agent: k as u32,
                    version: trained.versions[k],
                    bytes: trained.bytes[k],
                })
                .collect();
            let mut follower = tokio::task::JoinSet::new();
            follower.spawn(broadcast::follow(
                self.ctx.scheduler.clone(),
                self.ctx.report.clone(),
                targets,
            ));
            tokio::select! {
                r = self.ctx.scheduler.wait_prepared(generation) => sync = r.map_err(|e| CoordinatorError::Rollout(e.to_string()))?,
                _ = self.cancel.changed() => return Err(CoordinatorError::Cancelled(self.id.clone())),
            }
            drop(follower);
        }
        times.broadcast = started.elapsed().as_secs_f64();
        Ok(sync)
    }
}
