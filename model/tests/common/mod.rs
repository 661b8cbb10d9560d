//! Helpers shared by the model's integration tests: paths to the committed fixtures and their
//! reference outputs from `transformers` (tests/fixtures/gen_parity.py).
#![allow(dead_code)]
use comas_model::safetensors::SafeTensorsFile;
use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

/// The committed fixtures: COMAS_FIXTURES where a carried test binary runs in another tree
/// (scripts/gpu-check.sh), else this repository's.
pub fn fixtures() -> PathBuf {
    std::env::var_os("COMAS_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"))
}

/// The device the parity tests run the model on: COMAS_TEST_DEVICE (`cuda`, `cuda:1`), else
/// the CPU. References stay on the CPU; comparisons move both sides there.
pub fn device() -> Device {
    match std::env::var("COMAS_TEST_DEVICE") {
        Ok(d) => comas_model::dtype::parse_device(&d).expect("COMAS_TEST_DEVICE: cpu or cuda[:N]"),
        Err(_) => Device::Cpu,
    }
}

pub fn model_dir(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

pub struct Reference {
    pub json: serde_json::Value,
    pub tensors: SafeTensorsFile,
}

impl Reference {
    pub fn load(name: &str) -> Self {
        let dir = fixtures().join("reference");
        let json = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        let tensors = SafeTensorsFile::open(&dir.join(format!("{name}.safetensors"))).unwrap();
        Self { json, tensors }
    }

    pub fn tensor(&self, name: &str) -> Tensor {
        self.tensors.tensor(name).unwrap_or_else(|e| panic!("reference tensor {name}: {e}"))
    }

    pub fn prompt_ids(&self, i: usize) -> Vec<i64> {
        self.json["prompts"][i]["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    }

    pub fn num_prompts(&self) -> usize {
        self.json["prompts"].as_array().unwrap().len()
    }

    pub fn ids(&self, name: &str) -> Vec<i64> {
        Vec::<i64>::try_from(&self.tensor(name)).unwrap()
    }

    pub fn floats(&self, name: &str) -> Vec<f32> {
        Vec::<f32>::try_from(&self.tensor(name).to_kind(Kind::Float)).unwrap()
    }
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shapes differ");
    let on_cpu = |t: &Tensor| t.to_device(Device::Cpu).to_kind(Kind::Float);
    (on_cpu(a) - on_cpu(b)).abs().max().double_value(&[])
}

pub fn ids_tensor(ids: &[i64]) -> Tensor {
    Tensor::from_slice(ids).view([1, ids.len() as i64]).to_device(device())
}
