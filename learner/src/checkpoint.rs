//! Checkpoints and exports. A checkpoint is a folder `step-<N>` holding the model in the Hugging
//! Face layout (or the PEFT adapter), the optimizer moments, and the counters; it is written
//! under a temporary name and renamed into place, with a `COMPLETE` marker, so a partial
//! checkpoint is never loaded.
use crate::config::TrainConfig;
use crate::error::{LearnerError, Result};
use crate::trainer::{Bases, Trainer};
use comas_model::dtype::kind_name;
use comas_model::lora::Proj;
use comas_model::safetensors::{self, write_atomic, SafeTensorsFile};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// Files copied next to the weights so the folder is a complete model.
const SIDECAR_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
];
const MARKER: &str = "COMPLETE";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointState {
    pub format: u32,
    pub global_step: u64,
    pub optimizer_steps: u64,
    pub adam_steps: u64,
    /// The resolved training config, stored so a resume can be checked against it.
    pub config: TrainConfig,
    pub lora: bool,
    /// The trainer's recent step reports (absent in older checkpoints).
    #[serde(default)]
    pub reports: Vec<(String, crate::trainer::StepReport)>,
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|e| LearnerError::io(path, e))
}

/// Writes `tensors` plus config and tokenizer files of `source` as a model folder in `dir`,
/// with the config's dtype set to what was saved.
pub fn write_model_folder(
    dir: &Path,
    source: &Path,
    tensors: &[(String, Tensor)],
    kind: Kind,
) -> Result<()> {
    io(dir, std::fs::create_dir_all(dir))?;
    let cfg_path = source.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&io(&cfg_path, std::fs::read_to_string(&cfg_path))?)
            .map_err(|e| LearnerError::Checkpoint(format!("{}: {e}", cfg_path.display())))?;
    let key = if cfg.get("dtype").is_some() { "dtype" } else { "torch_dtype" };
    cfg[key] = kind_name(kind).into();
    let text = serde_json::to_string_pretty(&cfg).expect("json");
    write_atomic(&dir.join("config.json"), |w| w.write_all(text.as_bytes()))?;
    for f in SIDECAR_FILES {
        let (src, dst) = (source.join(f), dir.join(f));
        // Exporting over the model folder itself (a job continuing from its own export):
        // copying a file onto itself would truncate it to nothing.
        if src.is_file() && !comas_files::same_file(&src, &dst) {
            io(&src, std::fs::copy(&src, &dst))?;
        }
    }
    let cpu: Vec<(String, Tensor)> = tch::no_grad(|| {
        tensors.iter().map(|(n, t)| (n.clone(), t.detach().to_kind(kind))).collect()
    });
    safetensors::write(&dir.join("model.safetensors"), &cpu, &BTreeMap::new())?;
    Ok(())
}

impl Trainer {
    /// The trained weights as a plain model folder. With LoRA, `merge` folds the adapter into
    /// the base weights (W + scale·B·A); otherwise the adapter is written in the PEFT layout.
    pub fn export(&self, dir: &Path, merge: bool) -> Result<()> {
        let kind = self.model().kind();
        match (self.adapter(), merge) {
            (None, _) => {
                write_model_folder(dir, self.source_dir(), &self.model().named_parameters(), kind)
            }
            (Some(a), false) => Ok(a.save(dir)?),
            (Some(a), true) => {
                let merged: Vec<(String, Tensor)> = tch::no_grad(|| {
                    self.model()
                        .named_parameters()
                        .into_iter()
                        .map(|(name, w)| {
                            let target = (0..self.model().config().num_hidden_layers as usize)
                                .find_map(|l| {
                                    Proj::ALL
                                        .into_iter()
                                        .find(|p| {
                                            name == format!(
                                                "model.layers.{l}.{}.weight",
                                                p.module_path()
                                            )
                                        })
                                        .map(|p| (l, p))
                                });
                            match target.and_then(|(l, p)| a.get(l, p)) {
                                Some((la, lb)) => (name, &w + lb.matmul(la) * a.scale()),
                                None => (name, w),
                            }
                        })
                        .collect()
                });
                write_model_folder(dir, self.source_dir(), &merged, kind)
            }
        }
    }

    /// Writes `root/step-<global_step>` atomically and keeps the newest `keep` checkpoints.
    pub fn save_checkpoint(&self, root: &Path, keep: usize) -> Result<PathBuf> {
        io(root, std::fs::create_dir_all(root))?;
        let name = format!("step-{}", self.global_step);
        let tmp = root.join(format!(".{name}.tmp-{}", std::process::id()));
        if tmp.exists() {
            io(&tmp, std::fs::remove_dir_all(&tmp))?;
        }
        let sub = if self.adapter().is_some() { "adapter" } else { "model" };
        self.export(&tmp.join(sub), false)?;
        safetensors::write(
            &tmp.join("optimizer.safetensors"),
            &self.optimizer().state_tensors(),
            &BTreeMap::new(),
        )?;
        let state = CheckpointState {
            format: 1,
            global_step: self.global_step,
            optimizer_steps: self.optimizer_steps,
            adam_steps: self.optimizer().steps,
            config: self.config().clone(),
            lora: self.adapter().is_some(),
            reports: self.recent_reports.iter().cloned().collect(),
        };
        let text = serde_json::to_string_pretty(&state).expect("json");
        write_atomic(&tmp.join("state.json"), |w| w.write_all(text.as_bytes()))?;
        write_atomic(&tmp.join(MARKER), |w| w.write_all(b"ok\n"))?;
        let dest = root.join(&name);
        // A checkpoint of this step already there is moved aside, not deleted, before the new
        // one takes its name: a crash in between leaves the old one to resume from.
        let aside = root.join(format!(".{name}.old-{}", std::process::id()));
        if dest.exists() {
            io(&dest, std::fs::rename(&dest, &aside))?;
        }
        io(&dest, std::fs::rename(&tmp, &dest))?;
        // What earlier crashed saves of this step left: moved-aside and half-written copies.
        for entry in io(root, std::fs::read_dir(root))?.flatten() {
            let n = entry.file_name().to_string_lossy().into_owned();
            if n.starts_with(&format!(".{name}.old-")) || n.starts_with(&format!(".{name}.tmp-")) {
                io(&entry.path(), std::fs::remove_dir_all(entry.path()))?;
            }
        }
        io(root, comas_files::sync_dir(root))?;
        let mut all = list_checkpoints(root)?;
        while all.len() > keep.max(1) {
            let (_, old) = all.remove(0);
            io(&old, std::fs::remove_dir_all(&old))?;
        }
        Ok(dest)
    }

    /// Restores a trainer from a checkpoint folder written by `save_checkpoint`. The weights
    /// come from the checkpoint; `base_model` is the job's original model, which stays the KL
    /// reference (and the base under a LoRA adapter). `cfg` defaults to the stored config.
    pub fn resume(ckpt: &Path, base_model: &Path, cfg: Option<TrainConfig>) -> Result<Self> {
        Self::restore(&mut Bases::default(), ckpt, base_model, cfg, true)
    }

    /// As `resume`, a LoRA trainer taking its base from `bases`.
    pub fn resume_in(
        bases: &mut Bases,
        ckpt: &Path,
        base_model: &Path,
        cfg: Option<TrainConfig>,
    ) -> Result<Self> {
        Self::restore(bases, ckpt, base_model, cfg, true)
    }

    /// A new job's trainer that starts from another job's LoRA checkpoint (`agents.init_from`,
    /// what `comas grow` writes): its adapter and Adam moments, bit for bit, with this job's
    /// config and counters from zero (the schedule starts again; Adam's bias correction keeps
    /// the moments' age).
    pub fn start_from(
        bases: &mut Bases,
        ckpt: &Path,
        base_model: &Path,
        cfg: TrainConfig,
    ) -> Result<Self> {
        let t = Self::restore(bases, ckpt, base_model, Some(cfg), false)?;
        if t.adapter().is_none() {
            return Err(LearnerError::Checkpoint(format!(
                "{} holds full weights; init_from takes a LoRA checkpoint",
                ckpt.display()
            )));
        }
        Ok(t)
    }

    fn restore(
        bases: &mut Bases,
        ckpt: &Path,
        base_model: &Path,
        cfg: Option<TrainConfig>,
        counters: bool,
    ) -> Result<Self> {
        if !ckpt.join(MARKER).is_file() {
            return Err(LearnerError::Checkpoint(format!(
                "{} is incomplete (no {MARKER} marker); use an earlier checkpoint",
                ckpt.display()
            )));
        }
        let state_path = ckpt.join("state.json");
        let state: CheckpointState =
            serde_json::from_str(&io(&state_path, std::fs::read_to_string(&state_path))?)
                .map_err(|e| LearnerError::Checkpoint(format!("{}: {e}", state_path.display())))?;
        let mut cfg = cfg.unwrap_or_else(|| state.config.clone());
        if counters {
            cfg.completed_steps = state.optimizer_steps;
        }
        let mut t = if state.lora {
            Trainer::in_process(bases, base_model, cfg, Some(&ckpt.join("adapter")), None)?
        } else {
            let mut t = Trainer::with_reference(&ckpt.join("model"), cfg, None, Some(base_model))?;
            // Later checkpoints copy config and tokenizer files from here; the checkpoint we
            // resumed from may be rotated away, the base model folder is not.
            t.source_dir = base_model.to_path_buf();
            t
        };
        let opt_path = ckpt.join("optimizer.safetensors");
        let f = SafeTensorsFile::open(&opt_path)?;
        let device = t.model().device();
        let mut tensors = BTreeMap::new();
        for n in f.names() {
            tensors.insert(n.to_string(), f.tensor(n)?.to_device(device));
        }
        t.optimizer_mut()
            .load_state(&tensors, state.adam_steps)
            .map_err(|e| LearnerError::Checkpoint(format!("{}: {e}", opt_path.display())))?;
        if counters {
            t.global_step = state.global_step;
            t.optimizer_steps = state.optimizer_steps;
            t.recent_reports = state.reports.into_iter().collect();
        }
        Ok(t)
    }
}

/// The folder under a learner's `--checkpoint-dir` that holds job `name`'s checkpoints, so a new
/// job never resumes from another job's. A name of letters, digits, `-` and `_` (up to
/// [`JOB_FOLDER_CHARS`]) is its own folder; any other has its other characters replaced by `_`,
/// is cut to that length, and gets a hash of the whole name, so that two names never share a
/// folder (`col.a` and `col_a`, or two long names that start alike).
pub fn job_folder(name: &str) -> String {
    use sha2::Digest;
    let safe = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if !name.is_empty() && name.len() <= JOB_FOLDER_CHARS && name.chars().all(safe) {
        return name.to_string();
    }
    let stem: String =
        name.chars().take(JOB_FOLDER_CHARS).map(|c| if safe(c) { c } else { '_' }).collect();
    let hash = sha2::Sha256::digest(name.as_bytes());
    let hex: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{stem}-{hex}")
}

/// The longest job name that is its own checkpoint folder (file names stop at 255 bytes).
pub const JOB_FOLDER_CHARS: usize = 100;

/// Complete checkpoints under `root`, oldest first.
pub fn list_checkpoints(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    if !root.is_dir() {
        return Ok(out);
    }
    let mut aside = Vec::new();
    for entry in io(root, std::fs::read_dir(root))? {
        let p = io(root, entry)?.path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        if !p.join(MARKER).is_file() {
            continue;
        }
        if let Some(s) = name.strip_prefix("step-").and_then(|s| s.parse::<u64>().ok()) {
            out.push((s, p));
        } else if let Some(s) = name
            .strip_prefix(".step-")
            .and_then(|r| r.split_once(".old-"))
            .and_then(|(s, _)| s.parse::<u64>().ok())
        {
            aside.push((s, p));
        }
    }
    // A checkpoint moved aside by a save that crashed before its replacement took the name.
    for (s, p) in aside {
        if !out.iter().any(|(o, _)| *o == s) {
            out.push((s, p));
        }
    }
    out.sort();
    Ok(out)
}

pub fn latest_checkpoint(root: &Path) -> Result<Option<PathBuf>> {
    Ok(list_checkpoints(root)?.pop().map(|(_, p)| p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that continues from its own export writes the new one over it: the tokenizer
    /// files stay whole (copying them onto themselves used to leave them empty).
    #[test]
    fn a_model_folder_written_over_its_own_source_keeps_its_tokenizer_files() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("agent-0");
        std::fs::create_dir(&model).unwrap();
        std::fs::write(model.join("config.json"), r#"{"torch_dtype": "bfloat16"}"#).unwrap();
        std::fs::write(model.join("tokenizer.json"), "{\"tokens\": 1}").unwrap();
        let w = vec![("w".to_string(), Tensor::ones([2], (Kind::Float, tch::Device::Cpu)))];
        // The same folder under another spelling, as a job file's relative path gives it.
        let again = dir.path().join("agent-0/../agent-0");
        write_model_folder(&again, &model, &w, Kind::Float).unwrap();
        assert_eq!(
            std::fs::read_to_string(model.join("tokenizer.json")).unwrap(),
            "{\"tokens\": 1}"
        );
        let cfg = std::fs::read_to_string(model.join("config.json")).unwrap();
        assert!(cfg.contains("\"float32\""), "{cfg}");
        // Another folder still gets its own copies.
        let other = dir.path().join("out");
        write_model_folder(&other, &model, &w, Kind::Float).unwrap();
        assert_eq!(
            std::fs::read_to_string(other.join("tokenizer.json")).unwrap(),
            "{\"tokens\": 1}"
        );
    }

    #[test]
    fn names_that_differ_never_share_a_checkpoint_folder() {
        assert_eq!(job_folder("grpo-smollm2_2"), "grpo-smollm2_2");
        let (dot, underscore) = (job_folder("col.a"), job_folder("col_a"));
        assert_eq!(underscore, "col_a");
        assert!(dot.starts_with("col_a-") && dot.len() == "col_a-".len() + 8, "{dot}");
        assert_ne!(dot, underscore);
        // Stable: a restarted learner finds its job's folder again.
        assert_eq!(job_folder("col.a"), dot);
        assert!(!job_folder("../../etc/evil").contains('/'));
        // Long names that start alike: each cut to the limit, told apart by the hash.
        let (a, b) = ("x".repeat(300), format!("{}y", "x".repeat(299)));
        assert_ne!(job_folder(&a), job_folder(&b));
        assert!(job_folder(&a).len() <= JOB_FOLDER_CHARS + 9);
        assert_ne!(job_folder(""), "");
    }
}
