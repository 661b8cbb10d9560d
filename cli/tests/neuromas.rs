//! NeuroMAS end to end: a layered graph of LoRA nodes trained by one learner, then grown.
mod harness;

use harness::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A NeuroMAS graph as a job: the layers speak in order (2 calls then 1 per rollout), every
/// node's sample of a rollout carries the rollout's reward (the readout's grade, computed here
/// again from the record), the messages passed on are cuts of the replies without thinking, and
/// each agent (a node's adapter) trains on its own node's samples only. One learner process
/// trains all three adapters over the one base it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neuromas_graph_runs_layer_by_layer_and_every_node_shares_the_rollout_reward() {
    let tmp = tempfile::tempdir().unwrap();
    // One learner process trains the three adapters over one base.
    let port = free_port();
    write_neuromas_job(tmp.path(), &[port; 3]);
    let c = Cluster::launch_one_learner(
        tmp.path(),
        port,
        3,
        1,
        &[],
        NEUROMAS_STEPS,
        &["--max-episodes", "4"],
    );
    let id = c.submit().await;
    let st = c.finished(&id).await;
    assert!(st.agents.iter().all(|a| a.version == NEUROMAS_STEPS), "{:?}", st.agents);
    let log = c.metrics_log();
    assert_eq!(log.len() as u64, NEUROMAS_STEPS);
    let mut rewards_seen = Vec::new();
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        assert_eq!(
            (m["method"].as_str(), m["episodes"].as_u64()),
            (Some("neuromas"), Some(4)),
            "{m}"
        );
        // Calls per layer: 2 nodes then the readout, in each of the 4 rollouts.
        assert_eq!(
            (
                m["completion_tokens"]["1"]["count"].as_u64(),
                m["completion_tokens"]["2"]["count"].as_u64()
            ),
            (Some(8), Some(4)),
            "{m}"
        );
        let text =
            std::fs::read_to_string(tmp.path().join(format!("out/episodes/step-{step:05}.jsonl")))
                .unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["record"].clone())
            .collect();
        assert_eq!(records.len(), 4);
        let mut rewards = Vec::new();
        for r in &records {
            let turns = r["turns"].as_array().unwrap();
            let layers: Vec<u64> =
                turns.iter().map(|t| t["node"]["layer"].as_u64().unwrap()).collect();
            assert_eq!(layers, vec![1, 1, 2], "{r}");
            let agents: Vec<u64> = turns.iter().map(|t| t["agent"].as_u64().unwrap()).collect();
            assert_eq!(agents, vec![0, 1, 2]);
            for t in turns {
                // The message is the reply without thinking, cut (or not) at a token boundary.
                let reply = t["text"].as_str().unwrap().trim();
                let message = t["message"]["text"].as_str().unwrap();
                assert!(
                    reply.starts_with(message)
                        && (message.len() < reply.len())
                            == t["message"]["truncated"].as_bool().unwrap()
                        || message.is_empty(),
                    "{t}"
                );
            }
            // The readout's grade, by this test: the digit in its last box against the answer.
            let answer = r["task"]["answer"].as_str().unwrap();
            let readout = turns[2]["text"].as_str().unwrap();
            let reward = match readout.rfind("\\boxed{") {
                None => -0.5,
                Some(i) => {
                    let inner = &readout[i + 7..];
                    f64::from(u8::from(inner.split('}').next() == Some(answer)))
                }
            };
            rewards.push(reward);
        }
        let mean = rewards.iter().sum::<f64>() / 4.0;
        let right = rewards.iter().filter(|&&r| r == 1.0).count() as f64 / 4.0;
        assert_eq!(m["graph_accuracy"]["mean"].as_f64(), Some(right), "{m}");
        for k in 0..3 {
            let a = &m["agents"][k];
            // Each node's adapter trains on its one sample of each of the 4 rollouts, each with
            // its rollout's reward: every agent's mean is the rollouts' mean.
            assert_eq!(
                (a["samples"].as_u64(), a["train"]["samples"].as_u64()),
                (Some(4), Some(4)),
                "step {step} agent {k}"
            );
            let got = a["reward_mean"].as_f64().unwrap();
            assert!(
                (got - mean).abs() < 1e-12,
                "step {step} agent {k}: reward mean {got}, the rollouts' {mean}"
            );
        }
        // Only adapter bytes travel: r = 2 on q (64 -> 64) and v (64 -> 32) in 2 layers, f32,
        // is 2 x (2x64 + 64x2 + 2x64 + 32x2) x 4 = 3,584 bytes per agent to the one worker
        // (after the last step nothing is sent).
        let sent = if step + 1 < NEUROMAS_STEPS { 3584 } else { 0 };
        for k in 0..3 {
            assert_eq!(m["agents"][k]["weight_sync"]["bytes"].as_u64(), Some(sent), "{m}");
        }
        rewards_seen.extend(rewards);
    }
    // Right and wrong readouts both occurred, so the equal rewards above were not all alike.
    assert!(rewards_seen.contains(&1.0) && rewards_seen.contains(&0.0), "{rewards_seen:?}");
    drop(c);
    grow_the_trained_graph(tmp.path()).await;
}

/// Growth (§6) of the [2, 1] graph the test above trained: `comas grow --to 2,2,1` keeps the
/// three trained nodes' adapters and Adam moments bit for bit, the new layer's nodes start as
/// copies of the nodes below them, and the grown job trains all five: 2, 2 and 1 calls per
/// rollout, the new layer reading through identity wiring for its one bridge step.
async fn grow_the_trained_graph(dir: &Path) {
    let grown = dir.join("grown");
    // Misuse first: a shrinking target, and checkpoints where there are none.
    let grow = |checkpoints: &str, to: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_comas"))
            .args([
                "grow",
                &dir.join("job.toml").display().to_string(),
                "--checkpoints",
                checkpoints,
                "--to",
                to,
                "--out",
                &dir.join("bad").display().to_string(),
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = grow(&format!("{}/ckpt-0/agent-{{agent}}", dir.display()), "1,1");
    assert!(e.contains("layer 1 has 2 nodes and growth only adds"), "{e}");
    let e = grow(&format!("{}/nowhere-{{agent}}", dir.display()), "2,2,1");
    assert!(e.contains("no complete checkpoint under") && e.contains("nowhere-0"), "{e}");
    // One folder for three agents would give every node agent 0's adapter.
    let e = grow(&format!("{}/ckpt-0/agent-0", dir.display()), "2,2,1");
    assert!(e.contains("the job has 3 agents") && e.contains("`{agent}`"), "{e}");
    assert!(!dir.join("bad/job.toml").exists());
    let out = Command::new(env!("CARGO_BIN_EXE_comas"))
        .args([
            "grow",
            &dir.join("job.toml").display().to_string(),
            "--checkpoints",
            &format!("{}/ckpt-0/agent-{{agent}}", dir.display()),
        ])
        .args(["--to", "2,2,1", "--bridge-steps", "1", "--out", &grown.display().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("new node 3 at L2N1: a copy of node 0's adapter")
            && stderr.contains("new node 4 at L2N2: a copy of node 1's adapter"),
        "{stderr}"
    );
    let source = |k: u64| dir.join(format!("ckpt-0/agent-{k}/neuromas-e2e/step-{NEUROMAS_STEPS}"));
    let bytes = |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    // Old nodes keep their uids; the new ones copy nodes 0 and 1.
    for (uid, from) in [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1)] {
        for f in ["adapter/adapter_model.safetensors", "optimizer.safetensors"] {
            assert!(
                bytes(grown.join(format!("nodes/uid-{uid}/{f}"))) == bytes(source(from).join(f)),
                "node {uid}'s {f} is not node {from}'s"
            );
        }
    }
    let adam_steps = |p: PathBuf| {
        serde_json::from_str::<Value>(&std::fs::read_to_string(p.join("state.json")).unwrap())
            .unwrap()["adam_steps"]
            .as_u64()
            .unwrap()
    };
    let trained = adam_steps(source(0));
    assert_eq!(trained, NEUROMAS_STEPS);
    let history: Value =
        serde_json::from_str(&std::fs::read_to_string(grown.join("growth.json")).unwrap()).unwrap();
    assert_eq!(history[0]["after"]["uids"], serde_json::json!([[0, 1], [3, 4], [2]]));

    // The grown job, with this run's learner addresses.
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let mut job: toml::Table =
        toml::from_str(&std::fs::read_to_string(grown.join("job.toml")).unwrap()).unwrap();
    for (a, port) in job["agents"].as_array_mut().unwrap().iter_mut().zip(&ports) {
        a.as_table_mut()
            .unwrap()
            .insert("learner".into(), format!("http://127.0.0.1:{port}").into());
    }
    std::fs::write(grown.join("job.toml"), toml::to_string(&job).unwrap()).unwrap();
    let c = Cluster::launch(&grown, ports, 1, &[], NEUROMAS_STEPS, &["--max-episodes", "4"]);
    let id = c.submit().await;
    c.finished(&id).await;
    for m in c.metrics_log() {
        let step = m["step"].as_u64().unwrap();
        let calls: Vec<Option<u64>> =
            ["1", "2", "3"].iter().map(|l| m["completion_tokens"][l]["count"].as_u64()).collect();
        assert_eq!(calls, vec![Some(8), Some(8), Some(4)], "{m}");
        let text =
            std::fs::read_to_string(grown.join(format!("out/episodes/step-{step:05}.jsonl")))
                .unwrap();
        for l in text.lines() {
            let r = &serde_json::from_str::<Value>(l).unwrap()["record"];
            let agents: Vec<u64> = r["turns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["agent"].as_u64().unwrap())
                .collect();
            assert_eq!(agents, vec![0, 1, 3, 4, 2], "{r}");
            // Identity wiring in the bridge step only.
            let bridged: Vec<u64> = if step == 0 { vec![2] } else { vec![] };
            assert_eq!(r["graph"]["identity_layers"], serde_json::json!(bridged), "step {step}");
        }
    }
    // Every learner went on from the moments it was given: one Adam step per job step.
    for uid in 0..5 {
        let ckpt = grown.join(format!("ckpt-{uid}/neuromas-e2e-grown/step-{NEUROMAS_STEPS}"));
        assert_eq!(adam_steps(ckpt), trained + NEUROMAS_STEPS, "node {uid}");
    }
}
