//! `comas grow`: progressive growth of a trained NeuroMAS graph (spec neuromas.md §6). It reads
//! a finished job's learner checkpoints, grows the graph to new widths, and writes a new job
//! whose agents start from them: old nodes keep their adapters and Adam moments bit for bit, new
//! nodes start from a copy of a sibling or of the node below (or from the backbone), and the
//! growth history goes next to the job.
use anyhow::{bail, Context, Result};
use comas_learner::checkpoint::{job_folder, list_checkpoints};
use comas_workflow::job::JobSpec;
use comas_workflow::method::Method;
use comas_workflow::neuromas::{Graph, Init, Neuromas, NeuromasConfig, ParamSharing};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The trained NeuroMAS job file.
    job: PathBuf,
    /// Each agent's learner checkpoint folder (its --checkpoint-dir), with `{agent}` for the
    /// agent's number; `comas local DIR` keeps them in `DIR/checkpoints/agent-{agent}`.
    #[arg(long)]
    checkpoints: String,
    /// The step to grow from (default: the newest step every agent has a checkpoint of).
    #[arg(long)]
    step: Option<u64>,
    /// The new layer widths, ending with the readout's 1, e.g. `3,3,1`.
    #[arg(long, value_delimiter = ',', required = true)]
    to: Vec<u32>,
    /// Where a node added to a layer starts: a copy of a sibling, or the backbone.
    #[arg(long, default_value = "copy_sibling", value_parser = ["copy_sibling", "zero"])]
    width_init: String,
    /// Where a node of a new layer starts: a copy of the node below it, or the backbone.
    #[arg(long, default_value = "copy_prev", value_parser = ["copy_prev", "zero"])]
    depth_init: String,
    /// Standard deviation of Gaussian noise added to a copied adapter's B (0: exact copies).
    #[arg(long, default_value_t = 0.0)]
    b_noise_std: f64,
    /// Steps a new layer reads only the node below it (identity wiring) before its full inputs.
    #[arg(long, default_value_t = 50)]
    bridge_steps: u64,
    /// The new job's name (default: the old name with `-grown` added).
    #[arg(long)]
    name: Option<String>,
    /// Folder for the new job: `job.toml`, `growth.json` and `nodes/uid-N/` (new, or empty).
    #[arg(long)]
    out: PathBuf,
}

/// One growth step, as kept in `growth.json` (the list of every step that made the graph).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GrowthStep {
    pub from_job: String,
    pub from_step: u64,
    pub before: Graph,
    pub after: Graph,
    /// Where each new node started: `Copy(uid)` of an old node, or `Zero` (the backbone).
    pub inits: Vec<(u64, Init)>,
    pub b_noise_std: f64,
    pub bridge_steps: u64,
    /// The checkpoint each node of the new graph starts from (none: a fresh adapter).
    pub sources: BTreeMap<u64, PathBuf>,
}

const HISTORY: &str = "growth.json";

pub fn run(a: Args) -> Result<()> {
    let text = std::fs::read_to_string(&a.job)
        .with_context(|| format!("reading job file {}", a.job.display()))?;
    let base = a
        .job
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let base = std::fs::canonicalize(&base).with_context(|| base.display().to_string())?;
    let mut spec = JobSpec::from_toml(&text).with_context(|| a.job.display().to_string())?;
    spec.resolve_paths(&base);
    if spec.method != Neuromas::NAME {
        bail!(
            "{} is not a NeuroMAS job (method = \"neuromas\"); only a graph grows",
            a.job.display()
        );
    }
    let cfg: NeuromasConfig =
        toml::Value::Table(spec.settings.clone()).try_into().context("[neuromas] of the job")?;
    if cfg.param_sharing != ParamSharing::PerNode {
        bail!("growth copies each node's own adapter: the job must use neuromas.param_sharing = \"per_node\"");
    }
    // The graph as trained last: bridges ended.
    let mut before = cfg.graph().map_err(|(k, m)| anyhow::anyhow!("neuromas.{k}: {m}"))?;
    before.end_bridge();
    before.spec.bridge_layers.clear();
    let grown = before
        .grow_to(&a.to, a.width_init == "copy_sibling", a.depth_init == "copy_prev")
        .map_err(|e| anyhow::anyhow!("--to: {e}"))?;

    let old_agents = spec.agents.len();
    // Without the placeholder every agent would read one folder: all nodes one adapter.
    if old_agents > 1 && !a.checkpoints.contains("{agent}") {
        bail!(
            "--checkpoints {}: the job has {old_agents} agents, each with its own checkpoint folder; put `{{agent}}` where the agent's number goes (`comas local DIR` keeps them in DIR/checkpoints/agent-{{agent}})",
            a.checkpoints
        );
    }
    if !(a.b_noise_std.is_finite() && a.b_noise_std >= 0.0) {
        bail!("--b-noise-std must be a finite number, at least 0 (got {})", a.b_noise_std);
    }
    let dirs: Vec<PathBuf> = (0..old_agents)
        .map(|k| {
            PathBuf::from(a.checkpoints.replace("{agent}", &k.to_string()))
                .join(job_folder(&spec.name))
        })
        .collect();
    let step = match a.step {
        Some(s) => s,
        None => common_step(&dirs)?,
    };
    let ckpt_of = |k: usize| -> Result<PathBuf> {
        list_checkpoints(&dirs[k])?
            .into_iter()
            .find(|(s, _)| *s == step)
            .map(|(_, p)| p)
            .with_context(|| format!("agent {k} has no complete checkpoint of step {step} under {} (check --checkpoints and --step)", dirs[k].display()))
    };

    if a.out.join("job.toml").exists() {
        bail!("--out {} already holds a job.toml; give a new folder", a.out.display());
    }
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("creating --out {}", a.out.display()))?;
    let out = std::fs::canonicalize(&a.out)?;
    let nodes = out.join("nodes");
    let staging = out.join(".nodes.tmp");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    // Each node of the new graph: where it starts from.
    let mut sources = BTreeMap::new();
    let mut agent_of_source = BTreeMap::new();
    for node in grown.graph.nodes() {
        let source = match grown.inits.iter().find(|(u, _)| *u == node.uid) {
            None => Some(node.uid),
            Some((_, Init::Copy(src))) => Some(*src),
            Some((_, Init::Zero)) => None,
        };
        agent_of_source.insert(node.uid, source);
        let Some(src) = source else { continue };
        let from = ckpt_of(src as usize)?;
        let to = staging.join(format!("uid-{}", node.uid));
        copy_dir(&from, &to)?;
        let copied = src != node.uid;
        if copied && a.b_noise_std > 0.0 {
            add_b_noise(
                &to.join("adapter"),
                a.b_noise_std,
                comas_workflow::seed::derive_seed(&[spec.seed, node.uid, 0x6120]),
            )?;
        }
        sources.insert(node.uid, nodes.join(format!("uid-{}", node.uid)));
    }
    if nodes.exists() {
        std::fs::remove_dir_all(&nodes)?;
    }
    std::fs::rename(&staging, &nodes)?;

    let name = a.name.clone().unwrap_or_else(|| format!("{}-grown", spec.name));
    let job_text = grown_job(
        &text,
        &base,
        &out,
        &name,
        &grown.graph,
        a.bridge_steps,
        &agent_of_source,
        &sources,
    )?;
    // The new job must pass the same checks a submit makes.
    comas_learner::cli::checked_job(&job_text, &out, "the grown job does not pass the job checks")?;

    let mut history: Vec<GrowthStep> = match std::fs::read_to_string(base.join(HISTORY)) {
        Ok(t) => {
            serde_json::from_str(&t).with_context(|| format!("{}", base.join(HISTORY).display()))?
        }
        Err(_) => Vec::new(),
    };
    history.push(GrowthStep {
        from_job: spec.name.clone(),
        from_step: step,
        before,
        after: grown.graph.clone(),
        inits: grown.inits.clone(),
        b_noise_std: a.b_noise_std,
        bridge_steps: a.bridge_steps,
        sources: sources.clone(),
    });
    let h = serde_json::to_string_pretty(&history)?;
    comas_service::write_atomic(&out.join(HISTORY), h.as_bytes())?;
    comas_service::write_atomic(&out.join("job.toml"), job_text.as_bytes())?;
    for (uid, init) in &grown.inits {
        let from = match init {
            Init::Copy(src) => format!("a copy of node {src}'s adapter and Adam moments"),
            Init::Zero => "the backbone (a fresh adapter, B = 0)".to_string(),
        };
        let at = grown
            .graph
            .nodes()
            .into_iter()
            .find(|n| n.uid == *uid)
            .map(|n| n.position())
            .unwrap_or_default();
        eprintln!("new node {uid} at {at}: {from}");
    }
    eprintln!(
        "grew {} from step {step}: {:?} -> {:?}",
        spec.name, cfg.topology.layers, grown.graph.spec.layers
    );
    println!("{}", out.join("job.toml").display());
    Ok(())
}

/// The newest step that every folder holds a complete checkpoint of.
fn common_step(dirs: &[PathBuf]) -> Result<u64> {
    let mut common: Option<Vec<u64>> = None;
    for d in dirs {
        let steps: Vec<u64> = list_checkpoints(d)?.into_iter().map(|(s, _)| s).collect();
        if steps.is_empty() {
            bail!("no complete checkpoint under {} (check --checkpoints: the learners' --checkpoint-dir, with {{agent}} for the agent)", d.display());
        }
        common = Some(match common {
            None => steps,
            Some(c) => c.into_iter().filter(|s| steps.contains(s)).collect(),
        });
    }
    common
        .and_then(|c| c.into_iter().max())
        .context("the agents have no checkpoint of the same step; give --step")
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| to.display().to_string())?;
    for e in std::fs::read_dir(from).with_context(|| from.display().to_string())? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), &target).with_context(|| {
                format!("copying {} to {}", e.path().display(), target.display())
            })?;
        }
    }
    Ok(())
}

/// Adds N(0, std²) noise to every `lora_B` tensor of the adapter in `dir` (§6 `b_init_noise_std`).
fn add_b_noise(dir: &Path, std: f64, seed: u64) -> Result<()> {
    let path = dir.join("adapter_model.safetensors");
    let f = comas_model::safetensors::SafeTensorsFile::open(&path)?;
    let metadata = f.metadata().clone();
    tch::manual_seed(seed as i64 & i64::MAX);
    let mut tensors = Vec::new();
    for n in f.names() {
        let t = f.tensor(n)?;
        let t = if n.contains("lora_B") { &t + t.randn_like() * std } else { t };
        tensors.push((n.to_string(), t));
    }
    drop(f);
    comas_model::safetensors::write(&path, &tensors, &metadata)?;
    Ok(())
}

/// The old job file made into the grown one: absolute paths, the new name and graph, its own
/// output folder, and one agent per node uid, each started from its checkpoint.
#[allow(clippy::too_many_arguments)]
fn grown_job(
    text: &str,
    base: &Path,
    out: &Path,
    name: &str,
    graph: &Graph,
    bridge_steps: u64,
    source_of: &BTreeMap<u64, Option<u64>>,
    sources: &BTreeMap<u64, PathBuf>,
) -> Result<String> {
    let mut t: toml::Table = toml::from_str(text).context("job file is not valid TOML")?;
    crate::local_cmd::absolute_paths(&mut t, base);
    t.insert("name".into(), name.into());
    let output = t.entry("output").or_insert_with(|| toml::Value::Table(Default::default()));
    if let Some(o) = output.as_table_mut() {
        o.insert("dir".into(), out.join("out").display().to_string().into());
    }
    let neuromas = t
        .get_mut("neuromas")
        .and_then(toml::Value::as_table_mut)
        .context("the job has no [neuromas] table")?;
    neuromas.insert("bridge_steps".into(), toml::Value::Integer(bridge_steps as i64));
    let topology = toml::Value::try_from(&graph.spec)?;
    neuromas.insert("topology".into(), topology);
    let old: Vec<toml::Table> = t
        .get("agents")
        .and_then(toml::Value::as_array)
        .context("the job lists no [[agents]]")?
        .iter()
        .filter_map(|v| v.as_table().cloned())
        .collect();
    let mut agents = Vec::new();
    for uid in 0..graph.next_uid {
        // A node's agent settings are its source's (a fresh node takes node 0's).
        let from = source_of.get(&uid).copied().flatten().unwrap_or(0) as usize;
        let mut a =
            old.get(from).or(old.first()).cloned().context("the job lists no [[agents]]")?;
        for key in ["id", "learner", "adapter", "init_from"] {
            a.remove(key);
        }
        if let Some(p) = sources.get(&uid) {
            a.insert("init_from".into(), p.display().to_string().into());
        }
        agents.push(toml::Value::Table(a));
    }
    t.insert("agents".into(), toml::Value::Array(agents));
    let body = toml::to_string(&t)?;
    Ok(format!("# Written by `comas grow` (see growth.json next to this file).\n{body}"))
}
