//! MAPPA end to end: a coached chain of agents with a sandboxed tool, a coach behind an
//! OpenAI-compatible endpoint, and a DSBench chain sharing its workspace.
mod harness;

use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use harness::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mappa_chain_is_coached_and_each_scored_action_trains_its_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_mappa_job(tmp.path(), &ports);
    let c = Cluster::launch(tmp.path(), ports, 1, &[], MAPPA_STEPS, &["--max-episodes", "4"]);
    let id = c.submit().await;
    c.finished(&id).await;
    let log = c.metrics_log();
    assert_eq!(log.len() as u64, MAPPA_STEPS, "each step logged exactly once");
    // Coach replies with and without a score, in step 0 (whose weights are the base models',
    // so its games are the same in every run) and in all steps.
    let (mut scored, mut unscored, mut first_step) = (0, 0, (0, 0));
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        assert_mappa_step_counts(m);
        // The saved records: contexts grow by exactly the action and its observation, and a coach
        // reply without a score (even after the retry) leaves the action without a reward.
        let text =
            std::fs::read_to_string(tmp.path().join(format!("out/episodes/step-{step:05}.jsonl")))
                .unwrap();
        let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(records.len() as u64, EPISODES);
        for r in &records {
            let actions = r["record"]["actions"].as_array().unwrap();
            assert_eq!(actions.len(), 4);
            let (first, second) = (&actions[1], &actions[2]);
            let (m0, m1) =
                (first["messages"].as_array().unwrap(), second["messages"].as_array().unwrap());
            assert_eq!(m1.len(), m0.len() + 2);
            assert_eq!(m1[..m0.len()], m0[..]);
            assert_eq!(
                m1[m0.len()],
                serde_json::json!({"role": "assistant", "content": first["text"]})
            );
            assert_eq!(
                m1[m0.len() + 1],
                serde_json::json!({"role": "user", "content": first["observation"]})
            );
            assert!(
                first["observation"]
                    .as_str()
                    .unwrap()
                    .starts_with("<tool_response>\n[Execution failed: wall-clock timeout]"),
                "{}",
                first["observation"]
            );
            assert!(first["text"]
                .as_str()
                .unwrap()
                .ends_with("```python\nimport os\nos.fork()\nwhile 1:0\n```"));
            for a in actions {
                let coach = &a["coach"];
                let replies: Vec<&str> = coach["replies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap())
                    .collect();
                let read = replies.iter().find_map(|t| {
                    t.split_once("PROCESS_SCORE:").map(|(_, d)| d[..1].parse::<f64>().unwrap())
                });
                assert_eq!(coach["process_score"].as_f64(), read, "{coach}");
                if step == 0 {
                    if read.is_some() {
                        first_step.0 += 1;
                    } else {
                        first_step.1 += 1;
                    }
                }
                match read {
                    Some(_) => scored += 1,
                    None => {
                        // The failure value: retried once, no score, no fallback, no sample.
                        assert_eq!(
                            (
                                replies.len(),
                                coach["retry_attempted"].as_bool(),
                                coach["fallback_used"].as_bool()
                            ),
                            (2, Some(true), Some(false))
                        );
                        unscored += 1;
                    }
                }
            }
        }
    }
    eprintln!(
        "coach replies scored / unscored: step 0 {first_step:?}, all steps ({scored}, {unscored})"
    );
    assert!(
        first_step.0 > 0 && first_step.1 > 0,
        "the coach both scored and failed to score in step 0 ({first_step:?})"
    );
    assert_eq!(running_sandbox_programs(), 0, "no forked program outlived its run");
}

/// Every coach reply of step 0, by episode (in spec order) and action.
fn coach_replies(dir: &Path) -> Vec<Vec<Vec<String>>> {
    let text = std::fs::read_to_string(dir.join("out/episodes/step-00000.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            let actions = r["record"]["actions"].as_array().unwrap().clone();
            actions
                .iter()
                .map(|a| {
                    a["coach"]["replies"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_str().unwrap().to_string())
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// A coach behind an OpenAI-compatible endpoint (`comas serve` on the coach's folder) gives the
/// chain exactly the replies that the workers' own copy of it gives: step 0 of the MathChat job
/// (base weights everywhere, so the same games), run both ways, every coach reply compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coach_behind_an_openai_endpoint_replies_as_the_workers_copy_does() {
    let one_step = |dir: &Path, frozen: &str| {
        let job = std::fs::read_to_string(dir.join("job.toml")).unwrap();
        let job = job
            .replace(&format!("steps = {MAPPA_STEPS}\n"), "steps = 1\n")
            .replace("[[frozen]]\nname = \"coach\"\nmodel = \"coach\"\n", frozen);
        std::fs::write(dir.join("job.toml"), job).unwrap();
    };
    let run = |dir: &Path, ports: Vec<u16>| {
        let dir = dir.to_path_buf();
        async move {
            let c = Cluster::launch(&dir, ports, 1, &[], 1, &["--max-episodes", "4"]);
            let id = c.submit().await;
            c.finished(&id).await;
            coach_replies(&dir)
        }
    };
    let local = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_mappa_job(local.path(), &ports);
    one_step(local.path(), "[[frozen]]\nname = \"coach\"\nmodel = \"coach\"\n");
    let want = run(local.path(), ports).await;

    let remote = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_mappa_job(remote.path(), &ports);
    let port = free_port();
    let _server = spawn(
        remote.path(),
        "serve",
        &s(&[
            "serve",
            "--model",
            remote.path().join("coach").to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--served-name",
            "judge",
        ]),
    );
    one_step(
        remote.path(),
        &format!("[[frozen]]\nname = \"coach\"\nendpoint = \"http://127.0.0.1:{port}/v1\"\nendpoint_model = \"judge\"\nmax_attempts = 1\n"),
    );
    let got = run(remote.path(), ports).await;
    let calls: usize = want.iter().flatten().map(Vec::len).sum();
    assert_eq!(
        (want.len() as u64, calls > EPISODES as usize * 4),
        (EPISODES, true),
        "every action coached, some retried"
    );
    assert_eq!(got, want);
}

/// Guided tails that make the tiny DSBench agents write working programs (regex-escaped).
const DS_ENGINEER: &str = r"```python\nimport os\nopen\('X_test\.pkl','w'\)\.write\('x'\)\nprint\(sorted\(os\.listdir\('\.'\)\)\)\n```";
const DS_MODELER: &str = r"```python\nimport os\nopen\('model\.pkl','w'\)\.write\('m'\)\nprint\(sorted\(os\.listdir\('\.'\)\)\)\n```";
const DS_ANALYST: &str = r"```python\nimport csv\nr=list\(csv\.reader\(open\('test\.csv'\)\)\)\[1:\]\nopen\('submission\.csv','w'\)\.write\('id,y\\n'\+''\.join\(x\[0\]\+',1\\n' for x in r\)\)\nprint\(len\(r\)\)\n```";

/// MAPPA's DSBench chain on tiny models and two tasks of the shipped set: each run starts from
/// the shared workspace (the data, then what earlier agents saved), the Analyst's submission is
/// scored against the hidden answers, and the scores reach the metrics log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dsbench_chain_shares_its_workspace_and_its_submission_is_scored() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let ports = vec![free_port(), free_port()];
    for (name, seed) in [("model-0", 3), ("model-1", 4), ("coach", 9)] {
        write_model(&d.join(name), &TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) })
            .unwrap();
    }
    let tasks = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/dsbench-mini/tasks.jsonl"),
    )
    .unwrap();
    let two: Vec<&str> = tasks.lines().take(2).collect();
    std::fs::write(d.join("tasks.jsonl"), two.join("\n")).unwrap();
    let agent = |k: usize| {
        format!("[[agents]]\nmodel = \"model-{k}\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-4\ntrain_batch_size = 4\nmicro_batch_size = 4\nmask_truncated = false\n", ports[k])
    };
    // A multi-line literal string: the programs quote with '.
    let tail = |role: &str, re: &str| {
        format!("[mappa.role_sampling.{role}]\nmax_new_tokens = 200\nmin_new_tokens = 0\nguided_suffix = '''{re}'''\n")
    };
    let job = format!(
        "name = \"dsbench-e2e\"\nseed = 5\nmethod = \"mappa\"\n[data]\ntrain = \"tasks.jsonl\"\nshuffle = false\n[schedule]\nquestions_per_step = 2\nsteps = 1\nlearner_timeout_secs = 120\n[output]\ndir = \"out\"\nsave_episodes = true\n\
         [mappa]\npipeline = \"ds_bench\"\nagents = [0, 1, 0]\nmax_turns = [1, 1, 1]\ninstances_per_question = 2\ntool_timeout_secs = 20.0\nnorm_scope = \"global\"\n\
         [mappa.coach_sampling]\ntemperature = 1.0\nmax_new_tokens = 24\nmin_new_tokens = 0\nguided_suffix = 'PROCESS_SCORE:[0-9]'\n{}{}{}\
         [[frozen]]\nname = \"coach\"\nmodel = \"coach\"\n{}{}",
        tail("data_engineer", DS_ENGINEER),
        tail("modeler", DS_MODELER),
        tail("analyst", DS_ANALYST),
        agent(0),
        agent(1)
    );
    std::fs::write(d.join("job.toml"), job).unwrap();
    let c = Cluster::launch(d, ports, 1, &[], 1, &["--max-episodes", "4"]);
    let id = c.submit().await;
    c.finished(&id).await;
    let log = c.metrics_log();
    let m = &log[0];
    for role in ["data_engineer", "modeler", "analyst"] {
        assert_eq!(m["actions"][role]["mean"], 1.0, "{role}: {m}");
    }
    assert_eq!(
        (m["tool_calls"].as_u64(), m["tool_success_rate"]["mean"].as_f64()),
        (Some(12), Some(1.0)),
        "{m}"
    );
    assert_eq!(
        (m["ds_success_rate"]["mean"].as_f64(), m["ds_success_rate"]["count"].as_u64()),
        (Some(1.0), Some(4))
    );
    // Every prediction is 1: accuracy is the share of positives in each task's hidden answers.
    let positives = |line: &str| {
        let t: Value = serde_json::from_str(line).unwrap();
        let answers: Vec<&str> = t["answer"].as_str().unwrap().lines().skip(1).collect();
        answers.iter().filter(|l| l.ends_with(",1")).count() as f64 / answers.len() as f64
    };
    let want = (positives(two[0]) + positives(two[1])) / 2.0;
    assert!((m["ds_metrics"]["accuracy"]["mean"].as_f64().unwrap() - want).abs() < 1e-12, "{m}");
    // `norm_scope = "global"`: both learners whitened with the moments of all their returns,
    // pooled by the coordinator; recomputed here from each learner's own moments.
    let own: Vec<(f64, f64, f64)> = (0..2)
        .map(|k| {
            let t = &m["agents"][k]["train"];
            let g = &t["return_moments"][""];
            (
                g["count"].as_f64().unwrap(),
                g["mean"].as_f64().unwrap(),
                t["advantage_mean"].as_f64().unwrap(),
            )
        })
        .collect();
    let tokens: f64 = own.iter().map(|o| o.0).sum();
    let mean = own.iter().map(|o| o.0 * o.1).sum::<f64>() / tokens;
    let p = &m["pooled_whitening"]["all"];
    assert_eq!(p["tokens"].as_f64(), Some(tokens), "{p}");
    assert!((p["mean"].as_f64().unwrap() - mean).abs() < 1e-9, "{p}");
    let std = p["std"].as_f64().unwrap();
    for (k, (_, own_mean, advantage_mean)) in own.iter().enumerate() {
        let want = (own_mean - mean) / std;
        assert!(
            (advantage_mean - want).abs() < 1e-6,
            "agent {k}: advantage mean {advantage_mean}, pooled offset {want}"
        );
    }
    assert!(
        own.iter().any(|o| o.2.abs() > 1e-3),
        "the pooled whitening moved some agent's mean advantage: {own:?}"
    );
    let text = std::fs::read_to_string(d.join("out/episodes/step-00000.jsonl")).unwrap();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let actions = r["record"]["actions"].as_array().unwrap();
        let obs = |i: usize| actions[i]["observation"].as_str().unwrap().to_string();
        // The Modeler's fresh folder holds what the Data Engineer saved.
        assert!(
            obs(1).contains("['X_test.pkl', 'main.py', 'model.pkl', 'test.csv', 'train.csv']"),
            "{}",
            obs(1)
        );
        assert!(obs(2).contains("40"), "{}", obs(2));
        let ws: Vec<&str> = actions[2]["workspace"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(ws, vec!["X_test.pkl", "model.pkl", "test.csv", "train.csv"]);
        let o = &r["record"]["ds_outcome"];
        assert_eq!(
            (o["success"].as_bool(), o["predictions"].as_u64(), o["expected"].as_u64()),
            (Some(true), Some(40), Some(40)),
            "{o}"
        );
    }
}
