//! Published weight versions: plain bytes copied off the training thread, so the async side can
//! stream them without touching a tensor. Each tensor carries a CRC32 for the receiver to check.
use crate::trainer::Trainer;
use comas_model::dtype::kind_name;
use comas_proto::v1::WeightChunk;
use std::sync::Arc;
use tch::{Device, Tensor};

pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;
/// Largest chunk a client may ask for: far below gRPC's 4 MiB message limit.
pub const MAX_CHUNK_BYTES: usize = 2 << 20;

pub struct PublishedTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<i64>,
    pub bytes: comas_proto::bytes::Bytes,
    pub crc32: u32,
}

pub struct PublishedWeights {
    pub version: u64,
    pub lora: bool,
    pub dtype: String,
    pub tensors: Vec<PublishedTensor>,
}

/// A private, contiguous host copy of a tensor, served as bytes where it lies: in page-locked
/// memory when the tensor is on a GPU (the copy off the device runs at full speed and is not
/// copied again into a `Vec`).
struct HostCopy(Tensor);

impl HostCopy {
    fn of(t: &Tensor) -> Self {
        let mut host = Tensor::empty(t.size(), (t.kind(), Device::Cpu));
        if t.device() != Device::Cpu {
            host = host.pin_memory(t.device());
        }
        host.copy_(t);
        Self(host)
    }
}

impl AsRef<[u8]> for HostCopy {
    fn as_ref(&self) -> &[u8] {
        // Nothing writes to the copy after `of` returned.
        comas_model::safetensors::cpu_bytes(&self.0)
    }
}

impl PublishedWeights {
    /// Copies the trainable weights (the adapter only, for LoRA) to host memory.
    pub fn snapshot(trainer: &Trainer, version: u64) -> Self {
        let _g = tch::no_grad_guard();
        let (lora, named) = match trainer.adapter() {
            Some(a) => (true, a.named_tensors()),
            None => (false, trainer.model().named_parameters()),
        };
        let kind = trainer.model().kind();
        let tensors = named
            .into_iter()
            .map(|(name, t)| {
                let host = HostCopy::of(&t.detach());
                let (dtype, shape) = (kind_name(host.0.kind()).to_string(), host.0.size());
                let bytes = comas_proto::bytes::Bytes::from_owner(host);
                let crc32 = crc32fast::hash(&bytes);
                PublishedTensor { name, dtype, shape, bytes, crc32 }
            })
            .collect();
        Self { version, lora, dtype: kind_name(kind).to_string(), tensors }
    }

    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes.len() as u64).sum()
    }

    /// The chunk sequence for a client: tensors in order, each split at `max_bytes`.
    pub fn chunks(
        self: &Arc<Self>,
        max_bytes: usize,
    ) -> impl Iterator<Item = WeightChunk> + Send + 'static {
        let max = max_bytes.clamp(1, MAX_CHUNK_BYTES);
        let this = Arc::clone(self);
        let plan: Vec<(usize, usize)> = self
            .tensors
            .iter()
            .enumerate()
            .flat_map(|(ti, t)| {
                let n = t.bytes.len();
                let pieces = n.div_ceil(max).max(1);
                (0..pieces).map(move |p| (ti, p * max))
            })
            .collect();
        plan.into_iter().map(move |(ti, off)| {
            let t = &this.tensors[ti];
            let end = (off + max).min(t.bytes.len());
            let last = end == t.bytes.len();
            WeightChunk {
                version: this.version,
                tensor_name: t.name.clone(),
                dtype: t.dtype.clone(),
                shape: t.shape.clone(),
                offset: off as u64,
                data: t.bytes.slice(off..end),
                last,
                crc32: if last { t.crc32 } else { 0 },
                tensor_bytes: t.bytes.len() as u64,
            }
        })
    }
}
