//! The synchronous training loop of one job, as in MARTI: rollout on the workers, experience
//! making here, training on every agent's learner in parallel, then the weight broadcast. A
//! step is committed to the store only when all of it is done, so a restarted coordinator
//! repeats at most the unfinished step, and only its missing episodes.
use crate::broadcast;
use crate::error::{CoordinatorError, Result};
use crate::experience::{make_step, Finished, StepBatch};
use crate::files::{load_job, Loaded};
use crate::jobs::Jobs;
use crate::learners::LearnerLink;
use crate::mappa_experience::make_mappa_step;
use crate::scheduler::{BatchLimits, BatchSpec};
use crate::scheduler::{Delivery, PolicyTarget};
use crate::store::{now, JobRow, JobState};
use crate::tensorboard;
use comas_proto::v1 as pb;
use comas_workflow::comas::{episode_seed, plan_batch, PlanSeed};
use comas_workflow::job::Job;
use comas_workflow::program::{Record, Settings};
use comas_workflow::task::TaskRecord;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Stable episode ids: the same (job, step, instance) gets the same id after a restart, so an
/// episode stored before the restart is recognised and never run or counted again.
fn episode_id(job_id: &str, step: u64, instance: u32) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("{job_id}/{step}/{instance}").as_bytes()).to_string()
}

/// The trained agents, then the frozen models (which share a base with the agents on the same
/// folder and are never updated).
fn load_request(job: &Job) -> pb::LoadPoliciesRequest {
    let trained = job.spec.agents.iter().enumerate().map(|(k, a)| pb::AgentPolicy {
        agent_id: k as u32,
        model_dir: a.model.display().to_string(),
        adapter_dir: a.adapter.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        full_weights: job.train[k].lora.is_none(),
        lora_json: job.train[k].lora.as_ref().filter(|_| a.adapter.is_none()).map(|l| serde_json::to_string(l).unwrap_or_default()).unwrap_or_default(),
    });
    let frozen = job.spec.frozen.iter().enumerate().map(|(i, f)| pb::AgentPolicy {
        agent_id: job.frozen_agent(i),
        model_dir: f.model.display().to_string(),
        adapter_dir: f.adapter.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        full_weights: false,
        lora_json: String::new(),
    });
    pb::LoadPoliciesRequest { agents: trained.chain(frozen).collect(), dtype: job.spec.rollout.dtype.clone() }
}

/// Evaluation episodes draw from their own seed stream, apart from every training step's.
const EVAL_SHARD: u64 = 1 << 32;

fn step_specs(job: &Job, job_id: &str, step: u64, questions: &[TaskRecord]) -> Result<Vec<pb::EpisodeSpec>> {
    let chosen = job.step_questions(step);
    let seed = PlanSeed { global: job.spec.seed, step, shard: 0 };
    episode_specs(job.settings(), &chosen, questions, seed, |i| episode_id(job_id, step, i))
}

/// The episodes of the `chosen` questions, `instances_per_question` copies each; a CoMAS game
/// also gets each instance's judge assignment.
fn episode_specs(
    settings: Settings<'_>,
    chosen: &[usize],
    questions: &[TaskRecord],
    seed: PlanSeed,
    id_of: impl Fn(u32) -> String,
) -> Result<Vec<pb::EpisodeSpec>> {
    let copies = settings.instances_per_question() as usize;
    let n = chosen.len() * copies;
    let plans: Vec<String> = match settings {
        Settings::Comas(comas) => plan_batch(comas, n, seed)
            .map_err(|e| CoordinatorError::Rollout(format!("planning step {}: {e}", seed.step)))?
            .instances
            .iter()
            .map(|p| serde_json::to_string(p).expect("plan serialises"))
            .collect(),
        Settings::Mappa(_) => vec![String::new(); n],
    };
    let config_json = settings.config_json();
    let method = settings.method().as_str().to_string();
    Ok(plans
        .into_iter()
        .enumerate()
        .map(|(i, plan_json)| {
            let instance = i as u32;
            pb::EpisodeSpec {
                episode_id: id_of(instance),
                config_json: config_json.clone(),
                question_json: serde_json::to_string(&questions[chosen[i / copies]]).expect("record serialises"),
                plan_json,
                instance,
                seed: episode_seed(seed, instance),
                method: method.clone(),
            }
        })
        .collect())
}

/// A stored record (it passed the same check when it arrived; versions are checked again when
/// the step's experiences are made).
fn parse_record(job: &Job, json: &str, episode: &str) -> Result<Record> {
    crate::experience::check_record(&job.settings().record_kind(), json, episode, None).map_err(CoordinatorError::Rollout)
}

/// Writes JSON lines atomically: the job's metrics log, rewritten from the store so it always
/// holds each committed step exactly once whatever restarts happened, and saved episodes.
fn write_lines(path: &Path, lines: &[String]) -> std::io::Result<()> {
    let mut text = String::new();
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    crate::files::write_atomic(path, text.as_bytes())
}

/// Keeps a step's records in `output.dir/episodes/step-NNNNN.jsonl` (with `output.save_episodes`),
/// so what the agents said can be read after the store has let go of them.
fn save_episodes(job: &Job, step: u64, records: &[(String, Record)]) -> Result<()> {
    let dir = job.spec.output.dir.join("episodes");
    let lines = records
        .iter()
        .map(|(id, r)| r.to_json().map(|json| format!("{{\"episode_id\":{},\"record\":{json}}}", serde_json::Value::String(id.clone()))))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| CoordinatorError::Other(e.to_string()))?;
    std::fs::create_dir_all(&dir)
        .and_then(|()| write_lines(&dir.join(format!("step-{step:05}.jsonl")), &lines))
        .map_err(|e| CoordinatorError::Other(format!("cannot save the episodes of step {step} in {}: {e}", dir.display())))
}

/// Rewrites the metrics log from the store, and brings the TensorBoard event file beside it up
/// to date; a failed write is logged, the store stays the truth.
fn refresh_metrics_log(jobs: &Jobs, id: &str, path: &Path) -> Result<()> {
    let lines = jobs.store.metrics_log(id)?;
    if let Err(e) = write_lines(path, &lines) {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the metrics log");
    }
    let events = tensorboard::path(path.parent().unwrap_or(Path::new(".")), id);
    let written = tensorboard::encode(&lines).map_err(std::io::Error::other).and_then(|bytes| tensorboard::sync(&events, &bytes));
    if let Err(e) = written {
        tracing::warn!(path = %events.display(), error = %e, "cannot write the TensorBoard event file");
    }
    Ok(())
}

/// Points every worker at these weight versions (agent k's from its learner); returns the new
/// target generation to wait for.
fn retarget(jobs: &Jobs, job: &Job, id: &str, load: &pb::LoadPoliciesRequest, versions: &[u64]) -> u64 {
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
    let sources = job.spec.agents.iter().enumerate().map(|(k, a)| (k as u32, versions[k], a.learner.clone().unwrap_or_default())).collect();
    let source_patience = Duration::from_secs(job.spec.schedule.learner_timeout_secs);
    jobs.scheduler.set_target(PolicyTarget { job_id: id.to_string(), generation, load: load.clone(), versions: sources, source_patience });
    generation
}

/// The episodes of `specs` in spec order (so every run builds the same batches).
fn in_spec_order(specs: &[pb::EpisodeSpec], mut done: HashMap<String, Record>) -> Result<Vec<(String, Record)>> {
    specs
        .iter()
        .map(|s| {
            let r = done.remove(&s.episode_id).ok_or_else(|| CoordinatorError::Rollout(format!("episode {} is missing after the rollout", s.episode_id)))?;
            Ok((s.episode_id.clone(), r))
        })
        .collect()
}

/// Rewards, experiences and metrics of a step's records, by the method's own formulation. A
/// CoMAS turn carries its role's temperature when `with_temperatures`.
fn make_batch(
    settings: Settings<'_>,
    records: Vec<(String, Record)>,
    questions: &[TaskRecord],
    num_agents: u32,
    versions: &[u64],
    with_temperatures: bool,
) -> Result<StepBatch> {
    let wrong = |id: &str| CoordinatorError::Rollout(format!("episode {id} came back as another method's record"));
    let made = match settings {
        Settings::Comas(comas) => {
            let by_id: HashMap<&str, &TaskRecord> = questions.iter().map(|q| (q.id.as_str(), q)).collect();
            let finished = records
                .into_iter()
                .map(|(episode_id, r)| match r {
                    Record::Comas(t) => {
                        // The question's reference answer, for logging only.
                        let answer = by_id.get(t.question_id.as_str()).map(|q| q.answer.clone()).unwrap_or_default();
                        Ok(Finished { episode_id, trajectory: t, answer })
                    }
                    Record::Mappa(_) => Err(wrong(&episode_id)),
                })
                .collect::<Result<Vec<_>>>()?;
            make_step(&finished, num_agents, Some(versions), with_temperatures.then_some(&comas.sampling), comas.reward)
        }
        Settings::Mappa(mappa) => {
            let finished = records
                .into_iter()
                .map(|(episode_id, r)| match r {
                    Record::Mappa(t) => Ok((episode_id, t)),
                    Record::Comas(_) => Err(wrong(&episode_id)),
                })
                .collect::<Result<Vec<_>>>()?;
            make_mappa_step(&finished, mappa, num_agents, Some(versions))
        }
    };
    made.map_err(|e| CoordinatorError::Rollout(e.to_string()))
}

/// Checks a learner before the job uses it: right agent, the job's settings, a step that fits.
async fn check_learner(link: &mut LearnerLink, job: &Job, step: u64) -> Result<u64> {
    let info = link.info().await?;
    let k = link.agent as usize;
    let bad = |m: String| CoordinatorError::Learner { agent: link.agent, address: link.address.clone(), message: m };
    if info.agent_id != link.agent {
        return Err(bad(format!("it serves agent {}, not agent {}; check agents[{k}].learner", info.agent_id, link.agent)));
    }
    // `completed_steps` is a counter a resumed learner takes from its checkpoint, not a setting.
    let settings = |mut v: Value| {
        if let Some(o) = v.as_object_mut() {
            o.remove("completed_steps");
        }
        v
    };
    let theirs = settings(serde_json::from_str(&info.config_json).unwrap_or(Value::Null));
    let ours = settings(serde_json::to_value(&job.train[k]).unwrap_or(Value::Null));
    if theirs != ours {
        let diff: Vec<String> = ours
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(key, v)| theirs.get(key.as_str()) != Some(v))
                    .map(|(key, v)| format!("{key}: job {v}, learner {}", theirs.get(key.as_str()).unwrap_or(&Value::Null)))
                    .collect()
            })
            .unwrap_or_default();
        return Err(bad(format!("its training settings differ from agents[{k}].train ({}); start it with this job file", diff.join(", "))));
    }
    if info.global_step != step && info.global_step != step + 1 {
        return Err(bad(format!(
            "it is at training step {} but the job has completed {step} steps; restart it from the checkpoint of step {step} (keep checkpoint_every = 1 to always have one)",
            info.global_step
        )));
    }
    Ok(info.global_step)
}

/// How often one learner may move to another step (restart) during one step's training before
/// the job fails.
const MAX_LEARNER_MOVES: u32 = 5;

/// Trains one learner on its turns of `step`, saves a checkpoint if due, and publishes version
/// `step + 1`. Every call names the learner step it expects, so a learner that restarts in
/// between (from an older or a newer checkpoint) is checked again and the rest planned again:
/// a step is never trained twice, and the version published is always the step's.
async fn train_learner(
    link: &mut LearnerLink,
    job: &Job,
    step_id: &str,
    exps: &[pb::Experience],
    step: u64,
    checkpoint: bool,
    mut at: u64,
) -> Result<(Option<pb::TrainReport>, pb::WeightsPublished)> {
    let mut moves = 0;
    loop {
        let attempt = async {
            // A step this learner already trained is not trained again; its report comes from
            // the learner's memory (kept in its checkpoints) if it still has it.
            let report = if at == step + 1 { link.report(step_id).await? } else { Some(link.train(step_id, exps, Some(step), Some(step)).await?) };
            if checkpoint {
                link.save(Some(step + 1)).await?;
            }
            Ok::<_, CoordinatorError>((report, link.publish(Some(step + 1)).await?))
        }
        .await;
        match attempt {
            Err(CoordinatorError::LearnerMoved { message, .. }) if moves < MAX_LEARNER_MOVES => {
                moves += 1;
                tracing::warn!(agent = link.agent, step, "{message}; checking the learner again");
                at = check_learner(link, job, step).await?;
            }
            other => return other,
        }
    }
}

/// Plays the CoMAS game on the held-out questions with the current weights; nothing is trained.
/// The record (accuracy, rewards and scores by agent; with `greedy`, the same for a greedy game
/// under `greedy`) goes into the store and the metrics log.
async fn evaluate(jobs: &Arc<Jobs>, job: &Job, id: &str, after: u64, questions: &[TaskRecord], cancel: &mut watch::Receiver<bool>) -> Result<()> {
    let started = Instant::now();
    let spec = job.spec.eval.as_ref().ok_or_else(|| CoordinatorError::Other("no [eval] settings".into()))?;
    let mut m = play_eval(jobs, job, id, after, questions, job.eval_method_at(spec.temperature).settings(), "eval", cancel).await?;
    if spec.greedy {
        let greedy = play_eval(jobs, job, id, after, questions, job.eval_method_at(0.0).settings(), "eval-greedy", cancel).await?;
        if let Some(o) = m.as_object_mut() {
            o.insert("greedy".into(), greedy);
        }
    }
    if let Some(o) = m.as_object_mut() {
        o.insert("kind".into(), json!("eval"));
        o.insert("job_id".into(), json!(id));
        o.insert("step".into(), json!(after));
        o.insert("after_steps".into(), json!(after));
        o.insert("temperature".into(), json!(spec.temperature));
        o.insert("unix_time".into(), json!(now()));
        o.insert("seconds".into(), json!({"total": started.elapsed().as_secs_f64()}));
    }
    let line = serde_json::to_string(&m).unwrap_or_default();
    jobs.store.record_eval(id, after, &line)?;
    tracing::info!(job = %id, after, accuracy = ?m.pointer("/accuracy/last_round"), "evaluation recorded");
    jobs.emit(id, "eval", line, format!("evaluation after {after} steps"));
    Ok(())
}

/// One evaluation game over every held-out question with `settings`; returns its metrics.
/// `tag` keeps the episode ids of different games apart.
#[allow(clippy::too_many_arguments)]
async fn play_eval(
    jobs: &Arc<Jobs>,
    job: &Job,
    id: &str,
    after: u64,
    questions: &[TaskRecord],
    settings: Settings<'_>,
    tag: &str,
    cancel: &mut watch::Receiver<bool>,
) -> Result<Value> {
    let chosen: Vec<usize> = (0..questions.len()).collect();
    let seed = PlanSeed { global: job.spec.seed, step: after, shard: EVAL_SHARD };
    let specs = episode_specs(settings, &chosen, questions, seed, |i| {
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("{id}/{tag}/{after}/{i}").as_bytes()).to_string()
    })?;
    let total = specs.len();
    jobs.set_live(id, |s| {
        s.enter("eval");
        s.episodes_total = total as u32;
    });
    jobs.emit(id, "stage", String::new(), format!("evaluation after {after} steps ({tag}): {total} episodes"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let batch = BatchSpec {
        specs: specs.clone(),
        kind: settings.record_kind(),
        limits: BatchLimits::of(&job.spec.schedule),
        versions: Some(vec![after; job.spec.agents.len()]),
    };
    jobs.scheduler.submit(id.to_string(), batch, tx);
    let mut done: HashMap<String, Record> = HashMap::new();
    while done.len() < total {
        let delivery = tokio::select! {
            d = rx.recv() => d,
            _ = cancel.changed() => return Err(CoordinatorError::Cancelled(id.to_string())),
        };
        match delivery {
            None => return Err(CoordinatorError::Rollout("the scheduler dropped the evaluation's episodes".into())),
            Some(Delivery::Done { episode_id, record, .. }) => {
                let tokens = record.completion_tokens();
                done.insert(episode_id, *record);
                jobs.set_live(id, |s| {
                    s.episodes_done = done.len() as u32;
                    s.stage_tokens += tokens;
                });
                jobs.emit(id, "episodes", String::new(), String::new());
            }
            Some(Delivery::Failed { episode_id, error }) => return Err(CoordinatorError::Rollout(format!("evaluation episode {episode_id}: {error}"))),
            Some(Delivery::Stalled { reason }) => return Err(CoordinatorError::Rollout(reason)),
        }
    }
    let finished = in_spec_order(&specs, done)?;
    Ok(make_batch(settings, finished, questions, job.spec.agents.len() as u32, &vec![after; job.spec.agents.len()], false)?.metrics)
}

/// One learner's share of the training stage, as far as the coordinator knows it.
#[derive(Clone, Copy, Default)]
struct TrainTally {
    samples: u32,
    tokens: u64,
    finished: bool,
}

impl TrainTally {
    fn sums(t: &[TrainTally]) -> (u32, u64) {
        (t.iter().map(|x| x.samples).sum(), t.iter().map(|x| x.tokens).sum())
    }

    /// Learner `k` has finished with `samples` experiences and `tokens` tokens; the new sums.
    fn finish(tally: &std::sync::Mutex<Vec<TrainTally>>, k: usize, samples: u32, tokens: u64) -> (u32, u64) {
        let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
        t[k] = TrainTally { samples, tokens, finished: true };
        Self::sums(&t)
    }
}

/// Polls every learner's progress about once a second while the training stage runs, into the
/// job's live status, so a watcher sees experiences and tokens/s inside a long step. Runs until
/// aborted; a learner that does not answer is asked again next time.
async fn follow_training(
    jobs: Arc<Jobs>,
    id: String,
    learners: Vec<(u32, String)>,
    global_step: u64,
    samples: Vec<u32>,
    tally: Arc<std::sync::Mutex<Vec<TrainTally>>>,
) {
    let mut links: Vec<LearnerLink> = learners.iter().map(|(k, a)| LearnerLink::new(*k, a, Duration::from_secs(2))).collect();
    loop {
        tokio::time::sleep(TRAIN_PROGRESS_EVERY).await;
        let mut changed = false;
        for (k, link) in links.iter_mut().enumerate() {
            let Some(p) = link.train_progress().await else { continue };
            if !p.training || p.global_step != global_step || p.samples_total == 0 {
                continue;
            }
            // The learner counts samples x epochs; show them as a share of this agent's samples.
            let done = (u64::from(p.samples_done) * u64::from(samples[k]) / u64::from(p.samples_total)) as u32;
            let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
            if !t[k].finished && (t[k].samples, t[k].tokens) != (done, p.tokens_done) {
                t[k] = TrainTally { samples: done, tokens: p.tokens_done, finished: false };
                changed = true;
            }
        }
        if changed {
            let (done, tokens) = TrainTally::sums(&tally.lock().unwrap_or_else(|e| e.into_inner()));
            jobs.set_live(&id, |s| {
                s.train_samples_done = done;
                s.stage_tokens = tokens;
            });
            jobs.emit(&id, "trained", String::new(), String::new());
        }
    }
}

/// How often the coordinator asks learners how far their step has got.
const TRAIN_PROGRESS_EVERY: Duration = Duration::from_secs(1);

pub async fn run_job(jobs: &Arc<Jobs>, row: JobRow, mut cancel: watch::Receiver<bool>) -> Result<()> {
    let id = row.id.clone();
    let (text, base) = (row.spec.clone(), row.base_dir.clone());
    let Loaded { job, questions, eval_questions } =
        tokio::task::spawn_blocking(move || load_job(&text, &base)).await.map_err(|e| CoordinatorError::Other(e.to_string()))??;
    // Shared with the per-learner training tasks.
    let job = Arc::new(job);
    jobs.store.set_state(&id, JobState::Running, "")?;
    jobs.emit(&id, "status", String::new(), "running".into());
    let patience = Duration::from_secs(job.spec.schedule.learner_timeout_secs);
    let mut links: Vec<LearnerLink> =
        job.spec.agents.iter().enumerate().map(|(k, a)| LearnerLink::new(k as u32, a.learner.as_deref().unwrap_or_default(), patience)).collect();
    let metrics_path = job.spec.output.dir.join("metrics.jsonl");
    let load = load_request(&job);
    let l = job.spec.agents.len();
    let mut target_versions: Option<Vec<u64>> = None;
    let mut step = row.steps_done;
    let cancelled = |c: &watch::Receiver<bool>| *c.borrow();

    loop {
        let step_started = Instant::now();
        let sched_before = jobs.metrics.scheduler_seconds.get();
        let mut store_secs = 0.0;
        // Learners: at `step` (or `step + 1` if they trained it before a coordinator restart).
        jobs.set_live(&id, |s| s.enter("learners"));
        let mut at = Vec::with_capacity(l);
        for link in links.iter_mut() {
            at.push(check_learner(link, &job, step).await?);
        }
        let versions = vec![step; l];

        // 0. Held-out evaluation with the weights of `step` completed steps.
        if job.eval_due(step) && !jobs.store.has_eval(&id, step)? {
            if at.iter().all(|&g| g == step) {
                if target_versions.as_ref() != Some(&versions) {
                    let generation = retarget(jobs, &job, &id, &load, &versions);
                    target_versions = Some(versions.clone());
                    jobs.scheduler.wait_prepared(generation).await.map_err(CoordinatorError::Rollout)?;
                }
                evaluate(jobs, &job, &id, step, &eval_questions, &mut cancel).await?;
                refresh_metrics_log(jobs, &id, &metrics_path)?;
            } else {
                tracing::warn!(job = %id, step, "skipping the evaluation after {step} steps: a learner has already trained the next step");
            }
        }
        if step >= job.total_steps {
            break;
        }

        // 1. Rollout with version `step` everywhere.
        let episodes_stored = {
            let t = Instant::now();
            let v = jobs.store.step_episodes(&id, step)?;
            store_secs += t.elapsed().as_secs_f64();
            v
        };
        let specs = step_specs(&job, &id, step, &questions)?;
        let total = specs.len();
        let mut done: HashMap<String, Record> = HashMap::new();
        for (eid, json) in episodes_stored {
            let r = parse_record(&job, &json, &eid)?;
            done.insert(eid, r);
        }
        let remaining: Vec<pb::EpisodeSpec> = specs.iter().filter(|s| !done.contains_key(&s.episode_id)).cloned().collect();
        let rollout_started = Instant::now();
        jobs.set_live(&id, |s| {
            s.enter("rollout");
            s.episodes_done = done.len() as u32;
            s.episodes_total = total as u32;
        });
        jobs.emit(&id, "stage", String::new(), format!("step {step}: rollout of {total} episodes ({} already done)", done.len()));
        if !remaining.is_empty() {
            if at.iter().any(|&g| g != step) {
                return Err(CoordinatorError::Other(format!(
                    "step {step} still has episodes to run but a learner has already trained it; the job store and the learners disagree"
                )));
            }
            if target_versions.as_ref() != Some(&versions) {
                retarget(jobs, &job, &id, &load, &versions);
                target_versions = Some(versions.clone());
            }
            let (tx, mut rx) = mpsc::unbounded_channel();
            let mut outstanding = remaining.len();
            let batch = BatchSpec {
                specs: remaining,
                kind: job.settings().record_kind(),
                limits: BatchLimits::of(&job.spec.schedule),
                versions: Some(versions.clone()),
            };
            jobs.scheduler.submit(id.clone(), batch, tx);
            while outstanding > 0 {
                let delivery = tokio::select! {
                    d = rx.recv() => d,
                    _ = cancel.changed() => {
                        jobs.scheduler.cancel_job(id.clone());
                        return Err(CoordinatorError::Cancelled(id.clone()));
                    }
                };
                match delivery {
                    None => return Err(CoordinatorError::Rollout("the scheduler dropped the step's episodes".into())),
                    Some(Delivery::Done { episode_id, record, trajectory_json, worker }) => {
                        let started = Instant::now();
                        let fresh = jobs.store.record_episode(&id, step, &episode_id, &trajectory_json, &worker)?;
                        store_secs += started.elapsed().as_secs_f64();
                        if fresh && !done.contains_key(&episode_id) {
                            let tokens = record.completion_tokens();
                            done.insert(episode_id, *record);
                            outstanding -= 1;
                            jobs.set_live(&id, |s| {
                                s.episodes_done = done.len() as u32;
                                s.stage_tokens += tokens;
                            });
                            jobs.emit(&id, "episodes", String::new(), String::new());
                        }
                    }
                    Some(Delivery::Failed { episode_id, error }) => return Err(CoordinatorError::Rollout(format!("episode {episode_id}: {error}"))),
                    Some(Delivery::Stalled { reason }) => return Err(CoordinatorError::Rollout(reason)),
                }
            }
        }
        let rollout_secs = rollout_started.elapsed().as_secs_f64();
        if cancelled(&cancel) {
            return Err(CoordinatorError::Cancelled(id.clone()));
        }

        // 2. Experience making, in the specs' order so every run builds the same batches.
        let exp_started = Instant::now();
        jobs.set_live(&id, |s| s.enter("experience"));
        let finished = in_spec_order(&specs, done)?;
        if job.spec.output.save_episodes {
            save_episodes(&job, step, &finished)?;
        }
        let batch = make_batch(job.settings(), finished, &questions, l as u32, &versions, true)?;
        let experience_secs = exp_started.elapsed().as_secs_f64();

        // 3. Training: every learner in parallel on its own agent's turns.
        let train_started = Instant::now();
        let samples: Vec<u32> = batch.per_agent.iter().map(|e| e.len() as u32).collect();
        jobs.set_live(&id, |s| {
            s.enter("train");
            s.train_samples_total = samples.iter().sum();
        });
        jobs.emit(&id, "stage", String::new(), format!("step {step}: training {l} agents"));
        let checkpoint = (step + 1) % job.spec.schedule.checkpoint_every == 0 || step + 1 == job.total_steps;
        let step_id = format!("{id}/{step}");
        let tally = Arc::new(std::sync::Mutex::new(vec![TrainTally::default(); l]));
        // A JoinSet aborts the poller when dropped, so it also stops when the stage fails or the
        // job is cancelled, not only when training finishes.
        let mut follower = tokio::task::JoinSet::new();
        follower.spawn(follow_training(
            Arc::clone(jobs),
            id.clone(),
            links.iter().map(|k| (k.agent, k.address.clone())).collect(),
            step + 1,
            samples.clone(),
            Arc::clone(&tally),
        ));
        let mut tasks = tokio::task::JoinSet::new();
        for (k, (mut link, exps)) in links.drain(..).zip(batch.per_agent).enumerate() {
            let (step_id, at_k, job) = (step_id.clone(), at[k], Arc::clone(&job));
            tasks.spawn(async move {
                let out = train_learner(&mut link, &job, &step_id, &exps, step, checkpoint, at_k).await;
                (k, link, out)
            });
        }
        let mut reports: Vec<Option<pb::TrainReport>> = vec![None; l];
        let mut new_versions = vec![0u64; l];
        let mut published_bytes = vec![0u64; l];
        let mut slots: Vec<Option<LearnerLink>> = (0..l).map(|_| None).collect();
        let mut first_err = None;
        let joined = async {
            while let Some(r) = tasks.join_next().await {
                let (k, link, out) = r.map_err(|e| CoordinatorError::Other(format!("training task: {e}")))?;
                slots[k] = Some(link);
                match out {
                    Ok((report, published)) => {
                        let tokens = report.as_ref().map_or(0, |r| r.tokens);
                        reports[k] = report;
                        new_versions[k] = published.version;
                        published_bytes[k] = published.total_bytes;
                        let (done, tokens) = TrainTally::finish(&tally, k, samples[k], tokens);
                        jobs.set_live(&id, |s| {
                            s.train_samples_done = done;
                            s.stage_tokens = tokens;
                        });
                        jobs.emit(&id, "trained", String::new(), format!("agent {k} trained on {} experiences", samples[k]));
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
            _ = cancel.changed() => return Err(CoordinatorError::Cancelled(id.clone())),
        }
        drop(follower);
        links = slots.into_iter().map(|s| s.expect("every task returned its link")).collect();
        if let Some(e) = first_err {
            return Err(e);
        }
        for (k, v) in new_versions.iter().enumerate() {
            if *v != step + 1 {
                return Err(CoordinatorError::Learner {
                    agent: k as u32,
                    address: links[k].address.clone(),
                    message: format!("published version {v} after step {step}; expected {}", step + 1),
                });
            }
        }
        let train_secs = train_started.elapsed().as_secs_f64();

        // 4. Broadcast: every worker pulls the new versions before the next rollout.
        let broadcast_started = Instant::now();
        let mut sync = crate::scheduler::SyncStats::default();
        jobs.set_live(&id, |s| s.enter("broadcast"));
        if step + 1 < job.total_steps {
            let generation = retarget(jobs, &job, &id, &load, &new_versions);
            target_versions = Some(new_versions.clone());
            let targets = (0..l).map(|k| broadcast::Target { agent: k as u32, version: new_versions[k], bytes: published_bytes[k] }).collect();
            let mut follower = tokio::task::JoinSet::new();
            follower.spawn(broadcast::follow(Arc::clone(jobs), id.clone(), targets));
            tokio::select! {
                r = jobs.scheduler.wait_prepared(generation) => sync = r.map_err(CoordinatorError::Rollout)?,
                _ = cancel.changed() => return Err(CoordinatorError::Cancelled(id.clone())),
            }
            drop(follower);
        }
        let broadcast_secs = broadcast_started.elapsed().as_secs_f64();

        // 5. Commit the step and its metrics.
        let commit_started = Instant::now();
        let mut metrics = batch.metrics;
        let tokens = metrics.get("generated_tokens").and_then(Value::as_u64).unwrap_or(0);
        let coordinator_secs = experience_secs + store_secs + (jobs.metrics.scheduler_seconds.get() - sched_before);
        if let Some(m) = metrics.as_object_mut() {
            m.insert("kind".into(), json!("step"));
            m.insert("job_id".into(), json!(id));
            m.insert("step".into(), json!(step));
            m.insert("unix_time".into(), json!(now()));
            m.insert("tokens_per_s".into(), json!(if rollout_secs > 0.0 { tokens as f64 / rollout_secs } else { 0.0 }));
            if let Some(agents) = m.get_mut("agents").and_then(Value::as_array_mut) {
                for (k, a) in agents.iter_mut().enumerate() {
                    let train = reports[k].as_ref().map(|r| serde_json::from_str::<Value>(&r.json).unwrap_or(Value::Null)).unwrap_or(Value::Null);
                    if let Some(o) = a.as_object_mut() {
                        let s = sync.per_agent.get(&(k as u32)).copied().unwrap_or_default();
                        // Bytes pulled by all workers, those the learner sent, the slowest worker's seconds.
                        o.insert("weight_sync".into(), json!({"bytes": s.bytes, "learner_bytes": s.learner_bytes, "seconds": s.seconds}));
                        o.insert("version".into(), json!(new_versions[k]));
                        o.insert("train".into(), train);
                    }
                }
            }
            m.insert(
                "seconds".into(),
                json!({
                    "rollout": rollout_secs, "experience": experience_secs, "train": train_secs, "broadcast": broadcast_secs,
                    "coordinator": coordinator_secs + commit_started.elapsed().as_secs_f64(),
                    "total": step_started.elapsed().as_secs_f64(),
                }),
            );
        }
        let line = serde_json::to_string(&metrics).unwrap_or_default();
        let versions_now: Vec<(u32, u64)> = new_versions.iter().enumerate().map(|(k, v)| (k as u32, *v)).collect();
        jobs.store.commit_step(&id, step, &line, &versions_now)?;
        refresh_metrics_log(jobs, &id, &metrics_path)?;
        jobs.metrics.steps_completed.inc();
        tracing::info!(job = %id, step, rollout_secs, train_secs, broadcast_secs, coordinator_secs, "step committed");
        jobs.emit(&id, "step", line, format!("step {step} done"));
        step += 1;
    }

    if job.spec.output.export {
        jobs.set_live(&id, |s| s.enter("export"));
        for (k, link) in links.iter_mut().enumerate() {
            let dir = job.spec.output.dir.join(format!("agent-{k}"));
            link.export(&dir.display().to_string()).await?;
        }
    }
    Ok(())
}
