//! Seeded fuzzing of the weight-chunk assembler: chunk streams cut, reordered, corrupted or
//! announcing absurd sizes are refused without a panic or a large allocation, and any stream it
//! accepts gives back whole tensors exactly as sent (a stream cut between tensors gives fewer:
//! the worker refuses an update whose tensor set differs from its policy's).
use comas_proto::v1::WeightChunk;
use comas_proto::weights::assemble;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Tensors of random sizes, each cut into chunks of random lengths.
fn stream(rng: &mut ChaCha8Rng) -> (Vec<(String, Vec<u8>)>, Vec<WeightChunk>) {
    let mut tensors = Vec::new();
    let mut chunks = Vec::new();
    for t in 0..rng.gen_range(1..5) {
        let name = format!("layer.{t}.weight");
        let bytes: Vec<u8> = (0..rng.gen_range(1..300)).map(|_| rng.gen()).collect();
        let mut offset = 0;
        while offset < bytes.len() {
            let end = (offset + rng.gen_range(1..80)).min(bytes.len());
            let last = end == bytes.len();
            chunks.push(WeightChunk {
                version: 1,
                tensor_name: name.clone(),
                dtype: "float32".into(),
                shape: vec![bytes.len() as i64],
                offset: offset as u64,
                data: bytes[offset..end].to_vec().into(),
                last,
                crc32: if last { crc32fast::hash(&bytes) } else { 0 },
                tensor_bytes: bytes.len() as u64,
            });
            offset = end;
        }
        tensors.push((name, bytes));
    }
    (tensors, chunks)
}

#[test]
fn damaged_chunk_streams_are_refused_and_whole_ones_reassemble_exactly() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let (mut refused, mut whole) = (0, 0);
    for _ in 0..5000 {
        let (tensors, mut chunks) = stream(&mut rng);
        let damaged = rng.gen_bool(0.8);
        if damaged {
            let i = rng.gen_range(0..chunks.len());
            match rng.gen_range(0..7) {
                0 => {
                    chunks.remove(i);
                }
                1 => {
                    let j = rng.gen_range(0..chunks.len());
                    chunks.swap(i, j);
                }
                2 => chunks[i].offset = rng.gen(),
                3 => chunks[i].tensor_bytes = [0, 1, u64::MAX, u64::MAX / 2][rng.gen_range(0..4)],
                4 => {
                    let mut data = chunks[i].data.to_vec();
                    data.push(rng.gen());
                    chunks[i].data = data.into();
                }
                5 => chunks[i].last = !chunks[i].last,
                _ => chunks.truncate(i),
            }
        }
        match assemble(chunks.clone()) {
            Ok(got) => {
                whole += 1;
                // Accepted: whole tensors, each exactly as sent (the order may differ when two
                // one-chunk tensors swapped; readers go by name).
                for t in &got {
                    let sent =
                        tensors.iter().find(|(n, _)| *n == t.name).expect("a tensor that was sent");
                    assert_eq!(t.bytes, sent.1, "an accepted stream changed `{}`", t.name);
                }
                assert!(damaged || got.len() == tensors.len());
            }
            Err(e) => {
                assert!(damaged, "an intact stream was refused: {e}");
                refused += 1;
            }
        }
    }
    assert!(refused > 3000 && whole > 900, "{refused} refused, {whole} whole");
}
