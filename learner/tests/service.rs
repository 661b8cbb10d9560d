//! The learner's gRPC API over real loopback TCP: training, idempotent retries, publishing and
//! streaming weights with checksums, checkpoints, readiness and bad input. The last test runs
//! the `comas-learner` binary as a process and stops it with SIGTERM.
use comas_learner::engine::EngineSettings;
use comas_learner::server::{serve, ServerSettings};
use comas_learner::TrainConfig;
use comas_model::safetensors::SafeTensorsFile;
use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use comas_proto::v1 as pb;
use comas_proto::v1::learner_client::LearnerClient;
use comas_proto::weights::assemble;
use std::path::Path;
use std::time::Duration;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const SERVICE: &str = "comas.v1.Learner";

fn experiences(n: usize, seed: u64) -> Vec<pb::Experience> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| pb::Experience {
            prompt_ids: (0..rng.gen_range(2..6)).map(|_| rng.gen_range(0..420)).collect(),
            completion_ids: (0..rng.gen_range(1..5)).map(|_| rng.gen_range(0..420)).collect(),
            reward: Some((i % 3) as f64 / 2.0),
            finish_reason: pb::FinishReason::Stop as i32,
            group: format!("q{}", i / 2),
            turn_id: i as u64,
            ..Default::default()
        })
        .collect()
}

fn train_messages(header: pb::TrainHeader, exps: Vec<pb::Experience>) -> Vec<pb::TrainRequest> {
    let mut msgs = vec![pb::TrainRequest { item: Some(pb::train_request::Item::Header(header)) }];
    msgs.extend(
        exps.into_iter()
            .map(|e| pb::TrainRequest { item: Some(pb::train_request::Item::Experience(e)) }),
    );
    msgs
}

fn train_stream(
    step_id: &str,
    announced: u32,
    exps: Vec<pb::Experience>,
) -> impl tokio_stream::Stream<Item = pb::TrainRequest> {
    tokio_stream::iter(train_messages(
        pb::TrainHeader {
            step_id: step_id.into(),
            num_experiences: announced,
            ..Default::default()
        },
        exps,
    ))
}

async fn start(model: &Path, ckpt: &Path) -> (String, tokio::sync::oneshot::Sender<()>) {
    start_with(model, ckpt, false).await
}

async fn start_with(
    model: &Path,
    ckpt: &Path,
    resume: bool,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    start_rooted(model, ckpt, resume, Default::default()).await
}

async fn start_rooted(
    model: &Path,
    ckpt: &Path,
    resume: bool,
    allowed_roots: comas_service::AllowedRoots,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let cfg = TrainConfig {
        lr: 1e-3,
        total_steps: 10,
        train_batch_size: 8,
        micro_batch_size: 4,
        ..Default::default()
    };
    let settings = ServerSettings {
        agents: vec![(
            3,
            EngineSettings {
                model_dir: model.to_path_buf(),
                adapter_dir: None,
                reference_dir: None,
                config: cfg,
                checkpoint_dir: Some(ckpt.to_path_buf()),
                keep_checkpoints: 2,
                resume,
                init_from: None,
                memory_bytes: None,
            },
        )],
        listener,
        metrics_listen: None,
        allowed_roots,
        tls: None,
        health_listen: None,
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        serve(settings, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (addr, tx)
}

async fn wait_status(addr: &str, want: ServingStatus) -> bool {
    for _ in 0..200 {
        if let Ok(ch) = Channel::from_shared(addr.to_string()).unwrap().connect().await {
            let mut h = HealthClient::new(ch);
            if let Ok(r) = h.check(HealthCheckRequest { service: SERVICE.into() }).await {
                if r.into_inner().status == want as i32 {
                    return true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn train_publish_stream_checkpoint_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_model(&model, &TinySpec { seed: 2, ..TinySpec::tiny(Architecture::Llama) }).unwrap();
    let (addr, stop) = start(&model, &dir.path().join("ckpt")).await;
    assert!(wait_status(&addr, ServingStatus::Serving).await, "learner never became ready");
    let mut c = LearnerClient::connect(addr.clone()).await.unwrap();

    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.agent_id, info.global_step, info.latest_version), (3, 0, 0));
    assert_eq!(info.model_type, "llama");
    assert_eq!(info.trainable_parameters, info.num_parameters);

    let r1 = c.train(train_stream("step-1", 8, experiences(8, 1))).await.unwrap().into_inner();
    assert_eq!((r1.global_step, r1.optimizer_steps, r1.samples), (1, 1, 8));
    assert!(r1.grad_norm > 0.0 && r1.lr > 0.0);
    // The step's progress, read by the service from the training thread's counters: every
    // sample once (one epoch), the tokens the report counts, and no step running.
    let p = c.train_progress(pb::TrainProgressRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (p.global_step, p.training, p.samples_done, p.samples_total, p.tokens_done),
        (1, false, 8, 8, r1.tokens)
    );
    // A retried step id is answered from the stored report, not trained again.
    let again = c.train(train_stream("step-1", 8, experiences(8, 1))).await.unwrap().into_inner();
    assert_eq!(again, r1);
    // Asked for the report alone, it answers from memory, or NOT_FOUND for a step it never trained.
    let report_only = |id: &str| {
        let h = pb::TrainHeader { step_id: id.into(), report_only: true, ..Default::default() };
        tokio_stream::iter(vec![pb::TrainRequest {
            item: Some(pb::train_request::Item::Header(h)),
        }])
    };
    assert_eq!(c.train(report_only("step-1")).await.unwrap().into_inner(), r1);
    assert_eq!(c.train(report_only("step-9")).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(c.info(pb::InfoRequest {}).await.unwrap().into_inner().global_step, 1);

    // Bad input is rejected with the reason; nothing trains.
    let err = c.train(train_stream("bad-1", 3, experiences(2, 2))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("2 of 3"), "{}", err.message());
    let mut nan = experiences(4, 3);
    nan[2].reward = Some(f64::NAN);
    let err = c.train(train_stream("bad-2", 4, nan)).await.unwrap_err();
    assert!(
        err.code() == tonic::Code::InvalidArgument && err.message().contains("not finite"),
        "{}",
        err.message()
    );
    let mut oov = experiences(4, 4);
    oov[0].completion_ids.push(100_000);
    let err = c.train(train_stream("bad-3", 4, oov)).await.unwrap_err();
    assert!(err.message().contains("vocabulary"), "{}", err.message());
    let err = c
        .train(tokio_stream::iter(vec![pb::TrainRequest {
            item: Some(pb::train_request::Item::Experience(Default::default())),
        }]))
        .await
        .unwrap_err();
    assert!(err.message().contains("header"), "{}", err.message());
    // A step that says which version it trains refuses an experience sampled with another.
    let mut stale = experiences(4, 5);
    stale[1].policy_version = 7;
    stale[1].episode_id = "ep-9".into();
    stale[1].turn_id = 3;
    let mut msgs: Vec<pb::TrainRequest> =
        tokio_stream::StreamExt::collect(train_stream("bad-4", 4, stale)).await;
    if let Some(pb::train_request::Item::Header(h)) = &mut msgs[0].item {
        h.expected_version = Some(1);
    }
    for e in msgs.iter_mut().skip(1) {
        if let Some(pb::train_request::Item::Experience(x)) = &mut e.item {
            x.policy_version = if x.policy_version == 7 { 7 } else { 1 };
        }
    }
    let err = c.train(tokio_stream::iter(msgs)).await.unwrap_err();
    assert!(
        err.code() == tonic::Code::InvalidArgument
            && err.message().contains("experience 1 (episode ep-9, turn 3) was sampled with policy version 7, but this step trains on version 1"),
        "{}",
        err.message()
    );
    assert_eq!(c.info(pb::InfoRequest {}).await.unwrap().into_inner().global_step, 1);

    // Publish version 1 and pull it in small chunks; it must equal the saved checkpoint.
    let p = c.publish_weights(pb::PublishWeightsRequest::default()).await.unwrap().into_inner();
    assert_eq!((p.version, p.lora), (1, false));
    let mut stream = c
        .stream_weights(pb::StreamWeightsRequest { version: 1, max_chunk_bytes: 1000 })
        .await
        .unwrap()
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(ch) = stream.message().await.unwrap() {
        assert!(ch.data.len() <= 1000);
        chunks.push(ch);
    }
    assert!(chunks.len() > p.num_tensors as usize, "tensors are split into chunks");
    let tensors = assemble(chunks.clone()).unwrap();
    assert_eq!(tensors.len(), p.num_tensors as usize);
    assert_eq!(tensors.iter().map(|t| t.bytes.len() as u64).sum::<u64>(), p.total_bytes);
    let saved = c.save_checkpoint(pb::SaveCheckpointRequest::default()).await.unwrap().into_inner();
    assert_eq!(saved.global_step, 1);
    let file =
        SafeTensorsFile::open(&Path::new(&saved.path).join("model/model.safetensors")).unwrap();
    for r in &tensors {
        let t = file.tensor(&r.name).unwrap();
        assert_eq!(t.size(), r.shape);
        let mut raw = vec![0u8; r.bytes.len()];
        t.copy_data_u8(&mut raw, t.numel());
        assert_eq!(raw, r.bytes, "{}", r.name);
    }
    // A corrupted chunk is caught by the checksum.
    let mut bad = chunks.clone();
    let mut flipped = bad[0].data.to_vec();
    flipped[0] ^= 1;
    bad[0].data = flipped.into();
    let last_of_first = bad.iter().position(|c| c.last).unwrap();
    assert!(assemble(bad[..=last_of_first].to_vec()).err().unwrap().contains("checksum"));
    let err = c
        .stream_weights(pb::StreamWeightsRequest { version: 7, max_chunk_bytes: 0 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    // Train once more, then load the checkpoint back: the step counter returns to 1.
    c.train(train_stream("step-2", 8, experiences(8, 5))).await.unwrap();
    let loaded = c
        .load_checkpoint(pb::LoadCheckpointRequest { path: String::new(), step: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(loaded.global_step, 1);
    assert_eq!(c.info(pb::InfoRequest {}).await.unwrap().into_inner().global_step, 1);
    // By step: a kept step loads (after another step trained), one not kept is named.
    c.train(train_stream("step-2b", 8, experiences(8, 5))).await.unwrap();
    let loaded = c
        .load_checkpoint(pb::LoadCheckpointRequest { path: String::new(), step: Some(1) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((loaded.global_step, loaded.path), (1, saved.path.clone()));
    let err = c
        .load_checkpoint(pb::LoadCheckpointRequest { path: String::new(), step: Some(2) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("no complete checkpoint of step 2 under"), "{}", err.message());
    assert!(err.message().contains("it keeps steps [1]"), "{}", err.message());
    let err = c
        .load_checkpoint(pb::LoadCheckpointRequest { path: saved.path.clone(), step: Some(1) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let _ = stop.send(());
}

/// Every call of a step names the learner step it was planned for; a learner at another step
/// (it restarted) refuses with ABORTED and does nothing, and a restarted learner still answers
/// a retried step from the reports kept in its checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_planned_for_another_step_are_refused_and_reports_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (model, ckpt) = (dir.path().join("model"), dir.path().join("ckpt"));
    write_model(&model, &TinySpec { seed: 2, ..TinySpec::tiny(Architecture::Llama) }).unwrap();
    let (addr, stop) = start(&model, &ckpt).await;
    assert!(wait_status(&addr, ServingStatus::Serving).await);
    let mut c = LearnerClient::connect(addr.clone()).await.unwrap();
    let planned = |id: &str, at: u64, seed: u64| {
        let header = pb::TrainHeader {
            step_id: id.into(),
            num_experiences: 8,
            at_step: Some(at),
            ..Default::default()
        };
        tokio_stream::iter(train_messages(header, experiences(8, seed)))
    };
    let err = c.train(planned("job/1", 1, 1)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted, "{err:?}");
    assert!(
        err.message().contains("planned for training step 1, but this learner is at step 0"),
        "{}",
        err.message()
    );
    let r0 = c.train(planned("job/0", 0, 1)).await.unwrap().into_inner();
    assert_eq!(r0.global_step, 1);
    // The same step id again is answered from the report, even though the learner moved on.
    assert_eq!(c.train(planned("job/0", 0, 1)).await.unwrap().into_inner(), r0);
    for (save, publish) in [(Some(0), None), (None, Some(0))] {
        let err = match save {
            Some(e) => c
                .save_checkpoint(pb::SaveCheckpointRequest { expected_step: Some(e) })
                .await
                .unwrap_err(),
            None => c
                .publish_weights(pb::PublishWeightsRequest { expected_version: publish })
                .await
                .unwrap_err(),
        };
        assert_eq!(err.code(), tonic::Code::Aborted, "{err:?}");
    }
    assert!(
        std::fs::read_dir(&ckpt).map(|d| d.count()).unwrap_or(0) == 0,
        "a refused save wrote nothing"
    );
    let saved = c
        .save_checkpoint(pb::SaveCheckpointRequest { expected_step: Some(1) })
        .await
        .unwrap()
        .into_inner();
    let weights = Path::new(&saved.path).join("model/model.safetensors");
    let written = std::fs::metadata(&weights).unwrap().modified().unwrap();
    // Saving the same step again keeps the checkpoint that is there.
    let again = c
        .save_checkpoint(pb::SaveCheckpointRequest { expected_step: Some(1) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (again.path.as_str(), std::fs::metadata(&weights).unwrap().modified().unwrap()),
        (saved.path.as_str(), written)
    );
    assert_eq!(
        c.publish_weights(pb::PublishWeightsRequest { expected_version: Some(1) })
            .await
            .unwrap()
            .into_inner()
            .version,
        1
    );
    let _ = stop.send(());

    // A new learner resumed from that checkpoint knows step `job/0`: a retry is not trained again.
    let (addr, stop) = start_with(&model, &ckpt, true).await;
    assert!(wait_status(&addr, ServingStatus::Serving).await);
    let mut c = LearnerClient::connect(addr).await.unwrap();
    assert_eq!(c.train(planned("job/0", 0, 1)).await.unwrap().into_inner(), r0);
    assert_eq!(c.info(pb::InfoRequest {}).await.unwrap().into_inner().global_step, 1);
    assert_eq!(c.train(planned("job/1", 1, 2)).await.unwrap().into_inner().global_step, 2);
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.global_step, info.optimizer_steps), (2, 2));
    let _ = stop.send(());
}

/// MAPPA's `global` scope, the learner's half: a moments call trains nothing and reports the
/// moments of the step's returns; the Train of the same step whitens with the pooled moments it
/// is given, and a later moments call is answered from the step's report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whitened_with_pooled_moments_uses_them() {
    use comas_workflow::moments::Moments;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_model(&model, &TinySpec { seed: 2, ..TinySpec::tiny(Architecture::Llama) }).unwrap();
    let (addr, stop) = start(&model, &dir.path().join("ckpt")).await;
    assert!(wait_status(&addr, ServingStatus::Serving).await);
    let mut c = LearnerClient::connect(addr).await.unwrap();
    let exps = experiences(8, 5);
    let call = |moments_only: bool, pooled: Vec<pb::GroupMoments>| {
        let header = pb::TrainHeader {
            step_id: "job/0".into(),
            num_experiences: 8,
            at_step: Some(0),
            moments_only,
            pooled_moments: pooled,
            ..Default::default()
        };
        tokio_stream::iter(train_messages(header, exps.clone()))
    };
    let own = c.train(call(true, Vec::new())).await.unwrap().into_inner().return_moments;
    assert_eq!(
        c.info(pb::InfoRequest {}).await.unwrap().into_inner().global_step,
        0,
        "a moments call trains nothing"
    );
    // No KL here and gamma 1: every completion token's return is its sample's reward.
    let returns: Vec<f64> =
        exps.iter().flat_map(|e| vec![e.reward.unwrap(); e.completion_ids.len()]).collect();
    let want = Moments::of(returns.iter());
    assert_eq!(own.len(), 1);
    assert_eq!((own[0].norm_group.as_str(), own[0].count), ("", want.count));
    assert!(
        (own[0].mean - want.mean).abs() < 1e-12 && (own[0].m2 - want.m2).abs() < 1e-12,
        "{own:?} {want:?}"
    );
    // Another learner's part, pooled with this one's as the coordinator does.
    let other = Moments { count: 30, mean: 2.0, m2: 12.0 };
    let pool = Moments { count: own[0].count, mean: own[0].mean, m2: own[0].m2 }.merge(other);
    let pooled = vec![pb::GroupMoments {
        norm_group: String::new(),
        count: pool.count,
        mean: pool.mean,
        m2: pool.m2,
    }];
    let bad = vec![pb::GroupMoments { mean: f64::NAN, ..pooled[0].clone() }];
    assert_eq!(c.train(call(false, bad)).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let r = c.train(call(false, pooled)).await.unwrap().into_inner();
    assert_eq!((r.global_step, r.return_moments.clone()), (1, own.clone()));
    let report: serde_json::Value = serde_json::from_str(&r.json).unwrap();
    // Every token whitened with the pool: the mean advantage is this part's offset from it.
    let expected = (own[0].mean - pool.mean) / pool.variance().sqrt();
    let got = report["advantage_mean"].as_f64().unwrap();
    assert!(
        (got - expected).abs() < 1e-9 && expected < -0.5,
        "advantage mean {got}, expected {expected}"
    );
    assert_eq!(
        c.train(call(true, Vec::new())).await.unwrap().into_inner().return_moments,
        own,
        "answered from the step's report"
    );
    assert_eq!(c.info(pb::InfoRequest {}).await.unwrap().into_inner().global_step, 1);
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_whose_model_fails_to_load_never_reports_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop) = start(&dir.path().join("missing"), &dir.path().join("ckpt")).await;
    assert!(wait_status(&addr, ServingStatus::NotServing).await);
    let mut c = LearnerClient::connect(addr).await.unwrap();
    let err = c.info(pb::InfoRequest {}).await.unwrap_err();
    // Permanent, and it says what is wrong: the caller fails the job instead of retrying.
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("could not load its model") && err.message().contains("missing"),
        "{}",
        err.message()
    );
    let _ = stop.send(());
}

#[test]
fn the_binary_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_model(&model, &TinySpec::tiny(Architecture::Qwen2)).unwrap();
    let cfg = dir.path().join("train.toml");
    std::fs::write(&cfg, "lr = 1e-4\n").unwrap();
    let port = comas_service::port::spare_port().unwrap();
    let metrics_port = comas_service::port::spare_port().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_comas-learner"))
        .args(["serve", "--model", model.to_str().unwrap(), "--config", cfg.to_str().unwrap()])
        .env("COMAS_LEARNER_LISTEN", format!("127.0.0.1:{port}"))
        .env("COMAS_LEARNER_METRICS_LISTEN", format!("127.0.0.1:{metrics_port}"))
        .env("COMAS_THREADS", "1")
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ready =
        rt.block_on(wait_status(&format!("http://127.0.0.1:{port}"), ServingStatus::Serving));
    if !ready {
        let _ = child.kill();
        panic!("learner process never became ready");
    }
    let body = rt.block_on(async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", metrics_port)).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    });
    assert!(body.contains("comas_learner_steps_total"), "{body}");
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "learner did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An export the coordinator asks for lands only inside the learner's allowed roots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_outside_the_allowed_roots_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_model(&model, &TinySpec { seed: 2, ..TinySpec::tiny(Architecture::Llama) }).unwrap();
    let exports = dir.path().join("exports");
    std::fs::create_dir_all(&exports).unwrap();
    let roots = comas_service::AllowedRoots::parse(exports.to_str().unwrap()).unwrap();
    let (addr, stop) = start_rooted(&model, &dir.path().join("ckpt"), false, roots).await;
    assert!(wait_status(&addr, ServingStatus::Serving).await, "learner never became ready");
    let mut c = LearnerClient::connect(addr.clone()).await.unwrap();
    for bad in ["/etc/comas-export", &format!("{}/../escaped", exports.display())] {
        let e =
            c.export(pb::ExportRequest { dir: bad.into(), merge_lora: false }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{bad}: {}", e.message());
        assert!(e.message().contains("export folder"), "{}", e.message());
    }
    assert!(!Path::new("/etc/comas-export").exists() && !dir.path().join("escaped").exists());
    let ok = c
        .export(pb::ExportRequest {
            dir: exports.join("agent-0").display().to_string(),
            merge_lora: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(exports.join("agent-0/config.json").is_file(), "{ok:?}");
    let _ = stop.send(());
}
