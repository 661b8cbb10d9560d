//! The rollout worker over real loopback gRPC: CoMAS episodes with continuous batching, logprob
//! agreement with scoring, identical greedy results at 1 and 64 concurrent episodes, a weight
//! update from a real learner in the middle of a run, a relay chain of workers, draining, and
//! bad input.
use comas_model::tiny::{write_model, TinySpec};
use comas_model::{Architecture, CausalLm};
use comas_proto::v1 as pb;
use comas_proto::v1::learner_client::LearnerClient;
use comas_proto::v1::rollout_worker_client::RolloutWorkerClient;
use comas_rollout_worker::engine::EngineSettings;
use comas_rollout_worker::server::{serve, ServerSettings};
use comas_workflow::comas::{plan_batch, CoMasConfig, InstancePlan, PlanSeed, Trajectory};
use comas_workflow::{Role, SamplingSpec, TaskKind, TaskRecord};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

fn config(max_new: u32) -> CoMasConfig {
    let greedy = SamplingSpec {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens: max_new,
        min_new_tokens: 0,
        guided_suffix: None,
        fit_context: false,
    };
    let mut c = CoMasConfig {
        num_agents: 2,
        num_rounds: 2,
        num_references: 1,
        instances_per_question: 1,
        ..Default::default()
    };
    c.sampling.solver = greedy.clone();
    c.sampling.evaluator = greedy.clone();
    c.sampling.scorer = greedy;
    c
}

fn question(i: usize) -> TaskRecord {
    TaskRecord {
        prompt: format!("What is {i} + {}?", i * 3 % 7),
        answer: format!("{}", i + i * 3 % 7),
        task: TaskKind::Math,
        id: format!("q{i}"),
        source: None,
        files: Default::default(),
    }
}

fn specs(cfg: &CoMasConfig, n: usize, tag: &str) -> Vec<pb::EpisodeSpec> {
    let plan = plan_batch(cfg, n, PlanSeed { global: 7, step: 1, shard: 0 }).unwrap();
    plan.instances
        .iter()
        .enumerate()
        .map(|(i, p): (usize, &InstancePlan)| pb::EpisodeSpec {
            episode_id: format!("{tag}-{i}"),
            config_json: serde_json::to_string(cfg).unwrap(),
            question_json: serde_json::to_string(&question(i)).unwrap(),
            plan_json: serde_json::to_string(p).unwrap(),
            instance: i as u32,
            seed: 1000 + i as u64,
            method: "comas".into(),
        })
        .collect()
}

async fn start_worker() -> (String, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let settings = ServerSettings {
        listener,
        metrics_listen: None,
        engine: EngineSettings {
            device: Device::Cpu,
            max_running: 256,
            max_batch_tokens: 1 << 20,
            prefill_chunk: 64,
            share_prompts: true,
            vllm: None,
            default_engine: comas_rollout_worker::engine::EngineKind::Comas,
            device_name: "cpu".into(),
        },
        drain_timeout: Duration::from_secs(60),
        weight_timeout: Duration::from_secs(60),
        relay: true,
        tls: None,
        health_listen: None,
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(async move {
        serve(settings, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (addr, tx, h)
}

async fn client(addr: &str) -> RolloutWorkerClient<tonic::transport::Channel> {
    for _ in 0..100 {
        if let Ok(c) = RolloutWorkerClient::connect(addr.to_string()).await {
            return c.max_decoding_message_size(64 << 20);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("worker did not come up");
}

async fn load(c: &mut RolloutWorkerClient<tonic::transport::Channel>, model: &Path, full: bool) {
    load_agents(c, model, full, 2).await
}

async fn load_agents(
    c: &mut RolloutWorkerClient<tonic::transport::Channel>,
    model: &Path,
    full: bool,
    n: u32,
) {
    let agents = (0..n)
        .map(|a| pb::AgentPolicy {
            agent_id: a,
            model_dir: model.display().to_string(),
            adapter_dir: String::new(),
            full_weights: full,
            ..Default::default()
        })
        .collect();
    c.load_policies(pb::LoadPoliciesRequest {
        agents,
        dtype: "float32".into(),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Sends `specs` on one stream and collects every result by episode id.
async fn run(
    c: &mut RolloutWorkerClient<tonic::transport::Channel>,
    specs: Vec<pb::EpisodeSpec>,
) -> BTreeMap<String, Trajectory> {
    let n = specs.len();
    let mut out = c.run_episodes(tokio_stream::iter(specs)).await.unwrap().into_inner();
    let mut got = BTreeMap::new();
    while let Some(r) = out.message().await.unwrap() {
        assert!(r.error.is_empty(), "episode {} failed: {}", r.episode_id, r.error);
        let t: Trajectory = serde_json::from_str(&r.trajectory_json).unwrap();
        assert_eq!(r.turns as usize, t.turns.len());
        assert!(got.insert(r.episode_id, t).is_none(), "an episode came back twice");
    }
    assert_eq!(got.len(), n, "every episode comes back exactly once");
    got
}

type Learner = LearnerClient<tonic::transport::Channel>;

/// Starts a real learner for agent 0 on loopback; returns its address, a ready client and the
/// stop switch.
async fn start_learner(
    model_dir: &Path,
    config: comas_learner::TrainConfig,
    ckpt: &Path,
) -> (String, Learner, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let settings = comas_learner::server::ServerSettings {
        agents: vec![(
            0,
            comas_learner::engine::EngineSettings {
                model_dir: model_dir.to_path_buf(),
                adapter_dir: None,
                reference_dir: None,
                config,
                checkpoint_dir: Some(ckpt.to_path_buf()),
                keep_checkpoints: 3,
                resume: false,
                init_from: None,
                memory_bytes: None,
            },
        )],
        listener,
        metrics_listen: None,
        allowed_roots: Default::default(),
        tls: None,
        health_listen: None,
    };
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(comas_learner::server::serve(settings, async {
        let _ = rx.await;
    }));
    loop {
        if let Ok(mut l) = LearnerClient::connect(format!("http://{addr}")).await {
            if l.info(pb::InfoRequest {}).await.is_ok() {
                return (addr, l, stop);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One training step on four fixed experiences, then publish: the learner's version 1.
async fn train_and_publish(learner: &mut Learner) -> pb::WeightsPublished {
    let exps: Vec<pb::TrainRequest> = std::iter::once(pb::TrainRequest {
        item: Some(pb::train_request::Item::Header(pb::TrainHeader {
            step_id: "s1".into(),
            num_experiences: 4,
            ..Default::default()
        })),
    })
    .chain((0..4).map(|i| pb::TrainRequest {
        item: Some(pb::train_request::Item::Experience(pb::Experience {
            prompt_ids: vec![421, 82, 313],
            completion_ids: vec![50 + i, 60, 70],
            reward: Some(i as f64),
            finish_reason: pb::FinishReason::Stop as i32,
            ..Default::default()
        })),
    }))
    .collect();
    learner.train(tokio_stream::iter(exps)).await.unwrap();
    let p =
        learner.publish_weights(pb::PublishWeightsRequest::default()).await.unwrap().into_inner();
    assert_eq!(p.version, 1);
    p
}

fn tiny(dir: &Path) {
    write_model(dir, &TinySpec { seed: 11, ..TinySpec::tiny(Architecture::Qwen2) }).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_episodes_match_at_1_and_64_concurrent_and_logprobs_match_scoring() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let (addr, stop, handle) = start_worker().await;
    let mut c = client(&addr).await;
    load(&mut c, dir.path(), false).await;
    let cfg = config(6);
    let all = specs(&cfg, 64, "ep");
    let together = run(&mut c, all.clone()).await;
    for (id, t) in &together {
        // l = 2, R = 2, n = 1: per round 2 solutions, 2 evaluations, 2 scores.
        assert_eq!(t.turns.len(), 12, "{id}");
        for role in [Role::Solver, Role::Evaluator, Role::Scorer] {
            assert_eq!(t.turns.iter().filter(|x| x.role == role).count(), 4, "{id} {role:?}");
        }
        for a in 0..2 {
            assert_eq!(
                t.turns.iter().filter(|x| x.role == Role::Solver && x.agent == a).count(),
                2,
                "each agent solves once per round"
            );
        }
        assert!(t.turns.iter().all(|x| x.policy_version == 0 && !x.completion_ids.is_empty()));
    }
    for spec in all.iter().take(64) {
        let alone = run(&mut c, vec![spec.clone()]).await;
        let (a, b) = (&alone[&spec.episode_id], &together[&spec.episode_id]);
        for (x, y) in a.turns.iter().zip(&b.turns) {
            assert_eq!(
                x.completion_ids, y.completion_ids,
                "{} turn {}",
                spec.episode_id, x.turn_index
            );
            assert_eq!(x.prompt_ids, y.prompt_ids);
        }
    }
    // The logprobs a worker records equal what scoring computes for the same tokens.
    let model = CausalLm::load(dir.path(), Kind::Float, Device::Cpu).unwrap();
    let mut worst: f64 = 0.0;
    for t in together.values().take(8) {
        for turn in &t.turns {
            let ids: Vec<i64> =
                turn.prompt_ids.iter().chain(&turn.completion_ids).map(|&x| x as i64).collect();
            let lp = tch::no_grad(|| {
                model
                    .token_logprobs(
                        &Tensor::from_slice(&ids).view([1, ids.len() as i64]),
                        None,
                        1.0,
                        None,
                    )
                    .unwrap()
            });
            let start = turn.prompt_ids.len() as i64 - 1;
            let want =
                Vec::<f32>::try_from(&lp.get(0).narrow(0, start, turn.completion_ids.len() as i64))
                    .unwrap();
            for (a, b) in turn.logprobs.iter().zip(&want) {
                worst = worst.max((a - b).abs() as f64);
            }
        }
    }
    eprintln!("worker vs score: max |logprob diff| = {worst:e}");
    assert!(worst <= 1e-4, "{worst:e}");
    let _ = stop.send(());
    handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_update_mid_run_changes_only_later_turns() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("model");
    tiny(&model_dir);
    // A real learner for agent 0: train one step, publish version 1.
    let ckpt = dir.path().join("ckpt");
    let cfg = comas_learner::TrainConfig {
        lr: 5e-2,
        warmup_ratio: 0.0,
        train_batch_size: 4,
        micro_batch_size: 4,
        ..Default::default()
    };
    let (learner_addr, mut learner, lstop_tx) = start_learner(&model_dir, cfg, &ckpt).await;
    let (addr, stop, handle) = start_worker().await;
    let mut c = client(&addr).await;
    load(&mut c, &model_dir, true).await;
    train_and_publish(&mut learner).await;
    let saved =
        learner.save_checkpoint(pb::SaveCheckpointRequest::default()).await.unwrap().into_inner();

    // Start a long run, update agent 0 while it decodes, then send more episodes.
    let cfg = config(12);
    let first = specs(&cfg, 16, "a");
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::EpisodeSpec>(64);
    let mut out =
        c.run_episodes(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    for s in &first {
        tx.send(s.clone()).await.unwrap();
    }
    let mut got: BTreeMap<String, Trajectory> = BTreeMap::new();
    let r = out.message().await.unwrap().unwrap();
    got.insert(r.episode_id.clone(), serde_json::from_str(&r.trajectory_json).unwrap());
    let upd = c
        .update_weights(pb::UpdateWeightsRequest {
            agent_id: 0,
            version: 1,
            source: learner_addr.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(upd.version, 1);
    assert!(upd.bytes > 0);
    let later = specs(&cfg, 4, "b");
    for s in &later {
        tx.send(s.clone()).await.unwrap();
    }
    drop(tx);
    while let Some(r) = out.message().await.unwrap() {
        assert!(r.error.is_empty(), "{}", r.error);
        got.insert(r.episode_id.clone(), serde_json::from_str(&r.trajectory_json).unwrap());
    }
    assert_eq!(got.len(), 20);
    let info = c.info(pb::WorkerInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(
        info.agents.iter().map(|a| (a.agent_id, a.version)).collect::<Vec<_>>(),
        vec![(0, 1), (1, 0)]
    );
    let (mut v0, mut v1) = (0, 0);
    for (id, t) in &got {
        // Agent 1 was never updated; agent 0's versions never go back within an episode.
        assert!(t.turns.iter().filter(|x| x.agent == 1).all(|x| x.policy_version == 0), "{id}");
        let versions: Vec<u64> =
            t.turns.iter().filter(|x| x.agent == 0).map(|x| x.policy_version).collect();
        assert!(versions.windows(2).all(|w| w[0] <= w[1]), "{id}: {versions:?}");
        if id.starts_with("b-") {
            assert!(
                versions.iter().all(|&v| v == 1),
                "episodes sent after the update use version 1: {id}"
            );
        }
        v0 += versions.iter().filter(|&&v| v == 0).count();
        v1 += versions.iter().filter(|&&v| v == 1).count();
    }
    assert!(v0 > 0 && v1 > 0, "both versions appear ({v0} / {v1})");
    // Version-1 turns were produced by exactly the learner's weights.
    let trained =
        CausalLm::load(&Path::new(&saved.path).join("model"), Kind::Float, Device::Cpu).unwrap();
    let turn = got["b-0"].turns.iter().find(|x| x.agent == 0).unwrap();
    let ids: Vec<i64> =
        turn.prompt_ids.iter().chain(&turn.completion_ids).map(|&x| x as i64).collect();
    let lp = tch::no_grad(|| {
        trained
            .token_logprobs(&Tensor::from_slice(&ids).view([1, ids.len() as i64]), None, 1.0, None)
            .unwrap()
    });
    let want = Vec::<f32>::try_from(&lp.get(0).narrow(
        0,
        turn.prompt_ids.len() as i64 - 1,
        turn.completion_ids.len() as i64,
    ))
    .unwrap();
    for (a, b) in turn.logprobs.iter().zip(&want) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
    // A version the learner does not have is refused without touching the policy.
    let err = c
        .update_weights(pb::UpdateWeightsRequest {
            agent_id: 0,
            version: 9,
            source: learner_addr.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let _ = stop.send(());
    handle.await.unwrap();
    let _ = lstop_tx.send(());
}

/// A relay chain asked all at once: the first worker pulls from the learner, each next one from
/// the worker before it while that one is still receiving. Every worker ends with the learner's
/// exact weights, the learner serves the version once, and a hop to a dead peer falls back to
/// the learner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_chain_delivers_the_learners_weights_once_and_a_broken_hop_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("model");
    tiny(&model_dir);
    let cfg = comas_learner::TrainConfig {
        lr: 5e-2,
        warmup_ratio: 0.0,
        train_batch_size: 4,
        micro_batch_size: 4,
        ..Default::default()
    };
    let (learner_addr, mut learner, lstop) =
        start_learner(&model_dir, cfg, &dir.path().join("ckpt")).await;
    let published = train_and_publish(&mut learner).await;
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (addr, stop, handle) = start_worker().await;
        let mut c = client(&addr).await;
        load(&mut c, &model_dir, true).await;
        workers.push((addr, c, stop, handle));
    }
    let ask = |c: &RolloutWorkerClient<tonic::transport::Channel>, source: &str, relay: bool| {
        let mut c = c.clone();
        let req = pb::UpdateWeightsRequest {
            agent_id: 0,
            version: 1,
            source: source.to_string(),
            relay,
            fallback_source: if relay { learner_addr.clone() } else { String::new() },
        };
        async move { c.update_weights(req).await.unwrap().into_inner() }
    };
    let (a, b, c) = tokio::join!(
        ask(&workers[2].1, &workers[1].0, true),
        ask(&workers[1].1, &workers[0].0, true),
        ask(&workers[0].1, &learner_addr, false)
    );
    let served: Vec<(&str, bool, u64)> =
        [&c, &b, &a].iter().map(|r| (r.served_by.as_str(), r.relayed, r.bytes)).collect();
    assert_eq!(
        served,
        vec![
            (learner_addr.as_str(), false, published.total_bytes),
            (workers[0].0.as_str(), true, published.total_bytes),
            (workers[1].0.as_str(), true, published.total_bytes)
        ]
    );
    // The fourth worker is sent to a peer that is gone.
    let dead = format!("127.0.0.1:{}", comas_service::port::spare_port().unwrap());
    let d = ask(&workers[3].1, &dead, true).await;
    assert_eq!(
        (d.served_by.as_str(), d.relayed, d.bytes),
        (learner_addr.as_str(), false, published.total_bytes)
    );
    // All four generate exactly alike with the new version.
    let episode = specs(&config(8), 1, "relay");
    let mut first: Option<Trajectory> = None;
    for (i, w) in workers.iter_mut().enumerate() {
        let info = w.1.info(pb::WorkerInfoRequest {}).await.unwrap().into_inner();
        assert_eq!(
            info.agents.iter().map(|a| (a.agent_id, a.version)).collect::<Vec<_>>(),
            vec![(0, 1), (1, 0)],
            "worker {i}"
        );
        // The live pull count: one whole copy, also on the worker whose relay peer was dead
        // (its count restarted with the pull from the learner).
        assert_eq!(
            info.pulls,
            vec![pb::WeightPull {
                agent_id: 0,
                version: 1,
                bytes_received: published.total_bytes,
                done: true
            }],
            "worker {i}"
        );
        let t = run(&mut w.1, episode.clone()).await.remove("relay-0").unwrap();
        assert!(t.turns.iter().any(|x| x.agent == 0 && x.policy_version == 1));
        match &first {
            None => first = Some(t),
            Some(f) => {
                for (x, y) in f.turns.iter().zip(&t.turns) {
                    assert_eq!(
                        (&x.completion_ids, &x.logprobs),
                        (&y.completion_ids, &y.logprobs),
                        "worker {i} turn {}",
                        x.turn_index
                    );
                }
            }
        }
    }
    for (_, _, stop, handle) in workers {
        let _ = stop.send(());
        handle.await.unwrap();
    }
    let _ = lstop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_draining() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let (addr, stop, handle) = start_worker().await;
    let mut c = client(&addr).await;
    // Nothing loaded yet: episodes are refused with the reason.
    let cfg = config(4);
    let mut s = specs(&cfg, 1, "x");
    let mut out = c.run_episodes(tokio_stream::iter(s.clone())).await.unwrap().into_inner();
    let r = out.message().await.unwrap().unwrap();
    assert!(r.error.contains("not loaded"), "{}", r.error);
    let err = c
        .load_policies(pb::LoadPoliciesRequest {
            agents: vec![pb::AgentPolicy {
                agent_id: 0,
                model_dir: "/nonexistent".into(),
                ..Default::default()
            }],
            dtype: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("/nonexistent"), "{}", err.message());
    load(&mut c, dir.path(), false).await;
    s[0].config_json = "{\"num_agents\": \"two\"}".into();
    let mut out = c.run_episodes(tokio_stream::iter(s)).await.unwrap().into_inner();
    let r = out.message().await.unwrap().unwrap();
    assert!(r.error.contains("config_json"), "{}", r.error);
    // Shutdown while episodes run: they still finish and come back, then the server exits.
    let many = specs(&config(8), 8, "d");
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::EpisodeSpec>(16);
    let mut out =
        c.run_episodes(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    for s in &many {
        tx.send(s.clone()).await.unwrap();
    }
    drop(tx);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let _ = stop.send(());
    // Once the engine drains, a new episode is handed back as a draining refusal, by kind.
    while !c.info(pb::WorkerInfoRequest {}).await.unwrap().into_inner().draining {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut late = c
        .run_episodes(tokio_stream::iter(specs(&config(8), 1, "late")))
        .await
        .unwrap()
        .into_inner();
    let r = late.message().await.unwrap().unwrap();
    assert_eq!(
        (r.error_kind, r.error.contains("draining")),
        (pb::EpisodeErrorKind::Draining as i32, true),
        "{r:?}"
    );
    let mut n = 0;
    while let Ok(Some(r)) = out.message().await {
        assert!(r.error.is_empty(), "{}", r.error);
        n += 1;
    }
    assert_eq!(n, 8, "draining finishes the running episodes");
    tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .expect("server stops after draining")
        .unwrap();
}

/// CancelEpisodes stops running episodes (they come back CANCELLED on their stream, which then
/// ends normally), counts ids it does not hold as unknown, and remembers them: a spec that
/// arrives after its cancel is answered CANCELLED at once. The episodes not named finish as
/// they would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_episodes_stop_and_a_cancel_that_comes_first_is_remembered() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let (addr, _stop, _handle) = start_worker().await;
    let mut c = client(&addr).await;
    load(&mut c, dir.path(), false).await;
    // Long turns (1000 tokens each, never stopping early), so the cancel lands mid-decode.
    let mut cfg = config(1000);
    for s in [&mut cfg.sampling.solver, &mut cfg.sampling.evaluator, &mut cfg.sampling.scorer] {
        s.min_new_tokens = 1000;
    }
    let all = specs(&cfg, 3, "c");
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::EpisodeSpec>(16);
    let mut out =
        c.run_episodes(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    for s in &all[..2] {
        tx.send(s.clone()).await.unwrap();
    }
    // Two episodes, each with one solver turn per agent decoding.
    while c.info(pb::WorkerInfoRequest {}).await.unwrap().into_inner().running_sequences < 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ids = vec![all[0].episode_id.clone(), all[2].episode_id.clone(), "nobody".to_string()];
    let r = c
        .cancel_episodes(pb::CancelEpisodesRequest { episode_ids: ids })
        .await
        .unwrap()
        .into_inner();
    // c-0 was running; c-2 has not been sent yet, "nobody" never will be.
    assert_eq!((r.stopped, r.unknown), (1, 2), "{r:?}");
    let first = out.message().await.unwrap().unwrap();
    assert_eq!(
        (first.episode_id.as_str(), first.error_kind),
        ("c-0", pb::EpisodeErrorKind::Cancelled as i32),
        "{first:?}"
    );
    assert!(first.trajectory_json.is_empty());
    // The cancel came before c-2: it is answered at once, before c-1's long turns end.
    tx.send(all[2].clone()).await.unwrap();
    let second = out.message().await.unwrap().unwrap();
    assert_eq!(
        (second.episode_id.as_str(), second.error_kind),
        ("c-2", pb::EpisodeErrorKind::Cancelled as i32),
        "{second:?}"
    );
    // c-0's two turns left the batch at once: only c-1's decode.
    let info = c.info(pb::WorkerInfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.running_episodes, info.running_sequences), (1, 2), "{info:?}");
    let r = c
        .cancel_episodes(pb::CancelEpisodesRequest { episode_ids: vec!["c-1".into()] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.stopped, r.unknown), (1, 0));
    assert!(r.tokens_before > 0, "c-1 had decoded part of its first turn: {r:?}");
    drop(tx);
    let last = out.message().await.unwrap().unwrap();
    assert_eq!(
        (last.episode_id.as_str(), last.error_kind),
        ("c-1", pb::EpisodeErrorKind::Cancelled as i32)
    );
    assert!(out.message().await.unwrap().is_none(), "the stream ends once every episode answered");
    let info = c.info(pb::WorkerInfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.running_episodes, info.running_sequences), (0, 0), "{info:?}");
}

/// A worker on loopback with the given token budget, its /metrics on a socket bound here.
async fn start_budgeted(
    max_batch_tokens: usize,
) -> (String, String, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>)
{
    use std::os::fd::IntoRawFd;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics_addr = metrics.local_addr().unwrap().to_string();
    let settings = ServerSettings {
        listener,
        metrics_listen: Some(comas_service::Listen::Fd(metrics.into_raw_fd())),
        engine: EngineSettings {
            device: Device::Cpu,
            max_running: 256,
            max_batch_tokens,
            prefill_chunk: 64,
            share_prompts: true,
            vllm: None,
            default_engine: comas_rollout_worker::engine::EngineKind::Comas,
            device_name: "cpu".into(),
        },
        drain_timeout: Duration::from_secs(30),
        weight_timeout: Duration::from_secs(30),
        relay: true,
        tls: None,
        health_listen: None,
    };
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(serve(settings, async {
        let _ = rx.await;
    }));
    (addr, metrics_addr, stop, h)
}

async fn metric(addr: &str, name: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("comas_worker_{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {out}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// A tight token budget queues turns instead of admitting them all: no more sequences decode
/// at once than the budget holds, and the results do not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_token_budget_only_queues_work() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let s = specs(&config(5), 4, "t");
    let (addr, roomy_metrics, stop, h) = start_budgeted(1 << 20).await;
    let mut c = client(&addr).await;
    load(&mut c, dir.path(), false).await;
    let roomy = run(&mut c, s.clone()).await;
    let needs: Vec<usize> =
        roomy.values().flat_map(|t| t.turns.iter().map(|x| x.prompt_ids.len() + 5)).collect();
    let (least, most) = (*needs.iter().min().unwrap(), *needs.iter().max().unwrap());
    // With room for everything, the 8 solver turns of round 0 decode together.
    assert!(metric(&roomy_metrics, "peak_running_sequences").await >= 8.0);
    let budget = 2 * most;
    let (addr2, tight_metrics, stop2, h2) = start_budgeted(budget).await;
    let mut c2 = client(&addr2).await;
    load(&mut c2, dir.path(), false).await;
    let tight = run(&mut c2, s).await;
    let peak = metric(&tight_metrics, "peak_running_sequences").await as usize;
    // Every row is as wide as the widest, so at most budget / least rows fit.
    assert!(
        peak >= 1 && peak <= budget / least && peak < 8,
        "peak {peak}, budget {budget}, needs {least}..{most}"
    );
    for (id, t) in &tight {
        let ids: Vec<&Vec<u32>> = t.turns.iter().map(|x| &x.completion_ids).collect();
        let ids2: Vec<&Vec<u32>> = roomy[id].turns.iter().map(|x| &x.completion_ids).collect();
        assert_eq!(ids, ids2, "{id}");
    }
    let _ = stop.send(());
    let _ = stop2.send(());
    h.await.unwrap().unwrap();
    h2.await.unwrap().unwrap();
}

/// Spec 3.7: a prompt over the limit loses its quoted discussion blocks, and one that still
/// does not fit fails its episode with a message that names the turn and the limit; a problem
/// longer than the model's context fails the same way, and the worker goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_over_the_limit_are_cut_then_refused() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let (addr, metrics, stop, h) = start_budgeted(1 << 20).await;
    let mut c = client(&addr).await;
    load_agents(&mut c, dir.path(), false, 4).await;
    // Four long solutions quoted in round 1 make those solver prompts the longest of all.
    let mut cfg = config(5);
    cfg.num_agents = 4;
    cfg.num_references = 4;
    cfg.sampling.solver.max_new_tokens = 120;
    cfg.sampling.solver.min_new_tokens = 120;
    let full = run(&mut c, specs(&cfg, 2, "full")).await;
    let longest = |pick: &dyn Fn(&comas_workflow::comas::TrajectoryTurn) -> bool| {
        full.values()
            .flat_map(|t| t.turns.iter().filter(|x| pick(x)).map(|x| x.prompt_ids.len()))
            .max()
            .unwrap()
    };
    let bare = longest(&|x| x.role == Role::Solver && x.round == 0);
    let others = longest(&|x| x.role != Role::Solver);
    let quoting = full
        .values()
        .flat_map(|t| {
            t.turns
                .iter()
                .filter(|x| x.role == Role::Solver && x.round == 1)
                .map(|x| x.prompt_ids.len())
        })
        .min()
        .unwrap();
    let limit = bare.max(others);
    assert!(
        limit < quoting,
        "the set-up needs round-1 solver prompts ({quoting}) above every other ({limit})"
    );

    let cut = run(
        &mut c,
        specs(&CoMasConfig { prompt_max_len: Some(limit as u32), ..cfg.clone() }, 2, "cut"),
    )
    .await;
    for t in cut.values() {
        for x in t.turns.iter().filter(|x| x.role == Role::Solver && x.round == 1) {
            assert!(
                x.blocks_cut >= 1 && x.prompt_ids.len() <= limit,
                "{} blocks cut, {} tokens",
                x.blocks_cut,
                x.prompt_ids.len()
            );
            // Whole blocks go: the rest are numbered from 1 again.
            let blocks = (4 - x.blocks_cut) as usize;
            assert_eq!(x.prompt.matches("=== Discussion ").count(), blocks, "{}", x.prompt);
            assert_eq!(t.discussions[1].matches("\nEvaluation: ").count(), blocks);
        }
        assert!(t
            .turns
            .iter()
            .filter(|x| x.blocks_cut > 0)
            .all(|x| x.role == Role::Solver && x.round == 1));
        assert_eq!(t.truncated_prompts(), 4);
    }
    assert_eq!(metric(&metrics, "prompt_truncated_total").await, 8.0);

    // Room for no round-0 prompt: refused with the turn and the limit named.
    let tight = CoMasConfig { prompt_max_len: Some(bare as u32 - 1), ..cfg.clone() };
    let mut out =
        c.run_episodes(tokio_stream::iter(specs(&tight, 1, "refused"))).await.unwrap().into_inner();
    let r = out.message().await.unwrap().unwrap();
    assert!(
        r.error.contains("(solver, round 0, agent")
            && r.error.contains(&format!("over comas.prompt_max_len {}", bare - 1)),
        "{}",
        r.error
    );

    // A problem longer than the tiny model's 4096-token context.
    let mut huge = specs(&cfg, 1, "huge");
    let long = TaskRecord { prompt: "seven ".repeat(6000), ..question(0) };
    huge[0].question_json = serde_json::to_string(&long).unwrap();
    let mut out = c.run_episodes(tokio_stream::iter(huge)).await.unwrap().into_inner();
    let r = out.message().await.unwrap().unwrap();
    assert!(r.error.contains("exceed the model's context of 4096 tokens"), "{}", r.error);
    assert_eq!(metric(&metrics, "prompt_refused_total").await, 2.0);
    // The worker is still there and well.
    assert_eq!(run(&mut c, specs(&cfg, 2, "after")).await.len(), 2);
    let _ = stop.send(());
    h.await.unwrap().unwrap();
}

/// Evaluation calls (`fit_context`) are shortened to the room the context leaves instead of
/// refused, and a prompt longer than the context is answered empty, as on one machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluation_calls_fit_the_context_instead_of_failing() {
    use comas_workflow::eval::{EvalQuestion, EvalSettings, EvalTranscript, Setup};
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let (addr, _metrics, stop, h) = start_budgeted(1 << 20).await;
    let mut c = client(&addr).await;
    load_agents(&mut c, dir.path(), false, 1).await;
    let settings = EvalSettings {
        setup: Setup::Vanilla,
        members: 1,
        temperature: 0.0,
        max_new_tokens: 100_000,
        seed: 3,
    };
    let spec = |i: u32, query: String| pb::EpisodeSpec {
        episode_id: format!("e{i}"),
        config_json: serde_json::to_string(&settings).unwrap(),
        question_json: serde_json::to_string(&EvalQuestion {
            index: i,
            id: format!("q{i}"),
            query,
        })
        .unwrap(),
        plan_json: String::new(),
        instance: i,
        seed: 0,
        method: "eval".into(),
    };
    let specs = vec![spec(0, "What is 2 + 3?".into()), spec(1, "seven ".repeat(6000))];
    let mut out = c.run_episodes(tokio_stream::iter(specs)).await.unwrap().into_inner();
    let mut got = BTreeMap::new();
    while let Some(r) = out.message().await.unwrap() {
        assert!(r.error.is_empty(), "episode {} failed: {}", r.episode_id, r.error);
        let t: EvalTranscript = serde_json::from_str(&r.trajectory_json).unwrap();
        got.insert(r.episode_id, t);
    }
    // max_new_tokens far over the 4096-token context: cut to the room left, not refused.
    let short = &got["e0"].calls[0];
    assert!(
        short.prompt_tokens + short.new_tokens <= 4096
            && short.new_tokens > 0
            && short.error.is_none(),
        "{short:?}"
    );
    // No room at all: an empty reply that grades wrong, and the episode still ends.
    let long = &got["e1"].calls[0];
    assert!(long.prompt_tokens > 4096, "{}", long.prompt_tokens);
    assert_eq!(
        (long.new_tokens, long.finish.as_str(), got["e1"].output.as_str()),
        (0, "error", "")
    );
    let _ = stop.send(());
    h.await.unwrap().unwrap();
}

#[test]
fn the_binary_exposes_metrics_and_stops_on_sigterm() {
    let port = comas_service::port::spare_port().unwrap();
    let metrics_port = comas_service::port::spare_port().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_comas-rollout-worker"))
        .env("COMAS_WORKER_LISTEN", format!("127.0.0.1:{port}"))
        .env("COMAS_WORKER_METRICS_LISTEN", format!("127.0.0.1:{metrics_port}"))
        .env("COMAS_THREADS", "1")
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let body = rt.block_on(async {
        for _ in 0..200 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", metrics_port)).await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                return out;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        String::new()
    });
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(
        body.contains("comas_worker_queue_depth") && body.contains("comas_worker_kv_cache_bytes"),
        "{body}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "worker did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// LoRA agents: a learner trains agent 0's adapter and publishes only the adapter tensors; the
/// worker swaps them into agent 0's adapter while agent 1 keeps sharing the same base.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_adapters_are_updated_from_a_lora_learner() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    tiny(&base);
    let cfg = comas_learner::TrainConfig::from_toml(
        "lr = 5e-2\nwarmup_ratio = 0.0\ntrain_batch_size = 4\nmicro_batch_size = 4\n[lora]\nr = 4\nalpha = 8.0\ntarget_modules = [\"q_proj\", \"v_proj\"]\n",
    )
    .unwrap();
    let (learner_addr, mut learner, lstop) =
        start_learner(&base, cfg, &dir.path().join("ckpt")).await;
    let (addr, stop, handle) = start_worker().await;
    let mut c = client(&addr).await;
    let agents = vec![
        // No adapter folder: the worker starts a zero adapter (B = 0) from the job's LoRA settings,
        // as a coordinator does for a LoRA agent that starts from its base model.
        pb::AgentPolicy {
            agent_id: 0,
            model_dir: base.display().to_string(),
            adapter_dir: String::new(),
            full_weights: false,
            lora_json: r#"{"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}"#.into(),
            ..Default::default()
        },
        pb::AgentPolicy {
            agent_id: 1,
            model_dir: base.display().to_string(),
            ..Default::default()
        },
    ];
    let loaded = c
        .load_policies(pb::LoadPoliciesRequest {
            agents,
            dtype: String::new(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((loaded.num_agents, loaded.num_models), (2, 1), "both agents share one base model");
    let p = train_and_publish(&mut learner).await;
    assert!(p.lora);
    let trained =
        learner.save_checkpoint(pb::SaveCheckpointRequest::default()).await.unwrap().into_inner();
    let upd = c
        .update_weights(pb::UpdateWeightsRequest {
            agent_id: 0,
            version: 1,
            source: learner_addr.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(upd.bytes, p.total_bytes, "only the adapter travels");
    let got = run(&mut c, specs(&config(6), 2, "l")).await;
    let base_model = CausalLm::load(&base, Kind::Float, Device::Cpu).unwrap();
    let adapter = comas_model::LoraAdapter::load(
        &Path::new(&trained.path).join("adapter"),
        base_model.config(),
        Kind::Float,
        Device::Cpu,
    )
    .unwrap();
    for t in got.values() {
        for turn in &t.turns {
            assert_eq!(turn.policy_version, if turn.agent == 0 { 1 } else { 0 });
            let ids: Vec<i64> =
                turn.prompt_ids.iter().chain(&turn.completion_ids).map(|&x| x as i64).collect();
            let lora = comas_model::LoraBatch::uniform(&adapter);
            let lp = tch::no_grad(|| {
                base_model
                    .token_logprobs(
                        &Tensor::from_slice(&ids).view([1, ids.len() as i64]),
                        None,
                        1.0,
                        (turn.agent == 0).then_some(&lora),
                    )
                    .unwrap()
            });
            let want = Vec::<f32>::try_from(&lp.get(0).narrow(
                0,
                turn.prompt_ids.len() as i64 - 1,
                turn.completion_ids.len() as i64,
            ))
            .unwrap();
            for (a, b) in turn.logprobs.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-4,
                    "agent {} turn {}: {a} vs {b}",
                    turn.agent,
                    turn.turn_index
                );
            }
        }
    }
    let _ = stop.send(());
    handle.await.unwrap();
    let _ = lstop.send(());
}

/// The worker binary with a fault injected (`COMAS_WORKER_FAULT`), its models loaded.
async fn faulty_worker(
    model: &Path,
    fault: &str,
) -> (std::process::Child, RolloutWorkerClient<tonic::transport::Channel>) {
    let port = comas_service::port::spare_port().unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_comas-rollout-worker"))
        .env("COMAS_WORKER_LISTEN", format!("127.0.0.1:{port}"))
        .env("COMAS_WORKER_FAULT", fault)
        .env("COMAS_THREADS", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = client(&format!("http://127.0.0.1:{port}")).await;
    load(&mut c, model, false).await;
    (child, c)
}

/// A panic inside a decode step (libtorch failing an allocation does that) fails that batch's
/// episodes with the reason and leaves the worker serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_decode_step_fails_its_episodes_and_the_worker_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let (mut child, mut c) = faulty_worker(dir.path(), "step-panic:3").await;
    let mut out =
        c.run_episodes(tokio_stream::iter(specs(&config(5), 2, "p"))).await.unwrap().into_inner();
    let mut errors = Vec::new();
    while let Some(r) = out.message().await.unwrap() {
        errors.push(r.error);
    }
    assert_eq!(errors.len(), 2);
    assert!(
        errors
            .iter()
            .all(|e| e.contains("the decode step panicked: injected by COMAS_WORKER_FAULT")),
        "{errors:?}"
    );
    assert_eq!(run(&mut c, specs(&config(5), 2, "after")).await.len(), 2);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// An engine thread that dies takes the worker down with the reason, instead of a process that
/// holds its episodes and never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_thread_takes_the_worker_down() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let (mut child, mut c) = faulty_worker(dir.path(), "engine-panic:3").await;
    let mut out =
        c.run_episodes(tokio_stream::iter(specs(&config(5), 2, "d"))).await.unwrap().into_inner();
    let mut finished = 0;
    while let Ok(Some(r)) = out.message().await {
        assert!(r.error.is_empty(), "{}", r.error);
        finished += 1;
    }
    assert!(finished < 2, "the stream ends without the episodes");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the worker outlived its engine thread");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("the engine thread died (injected by COMAS_WORKER_FAULT after step 3)"),
        "{err}"
    );
}
