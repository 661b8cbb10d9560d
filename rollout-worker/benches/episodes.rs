//! CoMAS episode throughput of a worker: episodes run one at a time versus many at once on one
//! stream (continuous batching). Prints tokens/s, episodes/s and the speed-up.
//!
//!   cargo bench -p comas-rollout-worker --bench episodes
//!
//! Knobs: COMAS_BENCH_MODEL (a model folder, e.g. the SmolLM2 import; default a random ~40M
//! Qwen2), COMAS_BENCH_LORA (r: both agents are LoRA adapters of that rank on q/v over one
//! shared base, as in the SmolLM2 example; default 0 = two plain agents), COMAS_BENCH_THREADS (2),
//! COMAS_BENCH_TOKENS (64 per turn, fixed length), COMAS_BENCH_SERIAL (4 episodes run one by
//! one), COMAS_BENCH_CONCURRENT (64), COMAS_BENCH_DTYPE (float32 or bfloat16), COMAS_BENCH_TOP_P
//! (1.0: every turn samples from the whole vocabulary; below 1, from its top-p set, as the
//! SmolLM2 experiments' solvers and evaluators do at 0.95), COMAS_BENCH_TEMPERATURE (1.0; those
//! experiments sample at 0.5).
//! Prompt tokens are reported too: with the tiny test tokenizer CoMAS prompts are a few hundred
//! tokens, and their prefill (already batched within a sequence) does not speed up.
// Measured as the services run: jemalloc, MKL dispatching on the instruction set.
comas_model::process_setup!();

use comas_model::tiny::{write_model, TinySpec};
use comas_proto::v1 as pb;
use comas_proto::v1::rollout_worker_client::RolloutWorkerClient;
use comas_rollout_worker::engine::EngineSettings;
use comas_rollout_worker::server::{serve, ServerSettings};
use comas_workflow::comas::{plan_batch, CoMasConfig, PlanSeed};
use comas_workflow::train_config::LoraSettings;
use comas_workflow::{SamplingSpec, TaskKind, TaskRecord};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn specs(cfg: &CoMasConfig, n: usize, tag: &str) -> Vec<pb::EpisodeSpec> {
    let plan = plan_batch(cfg, n, PlanSeed { global: 3, step: 0, shard: 0 }).unwrap();
    plan.instances
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let q = TaskRecord {
                prompt: format!("Compute {i} * 7 - 3."),
                answer: format!("{}", i * 7 - 3),
                task: TaskKind::Math,
                id: format!("{tag}{i}"),
                source: None,
                files: Default::default(),
            };
            pb::EpisodeSpec {
                episode_id: format!("{tag}{i}"),
                config_json: serde_json::to_string(cfg).unwrap(),
                question_json: serde_json::to_string(&q).unwrap(),
                plan_json: serde_json::to_string(p).unwrap(),
                instance: i as u32,
                seed: i as u64,
                method: "comas".into(),
            }
        })
        .collect()
}

/// Runs the specs on one stream; returns (generated tokens, prompt tokens).
async fn run(
    c: &mut RolloutWorkerClient<tonic::transport::Channel>,
    s: Vec<pb::EpisodeSpec>,
) -> (u64, u64) {
    let mut out = c.run_episodes(tokio_stream::iter(s)).await.unwrap().into_inner();
    let (mut tokens, mut prompt) = (0, 0);
    while let Some(r) = out.message().await.unwrap() {
        assert!(r.error.is_empty(), "{}", r.error);
        tokens += r.generated_tokens;
        let t: comas_workflow::comas::Trajectory =
            serde_json::from_str(&r.trajectory_json).unwrap();
        prompt += t.turns.iter().map(|x| x.prompt_ids.len() as u64).sum::<u64>();
    }
    (tokens, prompt)
}

fn main() {
    let threads: i32 = env_or("COMAS_BENCH_THREADS", 2);
    let per_turn: u32 = env_or("COMAS_BENCH_TOKENS", 64);
    let serial: usize = env_or("COMAS_BENCH_SERIAL", 4);
    let concurrent: usize = env_or("COMAS_BENCH_CONCURRENT", 64);
    tch::set_num_threads(threads);
    let lora_r: i64 = env_or("COMAS_BENCH_LORA", 0);
    let dtype = std::env::var("COMAS_BENCH_DTYPE").unwrap_or_else(|_| "float32".into());
    let top_p: f64 = env_or("COMAS_BENCH_TOP_P", 1.0);
    let temperature: f64 = env_or("COMAS_BENCH_TEMPERATURE", 1.0);
    let model = match std::env::var_os("COMAS_BENCH_MODEL") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-worker-qwen2-40m");
            if !dir.join("model.safetensors").is_file() {
                write_model(&dir, &TinySpec::bench()).unwrap();
            }
            dir
        }
    };
    let params =
        comas_model::Config::from_file(&model.join("config.json")).unwrap().num_parameters();
    // l = 2 agents on one base, one round: 2 solutions, 2 evaluations, 2 scores per episode.
    // Every turn generates exactly `per_turn` tokens, so both modes do the same work.
    let fixed = SamplingSpec {
        temperature,
        top_p,
        top_k: 0,
        max_new_tokens: per_turn,
        min_new_tokens: per_turn,
        guided_suffix: None,
        fit_context: false,
    };
    let mut cfg = CoMasConfig {
        num_agents: 2,
        num_rounds: 1,
        num_references: 1,
        instances_per_question: 1,
        ..Default::default()
    };
    cfg.sampling.solver = fixed.clone();
    cfg.sampling.evaluator = fixed.clone();
    cfg.sampling.scorer = fixed;
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let settings = ServerSettings {
            listener,
            metrics_listen: None,
            engine: EngineSettings { device: tch::Device::Cpu, max_running: 512, max_batch_tokens: 1 << 22, prefill_chunk: 512, share_prompts: true, vllm: None, default_engine: comas_rollout_worker::engine::EngineKind::Comas, device_name: "cpu".into() },
            drain_timeout: Duration::from_secs(5),
            weight_timeout: Duration::from_secs(60),
            relay: true,
            tls: None,
            health_listen: None,
        };
        tokio::spawn(serve(settings, std::future::pending::<()>()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut c = RolloutWorkerClient::connect(addr).await.unwrap().max_decoding_message_size(256 << 20);
        let lora_json = if lora_r > 0 {
            let l = LoraSettings { r: lora_r, alpha: 2.0 * lora_r as f64, target_modules: vec!["q_proj".into(), "v_proj".into()], use_rslora: false };
            serde_json::to_string(&l).unwrap()
        } else {
            String::new()
        };
        let agents = (0..2)
            .map(|a| pb::AgentPolicy { agent_id: a, model_dir: model.display().to_string(), lora_json: lora_json.clone(), ..Default::default() })
            .collect();
        c.load_policies(pb::LoadPoliciesRequest { agents, dtype: dtype.clone(), ..Default::default() }).await.unwrap();
        run(&mut c, specs(&cfg, 1, "warm")).await;

        let t0 = Instant::now();
        let (mut serial_tokens, mut serial_prompt) = (0, 0);
        for s in specs(&cfg, serial, "s") {
            let (g, p) = run(&mut c, vec![s]).await;
            serial_tokens += g;
            serial_prompt += p;
        }
        let serial_s = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let (conc_tokens, conc_prompt) = run(&mut c, specs(&cfg, concurrent, "c")).await;
        let conc_s = t0.elapsed().as_secs_f64();
        let agents = if lora_r > 0 { format!("2 LoRA r={lora_r} agents on one base") } else { "2 agents".to_string() };
        println!(
            "CoMAS episode benchmark: {} ({:.1}M parameters), {agents}, {dtype} CPU, {threads} threads, l=2 R=1 (6 turns/episode), {per_turn} tokens/turn, temperature {temperature}, top_p {top_p}",
            model.display(),
            params as f64 / 1e6
        );
        println!("{:>16} {:>9} {:>16} {:>18} {:>11}", "mode", "episodes", "generated tok/s", "prompt tok/episode", "episodes/s");
        let (st, se) = (serial_tokens as f64 / serial_s, serial as f64 / serial_s);
        let (ct, ce) = (conc_tokens as f64 / conc_s, concurrent as f64 / conc_s);
        println!("{:>16} {:>9} {:>16.1} {:>18} {:>11.3}", "1 at a time", serial, st, serial_prompt / serial as u64, se);
        println!("{:>16} {:>9} {:>16.1} {:>18} {:>11.3}", format!("{concurrent} concurrent"), concurrent, ct, conc_prompt / concurrent as u64, ce);
        println!("speed-up from continuous batching: {:.2}x episodes/s", ce / se);
    });
}
