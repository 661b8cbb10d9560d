//! `method = "grpo"` end to end, with real processes on loopback: two tiny agents, each with its
//! own learner, answer every question G times on one rollout worker; every answer is graded,
//! trains its own agent, and the step's figures are what the saved episodes say.
mod harness;

use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use harness::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

const STEPS: u64 = 2;
const QUESTIONS_PER_STEP: u64 = 2;
const G: u64 = 4;

/// Two tiny models, four questions whose answers are 2 or 3, and a job whose answers end in a
/// guided `\boxed{2}` or `\boxed{3}`: about half are right, so rewards vary within a group.
fn write_grpo_job(dir: &Path, learner_ports: &[u16]) {
    for (k, seed) in [(0, 3), (1, 4)] {
        write_model(
            &dir.join(format!("model-{k}")),
            &TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) },
        )
        .unwrap();
    }
    write_four_sums(dir);
    let agent = |k: usize| {
        format!(
            "[[agents]]\nmodel = \"model-{k}\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-4\ntrain_batch_size = 8\nmicro_batch_size = 8\nmask_truncated = false\n",
            learner_ports[k]
        )
    };
    let job = format!(
        "name = \"grpo-e2e\"\nseed = 5\nmethod = \"grpo\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = {QUESTIONS_PER_STEP}\nsteps = {STEPS}\n\
         learner_timeout_secs = 120\n[output]\ndir = \"out\"\nsave_episodes = true\n[grpo]\ngroup_size = {G}\nprompt_suffix = \" Box the answer.\"\n\
         [grpo.sampling]\ntemperature = 1.0\nmax_new_tokens = 24\nguided_suffix = '''\\\\boxed\\{{[23]\\}}'''\n{}{}",
        agent(0),
        agent(1)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_answers_each_question_g_times_and_trains_on_its_own_graded_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_grpo_job(tmp.path(), &ports);
    let c = Cluster::launch(tmp.path(), ports, 1, &[], STEPS, &["--max-episodes", "8"]);
    let id = c.submit().await;
    let st = c.finished(&id).await;
    assert!(st.agents.iter().all(|a| a.version == STEPS), "{:?}", st.agents);
    let log = c.metrics_log();
    assert_eq!(
        log.iter().map(|m| m["step"].as_u64().unwrap()).collect::<Vec<_>>(),
        (0..STEPS).collect::<Vec<_>>()
    );
    let mut seen = Vec::new();
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        let episodes = QUESTIONS_PER_STEP * G;
        assert_eq!(
            (m["method"].as_str(), m["episodes"].as_u64(), m["answers"].as_u64()),
            (Some("grpo"), Some(episodes), Some(2 * episodes)),
            "{m}"
        );
        // The grade of every answer, by this test: the digit in its last box against the answer.
        let text =
            std::fs::read_to_string(tmp.path().join(format!("out/episodes/step-{step:05}.jsonl")))
                .unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["record"].clone())
            .collect();
        assert_eq!(records.len() as u64, episodes);
        let mut by_group: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
        let mut by_agent = [Vec::new(), Vec::new()];
        for r in &records {
            let answer = r["task"]["answer"].as_str().unwrap();
            let answers = r["answers"].as_array().unwrap();
            assert_eq!(
                answers.iter().map(|a| a["agent"].as_u64().unwrap()).collect::<Vec<_>>(),
                [0, 1],
                "{r}"
            );
            for a in answers {
                let text = a["text"].as_str().unwrap();
                let boxed = text.rfind("\\boxed{").map(|i| &text[i + 7..i + 8]);
                let reward = f64::from(u8::from(boxed == Some(answer)));
                let agent = a["agent"].as_u64().unwrap();
                by_group
                    .entry((r["task"]["id"].as_str().unwrap().to_string(), agent))
                    .or_default()
                    .push(reward);
                by_agent[agent as usize].push(reward);
            }
        }
        let all: Vec<f64> = by_agent.iter().flatten().copied().collect();
        assert_eq!(
            m["accuracy"]["mean"].as_f64(),
            Some(all.iter().sum::<f64>() / all.len() as f64),
            "{m}"
        );
        assert_eq!(m["groups"].as_u64(), Some(QUESTIONS_PER_STEP * 2));
        let equal = by_group.values().filter(|g| g.iter().all(|&r| r == g[0])).count() as u64;
        assert_eq!(m["equal_groups"].as_u64(), Some(equal), "{m}");
        for (k, rewards) in by_agent.iter().enumerate() {
            let a = &m["agents"][k];
            // Each agent trains on its own G answers to each of the step's questions.
            assert_eq!(
                (a["samples"].as_u64(), a["train"]["samples"].as_u64(), a["version"].as_u64()),
                (Some(episodes), Some(episodes), Some(step + 1)),
                "{m}"
            );
            let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
            assert!(
                (a["reward_mean"].as_f64().unwrap() - mean).abs() < 1e-12,
                "step {step} agent {k}: {a}"
            );
        }
        seen.extend(all);
    }
    // Right and wrong answers both occurred: the groups had something to teach.
    assert!(seen.contains(&1.0) && seen.contains(&0.0), "{seen:?}");
}

/// Answers all cut at `max_new_tokens` under `mask_truncated`: no step of the agent carries a
/// gradient. Each step's record says so with its counts, and the third in a row is streamed
/// to watchers as a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_learns_nothing_is_told_of() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_grpo_job(tmp.path(), &ports);
    let job = std::fs::read_to_string(tmp.path().join("job.toml")).unwrap();
    let cut = job
        .replace(
            "max_new_tokens = 24\nguided_suffix = '''\\\\boxed\\{[23]\\}'''\n",
            "max_new_tokens = 2\nmin_new_tokens = 2\n",
        )
        .replace("mask_truncated = false", "mask_truncated = true")
        .replace(&format!("steps = {STEPS}\n"), "steps = 3\n");
    assert_ne!(cut, job);
    std::fs::write(tmp.path().join("job.toml"), cut).unwrap();
    let c = Cluster::launch(tmp.path(), ports, 1, &[], 3, &["--max-episodes", "8"]);
    let id = c.submit().await;
    let mut client = c.client().await;
    let mut stream = client
        .watch_job(comas_proto::v1::WatchJobRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let mut warnings = Vec::new();
    while let Some(ev) = stream.message().await.unwrap() {
        if ev.kind == "warning" {
            warnings.push(ev.message.clone());
        }
        if ev.kind == "finished" {
            break;
        }
    }
    c.finished(&id).await;
    for m in c.metrics_log() {
        for k in 0..2 {
            let t = &m["agents"][k]["train"];
            assert_eq!(
                (t["no_gradient"].as_bool(), t["masked_samples"].as_u64(), t["samples"].as_u64()),
                (Some(true), Some(8), Some(8)),
                "{m}"
            );
        }
    }
    assert_eq!(warnings.len(), 2, "one per agent: {warnings:?}");
    assert!(
        warnings[0].contains("has trained on no policy gradient for 3 steps in a row (to step 2)"),
        "{warnings:?}"
    );
}

/// The four sums as a user's data set: parquet shards written by PyPI `datasets` (training) and
/// a parquet file written by `pyarrow` (held-out, an integer answer column), both with their own
/// column names, read through `[data]`'s `prompt_key`, `answer_key`, `id_key` and `task`.
/// Every episode plays a question of the shards, under its own id, with its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_trains_on_parquet_shards_written_by_datasets_with_its_own_column_names() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_grpo_job(tmp.path(), &ports);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let python = root.join(".venv-clients/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash scripts/setup-clients.sh`",
        python.display()
    );
    let rows: Vec<Value> = [(0, 2), (1, 2), (2, 0), (2, 1)]
        .iter()
        .enumerate()
        .map(|(i, (a, b))| {
            serde_json::json!({"question": format!("What is {a} + {b}?"), "solution": (a + b).to_string(), "idx": 100 + i})
        })
        .collect();
    let out = std::process::Command::new(&python)
        .arg(root.join("tests/fixtures/write_parquet_data.py"))
        .arg(tmp.path())
        .arg(serde_json::to_string(&rows).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(tmp.path().join("train.jsonl")).unwrap();
    let job = std::fs::read_to_string(tmp.path().join("job.toml")).unwrap().replace(
        "[data]\ntrain = \"train.jsonl\"\n",
        "[data]\ntrain = \"shards\"\nprompt_key = \"question\"\nanswer_key = \"solution\"\nid_key = \"idx\"\ntask = \"math\"\n",
    );
    let job =
        format!("{job}[eval]\ndata = \"heldout.parquet\"\nevery_steps = 2\nat_start = false\n");
    std::fs::write(tmp.path().join("job.toml"), job).unwrap();
    let c = Cluster::launch(tmp.path(), ports, 1, &[], STEPS, &["--max-episodes", "8"]);
    let id = c.submit().await;
    c.finished(&id).await;
    assert_eq!(c.metrics_log().len() as u64, STEPS);
    let evals = c.log_of("eval");
    assert_eq!(evals.len(), 1, "one evaluation, after the last step");
    assert_eq!(evals[0]["episodes"].as_u64(), Some(4), "every held-out row once: {}", evals[0]);
    let by_id: BTreeMap<String, (String, String)> = rows
        .iter()
        .map(|r| {
            let text = |k: &str| r[k].as_str().unwrap().to_string();
            (r["idx"].to_string(), (text("question"), text("solution")))
        })
        .collect();
    let mut played = 0;
    for step in 0..STEPS {
        let text =
            std::fs::read_to_string(tmp.path().join(format!("out/episodes/step-{step:05}.jsonl")))
                .unwrap();
        for line in text.lines() {
            let task = &serde_json::from_str::<Value>(line).unwrap()["record"]["task"];
            let (prompt, answer) = &by_id[task["id"].as_str().unwrap()];
            assert!(task["prompt"].as_str().unwrap().starts_with(prompt.as_str()), "{task}");
            assert_eq!(
                (task["answer"].as_str(), task["task"].as_str()),
                (Some(answer.as_str()), Some("math"))
            );
            played += 1;
        }
    }
    assert_eq!(played, STEPS * QUESTIONS_PER_STEP * G);
}
