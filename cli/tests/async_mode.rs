//! Asynchronous mode end to end: the next steps' rollouts beside training, bounded policy lag,
//! and kills of a worker, the coordinator and a learner in the middle of an async job.
mod harness;

use harness::*;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// Async mode with a lag bound of 2: steps s + 1 and s + 2's episodes run while the learners
/// train step s, and the new weights swap in between turns. Every trained turn is at most two
/// versions behind its learner (the bound), each step accounts for every turn it produced
/// (trained + dropped, none dropped here), some turns were sampled two versions before the
/// weights of their step, and a worker killed while rollouts run beside training loses and
/// doubles nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_job_trains_turns_at_most_two_versions_behind_and_a_killed_worker_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = async_cluster(dir.path(), 48, "max_policy_lag = 2\n");
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's training", |s| s.steps_done == 1 && s.stage == "train").await;
    c.workers[1].sigkill();
    let st = c.finished(&id).await;
    assert_eq!(st.steps_done, ASYNC_STEPS);
    check_async_run(&c, ASYNC_STEPS, 2).await;
    assert_eq!(
        c.prometheus("comas_coordinator_episodes_completed_total"),
        (ASYNC_STEPS * EPISODES) as f64
    );
}

/// An async job whose coordinator is killed while step 2's rollout runs beside step 1's
/// training resumes with the episodes it stored: every step accounts for exactly its turns,
/// within the lag bound, and no finished episode runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_async_coordinator_resumes_its_rollout_ahead() {
    let dir = tempfile::tempdir().unwrap();
    // The default lag bound (1).
    let mut c = async_cluster(dir.path(), 24, "");
    let id = c.submit().await;
    // Step 2's rollout runs beside step 1's training and broadcast (the stage shown is theirs).
    c.on_event(&id, 120, "step 2's first episodes", |s| {
        s.steps_done == 1 && s.stage != "rollout" && s.episodes_done >= 1
    })
    .await;
    c.coordinator.as_mut().unwrap().sigkill();
    assert_eq!(c.metrics_log().len(), 1, "step 0 was committed before the kill");
    c.start_coordinator();
    c.finished(&id).await;
    check_async_run(&c, ASYNC_STEPS, 1).await;
    // The new coordinator ran only what was missing: steps 0 and 1 and some of step 2 were in.
    let ran = c.prometheus("comas_coordinator_episodes_completed_total");
    assert!(
        ran <= (2 * EPISODES - 1) as f64,
        "the restarted coordinator re-ran finished episodes: {ran}"
    );
}

/// An async job whose learner is SIGKILLed during step 1's training (step 2's rollout beside
/// it) and restarted from its checkpoint trains every step once: the coordinator finds the
/// learner again, and every turn is accounted for within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_job_resumes_with_a_killed_learner() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = async_cluster(dir.path(), 24, "");
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's training", |s| s.steps_done == 1 && s.stage == "train").await;
    c.learners[1].as_mut().unwrap().sigkill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.start_learner(1);
    let st = c.finished(&id).await;
    assert_eq!(st.steps_done, ASYNC_STEPS);
    check_async_run(&c, ASYNC_STEPS, 1).await;
    assert_eq!(
        c.prometheus("comas_coordinator_episodes_completed_total"),
        (ASYNC_STEPS * EPISODES) as f64
    );
}

const ASYNC_STEPS: u64 = 4;

/// Two tiny agents and two workers on an async job of `ASYNC_STEPS` steps with `tokens`-token
/// turns and `more` added to its `[schedule]`.
fn async_cluster(dir: &Path, tokens: u32, more: &str) -> Cluster {
    let ports = vec![free_port(), free_port()];
    write_job_of(dir, &ports, tokens, false, ASYNC_STEPS);
    let job = std::fs::read_to_string(dir.join("job.toml")).unwrap();
    std::fs::write(
        dir.join("job.toml"),
        job.replace("[schedule]\n", &format!("[schedule]\nsync = \"async\"\n{more}")),
    )
    .unwrap();
    Cluster::launch(dir, ports, 2, &[], ASYNC_STEPS, &["--max-episodes", "3"])
}

/// Checks an async run's metrics log: each step once, its turns all accounted for (produced =
/// trained, none dropped), each at most `bound` versions behind its learner (and no further
/// behind than version 0), some of them exactly `bound` behind (the rollouts ran that far
/// ahead of training), and every learner at the last version.
async fn check_async_run(c: &Cluster, steps: u64, bound: u64) {
    let log = c.metrics_log();
    let logged: Vec<u64> = log.iter().map(|m| m["step"].as_u64().unwrap()).collect();
    assert_eq!(logged, (0..steps).collect::<Vec<_>>(), "each step logged exactly once");
    let mut at_bound = 0;
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        assert_eq!(m["episodes"], EPISODES, "step {step}");
        assert!(
            m["idle_seconds"]["workers"].is_number() && m["idle_seconds"]["learners"].is_number(),
            "{m}"
        );
        assert_eq!(m["policy_lag"]["bound"], bound);
        for k in 0..2 {
            let lag = &m["policy_lag"]["agents"][k];
            assert_eq!(
                (lag["produced"].as_u64(), lag["trained"].as_u64(), lag["dropped"].as_u64()),
                (Some(SAMPLES_PER_AGENT), Some(SAMPLES_PER_AGENT), Some(0)),
                "step {step} agent {k}: {lag}"
            );
            let hist = lag["lag"].as_object().unwrap();
            let most = step.min(bound);
            assert!(
                hist.keys().all(|l| l.parse::<u64>().unwrap() <= most),
                "step {step} agent {k}: lags {hist:?} past {most}"
            );
            assert_eq!(hist.values().map(|v| v.as_u64().unwrap()).sum::<u64>(), SAMPLES_PER_AGENT);
            at_bound += hist.get(&bound.to_string()).and_then(Value::as_u64).unwrap_or(0);
            let a = &m["agents"][k];
            assert_eq!(a["train"]["samples"], SAMPLES_PER_AGENT, "step {step} agent {k}");
            assert_eq!(a["version"], step + 1);
            let versions: Vec<u64> = a["policy_versions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert!(
                versions.iter().all(|&v| v + bound >= step && v <= step),
                "step {step} agent {k}: versions {versions:?}"
            );
        }
    }
    assert!(at_bound > 0, "no turn was sampled {bound} versions before its step's weights: the rollouts did not run that far ahead");
    for k in 0..2 {
        let info = c.learner_info(k).await;
        assert_eq!((info.global_step, info.latest_version), (steps, steps));
    }
}
