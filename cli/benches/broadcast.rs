//! Weight broadcast: the time until W rollout-worker processes all hold a new version of a
//! model's full f32 weights, and the bytes the learner sent, with every worker pulling from
//! the learner ("direct"), with the workers in a relay chain (each pulls from the one before
//! while that one is still receiving) and in a relay tree of fan-out 2, at W = 1, 2, 4 and 8.
//! The learner runs in this process and trains one step before each broadcast, so every round
//! sends a new version.
//!
//! cargo bench -p comas --bench broadcast
//! COMAS_BENCH_MODEL=DIR uses that model folder (default: the 40M-parameter bench model).
//! COMAS_BENCH_LINK_MBIT=1000 puts each worker in a network namespace of its own behind a link
//! of that rate, and the learner behind one too (the emulated cluster of
//! cli/tests/harness/netns.rs; root and iptables, scripts/setup-netns.sh): the case where the
//! network, not the cores, binds. Without it everything runs on loopback.
#[path = "../tests/harness/netns.rs"]
#[allow(dead_code)]
mod netns;
use comas_model::tiny::{write_model, TinySpec};
use comas_proto::v1 as pb;
use comas_proto::v1::learner_client::LearnerClient;
use comas_proto::v1::rollout_worker_client::RolloutWorkerClient;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const WORKERS: [usize; 4] = [1, 2, 4, 8];

fn free_port() -> u16 {
    comas_service::port::spare_port().unwrap()
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

/// A worker process listening on `ip`, in namespace `ns` when given.
async fn start_worker(model: &Path, ip: &str, ns: Option<&str>) -> Worker {
    let port = free_port();
    let address = format!("{ip}:{port}");
    let child = netns::command_in(ns, env!("CARGO_BIN_EXE_comas"))
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

/// Who each worker pulls from: the learner, or an earlier worker of the relay.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Direct,
    Chain,
    /// Worker i pulls from worker (i - 1) / 2: each passes the version on to two.
    Tree,
}

impl Mode {
    fn source(self, i: usize) -> Option<usize> {
        match self {
            _ if i == 0 => None,
            Mode::Direct => None,
            Mode::Chain => Some(i - 1),
            Mode::Tree => Some((i - 1) / 2),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Chain => "chain",
            Mode::Tree => "tree-2",
        }
    }
}

/// Every worker takes `version` at once; returns the seconds until the last holds it.
async fn broadcast(workers: &[Worker], learner: &str, version: u64, mode: Mode) -> f64 {
    let started = Instant::now();
    let pulls = workers.iter().enumerate().map(|(i, w)| {
        let req = if let Some(from) = mode.source(i) {
            pb::UpdateWeightsRequest {
                agent_id: 0,
                version,
                source: workers[from].address.clone(),
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
            let relayed = mode.source(i).is_some();
            assert_eq!(r.relayed, relayed, "worker {i} fell back to the learner: {r:?}");
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
    let link_mbit: Option<f64> = std::env::var("COMAS_BENCH_LINK_MBIT").ok().map(|v| {
        v.parse().unwrap_or_else(|_| panic!("COMAS_BENCH_LINK_MBIT={v:?}: a rate in Mbit/s"))
    });
    let most = *WORKERS.iter().max().unwrap();
    let names: Vec<String> = (0..most).map(|i| format!("worker-{i}")).collect();
    let net = link_mbit.map(|rate| {
        let shape = netns::Shape { rate_mbit: rate };
        let net =
            netns::Net::new(&names.iter().map(String::as_str).collect::<Vec<_>>(), Some(shape));
        // This process's own link is the learner's.
        net.shape_leg(shape);
        net
    });
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let learner_ip = net.as_ref().map_or("127.0.0.1".to_string(), |n| n.leg_ip());
        let listener = tokio::net::TcpListener::bind((learner_ip.as_str(), 0)).await.unwrap();
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
        for name in &names {
            let (ip, ns) = match &net {
                Some(n) => (n.ip(name).to_string(), n.ns_of(name)),
                None => ("127.0.0.1".to_string(), None),
            };
            workers.push(start_worker(&model, &ip, ns).await);
        }
        let sent = || scrape(metrics_port, "comas_learner_weight_bytes_sent_total");
        let place = match link_mbit {
            Some(rate) => format!("each in a network namespace behind a {rate} Mbit/s link"),
            None => "on loopback".to_string(),
        };
        println!(
            "model {} ; learner and up to {} worker processes {place}",
            model.display(),
            workers.len()
        );
        println!(
            "{:>3} {:>7} {:>10} {:>10} {:>8} {:>10} {:>14}",
            "W", "mode", "MB/version", "seconds", "vs W=1", "learner MB", "MB/s a worker"
        );
        let mut step = 0;
        for mode in [Mode::Direct, Mode::Chain, Mode::Tree] {
            let mut first = None;
            for w in WORKERS {
                step += 1;
                let p = next_version(&mut learner, step).await;
                let before = sent();
                let secs = broadcast(&workers[..w], &learner_addr, p.version, mode).await;
                let learner_mb = (sent() - before) / 1e6;
                let base = *first.get_or_insert(secs);
                let mb = p.total_bytes as f64 / 1e6;
                println!(
                    "{w:>3} {:>7} {mb:>10.1} {secs:>10.3} {:>7.2}× {learner_mb:>10.1} {:>14.1}",
                    mode.name(),
                    secs / base,
                    mb / secs
                );
            }
        }
    });
}
