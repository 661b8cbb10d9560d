//! Held-out evaluation of a job: the method's game on the evaluation shard with the current
//! weights, sampled (and greedy with `[eval] greedy`), its figures recorded as an `EvalLog`.
use crate::episodes::{episode_specs, in_spec_order, make_batch, EVAL_SHARD};
use crate::error::{CoordinatorError, Result};
use crate::progress::{RunContext, Update};
use crate::scheduler::{BatchLimits, BatchSpec, Delivery};
use crate::store::now;
use comas_workflow::job::Job;
use comas_workflow::program::{MethodConfig, Record};
use comas_workflow::seed::PlanSeed;
use comas_workflow::step_log::{EvalLog, EvalSeconds, Record as LogRecord};
use comas_workflow::task::TaskRecord;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Instant;
use tokio::sync::{mpsc, watch};

/// Plays the job's method on the held-out tasks with the current weights; nothing is trained.
/// The record (the method's figures; with `greedy`, the same for a greedy game under `greedy`)
/// goes into the store; it is returned for the metrics log.
pub(super) async fn evaluate(
    ctx: &RunContext,
    job: &Job,
    id: &str,
    after: u64,
    questions: &[TaskRecord],
    cancel: &mut watch::Receiver<bool>,
) -> Result<String> {
    let started = Instant::now();
    let spec = job
        .spec
        .eval
        .as_ref()
        .ok_or_else(|| CoordinatorError::Other("no [eval] settings".into()))?;
    let m = play_eval(
        ctx,
        job,
        id,
        after,
        questions,
        &job.eval_method_at(spec.temperature),
        "eval",
        cancel,
    )
    .await?;
    let greedy = match spec.greedy {
        true => Some(
            play_eval(
                ctx,
                job,
                id,
                after,
                questions,
                &job.eval_method_at(0.0),
                "eval-greedy",
                cancel,
            )
            .await?,
        ),
        false => None,
    };
    let accuracy = comas_workflow::registry::summary(&m).and_then(|s| s.accuracy);
    let mut log = EvalLog::new(id, after, spec.temperature, m, greedy);
    log.unix_time = now();
    log.seconds = EvalSeconds { total: started.elapsed().as_secs_f64() };
    let line = LogRecord::Eval(log).line();
    ctx.store.record_eval(id, after, &line)?;
    tracing::info!(job = %id, after, ?accuracy, "evaluation recorded");
    ctx.report.event("eval", line.clone(), format!("evaluation after {after} steps"));
    Ok(line)
}

/// One evaluation game over every held-out task with `method`; returns its metrics. `tag`
/// keeps the episode ids of different games apart.
#[allow(clippy::too_many_arguments)]
async fn play_eval(
    ctx: &RunContext,
    job: &Job,
    id: &str,
    after: u64,
    questions: &[TaskRecord],
    method: &MethodConfig,
    tag: &str,
    cancel: &mut watch::Receiver<bool>,
) -> Result<Value> {
    // Generated tasks: the evaluation shard's first `max_questions`.
    let chosen: Vec<usize> = (0..job.eval_tasks(questions.len())).collect();
    let seed = PlanSeed { global: job.spec.seed, step: after, shard: EVAL_SHARD };
    let specs = episode_specs(method, &chosen, questions, seed, |i| {
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("{id}/{tag}/{after}/{i}").as_bytes())
            .to_string()
    })?;
    let total = specs.len();
    ctx.report.live(Update::Enter("eval"));
    ctx.report.live(Update::EpisodesPlanned { done: 0, total: total as u32 });
    ctx.report.event(
        "stage",
        String::new(),
        format!("evaluation after {after} steps ({tag}): {total} episodes"),
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    let batch = BatchSpec {
        tag: format!("eval-{tag}-{after}"),
        // Ahead of an async job's later steps: the loop waits for it.
        first: true,
        specs: specs.clone(),
        method: method.clone(),
        limits: BatchLimits::of(&job.spec.schedule),
        versions: Some(vec![after; job.spec.agents.len()]),
    };
    ctx.scheduler.submit(id.to_string(), batch, tx);
    let mut done: HashMap<String, Record> = HashMap::new();
    while done.len() < total {
        let delivery = tokio::select! {
            d = rx.recv() => d,
            _ = cancel.changed() => return Err(CoordinatorError::Cancelled(id.to_string())),
        };
        match delivery {
            None => {
                return Err(CoordinatorError::Rollout(
                    "the scheduler dropped the evaluation's episodes".into(),
                ))
            }
            Some(Delivery::Done { episode_id, record, .. }) => {
                let tokens = record.completion_tokens();
                done.insert(episode_id, *record);
                ctx.report.live(Update::EpisodeDone { done: done.len() as u32, tokens });
                ctx.report.event("episodes", String::new(), String::new());
            }
            Some(Delivery::Failed { episode_id, error }) => {
                return Err(CoordinatorError::Rollout(format!(
                    "evaluation episode {episode_id}: {error}"
                )))
            }
            Some(Delivery::Stalled { reason }) => return Err(CoordinatorError::Rollout(reason)),
        }
    }
    let finished = in_spec_order(&specs, done)?;
    Ok(make_batch(
        method,
        finished,
        questions,
        job.spec.agents.len() as u32,
        Some(&vec![after; job.spec.agents.len()]),
        None,
    )?
    .metrics)
}
