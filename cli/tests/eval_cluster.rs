//! Evaluations on a cluster's workers (`comas eval --coordinator`): the same calls as on one
//! machine, and a rerun that picks up an interrupted evaluation job.
mod harness;

use comas_proto::v1 as pb;
use harness::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `comas eval` as a user runs it, `--coordinator` added when `url` is given: every setup on 3
/// arithmetic questions of the f32 fixture model, at most 6 new tokens per call.
fn eval_cmd(out: &Path, url: Option<&str>, extra: &[&str]) -> std::process::Output {
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32");
    let mut args = s(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--setup",
        "all",
        "--bench",
        "arithmetic",
        "--arithmetic-questions",
        "3",
    ]);
    args.extend(s(&["--max-new-tokens", "6", "--out", out.to_str().unwrap()]));
    if let Some(url) = url {
        args.extend(s(&["--coordinator", url, "--dtype", "float32"]));
    }
    args.extend(s(extra));
    Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(&args)
        .env("COMAS_THREADS", "1")
        .output()
        .unwrap()
}

/// Every call of a results file: (setup, question id, call) -> (label, model, response).
fn eval_calls(
    out: &Path,
) -> std::collections::BTreeMap<(String, String, u64), (String, String, String)> {
    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let mut calls = std::collections::BTreeMap::new();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        for c in r["calls"].as_array().unwrap() {
            let key = (
                r["setup"].as_str().unwrap().to_string(),
                r["id"].as_str().unwrap().to_string(),
                c["call"].as_u64().unwrap(),
            );
            let text = |k: &str| c[k].as_str().unwrap().to_string();
            calls.insert(key, (text("label"), text("model"), text("response")));
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluation_on_the_cluster_workers_makes_the_calls_of_one_machine() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::launch(dir.path(), Vec::new(), 2, &[], 1, &[]);
    let url = format!("http://127.0.0.1:{}", cluster.coord_port);
    cluster.client().await;
    let here = dir.path().join("here");
    let o = tokio::task::block_in_place(|| eval_cmd(&here, None, &[]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // First one question per setup on the cluster, then the rest: a resumed run's subset keeps
    // each question's seeds.
    let there = dir.path().join("there");
    let o = tokio::task::block_in_place(|| eval_cmd(&there, Some(&url), &["--limit", "1"]));
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stderr), cluster.logs());
    let o = tokio::task::block_in_place(|| eval_cmd(&there, Some(&url), &[]));
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stderr), cluster.logs());
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["graded"], 12, "3 questions x 4 setups");
    // 3 x (1 + 6 + 7 + 5) calls, each the same prompt, model and reply as on one machine.
    let (local, remote) = (eval_calls(&here), eval_calls(&there));
    assert_eq!(remote.len(), 57);
    assert_eq!(remote, local);
    // One job per setup and run, each an evaluation of one step, nothing trained.
    let jobs =
        cluster.client().await.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs;
    assert_eq!(jobs.len(), 8);
    let (mut episodes, mut calls) = (0, 0);
    for j in &jobs {
        assert_eq!(
            (j.state, j.steps_done, j.total_steps),
            (pb::JobState::Succeeded as i32, 1, 1),
            "{j:?}"
        );
        assert!(j.name.starts_with("eval-arithmetic-"), "{}", j.name);
        let metrics: Value = serde_json::from_str(
            std::fs::read_to_string(&j.metrics_path).unwrap().lines().next().unwrap(),
        )
        .unwrap();
        episodes += metrics["episodes"].as_u64().unwrap();
        calls += metrics["calls"].as_u64().unwrap();
    }
    assert_eq!((episodes, calls), (12, 57), "each question ran once on the cluster");
    // A rerun has nothing left to ask the cluster.
    let o = tokio::task::block_in_place(|| eval_cmd(&there, Some(&url), &[]));
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stderr).contains("0 calls, 0 tokens"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        cluster
            .client()
            .await
            .list_jobs(pb::ListJobsRequest {})
            .await
            .unwrap()
            .into_inner()
            .jobs
            .len(),
        8
    );
}

/// A job an interrupted `comas eval --coordinator` left behind (`remote-<setup>.json`) is
/// picked up by the rerun: the client is killed while its job waits for a worker, the job is
/// cancelled, and the rerun resumes that job instead of submitting its questions again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_picks_up_the_evaluation_job_of_an_interrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::launch(dir.path(), Vec::new(), 0, &[], 1, &[]);
    let url = format!("http://127.0.0.1:{}", cluster.coord_port);
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32");
    let eval = |out: &Path| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_comas"));
        c.args([
            "eval",
            "--model",
            model.to_str().unwrap(),
            "--setup",
            "vanilla",
            "--bench",
            "arithmetic",
            "--arithmetic-questions",
            "3",
        ])
        .args(["--max-new-tokens", "6", "--coordinator", &url, "--out", out.to_str().unwrap()])
        .env("COMAS_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        c
    };
    // The client does not wait for a coordinator that is still starting: wait here.
    let mut c = cluster.client().await;
    let part = dir.path().join("part");
    let mut first = eval(&part).spawn().unwrap();
    let pending = part.join("remote-vanilla.json");
    let started = Instant::now();
    while !pending.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "the job was never submitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let text = std::fs::read_to_string(&pending).unwrap();
    let id = serde_json::from_str::<Value>(&text).unwrap()["job_id"].as_str().unwrap().to_string();
    c.cancel_job(pb::CancelJobRequest { job_id: id.clone() }).await.unwrap();
    cluster.wait_for(&id, 30, "the cancel", |s| s.state == pb::JobState::Cancelled as i32).await;
    cluster.add_worker();
    let o = tokio::task::block_in_place(|| eval(&part).output().unwrap());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}\n{}", cluster.logs());
    assert!(err.contains(&format!("vanilla: picking up job {id} (cancelled)")), "{err}");
    assert!(!pending.exists());
    let jobs = c.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs;
    assert_eq!(jobs.len(), 1, "no question was submitted twice");
    assert_eq!(jobs[0].state, pb::JobState::Succeeded as i32);
    // The same replies as a run that was never interrupted.
    let whole = dir.path().join("whole");
    let o = tokio::task::block_in_place(|| eval(&whole).output().unwrap());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(eval_calls(&part).len(), 3);
    assert_eq!(eval_calls(&part), eval_calls(&whole));
}
