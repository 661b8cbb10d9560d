//! The whole pipeline learns: workers sample, the grader rewards, the learner trains, the new
//! weights reach the workers, and the rewarded behaviour becomes more likely. A tiny model
//! answers in a guided `\boxed{2}` or `\boxed{3}` (one free choice, so chance is what the
//! untrained model gives); GRPO pays 1 for `2`. The mean reward must rise from chance to at
//! least 0.9 within a fixed number of steps, and must not when the learners train against
//! their advantages or when the new weights never reach the workers: both broken pipelines
//! are run too, so the test is seen to be able to fail.
mod harness;

use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use harness::*;
use std::path::Path;

const STEPS: u64 = 10;

/// One tiny model, 8 questions whose answer is always 2, and a GRPO job whose answer is a
/// guided box after at most one free token.
fn write_job(dir: &Path, learner_port: u16) {
    write_model(&dir.join("model"), &TinySpec { seed: 11, ..TinySpec::tiny(Architecture::Qwen2) })
        .unwrap();
    let data: String = (0..8).map(|i| format!("{{\"prompt\":\"Question {i}: pick two.\",\"answer\":\"2\",\"task\":\"math\",\"id\":\"q{i}\"}}\n")).collect();
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
    let job = format!(
        "name = \"learns\"\nseed = 3\nmethod = \"grpo\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = 2\nsteps = {STEPS}\nlearner_timeout_secs = 120\n\
         [output]\ndir = \"out\"\n[grpo]\ngroup_size = 8\n[grpo.sampling]\ntemperature = 1.0\nmax_new_tokens = 17\nguided_suffix = '''\\\\boxed\\{{[23]\\}}'''\n\
         [[agents]]\nmodel = \"model\"\nlearner = \"http://127.0.0.1:{learner_port}\"\n[agents.train]\nlr = 3e-3\nwarmup_ratio = 0.0\nmin_lr_ratio = 1.0\n\
         train_batch_size = 16\nmicro_batch_size = 16\nmask_truncated = false\n"
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

/// The mean reward of each step of a run whose services have `env` (a fault to inject).
async fn rewards_of_a_run(env: &[(&str, String)]) -> Vec<f64> {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    write_job(tmp.path(), port);
    let c =
        Cluster::launch_env(tmp.path(), vec![port], 1, &[], STEPS, &["--max-episodes", "16"], env);
    let id = c.submit().await;
    c.finished(&id).await;
    c.metrics_log().iter().map(|m| m["accuracy"]["mean"].as_f64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rewarded_answer_becomes_the_answer_and_broken_pipelines_do_not_learn_it() {
    let learns = rewards_of_a_run(&[]).await;
    let first = learns[0];
    // 16 answers of the untrained model: chance, neither solved nor impossible.
    assert!((0.1..=0.6).contains(&first), "step 0 is not at chance: {learns:?}");
    eprintln!("learning: {learns:?}");
    // The last two steps' 32 answers.
    let last = learns[learns.len() - 2..].iter().sum::<f64>() / 2.0;
    assert!(last >= 0.9, "the pipeline did not learn within {STEPS} steps: {learns:?}");

    // Trained against its advantages, the model moves away from the rewarded answer.
    let flipped = rewards_of_a_run(&[("COMAS_LEARNER_FAULT", "flip-advantage-sign".into())]).await;
    let flipped_last = flipped[flipped.len() - 2..].iter().sum::<f64>() / 2.0;
    assert!(flipped_last < first.min(0.5), "flipped advantages still learned: {flipped:?}");

    // New weights that never reach the workers: the samples stay at chance.
    let stale = rewards_of_a_run(&[("COMAS_WORKER_FAULT", "stale-weights:1".into())]).await;
    assert!(stale.iter().all(|&r| r < 0.9), "stale weights learned: {stale:?}");
    eprintln!("flipped advantages: {flipped:?}\nstale weights: {stale:?}");
    let late = stale[stale.len() - 2..].iter().sum::<f64>() / 2.0;
    assert!((late - first).abs() < 0.35, "stale weights drifted from chance ({first}): {stale:?}");
}
