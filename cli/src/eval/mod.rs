//! `comas eval`: a model (or a team of models) under the four inference setups of spec §8.2 on a
//! benchmark, graded by spec §8.3. Every call of every question goes through one continuous
//! batch per model. Writes every call, every verdict, a summary JSON and a Markdown table into
//! `--out`; a rerun skips the questions already graded there.
mod driver;
pub mod grading;
mod remote;
mod report;

use anyhow::{bail, Context, Result};
use comas_model::dtype::{parse_device, parse_kind};
use comas_model::{CausalLm, Config, LoraAdapter, Tokenizer};
use comas_workflow::code::CodeGrading;
use comas_workflow::eval::{self, BenchItem, Dialogue, Setup};
use driver::{CallSampling, Member, Open};
use remote::{RemoteRun, TeamModel};
use report::{QuestionResult, ResultsFile};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Model folder; repeat for a heterogeneous team (team member m is played by model m mod count).
    #[arg(long = "model", required_unless_present = "job_dir")]
    models: Vec<PathBuf>,
    /// A `comas local --dir` folder: evaluate one agent's checkpoint from it (as the first team
    /// member, before any --model).
    #[arg(long)]
    job_dir: Option<PathBuf>,
    /// The agent of --job-dir.
    #[arg(long, default_value_t = 0, requires = "job_dir")]
    agent: u32,
    /// The checkpoint of --job-dir: a step number, or `final` (the newest one).
    #[arg(long, default_value = "final", requires = "job_dir")]
    checkpoint: String,
    /// The training step to file this evaluation under (default: the --job-dir checkpoint's),
    /// e.g. 0 for a base model; `comas plot` draws accuracy against it.
    #[arg(long)]
    step: Option<u64>,
    /// PEFT LoRA adapter folder; the k-th `--adapter` goes with the k-th `--model` (`-` for none).
    #[arg(long = "adapter")]
    adapters: Vec<String>,
    /// Weights dtype (default: each checkpoint's).
    #[arg(long, env = "COMAS_DTYPE")]
    dtype: Option<String>,
    #[arg(long, env = "COMAS_DEVICE", default_value = "cpu")]
    device: String,
    /// vanilla, consistency, debate, autogen, or a comma-separated list of them, or `all`.
    #[arg(long, default_value = "vanilla")]
    setup: String,
    /// A JSONL file of benchmark records (spec §7.2), `humaneval` (the cached HumanEval, see
    /// scripts/fetch-humaneval.sh) or `arithmetic` (built in).
    #[arg(long)]
    bench: String,
    /// Evaluate only the first N questions.
    #[arg(long)]
    limit: Option<usize>,
    /// Output folder (calls.jsonl, results.jsonl, summary.json, summary.md).
    #[arg(long, default_value = "eval-out")]
    out: PathBuf,
    /// Sampling temperature of every call (spec §8.1).
    #[arg(long, default_value_t = 0.7)]
    temperature: f64,
    /// Most new tokens per call (spec §8.1: 2048).
    #[arg(long, default_value_t = 2048)]
    max_new_tokens: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Most sequences decoding at once per model (1: the calls one at a time).
    #[arg(long, env = "COMAS_EVAL_MAX_RUNNING", default_value_t = 64)]
    max_running: usize,
    /// Questions open at once (a new one opens as one ends): their pending calls form the batch.
    #[arg(long, default_value_t = 64)]
    max_open: usize,
    /// Which code blocks count (spec §8.3); the other mode is reported too.
    #[arg(long, default_value = "any_block")]
    code_grading: CodeGrading,
    /// Questions of the built-in arithmetic benchmark.
    #[arg(long, default_value_t = 100)]
    arithmetic_questions: usize,
    /// Run the calls on a cluster: this coordinator's rollout workers serve the team (the model
    /// folders must be where the workers see them); grading and the output files stay here.
    #[arg(long)]
    coordinator: Option<String>,
    /// With --coordinator: where the coordinator writes each evaluation job's logs, a folder it
    /// can write (default: `jobs/` in --out, for a coordinator on this file system).
    #[arg(long, requires = "coordinator")]
    jobs_dir: Option<PathBuf>,
}

/// The step, model folder and adapter of an agent's checkpoint in a `comas local --dir` folder:
/// `checkpoints/agent-K/<job>/step-N/` (a learner keeps one folder per job) holds `model/`
/// (full fine-tuning) or `adapter/` (LoRA, whose config names its base model).
fn job_checkpoint(dir: &Path, agent: u32, which: &str) -> Result<(u64, PathBuf, Option<String>)> {
    let agent_dir = dir.join("checkpoints").join(format!("agent-{agent}"));
    let mut roots = vec![agent_dir.clone()];
    if let Ok(entries) = std::fs::read_dir(&agent_dir) {
        let mut jobs: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        jobs.sort();
        roots.extend(jobs);
    }
    let mut found = Vec::new();
    for r in &roots {
        let steps = comas_learner::checkpoint::list_checkpoints(r)?;
        if !steps.is_empty() {
            found.push((r.clone(), steps));
        }
    }
    let (root, all) = match found.len() {
        0 => bail!("{} holds no complete checkpoint of agent {agent}", agent_dir.display()),
        1 => found.remove(0),
        _ => {
            let names: Vec<String> = found.iter().map(|(r, _)| r.display().to_string()).collect();
            bail!(
                "agent {agent} has checkpoints of several jobs ({}); move the others away",
                names.join(", ")
            )
        }
    };
    let step = match which {
        "final" | "latest" => {
            all.last().map(|(s, _)| *s).expect("found holds only non-empty step lists")
        }
        s => s
            .parse::<u64>()
            .with_context(|| format!("--checkpoint {s}: give a step number or `final`"))?,
    };
    let (_, at) = all.iter().find(|(s, _)| *s == step).with_context(|| {
        let have: Vec<String> = all.iter().map(|(s, _)| s.to_string()).collect();
        format!(
            "agent {agent} has no checkpoint of step {step} in {} (steps there: {})",
            root.display(),
            if have.is_empty() { "none".into() } else { have.join(", ") }
        )
    })?;
    if at.join("model").is_dir() {
        return Ok((step, at.join("model"), None));
    }
    let adapter = at.join("adapter");
    /// The one field of PEFT's adapter_config.json needed here.
    #[derive(serde::Deserialize)]
    struct Base {
        base_model_name_or_path: Option<String>,
    }
    let path = adapter.join("adapter_config.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let base: Base = serde_json::from_str(&text)
        .with_context(|| format!("{} is not an adapter config", path.display()))?;
    let base = base
        .base_model_name_or_path
        .with_context(|| format!("{}: the adapter does not name its base model", path.display()))?;
    Ok((step, PathBuf::from(base), Some(adapter.display().to_string())))
}

/// The team's members, and the checkpoint step of --job-dir if one was given.
/// `path` made absolute with links resolved; as given when that fails (it is checked on load).
fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string()
}

/// The team's model folders and adapters, named by their absolute paths, and the checkpoint
/// step of --job-dir if one was given.
fn team_of(a: &Args) -> Result<(Vec<TeamModel>, Option<u64>)> {
    if a.adapters.len() > a.models.len() {
        bail!("{} --adapter flags for {} --model flags: give at most one adapter per model (`-` for none)", a.adapters.len(), a.models.len());
    }
    let mut team: Vec<(PathBuf, Option<String>)> = Vec::new();
    let mut step = None;
    if let Some(dir) = &a.job_dir {
        let (s, model, adapter) = job_checkpoint(dir, a.agent, &a.checkpoint)?;
        step = Some(s);
        team.push((model, adapter));
    }
    for (i, dir) in a.models.iter().enumerate() {
        team.push((dir.clone(), a.adapters.get(i).filter(|p| p.as_str() != "-").cloned()));
    }
    let team = team
        .into_iter()
        .map(|(dir, adapter)| {
            // Absolute paths, so a rerun that spells a folder another way still matches `run.json`.
            let name = match &adapter {
                Some(p) => format!("{}+{}", canonical(&dir), canonical(Path::new(p))),
                None => canonical(&dir),
            };
            let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            TeamModel { model: abs(&dir), adapter: adapter.map(|p| abs(Path::new(&p))), name }
        })
        .collect();
    Ok((team, step))
}

fn load_members(a: &Args, team: &[TeamModel]) -> Result<Vec<Member>> {
    let device = parse_device(&a.device)?;
    let mut members = Vec::new();
    for t in team {
        let (dir, adapter) = (&t.model, t.adapter.as_ref().map(|p| p.display().to_string()));
        let config = Config::from_file(&dir.join("config.json"))
            .with_context(|| format!("loading model folder {}", dir.display()))?;
        let kind = match &a.dtype {
            Some(d) => parse_kind(d)?,
            None => config.dtype,
        };
        let tokenizer = Tokenizer::from_dir(dir)?;
        tokenizer
            .check_chat_template()
            .with_context(|| format!("{} cannot render chat calls", dir.display()))?;
        let model = CausalLm::load(dir, kind, device)
            .with_context(|| format!("loading {}", dir.display()))?;
        model.pack_for_decode();
        tokenizer.check_fits(model.config())?;
        let name = t.name.clone();
        let adapter = match adapter {
            None => None,
            Some(p) => Some(
                LoraAdapter::load(Path::new(&p), model.config(), kind, device)
                    .with_context(|| format!("loading adapter {p}"))?,
            ),
        };
        members.push(Member { name, model, tokenizer, adapter });
    }
    Ok(members)
}

fn load_bench(a: &Args) -> Result<(String, Vec<BenchItem>)> {
    let (name, mut items) = match a.bench.as_str() {
        "arithmetic" => ("arithmetic".to_string(), eval::arithmetic(a.arithmetic_questions, 0)),
        "humaneval" => {
            let path = comas_sandbox::default_humaneval_path();
            let problems = comas_sandbox::load_humaneval(&path)
                .with_context(|| "run `bash scripts/fetch-humaneval.sh` first".to_string())?;
            let items = problems
                .iter()
                .map(|p| BenchItem {
                    id: p.task_id.clone(),
                    query: eval::humaneval_query(&p.prompt),
                    answer: p.entry_point.clone(),
                    grader: eval::GraderKind::Code { checker: p.checker() },
                    tag: "humaneval".into(),
                })
                .collect();
            ("humaneval".to_string(), items)
        }
        file => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading benchmark {file}"))?;
            let items = eval::parse_bench(&text).with_context(|| format!("benchmark {file}"))?;
            let name = std::path::Path::new(file)
                .file_stem()
                .map_or(file.to_string(), |s| s.to_string_lossy().into_owned());
            (name, items)
        }
    };
    if let Some(n) = a.limit {
        items.truncate(n);
    }
    Ok((name, items))
}

/// What the results in an output folder depend on (`run.json`): a rerun into the folder must
/// match it, or its questions would be graded under mixed settings. Setups and `--limit` may
/// change between runs (adding a setup or more questions is what resuming is for).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct RunSettings {
    bench: String,
    models: Vec<String>,
    temperature: f64,
    max_new_tokens: usize,
    seed: u64,
    checkpoint_step: Option<u64>,
}

impl RunSettings {
    fn check_or_write(&self, dir: &Path) -> Result<()> {
        let path = dir.join("run.json");
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let before: RunSettings = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not a comas eval run file", path.display()))?;
                if &before != self {
                    bail!(
                        "{} holds results of another run ({}); give another --out, or the same model, benchmark, temperature, max new tokens, seed and step",
                        dir.display(),
                        serde_json::to_string(&before)?
                    );
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::plot::write_atomic(&path, serde_json::to_string_pretty(self)?.as_bytes())
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}

fn parse_setups(s: &str) -> Result<Vec<Setup>> {
    if s == "all" {
        return Ok(Setup::ALL.to_vec());
    }
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let setup: Setup = part.parse()?;
        if !out.contains(&setup) {
            out.push(setup);
        }
    }
    if out.is_empty() {
        bail!("--setup names no setup");
    }
    Ok(out)
}

pub fn run(a: Args) -> Result<()> {
    // Zero of any of these would run nothing and still write a summary (accuracy over no
    // questions, or over empty replies).
    for (flag, n) in [
        ("--limit", a.limit.unwrap_or(1)),
        ("--max-new-tokens", a.max_new_tokens),
        ("--max-running", a.max_running),
        ("--max-open", a.max_open),
        ("--arithmetic-questions", a.arithmetic_questions),
    ] {
        if n == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    let setups = parse_setups(&a.setup)?;
    let (bench_name, items) = load_bench(&a)?;
    let needs_code = items.iter().any(|i| matches!(i.grader, eval::GraderKind::Code { .. }));
    // The sandbox is checked before any model loads: a machine without python3 fails at once.
    let grader = grading::Grader::new(needs_code, a.code_grading)?;
    let (team, checkpoint_step) = team_of(&a)?;
    let checkpoint_step = a.step.or(checkpoint_step);
    let names: Vec<String> = team.iter().map(|t| t.name.clone()).collect();
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let settings = RunSettings {
        bench: bench_name.clone(),
        models: names.clone(),
        temperature: a.temperature,
        max_new_tokens: a.max_new_tokens,
        seed: a.seed,
        checkpoint_step,
    };
    settings.check_or_write(&a.out)?;
    let mut results = ResultsFile::open(&a.out)?;
    let started = Instant::now();
    let (total_calls, total_tokens) = match &a.coordinator {
        Some(url) => {
            run_remote(&a, url, &team, &setups, &bench_name, &items, &mut results, &grader)?
        }
        None => run_local(&a, &load_members(&a, &team)?, &setups, &items, &mut results, &grader)?,
    };
    let secs = started.elapsed().as_secs_f64();
    let summary = report::summarize(
        &bench_name,
        &names,
        checkpoint_step,
        &results.load_all()?,
        a.code_grading,
    );
    report::write_summary(&a.out, &summary)?;
    println!("{}", serde_json::to_string(&summary)?);
    eprintln!(
        "{total_calls} calls, {total_tokens} tokens in {secs:.1} s ({:.1} tok/s this run); results in {}",
        total_tokens as f64 / secs.max(1e-9),
        a.out.display()
    );
    Ok(())
}

/// Every setup's calls on the cluster behind `url`; returns (calls, tokens).
#[allow(clippy::too_many_arguments)]
fn run_remote(
    a: &Args,
    url: &str,
    team: &[TeamModel],
    setups: &[Setup],
    bench: &str,
    items: &[BenchItem],
    results: &mut ResultsFile,
    grader: &grading::Grader,
) -> Result<(u64, u64)> {
    let jobs_dir = match &a.jobs_dir {
        Some(d) => d.clone(),
        None => std::fs::canonicalize(&a.out)?.join("jobs"),
    };
    let dtype = a.dtype.clone().unwrap_or_else(|| "float32".into());
    let max_new_tokens =
        u32::try_from(a.max_new_tokens).context("--max-new-tokens is too large")?;
    let run = RemoteRun {
        coordinator: url,
        team,
        dtype: &dtype,
        temperature: a.temperature,
        max_new_tokens,
        seed: a.seed,
        jobs_dir: &jobs_dir,
        out: &a.out,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut totals = (0, 0);
    for &setup in setups {
        let (calls, tokens) = rt.block_on(run.run_setup(setup, items, bench, results, grader))?;
        totals = (totals.0 + calls, totals.1 + tokens);
    }
    Ok(totals)
}

/// Every setup's calls in this process, one continuous batch per model; returns (calls, tokens).
fn run_local(
    a: &Args,
    members: &[Member],
    setups: &[Setup],
    items: &[BenchItem],
    results: &mut ResultsFile,
    grader: &grading::Grader,
) -> Result<(u64, u64)> {
    let sampling =
        CallSampling { temperature: a.temperature, max_new_tokens: a.max_new_tokens, seed: a.seed };
    let mut total_tokens = 0u64;
    let mut total_calls = 0u64;
    for &setup in setups {
        let todo: Vec<(usize, &BenchItem)> =
            items.iter().enumerate().filter(|(_, it)| !results.has(setup, &it.id)).collect();
        let skipped = items.len() - todo.len();
        let bar = report::progress_bar(setup, items.len(), skipped);
        let setup_started = Instant::now();
        let questions = todo.iter().map(|&(index, it)| {
            let mut dialogue = Dialogue::new(setup, it.query.clone());
            let first = dialogue.start();
            (Open { index, dialogue, calls: Vec::new() }, first)
        });
        let progress =
            driver::run(members, &sampling, a.max_running, a.max_open, questions, |o, p| {
                let item = &items[o.index];
                let output = o.dialogue.output().unwrap_or_default().to_string();
                let verdict = grader.grade(item, &output)?;
                results.append(&QuestionResult::new(setup, item, output, verdict, o.calls))?;
                bar.inc(1);
                let secs = setup_started.elapsed().as_secs_f64().max(1e-9);
                bar.set_message(format!(
                    "{} calls, {:.1} tok/s",
                    p.calls_done,
                    p.tokens as f64 / secs
                ));
                Ok(())
            })?;
        total_calls += progress.calls_done;
        total_tokens += progress.tokens;
        bar.finish();
    }
    Ok((total_calls, total_tokens))
}
