//! The policies a worker hosts: base models with their tokenizers, and per agent either a LoRA
//! adapter on a shared base or a model instance of its own. Built and used on the engine thread.
use crate::engine::EngineError;
use crate::remote::RemotePolicy;
use comas_model::dtype::parse_kind;
use comas_model::lora::LoraConfig;
use comas_model::{CausalLm, LoraAdapter, ModelError, Tokenizer};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, PartialEq)]
pub struct PolicySpec {
    pub agent: u32,
    pub model_dir: PathBuf,
    pub adapter_dir: Option<PathBuf>,
    pub full_weights: bool,
    /// Start a zero LoRA adapter with these settings when there is no adapter folder.
    pub lora: Option<comas_workflow::train_config::LoraSettings>,
    /// A frozen model served elsewhere: its turns go to this endpoint and nothing is loaded.
    pub remote: Option<RemotePolicy>,
}

pub struct Base {
    pub model: CausalLm,
    pub tokenizer: Tokenizer,
}

pub struct AgentPolicy {
    /// Index into `Models::bases`.
    pub base: usize,
    pub adapter: Option<LoraAdapter>,
}

pub struct Models {
    pub bases: Vec<Base>,
    pub agents: BTreeMap<u32, AgentPolicy>,
    /// Frozen models behind an OpenAI-compatible endpoint.
    pub remote: BTreeMap<u32, RemotePolicy>,
}

impl Models {
    pub fn empty() -> Self {
        Self { bases: Vec::new(), agents: BTreeMap::new(), remote: BTreeMap::new() }
    }

    /// Loads every policy; agents without their own weights share a base loaded once per folder.
    pub fn load(specs: &[PolicySpec], dtype: &str, device: Device) -> Result<Self, ModelError> {
        let kind = if dtype.is_empty() { Kind::Float } else { parse_kind(dtype)? };
        let mut bases: Vec<Base> = Vec::new();
        let mut shared: BTreeMap<PathBuf, usize> = BTreeMap::new();
        let mut agents = BTreeMap::new();
        let mut remote = BTreeMap::new();
        for s in specs {
            if agents.contains_key(&s.agent) || remote.contains_key(&s.agent) {
                return Err(ModelError::Config(format!("agent {} is listed twice", s.agent)));
            }
            if let Some(r) = &s.remote {
                remote.insert(s.agent, r.clone());
                continue;
            }
            let own = s.full_weights && s.adapter_dir.is_none() && s.lora.is_none();
            let base = match (own, shared.get(&s.model_dir)) {
                (false, Some(&i)) => i,
                _ => {
                    let model = CausalLm::load(&s.model_dir, kind, device)?;
                    // The worker only generates: decode steps may use packed linears.
                    model.pack_for_decode();
                    let tokenizer = Tokenizer::from_dir(&s.model_dir)?;
                    tokenizer.check_fits(model.config())?;
                    // Agents speak through the chat template: one that is missing or broken is
                    // refused at load, not at the first turn.
                    tokenizer.check_chat_template().map_err(|e| {
                        ModelError::ChatTemplate(format!(
                            "{}: {e}; agents speak through it",
                            s.model_dir.display()
                        ))
                    })?;
                    bases.push(Base { model, tokenizer });
                    if !own {
                        shared.insert(s.model_dir.clone(), bases.len() - 1);
                    }
                    bases.len() - 1
                }
            };
            let adapter = match &s.adapter_dir {
                Some(dir) => {
                    Some(LoraAdapter::load(dir, bases[base].model.config(), kind, device)?)
                }
                // init leaves B = 0, so the adapter adds nothing until the learner's first version.
                None => match &s.lora {
                    Some(l) => {
                        let lc =
                            LoraConfig::new(l.r, l.alpha, l.target_modules.clone(), l.use_rslora);
                        Some(LoraAdapter::init(bases[base].model.config(), lc, 0, kind, device)?)
                    }
                    None => None,
                },
            };
            agents.insert(s.agent, AgentPolicy { base, adapter });
        }
        // Warm-up: one forward per base, so the first real batch does not pay for lazy init.
        for b in &bases {
            let _g = tch::no_grad_guard();
            let _ = b.model.forward(&Tensor::from_slice(&[0i64, 1]).view([1, 2]), None, None)?;
        }
        Ok(Self { bases, agents, remote })
    }

    /// Copies new weights for `agent` into its tensors in place. Every tensor of the agent's
    /// trainable set (its adapter, or its whole model) must be present, with matching shapes.
    /// Tokens base model `b` holds: its `max_position_embeddings`.
    pub fn context(&self, b: usize) -> usize {
        self.bases[b].model.config().max_position_embeddings.max(0) as usize
    }

    pub fn apply_update(
        &self,
        agent: u32,
        tensors: &[comas_proto::weights::ReceivedTensor],
    ) -> Result<(), EngineError> {
        let a = self.agents.get(&agent).ok_or(EngineError::NoPolicy { agent })?;
        let targets: Vec<(String, Tensor)> = match &a.adapter {
            Some(ad) => ad.named_tensors(),
            None => {
                if self.agents.values().filter(|o| o.base == a.base).count() > 1 {
                    return Err(EngineError::SharedBase { agent });
                }
                self.bases[a.base].model.named_parameters()
            }
        };
        if targets.len() != tensors.len() {
            return Err(EngineError::TensorCount {
                agent,
                got: tensors.len(),
                want: targets.len(),
            });
        }
        let by_name: BTreeMap<&str, &comas_proto::weights::ReceivedTensor> =
            tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        // Check everything before writing anything, so a bad update changes nothing.
        let mut staged = Vec::with_capacity(targets.len());
        for (name, dst) in &targets {
            let src = by_name
                .get(name.as_str())
                .ok_or_else(|| EngineError::MissingTensor { agent, name: name.clone() })?;
            if src.shape != dst.size() {
                return Err(EngineError::ShapeMismatch {
                    name: name.clone(),
                    update: src.shape.clone(),
                    policy: dst.size(),
                });
            }
            let kind = parse_kind(&src.dtype)
                .map_err(|err| EngineError::BadDtype { name: name.clone(), err })?;
            let t = Tensor::f_from_data_size(&src.bytes, &src.shape, kind)
                .map_err(|err| EngineError::BadTensor { name: name.clone(), err })?;
            staged.push((dst.shallow_clone(), t));
        }
        tch::no_grad(|| {
            for (mut dst, src) in staged {
                // Every shape and dtype was checked above; a failure here is libtorch's.
                dst.f_copy_(&src.to_kind(dst.kind()).to_device(dst.device()))
                    .map_err(|err| EngineError::CopyFailed { agent, err })?;
            }
            Ok::<(), EngineError>(())
        })?;
        Ok(())
    }
}
