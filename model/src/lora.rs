//! LoRA adapters in the PEFT layout (`adapter_config.json` + `adapter_model.safetensors`).
//! An adapter adds `scale * B(A(x))` to a projection; adapters are chosen per batch row, so one
//! decode batch can mix agents that share a base model.
use crate::config::Config;
use crate::error::{read_json, ModelError, Result};
use crate::safetensors::{self, SafeTensorsFile};
use crate::seeded::with_torch_seed;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// The projections LoRA can target, by their checkpoint names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] =
        [Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down];

    pub fn name(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    /// Path of the projection inside a decoder layer (`self_attn.q_proj`, `mlp.down_proj`).
    pub fn module_path(self) -> String {
        match self {
            Proj::Q | Proj::K | Proj::V | Proj::O => format!("self_attn.{}", self.name()),
            _ => format!("mlp.{}", self.name()),
        }
    }

    pub fn from_name(name: &str) -> Option<Proj> {
        Proj::ALL.into_iter().find(|p| p.name() == name)
    }

    /// (in_features, out_features) of this projection for `cfg`.
    pub fn dims(self, cfg: &Config) -> (i64, i64) {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let q = cfg.num_attention_heads * cfg.head_dim;
        let kv = cfg.num_key_value_heads * cfg.head_dim;
        match self {
            Proj::Q => (h, q),
            Proj::K | Proj::V => (h, kv),
            Proj::O => (q, h),
            Proj::Gate | Proj::Up => (h, i),
            Proj::Down => (i, h),
        }
    }
}

/// The subset of PEFT's `adapter_config.json` we read and write.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoraConfig {
    pub r: i64,
    pub lora_alpha: f64,
    pub target_modules: Vec<String>,
    #[serde(default)]
    pub use_rslora: bool,
    #[serde(default)]
    pub lora_dropout: f64,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
}

impl LoraConfig {
    /// A plain LoRA (no dropout) from a training config's `[lora]` settings.
    pub fn new(r: i64, lora_alpha: f64, target_modules: Vec<String>, use_rslora: bool) -> Self {
        Self {
            r,
            lora_alpha,
            target_modules,
            use_rslora,
            lora_dropout: 0.0,
            base_model_name_or_path: None,
        }
    }

    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.lora_alpha / (self.r as f64).sqrt()
        } else {
            self.lora_alpha / self.r as f64
        }
    }

    fn targets(&self) -> Result<Vec<Proj>> {
        let mut out = Vec::new();
        for name in &self.target_modules {
            let p = Proj::from_name(name).ok_or_else(|| {
                ModelError::Lora(format!("target module `{name}` is not supported; use any of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"))
            })?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        if out.is_empty() {
            return Err(ModelError::Lora("target_modules is empty".into()));
        }
        out.sort();
        Ok(out)
    }
}

/// Reads PEFT's config, rejecting options we would otherwise silently ignore.
fn parse_peft_config(path: &Path) -> Result<LoraConfig> {
    let raw: Value = read_json(path)?;
    let bad = |m: String| ModelError::Lora(format!("{}: {m}", path.display()));
    if let Some(t) = raw.get("peft_type").and_then(Value::as_str) {
        if t != "LORA" {
            return Err(bad(format!("peft_type `{t}` is not LORA")));
        }
    }
    for key in ["use_dora", "fan_in_fan_out", "lora_bias"] {
        if raw.get(key).and_then(Value::as_bool) == Some(true) {
            return Err(bad(format!("`{key}: true` is not supported")));
        }
    }
    if let Some(b) = raw.get("bias").and_then(Value::as_str) {
        if b != "none" {
            return Err(bad(format!("bias `{b}` is not supported; only \"none\"")));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if raw.get(key).and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
            return Err(bad(format!("`{key}` is not supported")));
        }
    }
    for key in ["layers_to_transform", "modules_to_save"] {
        if raw.get(key).is_some_and(|v| !v.is_null()) {
            return Err(bad(format!("`{key}` is not supported")));
        }
    }
    let target_modules = match raw.get("target_modules") {
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(String::from).collect(),
        Some(Value::String(s)) if s == "all-linear" => {
            Proj::ALL.iter().map(|p| p.name().to_string()).collect()
        }
        Some(Value::String(s)) => {
            return Err(bad(format!(
                "target_modules pattern `{s}` is not supported; list the module names"
            )))
        }
        _ => return Err(bad("target_modules is missing".into())),
    };
    let r = raw.get("r").and_then(Value::as_i64).ok_or_else(|| bad("`r` is missing".into()))?;
    if r <= 0 {
        return Err(bad(format!("`r` must be positive, got {r}")));
    }
    Ok(LoraConfig {
        r,
        lora_alpha: raw.get("lora_alpha").and_then(Value::as_f64).unwrap_or(8.0),
        target_modules,
        use_rslora: raw.get("use_rslora").and_then(Value::as_bool).unwrap_or(false),
        lora_dropout: raw.get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0),
        base_model_name_or_path: raw
            .get("base_model_name_or_path")
            .and_then(Value::as_str)
            .map(String::from),
    })
}

fn tensor_name(layer: usize, proj: Proj, ab: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{}.lora_{ab}.weight", proj.module_path())
}

pub struct LoraAdapter {
    pub config: LoraConfig,
    scale: f64,
    /// (layer, proj) -> (A [r, in], B [out, r])
    weights: HashMap<(usize, Proj), (Tensor, Tensor)>,
}

impl LoraAdapter {
    /// Loads an adapter folder for a model with config `cfg`, casting to `kind` on `device`.
    pub fn load(dir: &Path, cfg: &Config, kind: Kind, device: Device) -> Result<Self> {
        let config = parse_peft_config(&dir.join("adapter_config.json"))?;
        let targets = config.targets()?;
        let file_path = dir.join("adapter_model.safetensors");
        if !file_path.is_file() {
            return Err(ModelError::Lora(format!(
                "{} is missing (adapter_model.bin is not supported)",
                file_path.display()
            )));
        }
        let file = SafeTensorsFile::open(&file_path)?;
        let mut weights = HashMap::new();
        let mut used = 0usize;
        for layer in 0..cfg.num_hidden_layers as usize {
            for &proj in &targets {
                let (fan_in, fan_out) = proj.dims(cfg);
                let mut get = |ab: &str, shape: [i64; 2]| -> Result<Tensor> {
                    let name = tensor_name(layer, proj, ab);
                    let info = file.info(&name).ok_or_else(|| ModelError::MissingTensor {
                        name: name.clone(),
                        expected: shape.to_vec(),
                    })?;
                    if info.shape != shape {
                        return Err(ModelError::ShapeMismatch {
                            name,
                            expected: shape.to_vec(),
                            found: info.shape.clone(),
                        });
                    }
                    used += 1;
                    Ok(file.tensor(&name)?.to_kind(kind).to_device(device))
                };
                let a = get("A", [config.r, fan_in])?;
                let b = get("B", [fan_out, config.r])?;
                weights.insert((layer, proj), (a, b));
            }
        }
        let total = file.names().count();
        if used != total {
            let extra: Vec<&str> = file
                .names()
                .filter(|n| {
                    !weights.keys().any(|(l, p)| {
                        *n == tensor_name(*l, *p, "A") || *n == tensor_name(*l, *p, "B")
                    })
                })
                .take(3)
                .collect();
            return Err(ModelError::Lora(format!(
                "{}: {} tensors do not belong to the configured targets (e.g. {extra:?})",
                file_path.display(),
                total - used
            )));
        }
        Ok(Self { scale: config.scale(), config, weights })
    }

    /// A fresh adapter as PEFT initialises one: A Kaiming-uniform (a = sqrt(5)), B zero, so the
    /// adapter starts as the identity. Seeded for reproducibility.
    pub fn init(
        cfg: &Config,
        config: LoraConfig,
        seed: i64,
        kind: Kind,
        device: Device,
    ) -> Result<Self> {
        let targets = config.targets()?;
        if config.r <= 0 {
            return Err(ModelError::Lora(format!("`r` must be positive, got {}", config.r)));
        }
        let weights = with_torch_seed(seed, || {
            let mut weights = HashMap::new();
            for layer in 0..cfg.num_hidden_layers as usize {
                for &proj in &targets {
                    let (fan_in, fan_out) = proj.dims(cfg);
                    // kaiming_uniform with a = sqrt(5): bound = 1 / sqrt(fan_in)
                    let bound = 1.0 / (fan_in as f64).sqrt();
                    let a = Tensor::empty([config.r, fan_in], (Kind::Float, Device::Cpu))
                        .uniform_(-bound, bound);
                    let b = Tensor::zeros([fan_out, config.r], (Kind::Float, Device::Cpu));
                    weights.insert(
                        (layer, proj),
                        (a.to_kind(kind).to_device(device), b.to_kind(kind).to_device(device)),
                    );
                }
            }
            weights
        });
        Ok(Self { scale: config.scale(), config, weights })
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Makes the adapter trainable (learners) or frozen (inference).
    pub fn set_requires_grad(&self, on: bool) {
        for (a, b) in self.weights.values() {
            let _ = a.set_requires_grad(on);
            let _ = b.set_requires_grad(on);
        }
    }

    pub fn get(&self, layer: usize, proj: Proj) -> Option<&(Tensor, Tensor)> {
        self.weights.get(&(layer, proj))
    }

    /// Every adapted (layer, projection) with its (A, B).
    pub fn pairs(&self) -> impl Iterator<Item = (&(usize, Proj), &(Tensor, Tensor))> {
        self.weights.iter()
    }

    /// All adapter tensors with their PEFT names, sorted by name (shallow clones: shared storage).
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .weights
            .iter()
            .flat_map(|((l, p), (a, b))| {
                [
                    (tensor_name(*l, *p, "A"), a.shallow_clone()),
                    (tensor_name(*l, *p, "B"), b.shallow_clone()),
                ]
            })
            .collect();
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    }

    /// Writes the adapter in the PEFT layout, each file atomically.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let cfg = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.config.r,
            "lora_alpha": self.config.lora_alpha,
            "lora_dropout": self.config.lora_dropout,
            "target_modules": self.config.target_modules,
            "use_rslora": self.config.use_rslora,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "base_model_name_or_path": self.config.base_model_name_or_path,
        });
        let text = serde_json::to_string_pretty(&cfg).expect("json");
        safetensors::write_atomic(&dir.join("adapter_config.json"), |w| {
            std::io::Write::write_all(w, text.as_bytes())
        })?;
        safetensors::write(
            &dir.join("adapter_model.safetensors"),
            &self.named_tensors(),
            &BTreeMap::new(),
        )
    }
}

/// Which adapter each batch row uses. Rows without an adapter run the base model.
pub struct LoraBatch<'a> {
    groups: Vec<(&'a LoraAdapter, Option<Tensor>)>,
}

impl<'a> LoraBatch<'a> {
    /// Every row uses `adapter`.
    pub fn uniform(adapter: &'a LoraAdapter) -> Self {
        Self { groups: vec![(adapter, None)] }
    }

    /// `per_row[b]` is the adapter of row b (compared by address), or None for the base model.
    pub fn per_row(per_row: &[Option<&'a LoraAdapter>], device: Device) -> Self {
        let mut groups: Vec<(&'a LoraAdapter, Vec<i64>)> = Vec::new();
        for (row, a) in per_row.iter().enumerate() {
            if let Some(a) = a {
                match groups.iter_mut().find(|(g, _)| std::ptr::eq(*g, *a)) {
                    Some((_, rows)) => rows.push(row as i64),
                    None => groups.push((a, vec![row as i64])),
                }
            }
        }
        if groups.len() == 1 && groups[0].1.len() == per_row.len() {
            return Self::uniform(groups[0].0);
        }
        Self {
            groups: groups
                .into_iter()
                .map(|(a, rows)| (a, Some(Tensor::from_slice(&rows).to_device(device))))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Adds the adapters' contribution for projection `proj` of `layer` to `y` = base(x).
    pub fn apply(&self, layer: usize, proj: Proj, x: &Tensor, y: Tensor) -> Tensor {
        let mut y = y;
        for (adapter, rows) in &self.groups {
            let Some((a, b)) = adapter.get(layer, proj) else { continue };
            match rows {
                None => {
                    y = y + x.linear::<Tensor>(a, None).linear::<Tensor>(b, None) * adapter.scale
                }
                Some(rows) => {
                    let delta =
                        x.index_select(0, rows).linear::<Tensor>(a, None).linear::<Tensor>(b, None)
                            * adapter.scale;
                    y = y.index_add(0, rows, &delta);
                }
            }
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::Proj;

    /// The job check refuses a target by the workflow's list of names (which cannot depend on
    /// this crate): the two must name the same projections.
    #[test]
    fn the_job_check_knows_every_projection_by_its_peft_name() {
        let names: Vec<&str> = Proj::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names, comas_workflow::train_config::LORA_TARGET_MODULES);
        for p in Proj::ALL {
            assert_eq!(Proj::from_name(p.name()), Some(p));
        }
        assert_eq!(Proj::from_name("lm_head"), None);
    }
}
