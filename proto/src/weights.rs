//! Reassembling a `StreamWeights` chunk stream: tensors in order, each checked against its
//! CRC32. Shared by the workers that pull weights and the tests of the learner.
use crate::v1::WeightChunk;

pub struct ReceivedTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<i64>,
    pub bytes: Vec<u8>,
}

/// Bytes reserved up front for one tensor.
const MAX_RESERVE: u64 = 64 << 20;

/// Incremental reassembly, so a caller can verify while chunks arrive.
#[derive(Default)]
pub struct Assembler {
    done: Vec<ReceivedTensor>,
    open: Option<(ReceivedTensor, u64)>,
}

impl Assembler {
    pub fn push(&mut self, c: &WeightChunk) -> Result<(), String> {
        if self.open.is_none() {
            if c.offset != 0 {
                return Err(format!("tensor `{}` starts at offset {}", c.tensor_name, c.offset));
            }
            // The announced size only sizes the first allocation, capped: memory grows with the
            // bytes that really arrive, never with what a peer claims.
            let reserve = c.tensor_bytes.min(MAX_RESERVE) as usize;
            let t = ReceivedTensor {
                name: c.tensor_name.clone(),
                dtype: c.dtype.clone(),
                shape: c.shape.clone(),
                bytes: Vec::with_capacity(reserve),
            };
            self.open = Some((t, c.tensor_bytes));
        }
        let (cur, total) = self.open.as_mut().expect("open tensor");
        if cur.name != c.tensor_name || c.offset as usize != cur.bytes.len() {
            return Err(format!(
                "chunk of `{}` at offset {} out of order",
                c.tensor_name, c.offset
            ));
        }
        cur.bytes.extend_from_slice(&c.data);
        if cur.bytes.len() as u64 > *total {
            return Err(format!("tensor `{}` overruns its announced {} bytes", cur.name, total));
        }
        if c.last {
            let (t, total) = self.open.take().expect("open tensor");
            if t.bytes.len() as u64 != total || crc32fast::hash(&t.bytes) != c.crc32 {
                return Err(format!("tensor `{}` failed its checksum", t.name));
            }
            self.done.push(t);
        }
        Ok(())
    }

    pub fn finish(self) -> Result<Vec<ReceivedTensor>, String> {
        match self.open {
            Some((t, _)) => Err(format!("stream ended inside tensor `{}`", t.name)),
            None => Ok(self.done),
        }
    }
}

/// Reassembles a whole chunk sequence.
pub fn assemble(
    chunks: impl IntoIterator<Item = WeightChunk>,
) -> Result<Vec<ReceivedTensor>, String> {
    let mut a = Assembler::default();
    for c in chunks {
        a.push(&c)?;
    }
    a.finish()
}
