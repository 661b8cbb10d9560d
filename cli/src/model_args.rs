//! Flags that pick a model folder, dtype and device, shared by the commands that load a model.
use anyhow::{Context, Result};
use comas_model::dtype::{parse_device, parse_kind};
use comas_model::Config;
use std::path::PathBuf;
use tch::{Device, Kind};

#[derive(clap::Args)]
pub struct ModelArgs {
    /// Hugging Face model folder (config.json, safetensors, tokenizer.json).
    #[arg(long, env = "COMAS_MODEL")]
    pub model: PathBuf,
    /// Weights dtype (default: the checkpoint's).
    #[arg(long, env = "COMAS_DTYPE")]
    pub dtype: Option<String>,
    #[arg(long, env = "COMAS_DEVICE", default_value = "cpu")]
    pub device: String,
}

impl ModelArgs {
    /// The model's config and the dtype and device to load it in.
    pub fn resolve(&self) -> Result<(Config, Kind, Device)> {
        let device = parse_device(&self.device)?;
        let config = Config::from_file(&self.model.join("config.json"))
            .with_context(|| format!("loading model folder {}", self.model.display()))?;
        let kind = match &self.dtype {
            Some(d) => parse_kind(d)?,
            None => config.dtype,
        };
        Ok((config, kind, device))
    }
}
