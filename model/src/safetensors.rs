//! Reading and writing the safetensors format (an 8-byte header length, a JSON header, raw data).
//! Files are memory-mapped; each tensor is copied out only when asked for.
use crate::error::{ModelError, Result};
use memmap2::Mmap;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

const MAX_HEADER_BYTES: u64 = 100 << 20;

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub kind: Kind,
    pub shape: Vec<i64>,
    start: usize,
    end: usize,
}

pub struct SafeTensorsFile {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    tensors: BTreeMap<String, TensorInfo>,
    metadata: BTreeMap<String, String>,
}

fn kind_from_dtype(dtype: &str) -> Option<Kind> {
    Some(match dtype {
        "F32" => Kind::Float,
        "BF16" => Kind::BFloat16,
        "F16" => Kind::Half,
        "F64" => Kind::Double,
        "I64" => Kind::Int64,
        "I32" => Kind::Int,
        "I16" => Kind::Int16,
        "I8" => Kind::Int8,
        "U8" => Kind::Uint8,
        "BOOL" => Kind::Bool,
        _ => return None,
    })
}

fn dtype_from_kind(kind: Kind) -> Option<&'static str> {
    Some(match kind {
        Kind::Float => "F32",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Double => "F64",
        Kind::Int64 => "I64",
        Kind::Int => "I32",
        Kind::Int16 => "I16",
        Kind::Int8 => "I8",
        Kind::Uint8 => "U8",
        Kind::Bool => "BOOL",
        _ => return None,
    })
}

impl SafeTensorsFile {
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |message: String| ModelError::SafeTensors { path: path.to_path_buf(), message };
        let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: the mapping is read-only; a checkpoint rewritten in place while we read it is
        // not supported (our own writers always write a new file and rename).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        if mmap.len() < 8 {
            return Err(bad(format!("file is {} bytes, too short for a header", mmap.len())));
        }
        let header_len = u64::from_le_bytes(mmap[..8].try_into().unwrap());
        if header_len > MAX_HEADER_BYTES || 8 + header_len > mmap.len() as u64 {
            return Err(bad(format!(
                "header length {header_len} does not fit the file ({} bytes)",
                mmap.len()
            )));
        }
        let data_start = 8 + header_len as usize;
        let header: Map<String, Value> = serde_json::from_slice(&mmap[8..data_start])
            .map_err(|e| bad(format!("header is not a JSON object: {e}")))?;
        let data_len = mmap.len() - data_start;
        let mut tensors = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (name, entry) in header {
            if name == "__metadata__" {
                if let Value::Object(m) = entry {
                    for (k, v) in m {
                        if let Value::String(s) = v {
                            metadata.insert(k, s);
                        }
                    }
                }
                continue;
            }
            let dtype = entry.get("dtype").and_then(Value::as_str).unwrap_or("?");
            let kind = kind_from_dtype(dtype)
                .ok_or_else(|| bad(format!("tensor `{name}` has unsupported dtype {dtype}")))?;
            let shape: Vec<i64> = entry
                .get("shape")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_i64).collect())
                .ok_or_else(|| bad(format!("tensor `{name}` has no shape")))?;
            let offsets: Vec<u64> = entry
                .get("data_offsets")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            let (start, end) = match offsets[..] {
                [s, e] if s <= e && e <= data_len as u64 => (s as usize, e as usize),
                _ => return Err(bad(format!("tensor `{name}` has data offsets {offsets:?} outside the {data_len}-byte data section"))),
            };
            let numel: i64 = shape.iter().product();
            if shape.iter().any(|&d| d < 0)
                || numel as usize * kind.elt_size_in_bytes() != end - start
            {
                return Err(bad(format!(
                    "tensor `{name}` of shape {shape:?} and dtype {dtype} needs {} bytes but has {}",
                    numel.max(0) as usize * kind.elt_size_in_bytes(),
                    end - start
                )));
            }
            tensors.insert(name, TensorInfo { kind, shape, start, end });
        }
        Ok(Self { path: path.to_path_buf(), mmap, data_start, tensors, metadata })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Copies one tensor out of the mapping onto the CPU in its stored dtype.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.tensors.get(name).ok_or_else(|| ModelError::SafeTensors {
            path: self.path.clone(),
            message: format!("no tensor named `{name}`"),
        })?;
        let bytes = &self.mmap[self.data_start + info.start..self.data_start + info.end];
        Ok(Tensor::f_from_data_size(bytes, &info.shape, info.kind)?)
    }
}

/// Writes tensors to `path` atomically (temporary file in the same folder, fsync, rename).
/// Tensors are moved to the CPU and made contiguous; the header carries `format: pt` as
/// `transformers` expects.
pub fn write(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let mut header = Map::new();
    let mut meta = Map::new();
    meta.insert("format".into(), Value::String("pt".into()));
    for (k, v) in metadata {
        meta.insert(k.clone(), Value::String(v.clone()));
    }
    header.insert("__metadata__".into(), Value::Object(meta));
    let mut offset = 0usize;
    let mut cpu = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = t.to_device(tch::Device::Cpu).contiguous();
        let kind = t.kind();
        let dtype = dtype_from_kind(kind).ok_or_else(|| {
            ModelError::Weights(format!("cannot save tensor `{name}` of kind {kind:?}"))
        })?;
        let nbytes = t.numel() * kind.elt_size_in_bytes();
        let mut entry = Map::new();
        entry.insert("dtype".into(), Value::String(dtype.into()));
        entry.insert("shape".into(), Value::from(t.size()));
        entry.insert("data_offsets".into(), Value::from(vec![offset, offset + nbytes]));
        if header.insert(name.clone(), Value::Object(entry)).is_some() {
            return Err(ModelError::Weights(format!("tensor `{name}` given twice")));
        }
        offset += nbytes;
        cpu.push(t);
    }
    let mut header_bytes = serde_json::to_vec(&Value::Object(header)).expect("header serializes");
    while header_bytes.len() % 8 != 0 {
        header_bytes.push(b' ');
    }
    write_atomic(path, |w| {
        w.write_all(&(header_bytes.len() as u64).to_le_bytes())?;
        w.write_all(&header_bytes)?;
        let mut buf = Vec::new();
        for t in &cpu {
            let n = t.numel();
            buf.resize(n * t.kind().elt_size_in_bytes(), 0);
            t.f_copy_data_u8(&mut buf, n).map_err(std::io::Error::other)?;
            w.write_all(&buf)?;
        }
        Ok(())
    })
}

/// Writes a file atomically (`comas_files`: a reader never sees a half-written file, and the
/// rename is synced); errors name the file.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> std::io::Result<()>,
) -> Result<()> {
    comas_files::write_atomic_with(path, fill).map_err(|e| ModelError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_keeps_dtype_shape_and_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let a = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).reshape([2, 3]);
        let b = Tensor::from_slice(&[1.5f32, -2.0]).to_kind(Kind::BFloat16);
        write(
            &path,
            &[("a".into(), a.shallow_clone()), ("b".into(), b.shallow_clone())],
            &BTreeMap::new(),
        )
        .unwrap();
        let f = SafeTensorsFile::open(&path).unwrap();
        assert_eq!(f.metadata().get("format").map(String::as_str), Some("pt"));
        assert_eq!(f.info("a").unwrap().shape, vec![2, 3]);
        let a2 = f.tensor("a").unwrap();
        assert_eq!(a2.kind(), Kind::Float);
        assert!(a2.equal(&a));
        let b2 = f.tensor("b").unwrap();
        assert_eq!(b2.kind(), Kind::BFloat16);
        assert!(b2.equal(&b));
        assert!(f.tensor("c").unwrap_err().to_string().contains("`c`"));
    }

    #[test]
    fn truncated_file_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        write(
            &path,
            &[("a".into(), Tensor::zeros([4, 4], (Kind::Float, tch::Device::Cpu)))],
            &BTreeMap::new(),
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let err = SafeTensorsFile::open(&path).err().unwrap().to_string();
        assert!(err.contains("outside"), "{err}");
    }
}
