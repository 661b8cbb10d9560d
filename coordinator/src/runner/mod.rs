//! The training loop of one job. Synchronous, as in MARTI: rollout on the workers, experience
//! making here, training on every agent's learner in parallel, then the weight broadcast; the
//! asynchronous schedule (`pipeline`) runs later steps' rollouts beside the training. A step is
//! committed to the store only when all of it is done, so a restarted coordinator repeats at
//! most the unfinished step, and only its missing episodes.
use crate::broadcast;
use crate::episodes::{in_spec_order, make_batch, parse_record, save_episodes, step_specs};
use crate::error::{CoordinatorError, Result};
use crate::experience::StepBatch;
use crate::files::{load_job, Loaded};
use crate::learner_steps::{
    follow_training, learner_moments, pool_moments, train_learner, TrainTally,
};
use crate::learners::LearnerLink;
use crate::progress::{RunContext, Update};
use crate::scheduler::{BatchLimits, BatchSpec};
use crate::scheduler::{Delivery, PolicyTarget};
use crate::store::{now, JobRow, JobState};
use comas_proto::v1 as pb;
use comas_workflow::job::Job;
use comas_workflow::program::Record;
use comas_workflow::step_log::{
    IdleSeconds, PooledMoments, Record as LogRecord, StepLog, StepSeconds, TrainReport, WeightSync,
};
use comas_workflow::task::TaskRecord;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

mod evaluation;
mod learning;
mod pipeline;
mod rollback;

use evaluation::evaluate;

use pipeline::RolloutClock;

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The trained agents, then the frozen models (which share a base with the agents on the same
/// folder and are never updated).
fn load_request(job: &Job) -> pb::LoadPoliciesRequest {
    let trained = job.spec.agents.iter().enumerate().map(|(k, a)| pb::AgentPolicy {
        agent_id: k as u32,
        model_dir: a.model.display().to_string(),
        adapter_dir: a.adapter.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        full_weights: job.train[k].lora.is_none(),
        lora_json: job.train[k]
            .lora
            .as_ref()
            .filter(|_| a.adapter.is_none())
            .map(|l| serde_json::to_string(l).unwrap_or_default())
            .unwrap_or_default(),
        ..Default::default()
    });
    let frozen = job.spec.frozen.iter().enumerate().map(|(i, f)| pb::AgentPolicy {
        agent_id: job.frozen_agent(i),
        model_dir: f.model.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        adapter_dir: f.adapter.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        endpoint: f.endpoint.clone().unwrap_or_default(),
        endpoint_model: f
            .endpoint
            .as_ref()
            .map(|_| f.endpoint_model.clone().unwrap_or_else(|| f.name.clone()))
            .unwrap_or_default(),
        api_key_env: f.api_key_env.clone().unwrap_or_default(),
        max_attempts: f.max_attempts.unwrap_or(0),
        ..Default::default()
    });
    pb::LoadPoliciesRequest {
        agents: trained.chain(frozen).collect(),
        dtype: job.spec.rollout.dtype.clone(),
        engine: job.spec.rollout.engine.map(|e| e.name().to_string()).unwrap_or_default(),
    }
}

/// Points every worker at these weight versions (agent k's from its learner); returns the new
/// target generation to wait for.
fn retarget(
    ctx: &RunContext,
    job: &Job,
    id: &str,
    load: &pb::LoadPoliciesRequest,
    versions: &[u64],
) -> u64 {
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
    let sources = job
        .spec
        .agents
        .iter()
        .enumerate()
        .map(|(k, a)| (k as u32, versions[k], a.learner.clone().unwrap_or_default()))
        .collect();
    let source_patience = Duration::from_secs(job.spec.schedule.learner_timeout_secs);
    ctx.scheduler.set_target(PolicyTarget {
        job_id: id.to_string(),
        generation,
        load: load.clone(),
        versions: sources,
        source_patience,
    });
    generation
}

/// One job's run: what the stages of every step share.
struct JobRun {
    ctx: RunContext,
    id: String,
    job: Arc<Job>,
    questions: Arc<Vec<TaskRecord>>,
    eval_questions: Vec<TaskRecord>,
    links: Vec<LearnerLink>,
    load: pb::LoadPoliciesRequest,
    /// `metrics.jsonl` and the TensorBoard event file, appended per record.
    log: crate::metrics_log::MetricsLog,
    /// The versions the workers were last pointed at.
    target_versions: Option<Vec<u64>>,
    cancel: watch::Receiver<bool>,
    /// How long the job's rollouts and evaluations kept the workers busy.
    clock: RolloutClock,
    /// Steps in a row each agent trained without a policy gradient (since this run started).
    idle_agents: std::sync::Mutex<Vec<u64>>,
}

/// Where a step started: its clock, the workers' busy time and the scheduler's seconds then.
struct StepStart {
    at: Instant,
    busy: f64,
    scheduler_seconds: f64,
}

/// Steps in a row without a policy gradient after which an agent is reported as not learning.
const NO_GRADIENT_WARNING_STEPS: u64 = 3;

/// Seconds each stage of one step took, and the coordinator's own share.
#[derive(Default)]
struct StepTimes {
    rollout: f64,
    experience: f64,
    train: f64,
    broadcast: f64,
    /// Time in the job store during the step.
    store: f64,
}

/// What the training stage left: each learner's report (none when it had trained the step
/// before a restart and no longer keeps the report), published version and its size.
struct Trained {
    reports: Vec<Option<pb::TrainReport>>,
    versions: Vec<u64>,
    bytes: Vec<u64>,
    /// The moments every agent was whitened with, when pooled over all agents.
    pooled: Vec<pb::GroupMoments>,
}

/// The moments every agent's advantages were whitened with, per norm group ("all" for the
/// unnamed one), for the metrics log.
fn pooled_whitening_record(pooled: &[pb::GroupMoments]) -> BTreeMap<String, PooledMoments> {
    pooled
        .iter()
        .map(|g| {
            let m = comas_workflow::moments::Moments { count: g.count, mean: g.mean, m2: g.m2 };
            let group = if g.norm_group.is_empty() { "all" } else { g.norm_group.as_str() };
            (
                group.to_string(),
                PooledMoments { tokens: g.count, mean: g.mean, std: m.variance().sqrt() },
            )
        })
        .collect()
}

/// The record of step `step` around the method's figures (`metrics`), with the step's idle
/// time of the workers (no rollout or evaluation running) and of the learners (not training)
/// within its `wall` seconds; `commit` fills in the rest.
fn step_log(
    id: &str,
    step: u64,
    metrics: Value,
    wall: f64,
    workers_busy: f64,
    learners_busy: f64,
) -> StepLog {
    let mut log = StepLog::new(id, step, metrics);
    log.idle_seconds = Some(IdleSeconds {
        workers: (wall - workers_busy).max(0.0),
        learners: (wall - learners_busy).max(0.0),
    });
    log
}

/// What a rollout needs of its job run.
#[derive(Clone)]
struct RolloutSide {
    ctx: RunContext,
    id: String,
    job: Arc<Job>,
    questions: Arc<Vec<TaskRecord>>,
    clock: RolloutClock,
}

/// A step's episodes: every spec, the records the store holds, and the specs still to run.
struct Planned {
    specs: Vec<pb::EpisodeSpec>,
    done: HashMap<String, Record>,
    remaining: Vec<pb::EpisodeSpec>,
}

/// The episodes of `step`, with those the store holds already (from before a restart).
fn plan_rollout(side: &RolloutSide, step: u64, times: &mut StepTimes) -> Result<Planned> {
    let (ctx, id) = (&side.ctx, &side.id);
    let stored = {
        let t = Instant::now();
        let v = ctx.store.step_episodes(id, step)?;
        times.store += t.elapsed().as_secs_f64();
        v
    };
    let specs = step_specs(&side.job, id, step, &side.questions)?;
    let mut done: HashMap<String, Record> = HashMap::new();
    for (eid, json) in stored {
        let r = parse_record(&side.job, &json, &eid)?;
        done.insert(eid, r);
    }
    let remaining: Vec<pb::EpisodeSpec> =
        specs.iter().filter(|s| !done.contains_key(&s.episode_id)).cloned().collect();
    Ok(Planned { specs, done, remaining })
}

/// Runs `remaining` on the workers (each turn at `exact` versions when given, else at whatever
/// the workers hold) and returns all of the step's records in spec order.
async fn finish_rollout(
    side: &RolloutSide,
    step: u64,
    Planned { specs, mut done, remaining }: Planned,
    exact: Option<Vec<u64>>,
    beside_training: bool,
    cancel: &mut watch::Receiver<bool>,
    times: &mut StepTimes,
) -> Result<Vec<(String, Record)>> {
    let (ctx, id) = (side.ctx.clone(), side.id.clone());
    let total = specs.len();
    let started = Instant::now();
    let _running = side.clock.start();
    // Beside training, the stage shown stays the training's; the episodes still count.
    if !beside_training {
        ctx.report.live(Update::Enter("rollout"));
    }
    ctx.report.live(Update::EpisodesPlanned { done: done.len() as u32, total: total as u32 });
    let beside = if beside_training { ", beside the last step's training" } else { "" };
    ctx.report.event(
        "stage",
        String::new(),
        format!("step {step}: rollout of {total} episodes ({} already done){beside}", done.len()),
    );
    if !remaining.is_empty() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut outstanding = remaining.len();
        let batch = BatchSpec {
            tag: format!("step-{step}"),
            first: false,
            specs: remaining,
            method: side.job.method.clone(),
            limits: BatchLimits::of(&side.job.spec.schedule),
            versions: exact,
        };
        ctx.scheduler.submit(id.clone(), batch, tx);
        while outstanding > 0 {
            let delivery = tokio::select! {
                d = rx.recv() => d,
                _ = cancel.changed() => {
                    ctx.scheduler.cancel_job(id.clone());
                    return Err(CoordinatorError::Cancelled(id.clone()));
                }
            };
            match delivery {
                None => {
                    return Err(CoordinatorError::Rollout(
                        "the scheduler dropped the step's episodes".into(),
                    ))
                }
                Some(Delivery::Done { episode_id, record, trajectory_json, worker }) => {
                    let t = Instant::now();
                    let fresh = ctx.store.record_episode(
                        &id,
                        step,
                        &episode_id,
                        &trajectory_json,
                        &worker,
                    )?;
                    times.store += t.elapsed().as_secs_f64();
                    if fresh && !done.contains_key(&episode_id) {
                        let tokens = record.completion_tokens();
                        done.insert(episode_id, *record);
                        outstanding -= 1;
                        ctx.report.live(Update::EpisodeDone { done: done.len() as u32, tokens });
                        ctx.report.event("episodes", String::new(), String::new());
                    }
                }
                Some(Delivery::Failed { episode_id, error }) => {
                    return Err(CoordinatorError::Rollout(format!("episode {episode_id}: {error}")))
                }
                Some(Delivery::Stalled { reason }) => {
                    return Err(CoordinatorError::Rollout(reason))
                }
            }
        }
    }
    times.rollout = started.elapsed().as_secs_f64();
    if *cancel.borrow() {
        return Err(CoordinatorError::Cancelled(id));
    }
    in_spec_order(&specs, done)
}

/// The synchronous loop of spec 6: per step, the stages `learners`, `eval` (when due),
/// `rollout`, `experience`, `train`, `broadcast` and `commit`; after the last, `export`.
pub async fn run_job(ctx: &RunContext, row: JobRow, cancel: watch::Receiver<bool>) -> Result<()> {
    let mut step = row.steps_done;
    let mut run = JobRun::start(ctx, row, cancel).await?;
    if run.job.spec.schedule.policy_lag() > 0 {
        return run.run_async(step).await;
    }
    loop {
        let start = run.step_start();
        let at = run.learners(&mut step, true).await?;
        run.evaluate_if_due(step, &at).await?;
        if step >= run.job.total_steps {
            break;
        }
        let done = async {
            let mut times = StepTimes::default();
            let records = run.rollout(step, &at, &mut times).await?;
            let batch = run.experience(step, records, &mut times)?;
            let trained = run.train(step, &batch, &at, &mut times).await?;
            let sync = run.broadcast(step, &trained, &mut times).await?;
            run.commit(step, batch.metrics, &start, &trained, &sync, &times)
        };
        match done.await {
            // A learner restarted from an older checkpoint during the step: the next
            // `learners` stage takes the job back to that checkpoint's step.
            Err(CoordinatorError::LearnerBehind { .. }) => continue,
            r => r?,
        }
        step += 1;
    }
    run.export().await
}

impl JobRun {
    /// Loads and checks the job file, marks the job running and connects to its learners.
    async fn start(ctx: &RunContext, row: JobRow, cancel: watch::Receiver<bool>) -> Result<JobRun> {
        let id = row.id.clone();
        let (text, base, roots) = (row.spec.clone(), row.base_dir.clone(), ctx.roots.clone());
        let Loaded { job, questions, eval_questions } =
            tokio::task::spawn_blocking(move || load_job(&text, &base, &roots))
                .await
                .map_err(|e| CoordinatorError::Other(e.to_string()))??;
        ctx.store.set_state(&id, JobState::Running, "")?;
        ctx.report.event("status", String::new(), "running".into());
        let patience = Duration::from_secs(job.spec.schedule.learner_timeout_secs);
        let links = job
            .spec
            .agents
            .iter()
            .enumerate()
            .map(|(k, a)| {
                LearnerLink::new(k as u32, a.learner.as_deref().unwrap_or_default(), patience)
            })
            .collect();
        Ok(JobRun {
            ctx: ctx.clone(),
            log: crate::metrics_log::MetricsLog::open(
                &ctx.store,
                &id,
                &job.spec.output.dir.join("metrics.jsonl"),
            )?,
            load: load_request(&job),
            // Shared with the per-learner training tasks.
            job: Arc::new(job),
            id,
            questions: Arc::new(questions),
            eval_questions,
            links,
            target_versions: None,
            cancel,
            clock: RolloutClock::default(),
            idle_agents: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// A record the store has committed, to the metrics log, the event file and the tracker.
    fn publish(&self, line: &str) {
        self.log.append(line);
        if let Some(t) = &self.ctx.tracker {
            t.record(line);
        }
    }

    fn step_start(&self) -> StepStart {
        StepStart {
            at: Instant::now(),
            busy: self.clock.busy(),
            scheduler_seconds: self.ctx.metrics.scheduler_seconds.get(),
        }
    }

    fn agents(&self) -> usize {
        self.job.spec.agents.len()
    }

    /// Points the workers at `versions` unless they already are; returns the new generation.
    fn point_workers_at(&mut self, versions: &[u64]) -> Option<u64> {
        if self.target_versions.as_deref() == Some(versions) {
            return None;
        }
        self.target_versions = Some(versions.to_vec());
        Some(retarget(&self.ctx, &self.job, &self.id, &self.load, versions))
    }

    /// Stage `eval`: the held-out evaluation with the weights of `step` completed steps, when due.
    async fn evaluate_if_due(&mut self, step: u64, at: &[u64]) -> Result<()> {
        if !self.job.eval_due(step) || self.ctx.store.has_eval(&self.id, step)? {
            return Ok(());
        }
        if at.iter().any(|&g| g != step) {
            tracing::warn!(job = %self.id, step, "skipping the evaluation after {step} steps: a learner has already trained the next step");
            return Ok(());
        }
        if let Some(generation) = self.point_workers_at(&vec![step; self.agents()]) {
            self.ctx
                .scheduler
                .wait_prepared(generation)
                .await
                .map_err(|e| CoordinatorError::Rollout(e.to_string()))?;
        }
        // The workers are busy with the evaluation's episodes.
        let _running = self.clock.start();
        let line =
            evaluate(&self.ctx, &self.job, &self.id, step, &self.eval_questions, &mut self.cancel)
                .await?;
        self.publish(&line);
        Ok(())
    }

    /// Stage `rollout`: every episode of the step with version `step` everywhere; episodes the
    /// store already holds (from before a restart) are not run again. Returns the records in
    /// spec order, so every run builds the same batches. (Async mode accepts stored turns of an
    /// older version; the experience stage bounds their lag.)
    async fn rollout(
        &mut self,
        step: u64,
        at: &[u64],
        times: &mut StepTimes,
    ) -> Result<Vec<(String, Record)>> {
        let side = self.rollout_side();
        let planned = plan_rollout(&side, step, times)?;
        if !planned.remaining.is_empty() {
            if at.iter().any(|&g| g != step) {
                return Err(CoordinatorError::Other(format!(
                    "step {step} still has episodes to run but a learner has already trained it; the job store and the learners disagree"
                )));
            }
            self.point_workers_at(&vec![step; self.agents()]);
        }
        let exact = (self.job.spec.schedule.policy_lag() == 0).then(|| vec![step; self.agents()]);
        finish_rollout(&side, step, planned, exact, false, &mut self.cancel, times).await
    }

    /// What a rollout needs of the run, owned, so it can run beside training.
    fn rollout_side(&self) -> RolloutSide {
        RolloutSide {
            ctx: self.ctx.clone(),
            id: self.id.clone(),
            job: Arc::clone(&self.job),
            questions: Arc::clone(&self.questions),
            clock: self.clock.clone(),
        }
    }

    /// Stage `experience`: the method's rewards, one experience per trained turn, the metrics.
    fn experience(
        &self,
        step: u64,
        records: Vec<(String, Record)>,
        times: &mut StepTimes,
    ) -> Result<StepBatch> {
        let started = Instant::now();
        self.ctx.report.live(Update::Enter("experience"));
        if self.job.spec.output.save_episodes {
            save_episodes(&self.job, step, &records)?;
        }
        let lag = self.job.spec.schedule.policy_lag();
        let exact = (lag == 0).then(|| vec![step; self.agents()]);
        let mut batch = make_batch(
            &self.job.method,
            records,
            &self.questions,
            self.agents() as u32,
            exact.as_deref(),
            Some(step),
        )?;
        if lag > 0 {
            pipeline::bound_lag(&mut batch, step, lag);
        }
        times.experience = started.elapsed().as_secs_f64();
        Ok(batch)
    }

    /// Stage `commit`: the step's record (the method's metrics, each agent's training report,
    /// versions and weight sync, the stage times) goes to the store, then to the metrics log.
    fn commit(
        &self,
        step: u64,
        metrics: Value,
        start: &StepStart,
        trained: &Trained,
        sync: &crate::scheduler::SyncStats,
        times: &StepTimes,
    ) -> Result<()> {
        let commit_started = Instant::now();
        let started = start.at;
        let coordinator = times.experience
            + times.store
            + (self.ctx.metrics.scheduler_seconds.get() - start.scheduler_seconds);
        let mut log = step_log(
            &self.id,
            step,
            metrics,
            started.elapsed().as_secs_f64(),
            self.clock.busy() - start.busy,
            times.train,
        );
        let id = &self.id;
        let tokens = log.figures.get("generated_tokens").and_then(Value::as_u64).unwrap_or(0);
        log.unix_time = now();
        log.tokens_per_s = if times.rollout > 0.0 { tokens as f64 / times.rollout } else { 0.0 };
        for (k, a) in log.agents.iter_mut().flatten().enumerate() {
            // A report that does not read logs as null, like one the learner no longer keeps.
            a.train = trained
                .reports
                .get(k)
                .and_then(Option::as_ref)
                .and_then(|r| serde_json::from_str(&r.json).ok());
            let s = sync.per_agent.get(&(k as u32)).copied().unwrap_or_default();
            a.weight_sync =
                WeightSync { bytes: s.bytes, learner_bytes: s.learner_bytes, seconds: s.seconds };
            a.version = trained.versions.get(k).copied().unwrap_or_default();
        }
        if !trained.pooled.is_empty() {
            log.pooled_whitening = Some(pooled_whitening_record(&trained.pooled));
        }
        log.seconds = Some(StepSeconds {
            rollout: times.rollout,
            experience: times.experience,
            train: times.train,
            broadcast: times.broadcast,
            coordinator: coordinator + commit_started.elapsed().as_secs_f64(),
            total: started.elapsed().as_secs_f64(),
        });
        let line = LogRecord::Step(log).line();
        let versions_now: Vec<(u32, u64)> =
            trained.versions.iter().enumerate().map(|(k, v)| (k as u32, *v)).collect();
        self.ctx.store.commit_step(id, step, &line, &versions_now, !self.job.method.trains())?;
        self.publish(&line);
        self.ctx.metrics.steps_completed.inc();
        tracing::info!(job = %id, step, rollout_secs = times.rollout, train_secs = times.train, broadcast_secs = times.broadcast, coordinator_secs = coordinator, "step committed");
        self.ctx.report.event("step", line, format!("step {step} done"));
        self.warn_of_idle_agents(step, trained);
        Ok(())
    }

    /// Counts each agent's steps in a row without a policy gradient (every sample masked or
    /// with a zero advantage) and warns when one reaches `NO_GRADIENT_WARNING_STEPS`.
    fn warn_of_idle_agents(&self, step: u64, trained: &Trained) {
        let mut idle = self.idle_agents.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        idle.resize(trained.reports.len(), 0);
        for (k, report) in trained.reports.iter().enumerate() {
            let Some(report) = report else { continue };
            let none =
                serde_json::from_str::<TrainReport>(&report.json).is_ok_and(|r| r.no_gradient);
            idle[k] = if none { idle[k] + 1 } else { 0 };
            if idle[k] == NO_GRADIENT_WARNING_STEPS {
                let message = format!(
                    "agent {k} has trained on no policy gradient for {} steps in a row (to step {step}): every sample was masked (cut at max_new_tokens with mask_truncated) or its group's rewards were all equal; check max_new_tokens, mask_truncated and whether the rewards vary",
                    NO_GRADIENT_WARNING_STEPS
                );
                tracing::warn!(job = %self.id, agent = k, step, "{message}");
                self.ctx.report.event("warning", String::new(), message);
            }
        }
    }

    /// Stage `export`: each agent's final model or adapter into `output.dir/agent-K`.
    async fn export(mut self) -> Result<()> {
        if !self.job.spec.output.export {
            return Ok(());
        }
        self.ctx.report.live(Update::Enter("export"));
        for (k, link) in self.links.iter_mut().enumerate() {
            let dir = self.job.spec.output.dir.join(format!("agent-{k}"));
            link.export(&dir.display().to_string()).await?;
        }
        Ok(())
    }
}
