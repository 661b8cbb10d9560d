//! A fleet of fixed-token workers (`comas_rollout_worker::fixed`) in the test's own process,
//! and the one-agent GRPO job they run: for tests and benchmarks of the coordinator alone.
use super::*;
use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use comas_rollout_worker::fixed::{FixedSettings, FixedStats, FixedWorker};
use std::sync::Arc;

/// A GRPO job of one tiny agent: `questions` questions a step, `group` answers each.
pub fn write_fleet_job(dir: &std::path::Path, port: u16, questions: u64, group: u64, steps: u64) {
    write_model(&dir.join("model"), &TinySpec { seed: 3, ..TinySpec::tiny(Architecture::Qwen2) })
        .unwrap();
    let data: String = (0..questions.max(64))
        .map(|i| format!("{{\"prompt\":\"Question {i}\",\"answer\":\"{}\",\"task\":\"math\",\"id\":\"q{i}\"}}\n", 2 + i % 2))
        .collect();
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
    let job = format!(
        "name = \"fleet\"\nseed = 1\nmethod = \"grpo\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = {questions}\nsteps = {steps}\nlearner_timeout_secs = 120\n\
         [output]\ndir = \"out\"\n[grpo]\ngroup_size = {group}\n[grpo.sampling]\nmin_new_tokens = 0\nmax_new_tokens = 8\n\
         [[agents]]\nmodel = \"model\"\nlearner = \"http://127.0.0.1:{port}\"\n[agents.train]\ntrain_batch_size = {}\nmicro_batch_size = {}\nmask_truncated = false\n",
        questions * group,
        questions * group,
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

/// What every fixed worker answers: `\boxed{2}` in four tokens, after `delay` per turn, with
/// `slots` episodes at a time.
pub fn fixed_settings(coordinator: String, slots: u32, delay: Duration) -> Arc<FixedSettings> {
    Arc::new(FixedSettings {
        coordinator,
        ip: "127.0.0.1".parse().unwrap(),
        max_episodes: slots,
        turn_delay: delay,
        prompt_ids: vec![1, 2, 3, 4],
        completion_ids: vec![5, 6, 7, 8],
        text: "\\boxed{2}".into(),
    })
}

/// Waits until the coordinator and every learner listen: a fleet started before them could take
/// their ports (picked free, then released until they bind them).
pub async fn wait_until_listening(c: &Cluster) {
    let started = std::time::Instant::now();
    let up = |ip: String, port: u16| std::net::TcpStream::connect((ip.as_str(), port)).is_ok();
    loop {
        let coordinator =
            up(c.ip_of("coordinator"), c.coord_port) && up(c.ip_of("coordinator"), c.metrics_port);
        let learners = c
            .learner_ports
            .iter()
            .enumerate()
            .all(|(k, &port)| up(c.ip_of(&format!("learner-{k}")), port));
        if coordinator && learners {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "services not up\n{}", c.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the coordinator counts exactly `n` registered workers.
pub async fn wait_for_workers(c: &Cluster, n: usize) {
    let started = std::time::Instant::now();
    let at = (c.ip_of("coordinator"), c.metrics_port);
    while try_scrape(&at, "comas_coordinator_workers") != Some(n as f64) {
        let now = try_scrape(&at, "comas_coordinator_workers");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{now:?} workers registered, not {n}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Workers `fixed-{from}` to `fixed-{from + n - 1}`, started one after another.
pub async fn fleet(
    from: usize,
    n: usize,
    s: &Arc<FixedSettings>,
    stats: &Arc<FixedStats>,
) -> Vec<FixedWorker> {
    let mut out = Vec::with_capacity(n);
    for i in from..from + n {
        let w = FixedWorker::start(format!("fixed-{i}"), Arc::clone(s), Arc::clone(stats));
        out.push(w.await.unwrap());
    }
    out
}

/// A fleet job's end: every step logged once with `episodes` episodes, each one a sample the
/// agent trained on, its version advanced by one a step, and the coordinator having accepted
/// exactly `steps × episodes`. Returns the step records.
pub fn assert_fleet_run_exact(c: &Cluster, steps: u64, episodes: u64) -> Vec<Value> {
    let log = c.metrics_log();
    let logged: Vec<u64> = log.iter().map(|m| m["step"].as_u64().unwrap()).collect();
    assert_eq!(logged, (0..steps).collect::<Vec<_>>(), "each step logged once");
    for m in &log {
        let a = &m["agents"][0];
        assert_eq!(
            (m["episodes"].as_u64(), a["samples"].as_u64(), a["train"]["samples"].as_u64()),
            (Some(episodes), Some(episodes), Some(episodes)),
            "{m}"
        );
        assert_eq!(a["version"], m["step"].as_u64().unwrap() + 1);
    }
    assert_eq!(
        c.prometheus("comas_coordinator_episodes_completed_total"),
        (steps * episodes) as f64
    );
    log
}
