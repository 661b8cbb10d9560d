//! End to end, with real processes on loopback: a coordinator, one learner per agent and rollout
//! workers, each a `comas` child process, running a 2-agent CoMAS job on tiny models. Faults are
//! real too: SIGKILL of a worker, of the coordinator and of a learner in the middle of a job, a
//! hung learner, stale trajectories, a slow late joiner, random kills of every service.
mod harness;

use comas_proto::v1 as pb;
use comas_proto::v1::learner_client::LearnerClient;
use harness::*;
use serde_json::Value;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_two_workers_three_steps() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::with_flags(dir.path(), 2, 8, &[], true);
    let id = c.submit().await;
    let st = c.finished(&id).await;
    assert_eq!((st.steps_done, st.total_steps), (STEPS, STEPS));
    // Held-out evaluation before training, every 2 steps and at the end, on 2 questions each,
    // in the order it happened.
    let kinds: Vec<String> = std::fs::read_to_string(dir.path().join("out/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let m: Value = serde_json::from_str(l).unwrap();
            format!("{}{}", m["kind"].as_str().unwrap(), m["step"])
        })
        .collect();
    assert_eq!(kinds, ["eval0", "step0", "step1", "eval2", "step2", "eval3"]);
    for e in c.log_of("eval") {
        assert_eq!(
            (e["episodes"].as_u64(), e["turns"]["solver"].as_u64()),
            (Some(2), Some(8)),
            "{e}"
        );
        assert!(e["accuracy"]["last_round"].is_number());
        // Evaluation used the weights of the steps completed so far.
        assert_eq!(e["agents"][1]["policy_versions"], serde_json::json!([e["after_steps"]]));
    }
    assert_eq!(st.agents.iter().map(|a| a.version).collect::<Vec<_>>(), vec![STEPS, STEPS]);
    c.check_complete_run().await;
    assert_eq!(
        c.prometheus("comas_coordinator_episodes_completed_total"),
        (STEPS * EPISODES + 3 * 2) as f64
    );
    assert_eq!(c.prometheus("comas_coordinator_steps_completed_total"), STEPS as f64);
    assert_eq!(c.prometheus("comas_coordinator_pending_episodes"), 0.0);
    assert_eq!(c.prometheus("comas_coordinator_workers"), 2.0);
    // After every step but the last, both workers pulled each agent's full f32 weights once,
    // the second from the first (a relay chain): the learner sent them once.
    for m in c.metrics_log() {
        let last = m["step"].as_u64().unwrap() + 1 == STEPS;
        for k in 0..2 {
            let params = c.learner_info(k).await.trainable_parameters;
            let sync = &m["agents"][k]["weight_sync"];
            let want = if last { (0, 0) } else { (2 * 4 * params, 4 * params) };
            assert_eq!(
                (sync["bytes"].as_u64().unwrap(), sync["learner_bytes"].as_u64().unwrap()),
                want,
                "step {} agent {k}",
                m["step"]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_step_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Long turns, so the kill lands while the step's episodes are running.
    let mut c = Cluster::new(dir.path(), 2, 48);
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's rollout", |s| {
        s.steps_done == 1 && s.stage == "rollout" && s.episodes_total > 0
    })
    .await;
    let victim = &mut c.workers[1];
    eprintln!("killing {}", victim.name);
    victim.sigkill();
    c.finished(&id).await;
    c.check_complete_run().await;
    assert!(
        c.prometheus("comas_coordinator_requeued_episodes_total") >= 1.0,
        "the dead worker's leases were re-queued"
    );
    assert_eq!(
        c.prometheus("comas_coordinator_episodes_completed_total"),
        (STEPS * EPISODES) as f64
    );
    assert_eq!(c.prometheus("comas_coordinator_workers"), 1.0);
}

/// Episodes that outlive the lease timeout get a second copy on the other worker; only the
/// first result of each episode counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_leases_are_copied_and_only_one_result_counts() {
    let dir = tempfile::tempdir().unwrap();
    // Each result comes 1.5 s late, past the 1 s lease timeout on any hardware.
    let mut c = Cluster::with_flags(dir.path(), 0, 24, &["--episode-timeout-secs", "1"], false);
    for _ in 0..2 {
        c.add_worker_with(&[("COMAS_WORKER_FAULT", "slow-result:1500")]);
    }
    let id = c.submit().await;
    c.finished(&id).await;
    c.check_complete_run().await;
    assert!(
        c.prometheus("comas_coordinator_requeued_episodes_total") >= 1.0,
        "late leases were copied"
    );
    assert!(
        c.prometheus("comas_coordinator_duplicate_results_total") >= 1.0,
        "a second result of an episode was ignored"
    );
    assert_eq!(
        c.prometheus("comas_coordinator_episodes_completed_total"),
        (STEPS * EPISODES) as f64
    );
}

/// Nothing decodes for an episode that no longer counts. A job cancelled while a slow worker
/// runs its episodes stops them there at once; resumed, the same slow worker's episodes outlive
/// the lease timeout, copies run on the other worker, and each copy that loses is cancelled
/// where it runs. Its sequences leave the batch between two decode steps: no token is made for
/// a stopped episode (`tokens_after_stop_total` stays 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_and_a_straggler_copy_stop_decoding_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::with_flags(dir.path(), 0, 24, &["--episode-timeout-secs", "3"], false);
    // Each decode step 100 ms late: a turn of 24 tokens takes 2.4 s, an episode (six turns in a
    // row) at least 14 s, far past the 3 s lease timeout.
    let slow = c.add_worker_with_metrics(&[("COMAS_WORKER_FAULT", "slow-decode:100")]);
    let fast = c.add_worker_with_metrics(&[]);
    let worker = |at: &(String, u16), name: &str| scrape(at, &format!("comas_worker_{name}"));
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's rollout", |s| s.steps_done == 1 && s.stage == "rollout").await;
    let started = Instant::now();
    while worker(&slow, "running_episodes") < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(60), "no episode ran on the slow worker");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.client().await.cancel_job(pb::CancelJobRequest { job_id: id.clone() }).await.unwrap();
    c.wait_for(&id, 60, "the cancel", |s| s.state == pb::JobState::Cancelled as i32).await;
    while worker(&slow, "running_episodes") + worker(&fast, "running_episodes") > 0.0 {
        assert!(started.elapsed() < Duration::from_secs(60), "the cancelled episodes ran on");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped_by_cancel = worker(&slow, "episodes_cancelled_total");
    assert!(stopped_by_cancel >= 1.0, "the slow worker's episodes of the job were stopped");

    c.resume_to_exact_end(&id).await;
    let cancelled = |at| worker(at, "episodes_cancelled_total");
    assert!(cancelled(&slow) > stopped_by_cancel, "the straggler's copies were stopped");
    assert!(c.prometheus("comas_coordinator_requeued_episodes_total") >= 1.0, "copies were leased");
    // Each stop the workers made is one the coordinator asked for and heard back about. The
    // answer to the last cancels may still be on its way when the job ends (a worker counts a
    // stop before it answers): the two counts must meet within a few seconds. (A cancel that
    // overtakes its lease is answered "unknown" and the episode refused when it arrives: that
    // is counted apart, as `episodes_cancelled_before_start_total`.)
    let heard = || c.prometheus("comas_coordinator_cancels_stopped_total");
    let waited = Instant::now();
    while heard() != cancelled(&slow) + cancelled(&fast) {
        assert!(
            waited.elapsed() < Duration::from_secs(15),
            "the coordinator heard of {} stops, the workers made {} + {}",
            heard(),
            cancelled(&slow),
            cancelled(&fast)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        c.prometheus("comas_coordinator_cancelled_leases_total")
            >= cancelled(&slow) + cancelled(&fast)
    );
    for at in [&slow, &fast] {
        assert_eq!(worker(at, "tokens_after_stop_total"), 0.0, "a token made after a stop");
    }
    // What the stopped episodes had made before: spent for nothing, but not more.
    assert!(c.prometheus("comas_coordinator_cancelled_tokens_total") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinator_resumes_from_its_last_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 2, 24);
    let id = c.submit().await;
    // Kill it inside step 1's rollout, after some of its episodes came back.
    c.on_event(&id, 120, "step 1's first episodes", |s| {
        s.steps_done == 1 && s.stage == "rollout" && s.episodes_done >= 1
    })
    .await;
    c.coordinator.as_mut().unwrap().sigkill();
    let committed = c.metrics_log().len();
    assert_eq!(committed, 1, "step 0 was committed before the kill");
    c.start_coordinator();
    c.finished(&id).await;
    c.check_complete_run().await;
    // The new coordinator ran only what was missing: not step 0, nor step 1's stored episodes.
    let ran = c.prometheus("comas_coordinator_episodes_completed_total");
    assert!(
        ran <= (2 * EPISODES - 1) as f64,
        "the restarted coordinator re-ran finished episodes: {ran}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_learner_restarts_from_its_checkpoint_and_the_job_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1, 24);
    let id = c.submit().await;
    // During step 1's rollout: step 2 then starts by checking the resumed learner.
    c.on_event(&id, 120, "step 1's rollout", |s| s.steps_done == 1 && s.stage == "rollout").await;
    c.learners[1].as_mut().unwrap().sigkill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.start_learner(1);
    c.finished(&id).await;
    c.check_complete_run().await;
}

/// With a checkpoint every 3 steps, a learner killed in step 4's rollout restarts from its
/// checkpoint of step 3 while the other trains step 4. The job goes back to step 3 (the other
/// learner loads its own checkpoint of step 3, the one it keeps), runs step 3 again, and ends
/// with each step logged once, exact counts, and the final weights of an undisturbed run of the
/// same job. (Before, the job failed: the learner was behind.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_back_at_an_older_checkpoint_rolls_the_job_back_and_changes_nothing() {
    const STEPS: u64 = 7;
    // One episode per worker at a time, so that no batch differs between the runs.
    let flags = ["--max-episodes", "1"];
    let every_third = |dir: &std::path::Path| {
        let job = std::fs::read_to_string(dir.join("job.toml")).unwrap();
        let job = job.replace("[schedule]\n", "[schedule]\ncheckpoint_every = 3\n");
        std::fs::write(dir.join("job.toml"), job).unwrap();
    };
    let calm_dir = tempfile::tempdir().unwrap();
    let calm = Cluster::build(calm_dir.path(), 2, 24, &[], false, STEPS, &flags);
    every_third(calm_dir.path());
    let id = calm.submit().await;
    calm.finished(&id).await;
    calm.check_complete_run().await;
    drop(calm);

    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::build(dir.path(), 2, 24, &[], false, STEPS, &flags);
    every_third(dir.path());
    let id = c.submit().await;
    c.on_event(&id, 180, "step 4's rollout", |s| s.steps_done == 4 && s.stage == "rollout").await;
    c.learners[1].as_mut().unwrap().sigkill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.start_learner(1);
    c.finished(&id).await;
    c.check_complete_run().await;
    assert_eq!(c.prometheus("comas_coordinator_rollbacks_total"), 1.0);
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    assert!(
        log.contains("(agent 1's at step 3): the job goes back from step 4 to step 3"),
        "{log}"
    );
    c.assert_final_weights_equal(calm_dir.path(), &["learner-1 killed in step 4".to_string()]);
}

/// The job's own schedule times win over the coordinator's defaults: with no worker at all, a
/// job that waits 3 s for one fails after about that long, though the coordinator would wait 120.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waits_for_workers_as_long_as_its_schedule_says() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), 0, 8);
    let job = std::fs::read_to_string(dir.path().join("job.toml"))
        .unwrap()
        .replace("[schedule]\n", "[schedule]\nworker_wait_secs = 3\n");
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    let id = c.submit().await;
    let st =
        c.wait_for(&id, 90, "the job to fail", |s| s.state >= pb::JobState::Succeeded as i32).await;
    assert_eq!(st.state, pb::JobState::Failed as i32, "{}", st.error);
    assert!(
        st.error.contains("episodes waited 3s with no ready rollout worker (registered: none)"),
        "{}",
        st.error
    );
}

/// A worker that reports an episode sampled with the wrong weights does not fail the job: the
/// coordinator refuses that trajectory, counts it, runs the episode again, and the run ends
/// with the exact counts and every turn at its step's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_trajectory_is_refused_and_its_episode_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 0, 24);
    c.add_worker_with(&[("COMAS_WORKER_FAULT", "stale-version:2")]);
    c.add_worker();
    let id = c.submit().await;
    c.finished(&id).await;
    c.check_complete_run().await;
    assert_eq!(c.prometheus("comas_coordinator_malformed_trajectories_total"), 1.0);
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    // Which step the faulty worker's second episode falls in depends on how the two workers
    // shared the work: version 1000 + s against s.
    assert!(
        log.contains("malformed trajectory")
            && log.contains("was sampled with policy version 100")
            && log.contains(", but this step uses version "),
        "{log}"
    );
}

/// A learner that hangs (SIGSTOP: its port still accepts connections, nothing answers) fails the
/// job after the job's learner timeout with a message naming it, instead of a silent wait; once
/// it runs again, `comas resume` finishes the job with exact counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_learner_fails_the_job_after_its_deadline_and_the_job_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), 1, 24);
    let job = std::fs::read_to_string(dir.path().join("job.toml"))
        .unwrap()
        .replace("learner_timeout_secs = 120", "learner_timeout_secs = 20");
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's rollout", |s| s.steps_done == 1 && s.stage == "rollout").await;
    let pid = c.learners[1].as_ref().unwrap().child.id() as libc::pid_t;
    // SAFETY: kill(2) on a child this test spawned and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let stopped = Instant::now();
    let st = c
        .wait_for(&id, 180, "the job to fail", |s| s.state >= pb::JobState::Succeeded as i32)
        .await;
    assert_eq!(st.state, pb::JobState::Failed as i32, "{}", st.error);
    assert!(st.error.contains("learner of agent 1"), "{}", st.error);
    assert!(
        stopped.elapsed() < Duration::from_secs(150),
        "failed only after {:?}",
        stopped.elapsed()
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    c.resume_to_exact_end(&id).await;
}

/// A learner that answers but whose training thread is stuck (`stall-train:2`: its process
/// serves Info and TrainProgress, its second step never ends; a deadlocked thread or a hung
/// device) fails the job once its progress has not moved for the job's learner timeout, with a
/// message that names it; started again without the fault, `comas resume` finishes the job with
/// exact counts. Without a deadline on Train the job would wait forever: HTTP/2 pings are
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_alive_but_stuck_in_training_fails_the_job_and_the_job_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1, 24);
    let job = std::fs::read_to_string(dir.path().join("job.toml"))
        .unwrap()
        .replace("learner_timeout_secs = 120", "learner_timeout_secs = 20");
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    c.learners[1].as_mut().unwrap().sigkill();
    c.start_learner_with(1, &[("COMAS_LEARNER_FAULT", "stall-train:2")]);
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's training", |s| s.steps_done == 1 && s.stage == "train").await;
    let stuck = Instant::now();
    let st = c
        .wait_for(&id, 180, "the job to fail", |s| s.state >= pb::JobState::Succeeded as i32)
        .await;
    assert_eq!(st.state, pb::JobState::Failed as i32, "{}", st.error);
    assert!(
        st.error.contains("learner of agent 1") && st.error.contains("does not move"),
        "{}",
        st.error
    );
    assert!(stuck.elapsed() < Duration::from_secs(60), "failed only after {:?}", stuck.elapsed());
    // The process still answers, in its step 2 with nothing trained: the deadline, not a dead
    // connection, ended the step.
    let p = c.learner_progress(1).await;
    assert_eq!((p.global_step, p.training, p.samples_done), (2, true, 0), "{p:?}");
    c.learners[1].as_mut().unwrap().sigkill();
    c.start_learner(1);
    c.resume_to_exact_end(&id).await;
}

/// A worker that stalls in the middle of a rollout for longer than the heartbeat timeout (SIGSTOP:
/// a frozen VM, a long GC pause, a partition) is given up and its episodes re-queued; when it runs
/// again it registers anew while the episodes of its old stream may still be on its engine.
/// It must drop them and load the policies again, and the job (which has no other worker) ends
/// with exact counts. Before the fix, LoadPolicies was refused ("episodes are running"), nobody
/// asked again, and the job waited forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stalled_past_its_heartbeat_timeout_comes_back_and_the_job_ends() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), 1, 200);
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's rollout", |s| s.steps_done == 1 && s.stage == "rollout").await;
    let pid = c.workers[0].child.id() as libc::pid_t;
    // SAFETY: kill(2) on a child this test spawned and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Longer than the harness's heartbeat timeout (5 s).
    tokio::time::sleep(Duration::from_secs(8)).await;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    c.finished(&id).await;
    c.check_complete_run().await;
    // The stall was felt: the worker was given up with episodes leased, and came back.
    assert!(c.prometheus("comas_coordinator_requeued_episodes_total") > 0.0, "{}", c.logs());
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    assert!(log.contains("no heartbeat") && log.contains("worker lost"), "{log}");
}

/// A worker restarted in place (same id, same address, as a pod restarted by Kubernetes) while
/// idle is seen as new: it loads the policies again before it gets episodes, and the job ends
/// with exact counts. (Here the coordinator also sees the old connection break; the
/// registration's incarnation covers a restart it does not see.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_in_place_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 0, 24);
    let port = free_port();
    let args = s(&[
        "worker",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--coordinator",
        &format!("http://127.0.0.1:{}", c.coord_port),
        "--max-episodes",
        "3",
        "--worker-id",
        "pod-0",
    ]);
    c.workers.push(spawn(dir.path(), "worker-first", &args));
    let id = c.submit().await;
    // Step 0's training: the worker holds no episode, so only its registration can tell.
    c.on_event(&id, 120, "step 0's training", |s| s.steps_done == 0 && s.stage == "train").await;
    c.workers.pop().unwrap().sigkill();
    c.workers.push(spawn(dir.path(), "worker-second", &args));
    c.finished(&id).await;
    c.check_complete_run().await;
}

/// A broadcast shows its progress while it runs: with a worker that holds each received
/// version 3 s before swapping it in, a watcher sees the bytes it received, and at the end
/// they equal what the step's record says the broadcast moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_reports_the_bytes_received_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 0, 24);
    c.add_worker_with(&[("COMAS_WORKER_FAULT", "slow-swap:3")]);
    let id = c.submit().await;
    let full = |s: &pb::JobStatus| {
        s.stage == "broadcast" && s.broadcast_workers == 1 && s.broadcast_bytes_total > 0
    };
    let st = c
        .on_event(&id, 180, "step 0's broadcast with every byte in", move |s| {
            full(s) && s.broadcast_bytes_done == s.broadcast_bytes_total
        })
        .await;
    assert_eq!(st.steps_done, 0);
    c.finished(&id).await;
    c.check_complete_run().await;
    let step0 = &c.metrics_log()[0];
    let moved: u64 =
        (0..2).map(|k| step0["agents"][k]["weight_sync"]["bytes"].as_u64().unwrap()).sum();
    assert_eq!(st.broadcast_bytes_total, moved, "the live total is what the broadcast moved");
}

/// A worker that joins mid-job and takes long to load does not hold up the broadcast: the
/// ready worker goes on, and the job ends long before the late one is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_late_joiner_does_not_stall_the_broadcast() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1, 24);
    let id = c.submit().await;
    c.on_event(&id, 120, "step 0's rollout", |s| s.steps_done == 0 && s.stage == "rollout").await;
    c.add_worker_with(&[("COMAS_WORKER_FAULT", "slow-load:300")]);
    let joined = Instant::now();
    c.finished(&id).await;
    assert!(
        joined.elapsed() < Duration::from_secs(120),
        "the job waited {:?} for the late joiner",
        joined.elapsed()
    );
    c.check_complete_run().await;
}

/// Chaos: an 8-step job with a dozen seeded SIGKILLs at random moments, spread over the
/// coordinator, both learners and both workers, each killed service started again. The job
/// completes; every step is logged once with the exact episode and turn counts; every turn was
/// sampled with its step's version; and the final weights equal those of an undisturbed run of
/// the same job. (One episode per worker at a time, so that no batch differs between the runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_of_every_service_change_nothing_in_the_result() {
    use rand::{Rng, SeedableRng};
    const CHAOS_STEPS: u64 = 8;
    const KILLS: usize = 12;
    let flags = ["--max-episodes", "1"];
    let calm_dir = tempfile::tempdir().unwrap();
    let calm = Cluster::build(calm_dir.path(), 2, 40, &[], false, CHAOS_STEPS, &flags);
    let id = calm.submit().await;
    calm.finished(&id).await;
    calm.check_complete_run().await;
    drop(calm);

    let dir = tempfile::tempdir().unwrap();
    // Each result a second late: the job outlasts the kills on any hardware (it changes when
    // results come, not what they hold).
    let slow = [("COMAS_WORKER_FAULT", "slow-result:1000")];
    let mut c = Cluster::build(dir.path(), 0, 40, &[], false, CHAOS_STEPS, &flags);
    for _ in 0..2 {
        c.add_worker_with(&slow);
    }
    let id = c.submit().await;
    // COMAS_CHAOS_SEED replays another schedule of kills (to hunt for failures by hand).
    let seed = std::env::var("COMAS_CHAOS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(21);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Every kind of service is hit at least twice; the rest of the order is random.
    let mut victims: Vec<usize> = (0..KILLS).map(|i| i % 5).collect();
    for i in (1..victims.len()).rev() {
        victims.swap(i, rng.gen_range(0..=i));
    }
    let started = Instant::now();
    let mut killed = Vec::new();
    for &v in &victims {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(150..1000))).await;
        match c.status(&id).await {
            Some(st) if st.state >= pb::JobState::Succeeded as i32 => break,
            _ => {}
        }
        let name = match v {
            0 => {
                c.coordinator.as_mut().unwrap().sigkill();
                "coordinator".to_string()
            }
            1 | 2 => {
                c.learners[v - 1].as_mut().unwrap().sigkill();
                format!("learner-{}", v - 1)
            }
            _ => {
                c.workers[v - 3].sigkill();
                format!("worker-{}", v - 3)
            }
        };
        killed.push(format!("{name} at {:.1}s", started.elapsed().as_secs_f64()));
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..700))).await;
        match v {
            0 => c.start_coordinator(),
            1 | 2 => c.start_learner(v - 1),
            _ => c.workers[v - 3] = c.worker(v - 3, &slow),
        }
    }
    eprintln!("killed: {killed:?}");
    c.finished(&id).await;
    assert!(killed.len() >= 10, "the job ended after only {} kills: {killed:?}", killed.len());
    c.check_complete_run().await;
    c.assert_final_weights_equal(calm_dir.path(), &killed);
}

/// At submit the coordinator shows what each learner and each worker will hold, and warns of a
/// learner whose estimate exceeds the memory it says it may use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_shows_the_memory_estimate_and_warns_of_a_learner_too_small() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 0, 8);
    c.learners[1].as_mut().unwrap().sigkill();
    c.start_learner_with(1, &[("COMAS_LEARNER_MEMORY_BYTES", "1000000")]);
    for k in 0..2 {
        let started = Instant::now();
        while LearnerClient::connect(format!("http://127.0.0.1:{}", c.learner_ports[k]))
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "learner {k} never came up\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = c.learner_info(k).await;
    }
    let text = std::fs::read_to_string(dir.path().join("job.toml")).unwrap();
    let st = c
        .client()
        .await
        .submit_job(pb::SubmitJobRequest {
            job_toml: text,
            base_dir: dir.path().display().to_string(),
            reuse_name: false,
        })
        .await
        .unwrap()
        .into_inner();
    let notes = st.notes.join("\n");
    assert!(
        st.notes[0].starts_with("agent 0's learner needs about ")
            && st.notes[0].contains("optimizer state) plus activations; its device (Cpu) has "),
        "{notes}"
    );
    assert!(
        st.notes[1].starts_with("agent 1's learner needs about ")
            && st.notes[1].ends_with("its device (Cpu) has 976.6 KiB"),
        "{notes}"
    );
    assert!(
        st.notes[2].starts_with("warning: agent 1's learner needs about ")
            && st.notes[2].contains("has 976.6 KiB; train a LoRA adapter (agents[1].train.lora)"),
        "{notes}"
    );
    assert!(
        st.notes[3].starts_with("each rollout worker holds about ")
            && st.notes[3].contains("(2 base models, float32)"),
        "{notes}"
    );
    assert_eq!(st.notes.len(), 4, "{notes}");
}
