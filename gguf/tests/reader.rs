//! The reader and the dequantisation against gguf-py: `tests/fixtures/gguf/quants.gguf` holds one
//! tensor per supported ggml type (random blocks) and metadata of every value type; the
//! reference values come from gguf-py's numpy code (`tests/fixtures/gen_gguf.py`).
use comas_gguf::{GgmlType, GgufError, GgufFile};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf").join(name)
}

fn reference() -> safetensors::SafeTensors<'static> {
    let bytes: &'static [u8] =
        Box::leak(std::fs::read(fixture("quants.ref.safetensors")).unwrap().into_boxed_slice());
    safetensors::SafeTensors::deserialize(bytes).unwrap()
}

#[test]
fn every_supported_type_dequantises_like_gguf_py() {
    let g = GgufFile::open(&fixture("quants.gguf")).unwrap();
    let reference = reference();
    let mut checked = Vec::new();
    for t in &g.tensors {
        let want = reference.tensor(&t.name).unwrap();
        assert_eq!(t.shape(), want.shape(), "{}", t.name);
        let want: Vec<f32> = want
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let got = g.dequantize(t).unwrap();
        assert_eq!(got.len(), want.len());
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-6, "{}: max |diff| {worst}", t.name);
        assert!(got.iter().any(|&v| v != 0.0), "{} dequantised to zeros", t.name);
        checked.push(t.ty);
    }
    use GgmlType::*;
    for ty in [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K] {
        assert!(checked.contains(&ty), "no fixture tensor of type {ty:?}");
    }
}

#[test]
fn metadata_of_every_value_type_reads_back() {
    let g = GgufFile::open(&fixture("quants.gguf")).unwrap();
    let text = std::fs::read_to_string(fixture("quants.meta.json")).unwrap();
    let meta: serde_json::Value = serde_json::from_str(&text).unwrap();
    let kv = meta["kv"].as_object().unwrap();
    assert!(kv.len() >= 20, "the fixture lists {} keys", kv.len());
    assert_eq!(g.metadata.len(), kv.len(), "key count");
    for (key, want) in kv {
        let got = g.get(key).unwrap_or_else(|| panic!("{key} missing"));
        assert_eq!(got.type_name(), want["type"], "{key}: type");
        if let Some(item) = want.get("item_type") {
            assert!(
                got.as_array().unwrap().iter().all(|v| v.type_name() == item),
                "{key}: item type"
            );
        }
        assert!(
            same(&got.to_json(), &want["value"]),
            "{key}: {} != {}",
            got.to_json(),
            want["value"]
        );
    }
    assert_eq!((g.version, g.get_u64("general.alignment").unwrap()), (3, Some(64)));
    let tensors = meta["tensors"].as_object().unwrap();
    assert_eq!(g.tensors.len(), tensors.len());
    for t in &g.tensors {
        let want = &tensors[&t.name];
        assert_eq!(serde_json::json!(t.offset), want["offset"], "{}: offset", t.name);
        assert_eq!(serde_json::json!(t.dims), want["dims"], "{}: dims", t.name);
        assert_eq!(t.ty.name(), want["ggml_type"].as_str().unwrap(), "{}: type", t.name);
        assert_eq!(
            serde_json::json!(g.tensor_bytes(t).unwrap().len()),
            want["n_bytes"],
            "{}: bytes",
            t.name
        );
    }
}

/// JSON equality with floats compared to 1e-15 relative (serde_json's float parsing may be
/// one ulp off Python's printing); integers exact.
fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-15 * x.abs().max(y.abs())
        }
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        _ => a == b,
    }
}

fn write_tmp(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, bytes).unwrap();
    f
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = std::fs::read(fixture("quants.gguf")).unwrap();
    let header_end = 2000.min(bytes.len());
    let cuts = (0..header_end).step_by(7).chain((header_end..bytes.len()).step_by(997));
    for cut in cuts {
        let f = write_tmp(&bytes[..cut]);
        match GgufFile::open(f.path()) {
            Err(GgufError::Format { .. }) | Err(GgufError::Tensor { .. }) => {}
            Err(e) => panic!("cut at {cut}: unexpected error kind: {e}"),
            Ok(_) => panic!("a file cut at byte {cut} of {} opened", bytes.len()),
        }
    }
}

#[test]
fn lying_counts_are_refused_without_allocating() {
    let bytes = std::fs::read(fixture("quants.gguf")).unwrap();
    // tensor_count at byte 8, kv_count at byte 16.
    for (at, what) in [(8, "tensors claimed"), (16, "")] {
        let mut b = bytes.clone();
        b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let err = GgufFile::open(write_tmp(&b).path()).err().expect("must fail").to_string();
        assert!(err.contains(what), "{err}");
    }
    let mut b = bytes.clone();
    b[..4].copy_from_slice(b"GGUG");
    assert!(GgufFile::open(write_tmp(&b).path()).err().unwrap().to_string().contains("magic"));
    let mut b = bytes;
    b[4..8].copy_from_slice(&7u32.to_le_bytes());
    assert!(GgufFile::open(write_tmp(&b).path()).err().unwrap().to_string().contains("version 7"));
}
