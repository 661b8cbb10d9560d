//! The coordinator's side of a learner's training step: the check before a job uses it, one
//! step trained exactly once across learner restarts, and the progress poll while it runs.
use crate::error::{CoordinatorError, Result};
use crate::learners::{LearnerLink, TRAIN_PROGRESS_EVERY};
use crate::progress::{Reporter, Update};
use comas_proto::v1 as pb;
use comas_workflow::job::Job;
use comas_workflow::moments::Moments;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Checks a learner before the job uses it: right agent, the job's settings, a step that fits.
pub(crate) async fn check_learner(link: &mut LearnerLink, job: &Job, step: u64) -> Result<u64> {
    let info = link.info().await?;
    let k = link.agent as usize;
    let bad = |m: String| CoordinatorError::Learner {
        agent: link.agent,
        address: link.address.clone(),
        message: m,
    };
    if info.agent_id != link.agent {
        return Err(bad(format!(
            "it serves agent {}, not agent {}; check agents[{k}].learner",
            info.agent_id, link.agent
        )));
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
                    .map(|(key, v)| {
                        format!(
                            "{key}: job {v}, learner {}",
                            theirs.get(key.as_str()).unwrap_or(&Value::Null)
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        return Err(bad(format!(
            "its training settings differ from agents[{k}].train ({}); start it with this job file",
            diff.join(", ")
        )));
    }
    if info.global_step < step {
        return Err(CoordinatorError::LearnerBehind {
            agent: link.agent,
            address: link.address.clone(),
            at: info.global_step,
            step,
        });
    }
    if info.global_step > step + 1 {
        return Err(bad(format!(
            "it is at training step {}, ahead of the job's {step} completed steps: it holds another job's checkpoints, or this job's store was reset; give it this job's checkpoint folder",
            info.global_step
        )));
    }
    Ok(info.global_step)
}

/// How often one learner may move to another step (restart) during one step's training before
/// the job fails.
pub(crate) const MAX_LEARNER_MOVES: u32 = 5;

/// What a learner is asked for in a step.
enum StepCall<'a> {
    /// The moments of its returns (the first half of a step whitened over all agents).
    Moments,
    /// Train (with `pooled` moments, if any), checkpoint if due, publish.
    Train { pooled: &'a [pb::GroupMoments], checkpoint: bool },
}

enum StepAnswer {
    Moments(Vec<pb::GroupMoments>),
    Trained(Box<(Option<pb::TrainReport>, pb::WeightsPublished)>),
}

/// One try of `call` on a learner at training step `at` (`step`, or `step + 1` when it has
/// trained the step already).
async fn attempt(
    link: &mut LearnerLink,
    call: &StepCall<'_>,
    step_id: &str,
    exps: &[pb::Experience],
    step: u64,
    at: u64,
    job: &Job,
) -> Result<StepAnswer> {
    // Synchronous: every turn was sampled by the weights being trained. Async: turns come
    // from versions up to the lag bound behind (the coordinator dropped older ones).
    let version = (job.spec.schedule.policy_lag() == 0).then_some(step);
    match call {
        StepCall::Moments if at != step + 1 => Ok(StepAnswer::Moments(link.moments(step_id, exps, version, Some(step)).await?)),
        // A learner that trained the step kept its moments in the step's report.
        StepCall::Moments => match link.report(step_id).await? {
            Some(r) => Ok(StepAnswer::Moments(r.return_moments)),
            None => Err(CoordinatorError::Learner {
                agent: link.agent,
                address: link.address.clone(),
                message: format!(
                    "it trained step {step} already but keeps no report of it, so its return moments are lost and the other agents cannot be whitened with them; resume the job with every learner restarted from the checkpoint of step {step}"
                ),
            }),
        },
        StepCall::Train { pooled, checkpoint } => {
            // A step this learner already trained is not trained again; its report comes from
            // the learner's memory (kept in its checkpoints) if it still has it.
            let report = if at == step + 1 { link.report(step_id).await? } else { Some(link.train(step_id, exps, version, Some(step), pooled).await?) };
            if *checkpoint {
                link.save(Some(step + 1)).await?;
            }
            Ok(StepAnswer::Trained(Box::new((report, link.publish(Some(step + 1)).await?))))
        }
    }
}

/// Runs `call` on a learner thought to be at training step `at`; when the learner has moved
/// to another step (restarted from an older or a newer checkpoint) it is checked again and the
/// call planned again for the step it is at.
async fn despite_moves(
    link: &mut LearnerLink,
    job: &Job,
    call: StepCall<'_>,
    step_id: &str,
    exps: &[pb::Experience],
    step: u64,
    mut at: u64,
) -> Result<StepAnswer> {
    let mut moves = 0;
    loop {
        match attempt(link, &call, step_id, exps, step, at, job).await {
            Err(CoordinatorError::LearnerMoved { message, .. }) if moves < MAX_LEARNER_MOVES => {
                moves += 1;
                tracing::warn!(agent = link.agent, step, "{message}; checking the learner again");
                at = check_learner(link, job, step).await?;
            }
            other => return other,
        }
    }
}

/// Trains one learner on its turns of `step`, saves a checkpoint if due, and publishes version
/// `step + 1`. Every call names the learner step it expects, so a learner that restarts in
/// between (from an older or a newer checkpoint) is checked again and the rest planned again:
/// a step is never trained twice, and the version published is always the step's. Norm groups
/// in `pooled` are whitened with those moments (pooled over every learner's `learner_moments`).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn train_learner(
    link: &mut LearnerLink,
    job: &Job,
    step_id: &str,
    exps: &[pb::Experience],
    step: u64,
    checkpoint: bool,
    at: u64,
    pooled: &[pb::GroupMoments],
) -> Result<(Option<pb::TrainReport>, pb::WeightsPublished)> {
    match despite_moves(link, job, StepCall::Train { pooled, checkpoint }, step_id, exps, step, at)
        .await?
    {
        StepAnswer::Trained(done) => Ok(*done),
        StepAnswer::Moments(_) => unreachable!("a Train call answers with a report"),
    }
}

/// The moments of one learner's returns for `step`, per norm group: computed by a learner at
/// the step (which keeps its log-probs for the Train that follows), or taken from the report of
/// one that trained the step already.
pub(crate) async fn learner_moments(
    link: &mut LearnerLink,
    job: &Job,
    step_id: &str,
    exps: &[pb::Experience],
    step: u64,
    at: u64,
) -> Result<Vec<pb::GroupMoments>> {
    match despite_moves(link, job, StepCall::Moments, step_id, exps, step, at).await? {
        StepAnswer::Moments(m) => Ok(m),
        StepAnswer::Trained(..) => unreachable!("a moments call answers with moments"),
    }
}

/// Moments pooled per norm group over every learner's.
pub(crate) fn pool_moments(parts: &[Vec<pb::GroupMoments>]) -> Vec<pb::GroupMoments> {
    let mut pooled: std::collections::BTreeMap<&str, Moments> = Default::default();
    for g in parts.iter().flatten() {
        let m = pooled.entry(g.norm_group.as_str()).or_default();
        *m = m.merge(Moments { count: g.count, mean: g.mean, m2: g.m2 });
    }
    pooled
        .into_iter()
        .map(|(g, m)| pb::GroupMoments {
            norm_group: g.to_string(),
            count: m.count,
            mean: m.mean,
            m2: m.m2,
        })
        .collect()
}

/// One learner's share of the training stage, as far as the coordinator knows it.
#[derive(Clone, Copy, Default)]
pub(crate) struct TrainTally {
    samples: u32,
    tokens: u64,
    finished: bool,
}

impl TrainTally {
    fn sums(t: &[TrainTally]) -> (u32, u64) {
        (t.iter().map(|x| x.samples).sum(), t.iter().map(|x| x.tokens).sum())
    }

    /// Learner `k` has finished with `samples` experiences and `tokens` tokens; the new sums.
    pub(crate) fn finish(
        tally: &std::sync::Mutex<Vec<TrainTally>>,
        k: usize,
        samples: u32,
        tokens: u64,
    ) -> (u32, u64) {
        let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
        t[k] = TrainTally { samples, tokens, finished: true };
        Self::sums(&t)
    }
}

/// Polls every learner's progress about once a second while the training stage runs, into the
/// job's live status, so a watcher sees experiences and tokens/s inside a long step. Runs until
/// aborted; a learner that does not answer is asked again next time.
pub(crate) async fn follow_training(
    report: Reporter,
    learners: Vec<(u32, String)>,
    global_step: u64,
    samples: Vec<u32>,
    tally: Arc<std::sync::Mutex<Vec<TrainTally>>>,
) {
    let mut links: Vec<LearnerLink> =
        learners.iter().map(|(k, a)| LearnerLink::new(*k, a, Duration::from_secs(2))).collect();
    loop {
        tokio::time::sleep(TRAIN_PROGRESS_EVERY).await;
        let mut changed = false;
        for (k, link) in links.iter_mut().enumerate() {
            let Some(p) = link.train_progress().await else { continue };
            if !p.training || p.global_step != global_step || p.samples_total == 0 {
                continue;
            }
            // The learner counts samples x epochs; show them as a share of this agent's samples.
            let done = (u64::from(p.samples_done) * u64::from(samples[k])
                / u64::from(p.samples_total)) as u32;
            let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
            if !t[k].finished && (t[k].samples, t[k].tokens) != (done, p.tokens_done) {
                t[k] = TrainTally { samples: done, tokens: p.tokens_done, finished: false };
                changed = true;
            }
        }
        if changed {
            let (done, tokens) = TrainTally::sums(&tally.lock().unwrap_or_else(|e| e.into_inner()));
            report.live(Update::Trained { done, tokens });
            report.event("trained", String::new(), String::new());
        }
    }
}
