//! The training thread. It owns the trainer (model, optimizer, reference) and serves commands
//! from the async side over a channel; tensors never leave it.
use crate::checkpoint::{latest_checkpoint, list_checkpoints};
use crate::config::TrainConfig;
use crate::error::{LearnerError, Result};
use crate::experience::Experience;
use crate::progress::Progress;
use crate::publish::PublishedWeights;
use crate::trainer::{Bases, Prepared, StepReport, Trainer, KEPT_REPORTS};
use comas_workflow::moments::Moments;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, RwLock};
use tokio::sync::oneshot;

pub struct CheckpointSummary {
    pub path: PathBuf,
    pub global_step: u64,
    pub optimizer_steps: u64,
}

pub struct EngineInfo {
    pub model_type: String,
    pub num_parameters: u64,
    pub trainable_parameters: u64,
    pub lora: bool,
    pub dtype: String,
    pub device: String,
    pub global_step: u64,
    pub optimizer_steps: u64,
    pub config_json: String,
    pub memory_total_bytes: u64,
}

pub enum Command {
    /// With `at_step`, trains only if the trainer is at that step (see `TrainHeader.at_step`).
    Train {
        step_id: String,
        at_step: Option<u64>,
        batch: Vec<Experience>,
        /// Moments to whiten with, per norm group, instead of the batch's own.
        pooled: Option<BTreeMap<String, Moments>>,
        reply: oneshot::Sender<Result<StepReport>>,
    },
    /// The moments of the batch's returns per norm group (see `TrainHeader.moments_only`); the
    /// prepared batch is kept for the Train of the same step id.
    Moments {
        step_id: String,
        at_step: Option<u64>,
        batch: Vec<Experience>,
        reply: oneshot::Sender<Result<BTreeMap<String, Moments>>>,
    },
    /// The stored report of a step already trained.
    Report {
        step_id: String,
        reply: oneshot::Sender<Result<StepReport>>,
    },
    /// With `expected`, publishes only if the weights are that version.
    Publish {
        expected: Option<u64>,
        reply: oneshot::Sender<Result<Arc<PublishedWeights>>>,
    },
    /// With `expected`, saves only if the trainer is at that step.
    Save {
        expected: Option<u64>,
        reply: oneshot::Sender<Result<CheckpointSummary>>,
    },
    Load {
        which: LoadWhich,
        reply: oneshot::Sender<Result<CheckpointSummary>>,
    },
    Info {
        reply: oneshot::Sender<EngineInfo>,
    },
    Export {
        dir: PathBuf,
        merge_lora: bool,
        reply: oneshot::Sender<Result<CheckpointSummary>>,
    },
}

pub struct EngineSettings {
    pub model_dir: PathBuf,
    pub adapter_dir: Option<PathBuf>,
    /// Frozen KL reference; defaults to `model_dir`.
    pub reference_dir: Option<PathBuf>,
    pub config: TrainConfig,
    pub checkpoint_dir: Option<PathBuf>,
    pub keep_checkpoints: usize,
    /// Resume from the newest complete checkpoint under `checkpoint_dir` at start.
    pub resume: bool,
    /// With no checkpoint to resume from, start from this LoRA checkpoint of another job
    /// (`agents.init_from`).
    pub init_from: Option<PathBuf>,
    /// Memory this learner may use, reported to the coordinator's submit check (default: the
    /// device's total).
    pub memory_bytes: Option<u64>,
}

/// Published versions shared with the gRPC side (newest last, a few kept for slow pullers).
pub type Versions = Arc<RwLock<VecDeque<Arc<PublishedWeights>>>>;
const KEEP_VERSIONS: usize = 3;

/// Why the model could not be loaded, set once by the training thread before it exits, so that
/// every later call can say so instead of a bare "unavailable".
pub type LoadFailure = Arc<std::sync::OnceLock<String>>;

/// A command for one of the thread's agents.
pub struct Routed {
    pub agent: u32,
    pub command: Command,
}

/// One agent a learner process trains: its settings and what the gRPC side shares with it.
pub struct AgentSetup {
    pub agent: u32,
    pub settings: EngineSettings,
    pub versions: Versions,
    pub progress: Arc<Progress>,
}

/// Starts the training thread of every agent in `agents` (one thread: LoRA agents over one base
/// share it, and their steps run one after another); `ready` fires once every model is loaded
/// (or one failed, and then `failure` holds the reason).
pub fn spawn(
    agents: Vec<AgentSetup>,
    ready: oneshot::Sender<Result<()>>,
    failure: LoadFailure,
) -> mpsc::Sender<Routed> {
    let (tx, rx) = mpsc::channel::<Routed>();
    std::thread::Builder::new()
        .name("learner-train".into())
        .spawn(move || {
            let mut bases = Bases::default();
            let mut slots = BTreeMap::new();
            let many = agents.len() > 1;
            for a in agents {
                let (mut trainer, resumed_from) = match load(&mut bases, &a.settings) {
                    Ok(t) => t,
                    Err(e) => {
                        let e = if many {
                            LearnerError::Config(format!("agent {}: {e}", a.agent))
                        } else {
                            e
                        };
                        let _ = failure.set(e.to_string());
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                trainer.progress = a.progress;
                slots.insert(a.agent, Slot::new(trainer, resumed_from, a.settings, a.versions));
            }
            if many && !bases.is_empty() {
                tracing::info!(
                    agents = slots.len(),
                    bases = bases.len(),
                    "trainers loaded; LoRA agents share their base models"
                );
            }
            let _ = ready.send(Ok(()));
            while let Ok(Routed { agent, command }) = rx.recv() {
                match slots.get_mut(&agent) {
                    Some(slot) => slot.handle(command, &mut bases),
                    // The gRPC side only routes to agents it serves; a reply dropped here
                    // reads as a stopped thread.
                    None => {
                        tracing::error!(agent, "command for an agent this learner does not train")
                    }
                }
            }
            tracing::info!("training thread stops: all senders dropped");
        })
        .expect("spawn training thread");
    tx
}

/// Which checkpoint a `Load` restores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadWhich {
    /// This checkpoint folder.
    Path(PathBuf),
    /// The newest complete checkpoint under the checkpoint root.
    Newest,
    /// The complete checkpoint of this training step under the checkpoint root.
    Step(u64),
}

impl LoadWhich {
    /// The folder to load, or what is missing.
    pub fn resolve(self, root: Option<&Path>) -> Result<PathBuf> {
        let step = match self {
            LoadWhich::Path(p) => return Ok(p),
            LoadWhich::Newest => None,
            LoadWhich::Step(s) => Some(s),
        };
        let Some(root) = root else {
            return Err(LearnerError::Checkpoint(
                "no checkpoint path given and no --checkpoint-dir".into(),
            ));
        };
        let kept = list_checkpoints(root)?;
        let found = match step {
            Some(s) => kept.iter().find(|(k, _)| *k == s),
            None => kept.last(),
        };
        found.map(|(_, p)| p.clone()).ok_or_else(|| {
            let steps: Vec<String> = kept.iter().map(|(s, _)| s.to_string()).collect();
            let what = step.map_or("no complete checkpoint".to_string(), |s| {
                format!("no complete checkpoint of step {s}")
            });
            LearnerError::Checkpoint(format!(
                "{what} under {} (it keeps steps [{}]; --keep-checkpoints sets how many)",
                root.display(),
                steps.join(", ")
            ))
        })
    }
}

/// The trainer, and the checkpoint it resumed from if it did.
fn load(bases: &mut Bases, s: &EngineSettings) -> Result<(Trainer, Option<PathBuf>)> {
    if s.resume {
        if let Some(dir) = &s.checkpoint_dir {
            if let Some(ckpt) = latest_checkpoint(dir)? {
                tracing::info!(checkpoint = %ckpt.display(), "resuming");
                let t = Trainer::resume_in(
                    bases,
                    &ckpt,
                    s.reference_dir.as_deref().unwrap_or(&s.model_dir),
                    Some(s.config.clone()),
                )?;
                return Ok((t, Some(ckpt)));
            }
        }
    }
    if let Some(ckpt) = &s.init_from {
        tracing::info!(checkpoint = %ckpt.display(), "starting from another job's checkpoint");
        return Ok((
            Trainer::start_from(
                bases,
                ckpt,
                s.reference_dir.as_deref().unwrap_or(&s.model_dir),
                s.config.clone(),
            )?,
            None,
        ));
    }
    Ok((
        Trainer::in_process(
            bases,
            &s.model_dir,
            s.config.clone(),
            s.adapter_dir.as_deref(),
            s.reference_dir.as_deref(),
        )?,
        None,
    ))
}

fn publish(trainer: &Trainer, versions: &Versions) -> Arc<PublishedWeights> {
    let version = trainer.global_step;
    if let Some(v) = versions.read().expect("versions lock").back() {
        if v.version == version {
            return Arc::clone(v);
        }
    }
    let p = Arc::new(PublishedWeights::snapshot(trainer, version));
    let mut w = versions.write().expect("versions lock");
    w.push_back(Arc::clone(&p));
    while w.len() > KEEP_VERSIONS {
        w.pop_front();
    }
    p
}

/// One agent's trainer and what the thread keeps for it between commands.
struct Slot {
    trainer: Trainer,
    s: EngineSettings,
    versions: Versions,
    memory_total: u64,
    /// A checkpoint already written for the current step (loaded or saved), not written again.
    saved: Option<(u64, PathBuf)>,
    /// The batch of the last moments call, prepared at the current weights, for its Train.
    prepared: Option<(String, Prepared)>,
}

fn at(trainer: &Trainer, request: &'static str, expected: Option<u64>) -> Result<()> {
    match expected {
        Some(e) if e != trainer.global_step => {
            Err(LearnerError::StepMismatch { request, at: trainer.global_step, expected: e })
        }
        _ => Ok(()),
    }
}

impl Slot {
    fn new(
        trainer: Trainer,
        resumed_from: Option<PathBuf>,
        s: EngineSettings,
        versions: Versions,
    ) -> Self {
        // The starting weights are version `global_step` (0, or the resumed step).
        publish(&trainer, &versions);
        let memory_total = s
            .memory_bytes
            .or_else(|| comas_model::memory::total_bytes(trainer.model().device()))
            .unwrap_or(0);
        let saved = resumed_from.map(|p| (trainer.global_step, p));
        Self { trainer, s, versions, memory_total, saved, prepared: None }
    }

    fn handle(&mut self, cmd: Command, bases: &mut Bases) {
        let Self { trainer, s, versions, memory_total, saved, prepared } = self;
        let memory_total = *memory_total;
        match cmd {
            Command::Train { step_id, at_step, batch, pooled, reply } => {
                // A retried step is answered from the reports (kept across checkpoints),
                // without training twice.
                if let Some((_, r)) = trainer
                    .recent_reports
                    .iter()
                    .find(|(id, _)| !step_id.is_empty() && *id == step_id)
                {
                    let _ = reply.send(Ok(r.clone()));
                    return;
                }
                if let Err(e) = at(trainer, "this training step", at_step) {
                    let _ = reply.send(Err(e));
                    return;
                }
                let kept = prepared
                    .take()
                    .filter(|(id, p)| {
                        !step_id.is_empty() && *id == step_id && p.samples() == batch.len()
                    })
                    .map(|(_, p)| p);
                // A libtorch failure outside the update itself changed no weights.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if batch.is_empty() {
                        return Ok(trainer.empty_step());
                    }
                    let p = match kept {
                        Some(p) => p,
                        None => trainer.prepare(&batch)?,
                    };
                    trainer.train_prepared(&batch, p, pooled.as_ref())
                }))
                .unwrap_or_else(|p| {
                    Err(LearnerError::Panicked(comas_service::panic_message(p.as_ref())))
                });
                if let Ok(rep) = &r {
                    trainer.recent_reports.push_back((step_id, rep.clone()));
                    while trainer.recent_reports.len() > KEPT_REPORTS {
                        trainer.recent_reports.pop_front();
                    }
                }
                let _ = reply.send(r);
            }
            Command::Moments { step_id, at_step, batch, reply } => {
                // A step already trained answers with the moments it kept in its report.
                if let Some((_, r)) = trainer
                    .recent_reports
                    .iter()
                    .find(|(id, _)| !step_id.is_empty() && *id == step_id)
                {
                    let _ = reply.send(Ok(r.return_moments.clone()));
                    return;
                }
                if let Err(e) = at(trainer, "these return moments", at_step) {
                    let _ = reply.send(Err(e));
                    return;
                }
                if batch.is_empty() {
                    let _ = reply.send(Ok(BTreeMap::new()));
                    return;
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    trainer.prepare(&batch)
                }))
                .unwrap_or_else(|p| {
                    Err(LearnerError::Panicked(comas_service::panic_message(p.as_ref())))
                })
                .map(|p| {
                    let m = trainer.return_moments(&batch, &p);
                    *prepared = Some((step_id, p));
                    m
                });
                let _ = reply.send(r);
            }
            Command::Report { step_id, reply } => {
                let r = trainer
                    .recent_reports
                    .iter()
                    .find(|(id, _)| *id == step_id)
                    .map(|(_, r)| r.clone());
                let _ = reply.send(r.ok_or(LearnerError::UnknownStep(step_id)));
            }
            Command::Publish { expected, reply } => {
                let _ = reply.send(
                    at(trainer, "publishing these weights", expected)
                        .map(|()| publish(trainer, versions)),
                );
            }
            Command::Save { expected, reply } => {
                let summary = |path: PathBuf, t: &Trainer| CheckpointSummary {
                    path,
                    global_step: t.global_step,
                    optimizer_steps: t.optimizer_steps,
                };
                let r = match (&s.checkpoint_dir, at(trainer, "this checkpoint", expected)) {
                    (_, Err(e)) => Err(e),
                    (None, _) => Err(LearnerError::Checkpoint(
                        "no checkpoint directory configured (--checkpoint-dir)".into(),
                    )),
                    // Saving the same step twice (a retried save, or a step resumed from its
                    // own checkpoint) writes nothing.
                    (Some(_), Ok(()))
                        if saved
                            .as_ref()
                            .is_some_and(|(g, p)| *g == trainer.global_step && p.is_dir()) =>
                    {
                        Ok(summary(
                            saved.as_ref().map(|(_, p)| p.clone()).unwrap_or_default(),
                            trainer,
                        ))
                    }
                    (Some(dir), Ok(())) => {
                        trainer.save_checkpoint(dir, s.keep_checkpoints).map(|path| {
                            *saved = Some((trainer.global_step, path.clone()));
                            summary(path, trainer)
                        })
                    }
                };
                let _ = reply.send(r);
            }
            Command::Load { which, reply } => {
                let target = which.resolve(s.checkpoint_dir.as_deref());
                *prepared = None;
                let r = target.and_then(|p| {
                    let t = Trainer::resume_in(
                        bases,
                        &p,
                        s.reference_dir.as_deref().unwrap_or(&s.model_dir),
                        Some(s.config.clone()),
                    )?;
                    // The gRPC side reads this agent's progress from the one it was given.
                    let progress = Arc::clone(&trainer.progress);
                    *trainer = t;
                    trainer.progress = progress;
                    *saved = Some((trainer.global_step, p.clone()));
                    publish(trainer, versions);
                    Ok(CheckpointSummary {
                        path: p,
                        global_step: trainer.global_step,
                        optimizer_steps: trainer.optimizer_steps,
                    })
                });
                let _ = reply.send(r);
            }
            Command::Export { dir, merge_lora, reply } => {
                let r = trainer.export(&dir, merge_lora).map(|()| CheckpointSummary {
                    path: dir,
                    global_step: trainer.global_step,
                    optimizer_steps: trainer.optimizer_steps,
                });
                let _ = reply.send(r);
            }
            Command::Info { reply } => {
                let m = trainer.model();
                let trainable: i64 =
                    trainer.optimizer().params().iter().map(|(_, t)| t.numel() as i64).sum();
                let _ = reply.send(EngineInfo {
                    model_type: m.config().model_type.clone(),
                    num_parameters: m.config().num_parameters() as u64,
                    trainable_parameters: trainable as u64,
                    lora: trainer.adapter().is_some(),
                    dtype: comas_model::dtype::kind_name(m.kind()).to_string(),
                    device: format!("{:?}", m.device()),
                    global_step: trainer.global_step,
                    optimizer_steps: trainer.optimizer_steps,
                    config_json: serde_json::to_string(trainer.config()).unwrap_or_default(),
                    memory_total_bytes: memory_total,
                });
            }
        }
    }
}
