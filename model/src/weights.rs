//! Finding and reading a checkpoint's tensors: `model.safetensors` or a sharded set listed in
//! `model.safetensors.index.json`. Tensors are checked against the shapes the config implies
//! and cast to the requested dtype and device as they are taken.
use crate::error::{read_json, ModelError, Result};
use crate::safetensors::SafeTensorsFile;
use serde::Deserialize;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use tch::{Device, Kind, Tensor};

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

pub struct Checkpoint {
    files: Vec<SafeTensorsFile>,
    /// tensor name -> index into `files`
    index: HashMap<String, usize>,
    taken: BTreeSet<String>,
    /// Tensors already in memory (a model shared with another), taken as they are.
    held: HashMap<String, Tensor>,
    kind: Kind,
    device: Device,
}

impl Checkpoint {
    /// Opens the weights of the model folder `dir`; tensors will be cast to `kind` on `device`.
    pub fn open(dir: &Path, kind: Kind, device: Device) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let mut files = Vec::new();
        let mut index = HashMap::new();
        if single.is_file() {
            let f = SafeTensorsFile::open(&single)?;
            for name in f.names() {
                index.insert(name.to_string(), 0);
            }
            files.push(f);
        } else if index_path.is_file() {
            let shard_index: ShardIndex = read_json(&index_path)?;
            let mut by_file: HashMap<String, usize> = HashMap::new();
            let mut shard_names: Vec<&String> =
                shard_index.weight_map.values().collect::<BTreeSet<_>>().into_iter().collect();
            shard_names.sort();
            for shard in shard_names {
                if shard.contains('/') || shard.contains("..") {
                    return Err(ModelError::Folder {
                        folder: dir.into(),
                        what: format!("shard name `{shard}` must be a plain file name"),
                    });
                }
                let path = dir.join(shard);
                if !path.is_file() {
                    return Err(ModelError::Folder {
                        folder: dir.into(),
                        what: format!(
                            "shard `{shard}` listed in model.safetensors.index.json is missing"
                        ),
                    });
                }
                by_file.insert(shard.clone(), files.len());
                files.push(SafeTensorsFile::open(&path)?);
            }
            for (name, shard) in &shard_index.weight_map {
                let fi = by_file[shard];
                if files[fi].info(name).is_none() {
                    return Err(ModelError::Folder {
                        folder: dir.into(),
                        what: format!("index says tensor `{name}` is in `{shard}`, but that shard does not hold it"),
                    });
                }
                index.insert(name.clone(), fi);
            }
        } else if dir.join("pytorch_model.bin").exists() {
            return Err(ModelError::Folder {
                folder: dir.into(),
                what: "only pytorch_model.bin found; re-save the model with save_pretrained(safe_serialization=True)".into(),
            });
        } else {
            return Err(ModelError::Folder {
                folder: dir.into(),
                what: "no model.safetensors or model.safetensors.index.json".into(),
            });
        }
        Ok(Self { files, index, taken: BTreeSet::new(), held: HashMap::new(), kind, device })
    }

    /// A checkpoint of tensors already loaded (`kind` on `device`): taking one gives a tensor
    /// sharing its storage, so a model built from it shares the weights.
    pub fn held(tensors: Vec<(String, Tensor)>, kind: Kind, device: Device) -> Self {
        Self {
            files: Vec::new(),
            index: HashMap::new(),
            taken: BTreeSet::new(),
            held: tensors.into_iter().collect(),
            kind,
            device,
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name) || self.held.contains_key(name)
    }

    /// Takes tensor `name`, checking it has `shape`, cast to the checkpoint's target kind.
    pub fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        if let Some(t) = self.held.get(name) {
            if t.size() != shape {
                return Err(ModelError::ShapeMismatch {
                    name: name.into(),
                    expected: shape.to_vec(),
                    found: t.size(),
                });
            }
            self.taken.insert(name.to_string());
            return Ok(t.shallow_clone());
        }
        let fi = *self.index.get(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.into(),
            expected: shape.to_vec(),
        })?;
        let info = self.files[fi].info(name).expect("indexed tensor exists");
        if info.shape != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.into(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        if !matches!(info.kind, Kind::Float | Kind::BFloat16 | Kind::Half | Kind::Double) {
            return Err(ModelError::Weights(format!(
                "tensor `{name}` has non-float dtype {:?}",
                info.kind
            )));
        }
        let t = self.files[fi].tensor(name)?;
        self.taken.insert(name.to_string());
        Ok(t.to_kind(self.kind).to_device(self.device))
    }

    /// Names in the checkpoint that the model did not use (e.g. rotary buffers of old exports).
    pub fn unused(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .index
            .keys()
            .chain(self.held.keys())
            .map(String::as_str)
            .filter(|n| !self.taken.contains(*n))
            .collect();
        v.sort();
        v
    }
}
