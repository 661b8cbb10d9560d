//! A memory-mapped GGUF reader (versions 2 and 3): the header, metadata key/values, tensor
//! infos and the aligned data section. Every length and offset is checked against the file,
//! so a truncated or hostile file is an error, never a panic or a huge allocation.
use crate::error::{GgufError, Result};
use crate::quant::GgmlType;
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Dimensions a tensor may have (ggml's GGML_MAX_DIMS).
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// Any integer type, widened; None for other types or negative values.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer or float type, as f64. An f32 becomes the f64 of its shortest decimal form
    /// (1e-5, not 9.99999974e-6), which is what the original config said.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => v.to_string().parse().ok(),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as JSON (for printing and tests); integers stay exact.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::{json, Value as J};
        match self {
            Value::U8(v) => json!(v),
            Value::I8(v) => json!(v),
            Value::U16(v) => json!(v),
            Value::I16(v) => json!(v),
            Value::U32(v) => json!(v),
            Value::I32(v) => json!(v),
            Value::U64(v) => json!(v),
            Value::I64(v) => json!(v),
            Value::F32(v) => json!(f64::from(*v)),
            Value::F64(v) => json!(v),
            Value::Bool(b) => J::Bool(*b),
            Value::String(s) => J::String(s.clone()),
            Value::Array(a) => J::Array(a.iter().map(Value::to_json).collect()),
        }
    }

    /// gguf-py's name of the value type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "UINT8",
            Value::I8(_) => "INT8",
            Value::U16(_) => "UINT16",
            Value::I16(_) => "INT16",
            Value::U32(_) => "UINT32",
            Value::I32(_) => "INT32",
            Value::F32(_) => "FLOAT32",
            Value::Bool(_) => "BOOL",
            Value::String(_) => "STRING",
            Value::Array(_) => "ARRAY",
            Value::U64(_) => "UINT64",
            Value::I64(_) => "INT64",
            Value::F64(_) => "FLOAT64",
        }
    }
}

/// Where a tensor lives and how it is stored.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The PyTorch / Hugging Face shape: the ggml dimensions reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    data_start: usize,
}

/// A bounds-checked little-endian cursor over the mapped file.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, message: impl Into<String>) -> GgufError {
        GgufError::Format {
            path: self.path.to_path_buf(),
            offset: self.pos as u64,
            message: message.into(),
        }
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(
                self.err(format!("needs {n} more bytes but the file has {left} left (truncated?)"))
            );
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N as u64)?.try_into().expect("length checked"))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        let start = self.pos;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Format {
            path: self.path.to_path_buf(),
            offset: start as u64,
            message: "string is not UTF-8".into(),
        })
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("bool has byte value {b}"))),
            },
            8 => Value::String(self.string()?),
            9 => {
                if depth > 0 {
                    return Err(self.err("nested arrays are not supported"));
                }
                let elem = self.u32()?;
                let count = self.u64()?;
                // Every element takes at least one byte: a count beyond the bytes left is a lie,
                // and checking it first keeps the allocation bounded by the file size.
                let left = (self.buf.len() - self.pos) as u64;
                if count > left {
                    return Err(self.err(format!(
                        "array claims {count} elements but only {left} bytes remain"
                    )));
                }
                let mut out = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    out.push(self.value(elem, depth + 1)?);
                }
                Value::Array(out)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(self.err(format!("unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        // Mapping a folder fails with ENODEV ("No such device"), which names nothing useful.
        if path.is_dir() {
            return Err(GgufError::io(
                path,
                std::io::Error::other("a folder, not a GGUF file: give the .gguf file itself"),
            ));
        }
        let file = std::fs::File::open(path).map_err(|e| GgufError::io(path, e))?;
        // SAFETY: read-only mapping; a GGUF file changed on disk while it is imported is not supported.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| GgufError::io(path, e))?;
        let mut c = Cursor { buf: &mmap, pos: 0, path };
        if c.take(4).map_err(|_| c.err("file is shorter than the 4-byte magic"))? != MAGIC {
            return Err(GgufError::Format {
                path: path.into(),
                offset: 0,
                message: "magic is not `GGUF`".into(),
            });
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(c.err(format!("version {version} is not supported (2 and 3 are)")));
        }
        let tensor_count = c.u64()?;
        let kv_count = c.u64()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = c.string()?;
            let ty = c.u32()?;
            let value = c.value(ty, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(c.err(format!("metadata key `{key}` appears twice")));
            }
        }
        let left = (c.buf.len() - c.pos) as u64;
        if tensor_count > left {
            return Err(
                c.err(format!("{tensor_count} tensors claimed but only {left} bytes remain"))
            );
        }
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        for _ in 0..tensor_count {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.err(format!(
                    "tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
                )));
            }
            let dims = (0..n_dims).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
            let raw_ty = c.u32()?;
            let ty = GgmlType::from_id(raw_ty).ok_or_else(|| {
                c.err(format!("tensor `{name}` has unknown ggml type id {raw_ty}"))
            })?;
            let offset = c.u64()?;
            tensors.push(TensorInfo { name, dims, ty, offset });
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::meta(
                        "general.alignment",
                        format!("must be a power of two, is {v:?}"),
                    ))
                }
            },
        };
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        if data_start > mmap.len() as u64 {
            return Err(c.err("the data section starts beyond the end of the file"));
        }
        let file = Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            data_start: data_start as usize,
            mmap,
        };
        let mut seen = std::collections::BTreeSet::new();
        for t in &file.tensors {
            if !seen.insert(t.name.as_str()) {
                return Err(GgufError::Tensor {
                    tensor: t.name.clone(),
                    message: "appears twice".into(),
                });
            }
            if t.offset % alignment != 0 {
                return Err(GgufError::Tensor {
                    tensor: t.name.clone(),
                    message: format!("offset {} is not aligned to {alignment}", t.offset),
                });
            }
            file.tensor_bytes(t)?;
        }
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw (possibly quantised) bytes of a tensor, checked to lie inside the file.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8]> {
        let bad = |message: String| GgufError::Tensor { tensor: t.name.clone(), message };
        let len = t.ty.bytes_for(&t.dims).map_err(bad)?;
        let data_len = (self.mmap.len() - self.data_start) as u64;
        match t.offset.checked_add(len) {
            Some(end) if end <= data_len => {
                let start = self.data_start + t.offset as usize;
                Ok(&self.mmap[start..start + len as usize])
            }
            _ => Err(bad(format!("its {len} bytes at offset {} run past the end of the {data_len}-byte data section (truncated file?)", t.offset))),
        }
    }

    /// The tensor as f32 values in row-major order of [`TensorInfo::shape`].
    pub fn dequantize(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        Ok(t.ty.dequantize(self.tensor_bytes(t)?)?)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    GgufError::meta(key, format!("expected an integer, found {v:?}"))
                })
            })
            .transpose()
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| GgufError::meta(key, format!("expected a number, found {v:?}")))
            })
            .transpose()
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| GgufError::meta(key, "expected a string")))
            .transpose()
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| GgufError::meta(key, "expected a bool")))
            .transpose()
    }

    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?.ok_or_else(|| GgufError::meta(key, "is missing"))
    }
}
