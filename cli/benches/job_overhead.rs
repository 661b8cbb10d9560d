//! Where a training step's time goes: runs a real local job (coordinator, 2 learners and 2
//! workers as processes, tiny models) and prints rollout, training, broadcast and the
//! coordinator's own time (scheduling, reward formulation, routing, job store) per step. Then it
//! times experience making alone at the paper's batch shape (256 episodes, l = 4, R = 2).
//!
//! cargo bench -p comas --bench job_overhead
use comas_workflow::comas::experience::{make_step, Finished};
use comas_workflow::comas::{start_batch, CoMasConfig, PlanSeed};
use comas_workflow::{FinishReason, Role, TaskKind, TaskRecord, TurnOutput};
use serde_json::Value;
use std::process::Command;
use std::time::Instant;

const JOB: &str = r#"
name = "overhead"
[data]
train = "train.jsonl"
[schedule]
questions_per_step = 8
steps = 5
[output]
dir = "out"
export = false
[comas]
num_rounds = 2
instances_per_question = 2
[comas.sampling.solver]
max_new_tokens = 32
min_new_tokens = 32
[comas.sampling.evaluator]
max_new_tokens = 32
min_new_tokens = 32
[comas.sampling.scorer]
max_new_tokens = 16
min_new_tokens = 16
[[agents]]
model = "model"
[agents.train]
train_batch_size = 48
micro_batch_size = 16
mask_truncated = false
[[agents]]
model = "model"
[agents.train]
train_batch_size = 48
micro_batch_size = 16
mask_truncated = false
"#;

fn real_job() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let exe = env!("CARGO_BIN_EXE_comas");
    let st = Command::new(exe)
        .args(["tiny-model", "--out", &d.join("model").display().to_string(), "--seed", "3"])
        .status()
        .unwrap();
    assert!(st.success());
    let data: String = (0..64).map(|i| format!("{{\"prompt\":\"What is {i} + 1?\",\"answer\":\"{}\",\"task\":\"math\",\"id\":\"q{i}\"}}\n", i + 1)).collect();
    std::fs::write(d.join("train.jsonl"), data).unwrap();
    std::fs::write(d.join("job.toml"), JOB).unwrap();
    let started = Instant::now();
    let out = Command::new(exe)
        .args([
            "local",
            &d.join("job.toml").display().to_string(),
            "--dir",
            &d.join("run").display().to_string(),
            "--workers",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let wall = started.elapsed().as_secs_f64();
    let log: Vec<Value> = std::fs::read_to_string(d.join("out/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    println!("local job: 2 agents, 2 workers, 16 episodes (192 turns of 16-32 tokens) per step, tiny models, 1 thread per process");
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>10} {:>12} {:>9} {:>8}",
        "step", "rollout", "exper.", "train", "broadcast", "coordinator", "total", "coord %"
    );
    let mut sums = [0.0f64; 6];
    for m in &log {
        let s = &m["seconds"];
        let g = |k: &str| s[k].as_f64().unwrap_or(0.0);
        let row = [
            g("rollout"),
            g("experience"),
            g("train"),
            g("broadcast"),
            g("coordinator"),
            g("total"),
        ];
        println!(
            "{:>4} {:>8.3}s {:>8.4}s {:>8.3}s {:>9.3}s {:>11.4}s {:>8.3}s {:>7.2}%",
            m["step"],
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            100.0 * row[4] / row[5]
        );
        if m["step"].as_u64().unwrap() > 0 {
            for (a, b) in sums.iter_mut().zip(row) {
                *a += b;
            }
        }
    }
    let n = (log.len() - 1) as f64;
    println!(
        "mean of steps 1..: rollout {:.3}s, experience {:.4}s, train {:.3}s, broadcast {:.3}s, coordinator {:.4}s of {:.3}s ({:.2}%); wall {:.1}s incl. start-up",
        sums[0] / n, sums[1] / n, sums[2] / n, sums[3] / n, sums[4] / n, sums[5] / n, 100.0 * sums[4] / sums[5], wall
    );
}

/// Experience making alone at the paper's shape: 64 questions x 4 instances, l = 4, R = 2
/// (24 turns per instance, 6144 turns per step), 512-token completions.
fn paper_scale_experience() {
    let cfg = CoMasConfig {
        num_agents: 4,
        num_rounds: 2,
        instances_per_question: 4,
        ..Default::default()
    };
    let questions: Vec<TaskRecord> = (0..64)
        .map(|i| TaskRecord {
            prompt: format!("q{i}"),
            answer: "1".into(),
            task: TaskKind::Math,
            id: format!("q{i}"),
            source: None,
            files: Default::default(),
        })
        .collect();
    let episodes =
        start_batch(&cfg, &questions, PlanSeed { global: 1, step: 0, shard: 0 }).unwrap();
    let mut finished = Vec::new();
    for (i, mut ep) in episodes.into_iter().enumerate() {
        while !ep.is_done() {
            let outs = ep
                .next_turns()
                .iter()
                .map(|r| {
                    let text = if r.role == Role::Scorer {
                        "<score>2</score>".to_string()
                    } else {
                        "\\boxed{1}".to_string()
                    };
                    TurnOutput {
                        turn_index: r.turn_index,
                        raw_text: text.clone(),
                        text,
                        prompt_ids: vec![1; 256],
                        completion_ids: vec![2; 512],
                        logprobs: vec![-1.0; 512],
                        finish_reason: FinishReason::Stop,
                        policy_version: 0,
                        constrained: Vec::new(),
                    }
                })
                .collect();
            ep.submit(outs).unwrap();
        }
        finished.push(Finished {
            episode_id: format!("e{i}"),
            trajectory: ep.into_trajectory().unwrap(),
            answer: "1".into(),
        });
    }
    // Trajectories arrive as JSON; parsing them is part of the coordinator's work.
    let json: Vec<String> =
        finished.iter().map(|f| serde_json::to_string(&f.trajectory).unwrap()).collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let parsed: Vec<Finished> = json
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let trajectory: comas_workflow::comas::Trajectory =
                    serde_json::from_str(j).unwrap();
                trajectory.validate().unwrap();
                Finished { episode_id: format!("e{i}"), trajectory, answer: "1".into() }
            })
            .collect();
        let b = make_step(&parsed, 4, None, comas_workflow::comas::RewardSource::Comas).unwrap();
        assert_eq!(b.per_agent.iter().map(Vec::len).sum::<usize>(), 256 * 24);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let mb: usize = json.iter().map(String::len).sum();
    println!(
        "paper-scale experience making: 256 episodes, 6144 turns, {:.0} MB of trajectory JSON: parse + validate + rewards + experiences in {:.3}s (best of 3)",
        mb as f64 / 1e6,
        best
    );
}

fn main() {
    real_job();
    paper_scale_experience();
}
