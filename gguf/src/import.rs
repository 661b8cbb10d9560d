//! `comas import-gguf`: a GGUF file to a Hugging Face model folder (`config.json`,
//! `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`).
//! Everything is written into a temporary folder beside the output and renamed into place, so
//! an interrupted import leaves either the old folder or the complete new one.
use crate::arch::{map_name, unpermute_rows, Arch, HfConfig, Mapped};
use crate::error::{GgufError, Result};
use crate::reader::{GgufFile, TensorInfo};
use crate::vocab::Vocab;
use safetensors::tensor::{Dtype, View};
use serde::Serialize;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The dtype of the written weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    F32,
    BF16,
    F16,
}

impl OutDtype {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" | "float32" => Some(Self::F32),
            "bf16" | "bfloat16" => Some(Self::BF16),
            "f16" | "float16" => Some(Self::F16),
            _ => None,
        }
    }

    fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::BF16 => "bfloat16",
            Self::F16 => "float16",
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            Self::F32 => Dtype::F32,
            Self::BF16 => Dtype::BF16,
            Self::F16 => Dtype::F16,
        }
    }

    fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() * if self == Self::F32 { 4 } else { 2 });
        match self {
            Self::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Self::BF16 => values
                .iter()
                .for_each(|&v| out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes())),
            Self::F16 => values
                .iter()
                .for_each(|&v| out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes())),
        }
        out
    }
}

#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub dtype: OutDtype,
    /// Replace a non-empty output folder.
    pub force: bool,
}

/// What an import did, for the CLI to print.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    pub out: PathBuf,
    pub architecture: &'static str,
    pub gguf_version: u32,
    pub tensors: usize,
    pub parameters: u64,
    /// Source tensor types and how many tensors had each.
    pub source_types: BTreeMap<String, usize>,
    pub vocab_tokens: usize,
    pub merges: usize,
    pub tie_word_embeddings: bool,
    pub dtype: &'static str,
}

/// One output tensor, dequantised only when the safetensors writer asks for its bytes.
struct LazyTensor<'a> {
    file: &'a GgufFile,
    info: &'a TensorInfo,
    shape: Vec<usize>,
    unpermute_heads: Option<u64>,
    dtype: OutDtype,
    /// The first failure while writing (the writer's `data()` cannot return one).
    failed: &'a RefCell<Option<GgufError>>,
}

impl LazyTensor<'_> {
    fn values(&self) -> Result<Vec<f32>> {
        let v = self.file.dequantize(self.info)?;
        match self.unpermute_heads {
            None => Ok(v),
            Some(heads) => unpermute_rows(&v, self.shape[0], heads as usize)
                .map_err(|message| GgufError::Tensor { tensor: self.info.name.clone(), message }),
        }
    }
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype.safetensors()
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match self.values() {
            Ok(v) => Cow::Owned(self.dtype.encode(&v)),
            Err(e) => {
                self.failed.borrow_mut().get_or_insert(e);
                Cow::Owned(vec![0; self.data_len()])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * if self.dtype == OutDtype::F32 { 4 } else { 2 }
    }
}

/// The HF tensors a model of this configuration must have.
fn expected_names(arch: Arch, cfg: &HfConfig) -> BTreeSet<String> {
    let mut names: BTreeSet<String> =
        ["model.embed_tokens.weight", "model.norm.weight"].into_iter().map(String::from).collect();
    if !cfg.tie_word_embeddings {
        names.insert("lm_head.weight".into());
    }
    for l in 0..cfg.num_hidden_layers {
        let mut parts = vec![
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ];
        match arch {
            Arch::Qwen2 => parts.extend([
                "self_attn.q_proj.bias",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.bias",
            ]),
            Arch::Qwen3 => parts.extend(["self_attn.q_norm.weight", "self_attn.k_norm.weight"]),
            Arch::Llama => {}
        }
        names.extend(parts.into_iter().map(|p| format!("model.layers.{l}.{p}")));
    }
    names
}

/// Refuses an output that is a file, or a non-empty folder without `force`.
fn check_output(out: &Path, force: bool) -> Result<()> {
    let bad = |message: String| GgufError::Output { path: out.to_path_buf(), message };
    match std::fs::metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(bad(e.to_string())),
        Ok(m) if !m.is_dir() => Err(bad("exists and is not a folder".into())),
        Ok(_) => {
            let non_empty =
                std::fs::read_dir(out).map_err(|e| bad(e.to_string()))?.next().is_some();
            if non_empty && !force {
                Err(bad("is not empty; pass --force to replace it".into()))
            } else {
                Ok(())
            }
        }
    }
}

fn write_json<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<()> {
    let path = dir.join(name);
    let mut text = serde_json::to_string_pretty(value).expect("plain records serialise");
    text.push('\n');
    std::fs::write(&path, text).map_err(|e| GgufError::io(&path, e))
}

fn sync(path: &Path) -> Result<()> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).map_err(|e| GgufError::io(path, e))
}

pub fn import(gguf: &Path, out: &Path, opts: &ImportOptions) -> Result<ImportReport> {
    check_output(out, opts.force)?;
    let file = GgufFile::open(gguf)?;
    let arch_name = file
        .get_str("general.architecture")?
        .ok_or_else(|| GgufError::meta("general.architecture", "is missing"))?;
    let arch = Arch::from_name(arch_name)?;
    for t in &file.tensors {
        if !t.ty.can_dequantize() {
            return Err(GgufError::UnsupportedType {
                tensor: t.name.clone(),
                ty: t.ty.name(),
                supported: crate::quant::SUPPORTED,
            });
        }
    }
    let embed = file.tensor("token_embd.weight").ok_or_else(|| GgufError::Tensor {
        tensor: "token_embd.weight".into(),
        message: "is missing".into(),
    })?;
    let vocab_rows = embed.shape()[0] as u64;
    let tied = file.tensor("output.weight").is_none();
    let vocab = Vocab::from_gguf(&file)?;
    if vocab.tokens.len() as u64 > vocab_rows {
        return Err(GgufError::Tokenizer(format!(
            "{} tokens but token_embd.weight has only {vocab_rows} rows: the vocabulary does not belong to these weights",
            vocab.tokens.len()
        )));
    }
    let tokenizer = vocab.tokenizer()?;
    let mut cfg = HfConfig::from_gguf(&file, arch, vocab_rows, tied, opts.dtype.torch_name())?;

    let failed = RefCell::new(None);
    let mut lazy = Vec::new();
    let mut source_types = BTreeMap::new();
    let mut parameters = 0u64;
    for t in &file.tensors {
        match map_name(&t.name, arch, &cfg)? {
            Mapped::RopeFreqs => {
                let original =
                    file.get_u64(&format!("{}.rope.scaling.original_context_length", arch.name()))?;
                cfg.set_llama3_rope(&file.dequantize(t)?, original)?;
            }
            Mapped::Tensor { hf_name, unpermute_heads } => {
                let shape = t.shape();
                if let Some(heads) = unpermute_heads {
                    if shape[0] as u64 % (2 * heads) != 0 {
                        return Err(GgufError::Tensor {
                            tensor: t.name.clone(),
                            message: format!(
                                "{} rows do not split into {heads} rotary heads",
                                shape[0]
                            ),
                        });
                    }
                }
                *source_types.entry(t.ty.name()).or_insert(0) += 1;
                parameters += t.numel();
                lazy.push((
                    hf_name,
                    LazyTensor {
                        file: &file,
                        info: t,
                        shape,
                        unpermute_heads,
                        dtype: opts.dtype,
                        failed: &failed,
                    },
                ));
            }
        }
    }
    let have: BTreeSet<String> = lazy.iter().map(|(n, _)| n.clone()).collect();
    let expected = expected_names(arch, &cfg);
    if let Some(missing) = expected.difference(&have).next() {
        return Err(GgufError::Tensor {
            tensor: missing.clone(),
            message: format!("is missing from {} (a `{arch_name}` model needs it)", gguf.display()),
        });
    }
    if let Some(extra) = have.difference(&expected).next() {
        return Err(GgufError::Tensor {
            tensor: extra.clone(),
            message: format!("is not part of a `{arch_name}` model with this configuration"),
        });
    }

    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| GgufError::io(&parent, e))?;
    let tmp = tempfile::Builder::new()
        .prefix(".import-gguf-")
        .tempdir_in(&parent)
        .map_err(|e| GgufError::io(&parent, e))?;
    let dir = tmp.path();
    write_json(dir, "config.json", &cfg)?;
    write_json(dir, "generation_config.json", &vocab.generation_config())?;
    write_json(dir, "tokenizer_config.json", &vocab.tokenizer_config(cfg.max_position_embeddings))?;
    let tok_path = dir.join("tokenizer.json");
    tokenizer
        .save(&tok_path, false)
        .map_err(|e| GgufError::Tokenizer(format!("writing {}: {e}", tok_path.display())))?;
    let weights = dir.join("model.safetensors");
    let meta = Some(std::collections::HashMap::from([("format".to_string(), "pt".to_string())]));
    let tensors = lazy.len();
    safetensors::tensor::serialize_to_file(lazy, &meta, &weights)
        .map_err(|e| GgufError::Output { path: weights.clone(), message: format!("{e:?}") })?;
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    for name in [
        "config.json",
        "generation_config.json",
        "tokenizer_config.json",
        "tokenizer.json",
        "model.safetensors",
    ] {
        sync(&dir.join(name))?;
    }
    install(tmp, out)?;
    Ok(ImportReport {
        out: out.to_path_buf(),
        architecture: arch.name(),
        gguf_version: file.version,
        tensors,
        parameters,
        source_types,
        vocab_tokens: vocab.tokens.len(),
        merges: vocab.merges.len(),
        tie_word_embeddings: tied,
        dtype: opts.dtype.torch_name(),
    })
}

/// Renames the finished folder into place; an existing folder is moved aside first and removed
/// only once the new one is in.
fn install(tmp: tempfile::TempDir, out: &Path) -> Result<()> {
    let bad = |message: String| GgufError::Output { path: out.to_path_buf(), message };
    let new = tmp.keep();
    let old = if out.exists() {
        let aside = new.with_file_name(format!(".import-gguf-old-{}", std::process::id()));
        std::fs::rename(out, &aside)
            .map_err(|e| bad(format!("cannot move the old folder aside: {e}")))?;
        Some(aside)
    } else {
        None
    };
    if let Err(e) = std::fs::rename(&new, out) {
        if let Some(aside) = &old {
            let _ = std::fs::rename(aside, out);
        }
        let _ = std::fs::remove_dir_all(&new);
        return Err(bad(format!("cannot move the new folder into place: {e}")));
    }
    if let Some(aside) = old {
        std::fs::remove_dir_all(&aside).map_err(|e| {
            bad(format!(
                "imported, but the old folder {} could not be removed: {e}",
                aside.display()
            ))
        })?;
    }
    Ok(())
}
