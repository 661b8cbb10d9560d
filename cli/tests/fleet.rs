//! Many workers against one coordinator: a fleet of fixed-token workers (the worker protocol
//! in full, no model: `comas_rollout_worker::fixed`) in this process, a real coordinator and a
//! real learner. Most of the fleet is killed in the middle of a step and as many new workers
//! join; the job ends with every episode, sample and version exact.
mod harness;

use comas_rollout_worker::fixed::FixedStats;
use harness::*;
use std::sync::Arc;
use std::time::Duration;

/// 40 workers take a job of 3 steps (32 episodes a step, 2 slots each); in step 1's rollout 36
/// of them are killed, and 36 new ones join a second later. Every step is logged once with its
/// 32 episodes and samples, the agent's version advances by one a step, the coordinator accepted
/// exactly 96 episodes, re-queued the killed workers' leases, and ends with 40 workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn most_of_a_fleet_killed_mid_step_and_replaced_loses_nothing() {
    const STEPS: u64 = 3;
    const EPISODES: u64 = 32;
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    write_fleet_job(tmp.path(), port, 4, 8, STEPS);
    let c = Cluster::launch(tmp.path(), vec![port], 0, &[], STEPS, &[]);
    // Turns of a second: the kill lands well inside the rollout.
    let s = fixed_settings(c.coordinator_url(), 2, Duration::from_secs(1));
    let stats = Arc::new(FixedStats::default());
    wait_until_listening(&c).await;
    let mut workers = fleet(0, 40, &s, &stats).await;
    wait_for_workers(&c, 40).await;
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's rollout", |st| {
        st.steps_done == 1 && st.stage == "rollout" && st.episodes_total > 0
    })
    .await;
    for w in workers.drain(4..) {
        w.kill();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    workers.extend(fleet(40, 36, &s, &stats).await);
    c.finished(&id).await;
    assert_fleet_run_exact(&c, STEPS, EPISODES);
    assert!(c.prometheus("comas_coordinator_requeued_episodes_total") >= 1.0, "leases re-queued");
    // The killed workers were given up (their streams broke), the new ones registered.
    wait_for_workers(&c, 40).await;
    assert!(stats.episodes.load(std::sync::atomic::Ordering::Relaxed) >= STEPS * EPISODES);
}
