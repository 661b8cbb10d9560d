//! The policies a worker hosts: base models with their tokenizers, and per agent either a LoRA
//! adapter on a shared base or a model instance of its own. A base runs on comas's own engine
//! (its weights loaded here) or on a vLLM server (only its config, tokenizer and the agents'
//! adapters are kept here). Built and used on the engine thread.
use crate::engine::EngineError;
use crate::remote::RemotePolicy;
use crate::vllm::{self, ServeSpec, VllmServer, VllmSettings};
use comas_model::dtype::{kind_name, parse_kind};
use comas_model::lora::LoraConfig;
use comas_model::{CausalLm, Config, LoraAdapter, ModelError, Tokenizer};
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

/// What generates a base model's turns.
pub enum Engine {
    Own(CausalLm),
    Vllm(VllmServer),
}

pub struct Base {
    pub engine: Engine,
    pub config: Config,
    pub tokenizer: Tokenizer,
}

impl Base {
    /// The model, when comas's own engine runs it.
    pub fn own(&self) -> Option<&CausalLm> {
        match &self.engine {
            Engine::Own(m) => Some(m),
            Engine::Vllm(_) => None,
        }
    }

    pub fn vllm(&self) -> Option<&VllmServer> {
        match &self.engine {
            Engine::Vllm(s) => Some(s),
            Engine::Own(_) => None,
        }
    }
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
    /// With `vllm`, each base is served by a vLLM server instead (started here, or the one it
    /// names), and each LoRA agent's adapter is loaded into it as version 0.
    pub fn load(
        specs: &[PolicySpec],
        dtype: &str,
        device: Device,
        vllm: Option<&VllmSettings>,
    ) -> Result<Self, EngineError> {
        let kind = if dtype.is_empty() { Kind::Float } else { parse_kind(dtype)? };
        if let Some(settings) = vllm {
            return Self::load_on_vllm(specs, kind, settings);
        }
        let models = Self::assemble(specs, kind, device, |s, _| {
            let model = CausalLm::load(&s.model_dir, kind, device)?;
            // The worker only generates: decode steps may use packed linears.
            model.pack_for_decode();
            let tokenizer = checked_tokenizer(&s.model_dir, model.config())?;
            let config = model.config().clone();
            Ok(Base { engine: Engine::Own(model), config, tokenizer })
        })?;
        // Warm-up: one forward per base, so the first real batch does not pay for lazy init.
        for m in models.bases.iter().filter_map(Base::own) {
            let _g = tch::no_grad_guard();
            let _ = m.forward(&Tensor::from_slice(&[0i64, 1]).view([1, 2]), None, None)?;
        }
        Ok(models)
    }

    /// The policies of `specs`: agents without their own weights share a base made once per
    /// folder by `new_base` (given the spec and how many bases exist), each agent its adapter on
    /// `adapter_device`, frozen models behind endpoints as they are.
    fn assemble(
        specs: &[PolicySpec],
        kind: Kind,
        adapter_device: Device,
        mut new_base: impl FnMut(&PolicySpec, usize) -> Result<Base, EngineError>,
    ) -> Result<Self, EngineError> {
        let mut bases: Vec<Base> = Vec::new();
        let mut shared: BTreeMap<PathBuf, usize> = BTreeMap::new();
        let mut agents = BTreeMap::new();
        let mut remote = BTreeMap::new();
        for s in specs {
            if agents.contains_key(&s.agent) || remote.contains_key(&s.agent) {
                return Err(ModelError::Config(format!("agent {} is listed twice", s.agent)).into());
            }
            if let Some(r) = &s.remote {
                remote.insert(s.agent, r.clone());
                continue;
            }
            let base = match (own_weights(s), shared.get(&s.model_dir)) {
                (false, Some(&i)) => i,
                (own, _) => {
                    bases.push(new_base(s, bases.len())?);
                    if !own {
                        shared.insert(s.model_dir.clone(), bases.len() - 1);
                    }
                    bases.len() - 1
                }
            };
            let adapter = adapter_of(s, &bases[base].config, kind, adapter_device)?;
            agents.insert(s.agent, AgentPolicy { base, adapter });
        }
        Ok(Self { bases, agents, remote })
    }

    /// Every base on a vLLM server: LoRA agents of one base folder share its server, each
    /// full-weight agent has one of its own. Adapters live here on the CPU (updates are copied
    /// into them and written out for the server); version 0 of each is loaded here.
    fn load_on_vllm(
        specs: &[PolicySpec],
        kind: Kind,
        settings: &VllmSettings,
    ) -> Result<Self, EngineError> {
        if settings.url.is_none() {
            vllm::check_python(&settings.python)?;
        }
        let models = Self::assemble(specs, kind, Device::Cpu, |s, made| {
            let config = Config::from_file(&s.model_dir.join("config.json"))?;
            let tokenizer = checked_tokenizer(&s.model_dir, &config)?;
            // How many LoRA agents this server holds, and their largest rank.
            let mut ranks = Vec::new();
            for o in specs
                .iter()
                .filter(|o| !own_weights(s) && o.remote.is_none() && o.model_dir == s.model_dir)
            {
                if let Some(dir) = &o.adapter_dir {
                    ranks.push(LoraAdapter::load(dir, &config, kind, Device::Cpu)?.config.r);
                } else if let Some(l) = &o.lora {
                    ranks.push(l.r);
                }
            }
            // Each agent's adapter, and the next version beside it during a swap.
            let lora = ranks.iter().max().map(|&r| (r, 2 * ranks.len()));
            let spec = ServeSpec {
                model_dir: s.model_dir.clone(),
                dtype: kind_name(kind).to_string(),
                max_model_len: (config.max_position_embeddings.max(1) as usize)
                    .min(settings.max_model_len),
                lora,
                device: settings.device.clone(),
            };
            let server = match &settings.url {
                Some(url) if made == 0 => VllmServer::attach(settings, url)?,
                Some(_) => {
                    return Err(vllm::VllmError::Setup(
                        "--vllm-url names one server, but this job's agents need several base models (or full-weight agents of their own); let the worker start its servers".into(),
                    )
                    .into())
                }
                None => VllmServer::start(settings, &spec, &format!("base{made}"))?,
            };
            Ok(Base { engine: Engine::Vllm(server), config, tokenizer })
        })?;
        // Version 0 of each adapter, under the name the agent's turns ask for.
        for (&agent, p) in &models.agents {
            if let (Some(a), Some(server)) = (&p.adapter, models.bases[p.base].vllm()) {
                let name = vllm::adapter_name(agent, 0);
                let dir = settings.work_dir.join(&name);
                a.save(&dir)?;
                vllm::load_adapter(server, &name, &dir)?;
            }
        }
        Ok(models)
    }

    /// Copies new weights for `agent` into its tensors in place. Every tensor of the agent's
    /// trainable set (its adapter, or its whole model) must be present, with matching shapes.
    /// Tokens base model `b` holds: its `max_position_embeddings`.
    pub fn context(&self, b: usize) -> usize {
        self.bases[b].config.max_position_embeddings.max(0) as usize
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
                match self.bases[a.base].own() {
                    Some(m) => m.named_parameters(),
                    None => return Err(EngineError::NoPolicy { agent }),
                }
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

/// A base folder's tokenizer, checked against its config and for a chat template: agents
/// speak through the template, so one that is missing or broken is refused at load, not at the
/// first turn.
fn checked_tokenizer(dir: &std::path::Path, config: &Config) -> Result<Tokenizer, ModelError> {
    let tokenizer = Tokenizer::from_dir(dir)?;
    tokenizer.check_fits(config)?;
    tokenizer.check_chat_template().map_err(|e| {
        ModelError::ChatTemplate(format!("{}: {e}; agents speak through it", dir.display()))
    })?;
    Ok(tokenizer)
}

/// An agent's adapter: its folder's, or a fresh one whose B = 0 adds nothing until the
/// learner's first version; none for a full-weight agent.
fn adapter_of(
    s: &PolicySpec,
    config: &Config,
    kind: Kind,
    device: Device,
) -> Result<Option<LoraAdapter>, ModelError> {
    match (&s.adapter_dir, &s.lora) {
        (Some(dir), _) => Ok(Some(LoraAdapter::load(dir, config, kind, device)?)),
        (None, Some(l)) => {
            let lc = LoraConfig::new(l.r, l.alpha, l.target_modules.clone(), l.use_rslora);
            Ok(Some(LoraAdapter::init(config, lc, 0, kind, device)?))
        }
        (None, None) => Ok(None),
    }
}

/// An agent with a model instance of its own (full weights, no adapter), not a shared base.
fn own_weights(s: &PolicySpec) -> bool {
    s.full_weights && s.adapter_dir.is_none() && s.lora.is_none()
}
