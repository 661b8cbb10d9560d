//! Safetensors checkpoints through the `safetensors` crate (the format's own validation: header,
//! offsets that tile the data section, sizes that match shape and dtype), memory-mapped, each
//! tensor copied out only when asked for; written atomically and streamed, one tensor at a time.
use crate::error::{ModelError, Result};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

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

/// The dtypes both libtorch and the format have, each way.
const KINDS: [(Dtype, Kind); 10] = [
    (Dtype::F32, Kind::Float),
    (Dtype::BF16, Kind::BFloat16),
    (Dtype::F16, Kind::Half),
    (Dtype::F64, Kind::Double),
    (Dtype::I64, Kind::Int64),
    (Dtype::I32, Kind::Int),
    (Dtype::I16, Kind::Int16),
    (Dtype::I8, Kind::Int8),
    (Dtype::U8, Kind::Uint8),
    (Dtype::BOOL, Kind::Bool),
];

fn kind_of(dtype: Dtype) -> Option<Kind> {
    KINDS.iter().find(|(d, _)| *d == dtype).map(|&(_, k)| k)
}

fn dtype_of(kind: Kind) -> Option<Dtype> {
    KINDS.iter().find(|(_, k)| *k == kind).map(|&(d, _)| d)
}

/// What is wrong with a file, in words a user can act on.
fn describe(e: &SafeTensorError) -> String {
    match e {
        SafeTensorError::HeaderTooSmall => "the file is too short for a header".into(),
        SafeTensorError::HeaderTooLarge | SafeTensorError::InvalidHeaderLength => {
            "the header length does not fit the file".into()
        }
        SafeTensorError::InvalidHeader
        | SafeTensorError::InvalidHeaderStart
        | SafeTensorError::InvalidHeaderDeserialization
        | SafeTensorError::JsonError(_) => "the header is not a JSON object of tensors".into(),
        SafeTensorError::InvalidOffset(name) => format!(
            "tensor `{name}` has data offsets outside its place in the data section (overlapping \
             or leaving a gap)"
        ),
        SafeTensorError::TensorInvalidInfo | SafeTensorError::InvalidTensorView(..) => {
            "a tensor's data size does not match its shape and dtype".into()
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            "the data section does not end where the last tensor does (a truncated file?)".into()
        }
        SafeTensorError::ValidationOverflow => "a tensor's shape overflows".into(),
        other => format!("{other:?}"),
    }
}

impl SafeTensorsFile {
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |message: String| ModelError::SafeTensors { path: path.to_path_buf(), message };
        let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: the mapping is read-only; a checkpoint rewritten in place while we read it is
        // not supported (our own writers always write a new file and rename).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let (header_len, header) =
            SafeTensors::read_metadata(&mmap).map_err(|e| bad(describe(&e)))?;
        let mut tensors = BTreeMap::new();
        for (name, info) in header.tensors() {
            let kind = kind_of(info.dtype).ok_or_else(|| {
                bad(format!("tensor `{name}` has unsupported dtype {:?}", info.dtype))
            })?;
            let (start, end) = info.data_offsets;
            let shape = info.shape.iter().map(|&d| d as i64).collect();
            tensors.insert(name, TensorInfo { kind, shape, start, end });
        }
        let metadata = header.metadata().clone().unwrap_or_default().into_iter().collect();
        Ok(Self { path: path.to_path_buf(), mmap, data_start: 8 + header_len, tensors, metadata })
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

/// A contiguous CPU tensor as the writer sees it: its bytes are read where they lie.
struct Contiguous {
    tensor: Tensor,
    dtype: Dtype,
    shape: Vec<usize>,
}

impl View for &Contiguous {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(cpu_bytes(&self.tensor))
    }

    fn data_len(&self) -> usize {
        self.tensor.numel() * self.tensor.kind().elt_size_in_bytes()
    }
}

/// The bytes of a contiguous CPU tensor, where they lie (no copy). The caller must not write to
/// the tensor while the slice is borrowed.
///
/// # Panics
/// When the tensor is on another device or not contiguous.
pub fn cpu_bytes(t: &Tensor) -> &[u8] {
    assert!(
        t.device() == tch::Device::Cpu && t.is_contiguous(),
        "cpu_bytes needs a contiguous CPU tensor"
    );
    let n = t.numel() * t.kind().elt_size_in_bytes();
    if n == 0 {
        return &[];
    }
    // SAFETY: a contiguous CPU tensor holds n bytes at data_ptr, alive as long as `t` is.
    unsafe { std::slice::from_raw_parts(t.data_ptr() as *const u8, n) }
}

/// Writes tensors to `path` atomically (`comas_files`), one tensor at a time. Tensors are moved
/// to the CPU and made contiguous; the header carries `format: pt` as `transformers` expects.
pub fn write(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let mut meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    meta.extend(metadata.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut views: BTreeMap<&str, Contiguous> = BTreeMap::new();
    for (name, t) in tensors {
        let tensor = t.to_device(tch::Device::Cpu).contiguous();
        let kind = tensor.kind();
        let dtype = dtype_of(kind).ok_or_else(|| {
            ModelError::Weights(format!("cannot save tensor `{name}` of kind {kind:?}"))
        })?;
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        if views.insert(name, Contiguous { tensor, dtype, shape }).is_some() {
            return Err(ModelError::Weights(format!("tensor `{name}` given twice")));
        }
    }
    comas_files::write_atomic_at(path, |tmp| {
        safetensors::tensor::serialize_to_file(views.iter().map(|(&n, v)| (n, v)), &Some(meta), tmp)
            .map_err(|e| std::io::Error::other(describe(&e)))
    })
    .map_err(|e| ModelError::io(path, e))
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
        assert!(err.contains("a truncated file?"), "{err}");
    }
}
