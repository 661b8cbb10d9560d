//! Weight broadcast: the time until W rollout-worker processes all hold a new version of a
//! model's full f32 weights, and the bytes the learner sent, with every worker pulling from
//! the learner ("direct") and with the workers in a relay chain (each pulls from the one
//! before while that one is still receiving), at W = 1, 2, 4 and 8. The learner runs in this
//! process on loopback and trains one step before each broadcast, so every round sends a new
//! version.
//!
//! cargo bench -p comas --bench broadcast
//! COMAS_BENCH_MODEL=DIR uses that model folder (default: the 40M-parameter bench model).
use comas_model::tiny::{write_model, TinySpec};
use comas_proto::v1 as pb;
use comas_proto::v1::learner_client::LearnerClient;
use comas_proto::v1::rollout_worker_client::RolloutWorkerClient;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const WORKERS: [usize; 4] = [1, 2, 4, 8];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A counter from a Prometheus endpoint.
fn scrape(port: u16, name: &str) -> f64 {
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(sock, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    sock.read_to_string(&mut body).unwrap();
    // Summed over the label sets (`name{agent="0"} 123`).
    body.lines()
        .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Worker {
    address: String,
    client: RolloutWorkerClient<Channel>,
    child: Child,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_worker(model: &Path) -> Worker {
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(["worker", "--listen", &address])
        .env("COMAS_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker");
    let started = Instant::now();
    let mut client = loop {
        match RolloutWorkerClient::connect(format!("http://{address}")).await {
            Ok(c) => break c,
            Err(e) if started.elapsed() > Duration::from_secs(60) => {
                panic!("worker {address} did not come up: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let agents = vec![pb::AgentPolicy {
        agent_id: 0,
        model_dir: model.display().to_string(),
        full_weights: true,
        ..Default::default()
    }];
    client
        .load_policies(pb::LoadPoliciesRequest {
            agents,
            dtype: "float32".into(),
            ..Default::default()
        })
        .await
        .expect("load policies");
    Worker { address, client, child }
}

/// One training step on fixed experiences and a publish: the learner's next version.
async fn next_version(learner: &mut LearnerClient<Channel>, step: u64) -> pb::WeightsPublished {
    let header = pb::TrainHeader {
        step_id: format!("bench-{step}"),
        num_experiences: 4,
        ..Default::default()
    };
    let msgs: Vec<pb::TrainRequest> =
        std::iter::once(pb::TrainRequest { item: Some(pb::train_request::Item::Header(header)) })
            .chain((0..4i64).map(|i| pb::TrainRequest {
                item: Some(pb::train_request::Item::Experience(pb::Experience {
                    prompt_ids: vec![11, 12, 13],
                    completion_ids: vec![20 + i, 30, 40],
                    reward: Some(i as f64),
                    finish_reason: pb::FinishReason::Stop as i32,
                    ..Default::default()
                })),
            }))
            .collect();
    learner.train(tokio_stream::iter(msgs)).await.expect("train");
    learner
        .publish_weights(pb::PublishWeightsRequest::default())
        .await
        .expect("publish")
        .into_inner()
}

/// Every worker takes `version` at once; returns the seconds until the last holds it.
async fn broadcast(workers: &[Worker], learner: &str, version: u64, chain: bool) -> f64 {
    let started = Instant::now();
    let pulls = workers.iter().enumerate().map(|(i, w)| {
        let req = if chain && i > 0 {
            pb::UpdateWeightsRequest {
                agent_id: 0,
                version,
                source: workers[i - 1].address.clone(),
                relay: true,
                fallback_source: learner.to_string(),
            }
        } else {
            pb::UpdateWeightsRequest {
                agent_id: 0,
                version,
                source: learner.to_string(),
                ..Default::default()
            }
        };
        let mut c = w.client.clone();
        async move {
            let r = c.update_weights(req).await.expect("update weights").into_inner();
            assert_eq!(r.relayed, chain && i > 0, "worker {i} fell back to the learner: {r:?}");
        }
    });
    futures_join_all(pulls).await;
    started.elapsed().as_secs_f64()
}

async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    fs: impl Iterator<Item = F>,
) {
    let mut set = tokio::task::JoinSet::new();
    for f in fs {
        set.spawn(f);
    }
    while let Some(r) = set.join_next().await {
        r.expect("pull task");
    }
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let model: PathBuf = match std::env::var("COMAS_BENCH_MODEL") {
        Ok(d) => d.into(),
        Err(_) => {
            let d = tmp.path().join("model");
            write_model(&d, &TinySpec::bench()).expect("write bench model");
            d
        }
    };
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let learner_addr = listener.local_addr().unwrap().to_string();
        let metrics_port = free_port();
        let settings = comas_learner::server::ServerSettings {
            agents: vec![(
                0,
                comas_learner::engine::EngineSettings {
                    model_dir: model.clone(),
                    adapter_dir: None,
                    reference_dir: None,
                    config: comas_learner::TrainConfig {
                        lr: 1e-5,
                        train_batch_size: 4,
                        micro_batch_size: 4,
                        ..Default::default()
                    },
                    checkpoint_dir: None,
                    keep_checkpoints: 1,
                    resume: false,
                    init_from: None,
                    memory_bytes: None,
                },
            )],
            listener,
            metrics_listen: Some(format!("127.0.0.1:{metrics_port}").parse().unwrap()),
            allowed_roots: Default::default(),
            tls: None,
            health_listen: None,
        };
        tokio::spawn(comas_learner::server::serve(settings, std::future::pending::<()>()));
        let mut learner = loop {
            if let Ok(mut l) = LearnerClient::connect(format!("http://{learner_addr}")).await {
                if l.info(pb::InfoRequest {}).await.is_ok() {
                    break l;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut workers = Vec::new();
        for _ in 0..*WORKERS.iter().max().unwrap() {
            workers.push(start_worker(&model).await);
        }
        let sent = || scrape(metrics_port, "comas_learner_weight_bytes_sent_total");
        println!(
            "model {} ; learner and up to {} worker processes on loopback",
            model.display(),
            workers.len()
        );
        println!(
            "{:>3} {:>7} {:>10} {:>12} {:>12} {:>10}",
            "W", "mode", "MB/version", "seconds", "vs W=1", "learner MB"
        );
        let mut step = 0;
        for chain in [false, true] {
            let mut first = None;
            for w in WORKERS {
                step += 1;
                let p = next_version(&mut learner, step).await;
                let before = sent();
                let secs = broadcast(&workers[..w], &learner_addr, p.version, chain).await;
                let learner_mb = (sent() - before) / 1e6;
                let base = *first.get_or_insert(secs);
                let mode = if chain { "chain" } else { "direct" };
                println!(
                    "{w:>3} {mode:>7} {:>10.1} {secs:>12.3} {:>11.2}× {learner_mb:>10.1}",
                    p.total_bytes as f64 / 1e6,
                    secs / base
                );
            }
        }
    });
}
